// Per-element math of the unary ops, one definition for the CPU and CUDA kernels.
#pragma once

#include <cmath>

#include "ggml_rp/core/host_device.h"

namespace rp {

// The formulas from e = exp(-x), which each backend computes its own way (CUDA: expf; the CPU: vec_exp over
// a row, in vectors).
RP_HD inline float sigmoid_of(float e) { return 1.0f / (1.0f + e); }
RP_HD inline float silu_of(float x, float e) { return x * sigmoid_of(e); }
RP_HD inline float silu_grad_of(float x, float e) {
    const float s = sigmoid_of(e);
    return s * (1.0f + x * (1.0f - s));
}

RP_HD inline float silu_f(float x) { return silu_of(x, expf(-x)); }
RP_HD inline float silu_grad_f(float x) { return silu_grad_of(x, expf(-x)); }

} // namespace rp
