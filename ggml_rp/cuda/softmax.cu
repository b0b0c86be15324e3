// SOFTMAX and SOFTMAX_BACK: one block per row, fixed-order block reductions.
#include "ggml_rp/cuda/softmax.cuh"

#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/node_kernel.cuh"

namespace rp::cuda {

namespace {

__global__ void __launch_bounds__(kRowMaxThreads) softmax_fwd_kernel(const float * __restrict__ x, float * __restrict__ y, int64_t ne0) {
    __shared__ float red[32];
    const int64_t off = static_cast<int64_t>(blockIdx.x) * ne0;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) mx = fmaxf(mx, x[off + i]);
    mx = block_max(mx, red);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) {
        const float e = expf(x[off + i] - mx);
        y[off + i] = e;
        s += e;
    }
    s = block_sum(s, red);
    const float inv = 1.0f / s;
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) y[off + i] *= inv;
}

__global__ void __launch_bounds__(kRowMaxThreads) softmax_bwd_kernel(const float * __restrict__ y, const float * __restrict__ dy, float * __restrict__ dx,
                                   int64_t ne0) {
    __shared__ float red[32];
    const int64_t off = static_cast<int64_t>(blockIdx.x) * ne0;
    float dot = 0.0f;
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) dot = fmaf(y[off + i], dy[off + i], dot);
    dot = block_sum(dot, red);
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) dx[off + i] = y[off + i] * (dy[off + i] - dot);
}

void check_rows(const char * op, int64_t ne0, int64_t nrows) {
    require(ne0 >= 1 && nrows >= 0 && nrows <= 0x7fffffff, op,
            "bad shape ne0=" + std::to_string(ne0) + " rows=" + std::to_string(nrows));
}

} // namespace

void softmax_fwd(const float * x, float * y, int64_t ne0, int64_t nrows, cudaStream_t stream) {
    check_rows("softmax", ne0, nrows);
    if (nrows == 0) return;
    softmax_fwd_kernel<<<static_cast<unsigned>(nrows), row_threads(ne0), 0, stream>>>(x, y, ne0);
    check_launch("softmax");
}

void softmax_bwd(const float * y, const float * dy, float * dx, int64_t ne0, int64_t nrows, cudaStream_t stream) {
    check_rows("softmax_back", ne0, nrows);
    if (nrows == 0) return;
    softmax_bwd_kernel<<<static_cast<unsigned>(nrows), row_threads(ne0), 0, stream>>>(y, dy, dx, ne0);
    check_launch("softmax_back");
}

// ---- node entries ----
namespace {
void run_softmax(Tensor * n, const NodeRun & r) { softmax_fwd(in<float>(n->src[0]), out<float>(n), n->ne[0], n->nrows(), r.stream); }
void run_softmax_back(Tensor * n, const NodeRun & r) {
    softmax_bwd(in<float>(n->src[0]), in<float>(n->src[1]), out<float>(n), n->ne[0], n->nrows(), r.stream);
}
const RegisterNodeKernels kRegister{{Op::SOFTMAX, run_softmax}, {Op::SOFTMAX_BACK, run_softmax_back}};
} // namespace

} // namespace rp::cuda
