// PREFERENCE_LOSS and PREFERENCE_LOSS_BACK: one thread runs ops/preference_math.h's preference_batch_loss, as the
// CPU kernel does (the pairs in order, in double): a handful of numbers per sequence, deterministic. An answer
// without tokens beside one with tokens is the data's to refuse (the CPU kernel throws); here it makes the loss
// non-finite, which the trainer's step check reports. (Two empty answers are an empty slot: skipped.)
#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/node_kernel.cuh"
#include "ggml_rp/ops/preference_loss.h"

namespace rp::cuda {

namespace {

__global__ void __launch_bounds__(1) preference_loss_kernel(const float * lp, const float * seq, int64_t B, PreferenceParams p,
                                                            double scale, const float * dloss, float * loss, float * d) {
    const double acc = preference_batch_loss(p, lp, seq, B, scale, dloss ? static_cast<double>(*dloss) : 0.0, d);
    if (loss) *loss = static_cast<float>(acc);
}

void run_preference_loss(Tensor * n, const NodeRun & r) {
    preference_loss_kernel<<<1, 1, 0, r.stream>>>(in<float>(n->src[0]), in<float>(n->src[1]), n->src[0]->nelements(),
                                                  preference_params(n), preference_loss_scale(n), nullptr, out<float>(n), nullptr);
    check_launch("preference_loss");
}

void run_preference_loss_back(Tensor * n, const NodeRun & r) {
    preference_loss_kernel<<<1, 1, 0, r.stream>>>(in<float>(n->src[0]), in<float>(n->src[1]), n->src[0]->nelements(),
                                                  preference_params(n), preference_loss_scale(n), in<float>(n->src[2]), nullptr,
                                                  out<float>(n));
    check_launch("preference_loss_back");
}

const RegisterNodeKernels kRegister{{Op::PREFERENCE_LOSS, run_preference_loss}, {Op::PREFERENCE_LOSS_BACK, run_preference_loss_back}};

} // namespace

} // namespace rp::cuda
