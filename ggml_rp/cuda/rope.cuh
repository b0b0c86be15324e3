// Rotary position embedding on the GPU (CPU reference: ggml_rp/cpu/rope.cpp; semantics in ggml_rp/ops/rope.h;
// the angle formula in ggml_rp/ops/rope_math.h, shared).
// x, y: contiguous f32 [head_dim, n_heads, n_tokens, n_seqs] (y may be x); pos: device i32 with n_tokens or
// n_tokens * n_seqs entries (npos). backward = true rotates by -theta (the gradient).
#pragma once

#include "ggml_rp/ops/rope_math.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace rp::cuda {

struct RopeConfig {
    int32_t n_rot = 0;        // rotated dims, even, <= head_dim
    bool neox = false;        // pairs (i, i + n_rot/2) instead of (2i, 2i+1)
    float freq_base = 10000.0f;
    float freq_scale = 1.0f;
    RopeYarn yarn;            // rope_math.h (default: none)
    RopeTemperature temp;     // rope_math.h (default: none)
};

// freq_factors (device, optional): at least n_rot / 2 divisors of the pairs' angles (ops/rope.h).
void rope(const float * x, const int32_t * pos, int64_t npos, float * y, const int64_t ne[4], const RopeConfig & c,
          bool backward, cudaStream_t stream, const float * freq_factors = nullptr);

} // namespace rp::cuda
