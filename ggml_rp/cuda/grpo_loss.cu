// GRPO_LOSS and GRPO_LOSS_BACK on CUDA: ops/grpo_math.h's per-token loss, as the CPU kernels run it. The forward is
// one block: each thread sums its strided tokens in double, then a tree over the block's threads (a fixed order:
// deterministic, though not the CPU's token order); the backward is one thread per token.
#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/node_kernel.cuh"
#include "ggml_rp/ops/grpo_loss.h"

namespace rp::cuda {

namespace {

constexpr int kSumThreads = 256;

__global__ void __launch_bounds__(kSumThreads) grpo_loss_kernel(const float * lp, const float * v, int64_t N, GrpoParams p, float * loss) {
    __shared__ double part[kSumThreads];
    double acc = 0;
    for (int64_t t = threadIdx.x; t < N; t += kSumThreads) acc += grpo_token_loss(p, lp[t], v + kTokenValues * t).loss;
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = kSumThreads / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) *loss = static_cast<float>(part[0]);
}

__global__ void __launch_bounds__(kElemThreads) grpo_loss_back_kernel(const float * lp, const float * v, int64_t N, GrpoParams p,
                                                                      const float * dloss, float * d) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t < N) d[t] = static_cast<float>(static_cast<double>(*dloss) * grpo_token_loss(p, lp[t], v + kTokenValues * t).d);
}

void run_grpo_loss(Tensor * n, const NodeRun & r) {
    grpo_loss_kernel<<<1, kSumThreads, 0, r.stream>>>(in<float>(n->src[0]), in<float>(n->src[1]), n->src[0]->nelements(), grpo_params(n),
                                                      out<float>(n));
    check_launch("grpo_loss");
}

void run_grpo_loss_back(Tensor * n, const NodeRun & r) {
    const int64_t N = n->src[0]->nelements();
    grpo_loss_back_kernel<<<static_cast<unsigned>(ceil_div(N, kElemThreads)), kElemThreads, 0, r.stream>>>(
        in<float>(n->src[0]), in<float>(n->src[1]), N, grpo_params(n), in<float>(n->src[2]), out<float>(n));
    check_launch("grpo_loss_back");
}

const RegisterNodeKernels kRegister{{Op::GRPO_LOSS, run_grpo_loss}, {Op::GRPO_LOSS_BACK, run_grpo_loss_back}};

} // namespace

} // namespace rp::cuda
