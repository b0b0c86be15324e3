// DROPOUT on the GPU (CPU reference: ggml_rp/cpu/dropout.cpp; the mask rule is shared through
// ggml_rp/ops/dropout_math.h and ggml_rp/core/counter_rng.h, so both backends give the same bits).
// n contiguous f32 elements at device pointers whose logical flat indices are 0..n-1 (a strided source is
// packed first, in logical order, like every element-wise operand): element i is kept when
// rng_uniform(key, counter_offset + i) >= p, and then scaled by dropout_scale(p). y may alias x.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace rp::cuda {

// p in [0, 1) (throws rp::Error otherwise). The backward is the same call on dy with the same p, key, offset.
void dropout(const float * x, float * y, int64_t n, float p, uint64_t key, uint64_t counter_offset,
             cudaStream_t stream);

} // namespace rp::cuda
