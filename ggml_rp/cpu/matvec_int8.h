// One-token products of quantized weights with int8 activations: the generation path for Q8_0, Q4_K, Q5_K
// and Q6_K weights, as llama.cpp's CPU backend does it (its q8_0 / q8_K activations).
//
// Generating one token reads every weight once, so the product is bound by how fast the weights are decoded
// and multiplied, not by arithmetic on the activations. Quantizing the activation column once to int8 lets
// each weight row be dotted in its stored layout with integer multiply-adds (AVX-512 VNNI: 32 int8 products
// per instruction, exact in int32), then scaled once per block.
//
// Numerics (stated, and tested against a double-precision reference):
//   x is cut into blocks of 32; block b becomes d_b * q_i with d_b = max|x_i| / 127 and q_i = round(x_i / d_b)
//   (ties to even) in [-127, 127], so each |x_i - d_b q_i| <= d_b / 2. (llama.cpp: 32-blocks with an fp16 scale
//   for Q8_0, 256-blocks with an f32 scale for the K types; ours is at least as fine for every type.)
//   The weights are used exactly as rp::dequantize_row decodes them, factored per sub-block
//   (w = s * q - m), so y = sum over sub-blocks of s * d_b * (sum q_i q'_i, exact) - m * d_b * (sum q'_i).
//   The float combination is fixed per row (one order for any thread count, so results are deterministic),
//   but it is not the f32 path's order: a token's logits differ from its column in a batch by the
//   activation rounding (relative ~1e-3 of each product), which is why this is opt-in per process
//   (rp-generate turns it on) and the f32 path stays the default (training, perplexity, prompt batches).
#pragma once

#include "gguf/types.h"

#include <cstdint>
#include <vector>

namespace rp::cpu {

// An activation column quantized for int8_dot_row.
struct Int8Column {
    int64_t K = 0;
    std::vector<int8_t> q;        // K values
    std::vector<float> d;         // K/32 block scales
    std::vector<float> dsum16;    // K/16: d of the block * (sum of the 16 q's), for the min / offset terms
};

// Quantizes x[0..K) (K a multiple of 32).
void quantize_column(const float * x, int64_t K, Int8Column & out);

// Whether int8_dot_row takes weight rows of type t and length K.
bool int8_dot_supports(gguf::TensorType t, int64_t K);

// One weight row (K elements of type t, int8_dot_supports(t, K)) times the quantized column.
float int8_dot_row(gguf::TensorType t, const void * row, const Int8Column & x);

// True when int8_dot_row uses the VNNI instructions (false: a portable scalar loop, same numerics).
bool int8_dot_is_simd();

// Process-wide switch: one-token matmul_fwd products of supported weight types go through int8 activations.
// Off by default.
void set_int8_activations(bool on);
bool int8_activations();

} // namespace rp::cpu
