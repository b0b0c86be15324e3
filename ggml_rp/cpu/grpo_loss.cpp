// GRPO_LOSS and GRPO_LOSS_BACK: ops/grpo_math.h's per-token loss; the forward sums it in double in token order
// (one thread: a handful of operations per token), the backward writes each token's derivative (in parallel: the
// tokens are independent). The CUDA kernels run the same per-token function.
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/strided.h"
#include "ggml_rp/ops/grpo_loss.h"

namespace rp::cpu {

namespace {

void grpo_loss(Tensor * n) {
    const GrpoParams p = grpo_params(n);
    const float * lp = n->src[0]->data_as<float>();
    const float * v = n->src[1]->data_as<float>();
    const int64_t N = n->src[0]->nelements();
    double acc = 0;
    for (int64_t t = 0; t < N; ++t) acc += grpo_token_loss(p, lp[t], v + kTokenValues * t).loss;
    *n->data_as<float>() = static_cast<float>(acc);
}

void grpo_loss_back(Tensor * n) {
    const GrpoParams p = grpo_params(n);
    const float * lp = n->src[0]->data_as<float>();
    const float * v = n->src[1]->data_as<float>();
    const double dloss = *n->src[2]->data_as<float>();
    float * d = n->data_as<float>();
    const int64_t N = n->src[0]->nelements();
#pragma omp parallel for schedule(static) if (N >= min_parallel_elements())
    for (int64_t t = 0; t < N; ++t) d[t] = static_cast<float>(dloss * grpo_token_loss(p, lp[t], v + kTokenValues * t).d);
}

const RegisterKernels kRegister{{Op::GRPO_LOSS, grpo_loss}, {Op::GRPO_LOSS_BACK, grpo_loss_back}};

} // namespace

} // namespace rp::cpu
