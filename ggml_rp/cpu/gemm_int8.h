// Products of quantized weights with many tokens in integer arithmetic: the batch form of the row dots
// (matvec_dot.h), for prompts and for decode steps of many sequences in the processes that asked for the row
// dots' numerics (rp-generate's `--matvec fast`, GRPO's rollouts). Training keeps the exact path (gemm.h).
//
// Numerics: those of the row dots. Each token is quantized as quantize_column does (int8, blocks of 32, d_b =
// max|x| / 127); the weights are factored per sub-block as w = s (q - o) - m with q a small unsigned integer and o
// the type's integer offset (Q4_0: 8, Q5_0: 16, Q3_K: 4 (q its 3 bits), Q6_K: 32, MXFP4: 12 (q = ggml's doubled
// E2M1 value + 12, s its halved power of two), Q8_0: 128 with VNNI (q + 128), else 0); m is the min of Q4_1, Q5_1
// (their -m), Q2_K, Q4_K and Q5_K. Per sub-block g of G elements (G = 16 for Q2_K, Q3_K and Q6_K, else 32)
//     y += float(S_g) * (s_g * d_b) - m_g * (d_b * sum q'),   S_g = sum (q - o) q' (exact, in int32: the offset
// taken out as -o * sum q'). The sub-blocks are added in order in one f32 chain per output: the terms are the row
// dots', the order is not (the row dots keep 8 lanes), so an output differs from its row dot by f32 rounding
// (tested against double references at the row dots' bound). Deterministic: every output is formed by one thread
// in a fixed order whatever the thread count and the batch's size.
//
// Kernels: AVX-512 VNNI (16 rows a vector, vpdpbusd), AVX-VNNI (8 rows, vpdpbusd on 256 bits) or AVX2 (8 rows,
// vpmaddubsw + vpmaddwd: the same int32 sums; Q8_0 as |q| times x with q's sign there, the one form whose pairs
// cannot overflow int16). A block of 48 (256-bit: 16) weight rows is decoded once into unsigned bytes laid out [k / 4][row][4], its scales beside, and
// then multiplied with every token; each 4 bytes of a token are broadcast to all rows. Up to 8 tokens the row
// dots stay faster (rp-bench ops --only matvec); from 16 on the int8 product reads the weights 1.8-2.1x faster
// than the exact path, its products run 1.6-2.2x faster and a quantized model's prompt 1.4-1.8x (AVX-512 VNNI;
// AVX-VNNI: products 1.7-2.3x; plain AVX2: 1.1-1.4x for the K-quants', Q8_0's as fast as the exact path).
#pragma once

#include "gguf/types.h"

#include <cstddef>
#include <cstdint>

namespace rp::cpu {

// Whether int8_matmul_fwd takes rows of K elements of type t: the row dots' int8 types (Q4_0 .. Q8_0, Q2_K .. Q6_K,
// MXFP4) in a build with AVX2 (or AVX-512 VNNI); false otherwise (the caller keeps the exact path).
bool int8_matmul_supports(gguf::TensorType t, int64_t K);

// Y[n, t] (+)= the product above for rows n < N of W (row stride w_row_bytes) and tokens t < T (column t of X at
// X + t * x_col, of K floats; of Y at Y + t * y_col). parallel: over the OpenMP threads.
void int8_matmul_fwd(int64_t K, int64_t N, int64_t T, const void * W, gguf::TensorType t, size_t w_row_bytes,
                     const float * X, int64_t x_col, float * Y, int64_t y_col, bool accumulate, bool parallel);

} // namespace rp::cpu
