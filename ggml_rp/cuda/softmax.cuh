// Softmax over the contiguous axis on the GPU (CPU reference: ggml_rp/cpu/softmax.cpp).
//   y = exp(x - max) / sum exp(x - max);   dx = y * (dy - sum_j y[j] dy[j])
// Contiguous f32 rows of ne0 elements, device pointers, enqueued on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace rp::cuda {

void softmax_fwd(const float * x, float * y, int64_t ne0, int64_t nrows, cudaStream_t stream);
void softmax_bwd(const float * y, const float * dy, float * dx, int64_t ne0, int64_t nrows, cudaStream_t stream);

} // namespace rp::cuda
