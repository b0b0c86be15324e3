// RoPE frequency factors as the models' authors define them, for the files that carry them as tensors (formats.md
// §3.1): written by rp-gguf synth, recognised again by the Hugging Face export (which states them as a config).
#pragma once

#include <cstdint>
#include <vector>

namespace rp {

// Meta's Llama 3 rope scaling (apply_scaling; llama.cpp's converter writes its result as rope_freqs): the n_rot / 2
// pairs' factors for `factor` over an original context of `orig_ctx` tokens: a pair whose wavelength 2 pi / theta_i
// (theta_i = base^(-2i / n_rot)) is below orig_ctx / high keeps its frequency (1), one beyond orig_ctx / low is
// slowed by `factor`, one between by a smooth blend.
std::vector<float> llama3_rope_factors(float factor, float low, float high, uint32_t orig_ctx, float base, uint32_t n_rot);

} // namespace rp
