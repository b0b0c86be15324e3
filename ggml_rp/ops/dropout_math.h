// The per-element rule of DROPOUT, shared by the CPU kernel (ggml_rp/cpu/dropout.cpp) and the CUDA kernel
// (ggml_rp/cuda/dropout.cu) so that both produce the same bits.
#pragma once

#include "ggml_rp/core/counter_rng.h"
#include "ggml_rp/core/host_device.h"

#include <cstdint>

namespace rp {

// The factor of kept elements, rounded to float once: builders and launchers call this one function, so the
// CPU and the GPU multiply by the same float.
RP_HD inline float dropout_scale(float p) { return 1.0f / (1.0f - p); }

// Element with random word `word` (= rng_u32(key, counter_offset + i)) is kept when its uniform is >= p.
// A dropped element is x * 0, not a literal 0, so a NaN or Inf input stays non-finite (as in PyTorch) and the
// trainer's non-finite check still sees it.
RP_HD inline float dropout_f(float x, uint32_t word, float p, float scale) {
    return x * (rng_u32_to_uniform(word) >= p ? scale : 0.0f);
}

} // namespace rp
