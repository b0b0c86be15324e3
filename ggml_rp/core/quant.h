// Row-wise conversion between f32 and every GGUF storage type we support (reference CPU code).
// The per-block math is in quant_block.h, shared with the CUDA kernels.
#pragma once

#include "gguf/types.h"

#include <cstdint>

namespace rp {

using gguf::TensorType;

// True when dequantize_row handles this type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, MXFP4).
bool can_dequantize(TensorType t);
// True when quantize_row handles this type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, MXFP4).
bool can_quantize(TensorType t);

// n elements (a multiple of the type's block size) of type t at src -> n floats at dst.
// Throws rp::Error for an unsupported type or a bad n (names the type).
void dequantize_row(TensorType t, const void * src, float * dst, int64_t n);

// n floats at src -> n elements of type t at dst, round to nearest like ggml's reference quantizers.
void quantize_row(TensorType t, const float * src, void * dst, int64_t n);

// `rows` rows of n_per_row floats -> rows of type t (row_bytes(t, n_per_row) apart), rows shared among
// `threads` threads (the bytes do not depend on the count: blocks never span rows). Throws like quantize_row,
// before any thread starts.
void quantize_rows(TensorType t, const float * src, void * dst, int64_t n_per_row, int64_t rows, int threads);

} // namespace rp
