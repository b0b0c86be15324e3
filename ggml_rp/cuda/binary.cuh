// ADD and MUL with broadcast on the GPU (CPU reference: ggml_rp/cpu/binary.cpp).
//   out[i0,i1,i2,i3] = a[i0,i1,i2,i3] (+ or *) b[i0 % bne0, i1 % bne1, i2 % bne2, i3 % bne3]
// a and out: contiguous f32 with sizes ne[4]; b: contiguous f32 with sizes bne[4], each dividing ne. out may
// be a (in place). Device pointers, enqueued on `stream`. The backward of add/mul is composition (mul, sum_to),
// done by the graph, as on the CPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace rp::cuda {

void add(const float * a, const float * b, float * out, const int64_t ne[4], const int64_t bne[4], cudaStream_t stream);
void mul(const float * a, const float * b, float * out, const int64_t ne[4], const int64_t bne[4], cudaStream_t stream);

} // namespace rp::cuda
