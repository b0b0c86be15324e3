// RMS norm over the contiguous axis on the GPU (CPU reference: ggml_rp/cpu/norm.cpp).
//   y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]        (w nullable: no weight)
//   dx[i] = rs * g[i] - rs^3 * (sum_j g[j] x[j]) / ne0 * x[i],   g = dy * w
// l2: y = x / max(|x|, eps) (no mean; the L2 norm of Gated DeltaNet's q and k), dx = dy / eps where the norm is clamped;
//   `scales` (nullable, nrows floats): each row's 1 / max(|x|, eps), negated where clamped, for l2_norm_bwd:
//   dx = s (dy - y (y . dy)), or -s dy where s < 0 (clamped).
// gated (Qwen3.5's output norm): y = (x rs w) silu(z); gradients dx = rs g - rs^3 (sum_j g[j] x[j]) / ne0 x with
//   g = dy w silu(z), and dz = dy (x rs w) silu'(z) (want_dz).
// All pointers are device pointers to contiguous f32 rows of ne0 elements; nrows rows. Enqueued on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace rp::cuda {

void rms_norm_fwd(const float * x, const float * w, float * y, int64_t ne0, int64_t nrows, float eps,
                  cudaStream_t stream, bool l2 = false, float * scales = nullptr);
void rms_norm_bwd(const float * x, const float * w, const float * dy, float * dx, int64_t ne0, int64_t nrows,
                  float eps, cudaStream_t stream, bool l2 = false);
void rms_norm_gated_fwd(const float * x, const float * z, const float * w, float * y, int64_t ne0, int64_t nrows, float eps,
                        cudaStream_t stream);
void rms_norm_gated_bwd(const float * x, const float * z, const float * w, const float * dy, float * out, int64_t ne0,
                        int64_t nrows, float eps, bool want_dz, cudaStream_t stream);
void l2_norm_bwd(const float * y, const float * scales, const float * dy, float * dx, int64_t ne0, int64_t nrows,
                 cudaStream_t stream);

} // namespace rp::cuda
