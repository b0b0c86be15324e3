// Rotary position embedding with explicit i32 position ids (llama.cpp's semantics, formats.md §3.5).
//
// x: f32 [head_dim, n_heads, n_tokens, n_seqs]; pos: i32 with n_tokens elements (shared by all sequences) or
// n_tokens * n_seqs (token t of sequence s reads pos[t + s * n_tokens]). For pair i < n_rot / 2:
//   theta = pos * freq_base^(-2i / n_rot) * freq_scale
//   (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)
// where the pair is (x[2i], x[2i+1]) in NORMAL mode (llama) and (x[i], x[i + n_rot/2]) in NEOX mode (qwen).
// Elements from n_rot on pass through. The angle formula is in rope_math.h (shared with CUDA), with YaRN's
// context extension (ggml's rope_ext) when ext_factor is set, and a per-position temperature factor when
// temp_scale is.
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

enum class RopeMode : int32_t { Normal = 0, Neox = 2 };

struct RopeParams {
    int32_t n_rot = 0;          // rotated dimensions (even, <= head_dim)
    RopeMode mode = RopeMode::Normal;
    float freq_base = 10000.0f;
    float freq_scale = 1.0f;    // linear position interpolation (1 = none)
    // YaRN (rope_math.h): ext_factor 0 = none; with it, n_ctx_orig (the training context) must be > 0.
    float ext_factor = 0.0f;
    float attn_factor = 1.0f;   // the cos / sin scale (YaRN multiplies it by 1 + 0.1 ln(1 / freq_scale))
    float beta_fast = 32.0f, beta_slow = 1.0f;
    int32_t n_ctx_orig = 0;
    // Attention temperature tuning (rope_math.h RopeTemperature; the queries of Mistral 3 / Llama 4): temp_scale
    // 0 = none; with it, temp_floor > 0.
    float temp_scale = 0.0f;
    int32_t temp_floor = 0;
    float temp_offset = 0.0f;
};

// freq_factors (optional): f32 with at least n_rot / 2 values; pair i's angle is divided by freq_factors[i] before
// any interpolation (ggml_rope_ext's c: Llama 3's rope_freqs, Phi-3's LongRoPE factors). No gradient flows to it.
Tensor * rope(Context & ctx, Tensor * x, Tensor * pos, const RopeParams & p, Tensor * freq_factors = nullptr);
// The transpose rotation (by -theta): the gradient of rope.
Tensor * rope_back(Context & ctx, Tensor * dy, Tensor * pos, const RopeParams & p, Tensor * freq_factors = nullptr);

class Backward;
namespace rules {
// The backward rule of ROPE, ROPE_BACK (the op table's, core/ops.def).
void backward_rope(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
