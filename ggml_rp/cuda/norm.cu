// RMS_NORM and RMS_NORM_BACK (and their L2 form), L2_NORM_BACK, RMS_NORM_GATED and its gradients: one block per row,
// fixed-order block reductions.
#include "ggml_rp/cuda/norm.cuh"

#include "ggml_rp/ops/unary_math.h"

#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/node_kernel.cuh"

namespace rp::cuda {

namespace {

__global__ void __launch_bounds__(kRowMaxThreads) rms_norm_fwd_kernel(const float * __restrict__ x, const float * __restrict__ w, float * __restrict__ y,
                                    int64_t ne0, float eps, bool l2, float * __restrict__ scales) {
    __shared__ float red[32];
    const float * xr = x + blockIdx.x * ne0;
    float * yr = y + blockIdx.x * ne0;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    ss = block_sum(ss, red);
    const float rs = l2 ? 1.0f / fmaxf(sqrtf(ss), eps) : 1.0f / sqrtf(ss / static_cast<float>(ne0) + eps);
    if (scales && threadIdx.x == 0) scales[blockIdx.x] = sqrtf(ss) > eps ? rs : -rs;
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) {
        const float v = xr[i] * rs;
        yr[i] = w ? v * w[i] : v;
    }
}

__global__ void __launch_bounds__(kRowMaxThreads) rms_norm_bwd_kernel(const float * __restrict__ x, const float * __restrict__ w,
                                    const float * __restrict__ dy, float * __restrict__ dx, int64_t ne0, float eps, bool l2) {
    __shared__ float red[32];
    const int64_t off = static_cast<int64_t>(blockIdx.x) * ne0;
    float ss = 0.0f, gx = 0.0f;
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) {
        const float v = x[off + i];
        const float g = dy[off + i] * (w ? w[i] : 1.0f);
        ss = fmaf(v, v, ss);
        gx = fmaf(g, v, gx);
    }
    ss = block_sum(ss, red);
    gx = block_sum(gx, red);
    // L2: the norm clamped at eps is a constant there (dx = dy / eps); else the RMS formula with n = 1.
    const bool clamped = l2 && !(sqrtf(ss) > eps);
    const float rs = l2 ? (clamped ? 1.0f / eps : 1.0f / sqrtf(ss)) : 1.0f / sqrtf(ss / static_cast<float>(ne0) + eps);
    const float c = clamped ? 0.0f : rs * rs * rs * gx / (l2 ? 1.0f : static_cast<float>(ne0));
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) {
        const float g = dy[off + i] * (w ? w[i] : 1.0f);
        dx[off + i] = rs * g - c * x[off + i];
    }
}

__global__ void __launch_bounds__(kRowMaxThreads) l2_norm_bwd_kernel(const float * __restrict__ y, const float * __restrict__ scales,
                                    const float * __restrict__ dy, float * __restrict__ dx, int64_t ne0) {
    __shared__ float red[32];
    const int64_t off = static_cast<int64_t>(blockIdx.x) * ne0;
    const float s = scales[blockIdx.x];
    if (s < 0.0f) {   // clamped: s dy with s = 1 / eps (uniform over the block: no reduction to skip unevenly)
        for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) dx[off + i] = -s * dy[off + i];
        return;
    }
    float yg = 0.0f;
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) yg = fmaf(y[off + i], dy[off + i], yg);
    yg = block_sum(yg, red);
    const float c = s * yg;
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) dx[off + i] = s * dy[off + i] - c * y[off + i];
}

// The gated norm: rms_norm_fwd_kernel's product, then the SILU and MUL kernels' (silu_f), in their order.
__global__ void __launch_bounds__(kRowMaxThreads) rms_norm_gated_fwd_kernel(const float * __restrict__ x, const float * __restrict__ z,
                                    const float * __restrict__ w, float * __restrict__ y, int64_t ne0, float eps) {
    __shared__ float red[32];
    const int64_t off = static_cast<int64_t>(blockIdx.x) * ne0;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) ss = fmaf(x[off + i], x[off + i], ss);
    ss = block_sum(ss, red);
    const float rs = 1.0f / sqrtf(ss / static_cast<float>(ne0) + eps);
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) {
        const float v = x[off + i] * rs;
        y[off + i] = (w ? v * w[i] : v) * silu_f(z[off + i]);
    }
}

__global__ void __launch_bounds__(kRowMaxThreads) rms_norm_gated_bwd_kernel(const float * __restrict__ x, const float * __restrict__ z,
                                    const float * __restrict__ w, const float * dy, float * out, int64_t ne0,
                                    float eps, bool want_dz) {
    // (dy and out are not restrict: dz may be written over dy, each element after its own read)
    __shared__ float red[32];
    const int64_t off = static_cast<int64_t>(blockIdx.x) * ne0;
    float ss = 0.0f, gx = 0.0f;
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) {
        const float v = x[off + i];
        ss = fmaf(v, v, ss);
        if (!want_dz) gx = fmaf(dy[off + i] * (w ? w[i] : 1.0f) * silu_f(z[off + i]), v, gx);
    }
    ss = block_sum(ss, red);
    const float rs = 1.0f / sqrtf(ss / static_cast<float>(ne0) + eps);
    if (want_dz) {
        for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x)
            out[off + i] = dy[off + i] * (x[off + i] * rs * (w ? w[i] : 1.0f)) * silu_grad_f(z[off + i]);
        return;
    }
    gx = block_sum(gx, red);
    const float c = rs * rs * rs * gx / static_cast<float>(ne0);
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) {
        const float g = dy[off + i] * (w ? w[i] : 1.0f) * silu_f(z[off + i]);
        out[off + i] = rs * g - c * x[off + i];
    }
}

void check_rows(const char * op, int64_t ne0, int64_t nrows) {
    require(ne0 >= 1 && nrows >= 0 && nrows <= 0x7fffffff, op,
            "bad shape ne0=" + std::to_string(ne0) + " rows=" + std::to_string(nrows));
}

} // namespace

void rms_norm_fwd(const float * x, const float * w, float * y, int64_t ne0, int64_t nrows, float eps,
                  cudaStream_t stream, bool l2, float * scales) {
    check_rows("rms_norm", ne0, nrows);
    if (nrows == 0) return;
    rms_norm_fwd_kernel<<<static_cast<unsigned>(nrows), row_threads(ne0), 0, stream>>>(x, w, y, ne0, eps, l2, scales);
    check_launch("rms_norm");
}

void rms_norm_bwd(const float * x, const float * w, const float * dy, float * dx, int64_t ne0, int64_t nrows,
                  float eps, cudaStream_t stream, bool l2) {
    check_rows("rms_norm_back", ne0, nrows);
    if (nrows == 0) return;
    rms_norm_bwd_kernel<<<static_cast<unsigned>(nrows), row_threads(ne0), 0, stream>>>(x, w, dy, dx, ne0, eps, l2);
    check_launch("rms_norm_back");
}

void rms_norm_gated_fwd(const float * x, const float * z, const float * w, float * y, int64_t ne0, int64_t nrows, float eps,
                        cudaStream_t stream) {
    check_rows("rms_norm_gated", ne0, nrows);
    if (nrows == 0) return;
    rms_norm_gated_fwd_kernel<<<static_cast<unsigned>(nrows), row_threads(ne0), 0, stream>>>(x, z, w, y, ne0, eps);
    check_launch("rms_norm_gated");
}

void rms_norm_gated_bwd(const float * x, const float * z, const float * w, const float * dy, float * out, int64_t ne0,
                        int64_t nrows, float eps, bool want_dz, cudaStream_t stream) {
    check_rows("rms_norm_gated_back", ne0, nrows);
    if (nrows == 0) return;
    rms_norm_gated_bwd_kernel<<<static_cast<unsigned>(nrows), row_threads(ne0), 0, stream>>>(x, z, w, dy, out, ne0, eps, want_dz);
    check_launch("rms_norm_gated_back");
}

void l2_norm_bwd(const float * y, const float * scales, const float * dy, float * dx, int64_t ne0, int64_t nrows,
                 cudaStream_t stream) {
    check_rows("l2_norm_back", ne0, nrows);
    if (nrows == 0) return;
    l2_norm_bwd_kernel<<<static_cast<unsigned>(nrows), row_threads(ne0), 0, stream>>>(y, scales, dy, dx, ne0);
    check_launch("l2_norm_back");
}

// ---- node entries ----
namespace {
void run_rms_norm(Tensor * n, const NodeRun & r) {
    const bool l2 = n->param_i32(1) != 0;
    float * scales = l2 && n->aux_bytes ? reinterpret_cast<float *>(static_cast<char *>(n->data) + n->nbytes()) : nullptr;
    rms_norm_fwd(in<float>(n->src[0]), in<float>(n->src[1]), out<float>(n), n->ne[0], n->nrows(), n->param_f32(0), r.stream, l2,
                 scales);
}
void run_rms_norm_back(Tensor * n, const NodeRun & r) {
    rms_norm_bwd(in<float>(n->src[0]), in<float>(n->src[2]), in<float>(n->src[1]), out<float>(n), n->ne[0], n->nrows(),
                 n->param_f32(0), r.stream, n->param_i32(1) != 0);
}
void run_l2_norm_back(Tensor * n, const NodeRun & r) {
    l2_norm_bwd(in<float>(n->src[0]), in<float>(n->src[1]), in<float>(n->src[2]), out<float>(n), n->ne[0], n->nrows(), r.stream);
}
void run_rms_norm_gated(Tensor * n, const NodeRun & r) {
    rms_norm_gated_fwd(in<float>(n->src[0]), in<float>(n->src[1]), in<float>(n->src[2]), out<float>(n), n->ne[0], n->nrows(),
                       n->param_f32(0), r.stream);
}
void run_rms_norm_gated_back(Tensor * n, const NodeRun & r) {
    rms_norm_gated_bwd(in<float>(n->src[0]), in<float>(n->src[1]), in<float>(n->src[3]), in<float>(n->src[2]), out<float>(n), n->ne[0],
                       n->nrows(), n->param_f32(0), n->param_i32(1) == 1, r.stream);
}
const RegisterNodeKernels kRegister{{Op::RMS_NORM, run_rms_norm}, {Op::RMS_NORM_BACK, run_rms_norm_back},
                                    {Op::L2_NORM_BACK, run_l2_norm_back}, {Op::RMS_NORM_GATED, run_rms_norm_gated},
                                    {Op::RMS_NORM_GATED_BACK, run_rms_norm_gated_back}};
} // namespace

} // namespace rp::cuda
