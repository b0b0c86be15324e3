// Dequantization on the GPU: any dequantizable GGUF type -> f32, with the per-element math of
// ggml_rp/core/quant_block.h (bit-identical to the CPU's dequantize_row).
#pragma once

#include "gguf/types.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace rp::cuda {

// True for the types rp_cuda_dequantize handles (the same set as rp::can_dequantize).
bool can_dequantize(gguf::TensorType t);

// n elements of type t at device pointer dsrc -> n floats at device pointer ddst, enqueued on `stream`
// (asynchronous; nothing is synchronized). n must be a multiple of the type's block size and dsrc 2-byte
// aligned. Throws rp::Error naming the type for an unsupported type or a bad n, and on a launch error.
void dequantize(gguf::TensorType t, const void * dsrc, float * ddst, int64_t n, cudaStream_t stream);

} // namespace rp::cuda

// The C-style name used in design notes.
inline void rp_cuda_dequantize(gguf::TensorType t, const void * dsrc, float * ddst, int64_t n, cudaStream_t s) {
    rp::cuda::dequantize(t, dsrc, ddst, n, s);
}
