// The few-token matrix product (generation: one token per step). matmul_fwd (gemm.h) sends T <=
// kMatvecMaxTokens here; the contract is matmul_fwd's: Y[n, t] (+)= sum_k W[k, n] * X[k, t], W rows in their
// stored type. Weights are read once per call in their stored layout (no packing), dequantized a row at a
// time; deterministic for any thread count (cpu/matvec.cpp says how). Not bitwise the GEMM's result: the
// summation order differs (both are f32 sums of the same products).
#pragma once

#include "gguf/types.h"

#include <cstddef>
#include <cstdint>

namespace rp::cpu {

using gguf::TensorType;

inline constexpr int64_t kMatvecMaxTokens = 4;

void matvec_fwd(int64_t K, int64_t N, int64_t T, const void * W, TensorType wtype, size_t w_row_bytes, const float * X,
                int64_t x_col, float * Y, int64_t y_col, bool accumulate);

} // namespace rp::cpu
