// The K-quant quantizers (Q2_K .. Q6_K): ggml's reference algorithms without an importance matrix, which is
// what llama-quantize runs when it is given none, reproduced so that our bytes equal llama.cpp's. Host code
// only (quant.cpp calls them through quantize_row); the block layouts are in quant_block.h.
//
// Bit-identity needs ggml's float operations in ggml's order with nothing fused: quantize_k.cpp is compiled
// with -ffp-contract=off (ggml-base is built for baseline x86-64, which has no FMA), and every expression
// below keeps the association of ggml's C source.
#pragma once

#include "ggml_rp/core/quant_block.h"

#include <cstdint>

namespace rp::kquant {

// nb blocks of QK_K floats at x -> nb blocks at y.
void quantize_q2_K(const float * x, block_q2_K * y, int64_t nb);
void quantize_q3_K(const float * x, block_q3_K * y, int64_t nb);
void quantize_q4_K(const float * x, block_q4_K * y, int64_t nb);
void quantize_q5_K(const float * x, block_q5_K * y, int64_t nb);
void quantize_q6_K(const float * x, block_q6_K * y, int64_t nb);

} // namespace rp::kquant
