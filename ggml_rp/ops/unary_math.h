// Per-element math of the unary ops, one definition for the CPU and CUDA kernels.
#pragma once

#include <cmath>

#include "ggml_rp/core/host_device.h"

namespace rp {

RP_HD inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
RP_HD inline float silu_f(float x) { return x * sigmoidf(x); }
RP_HD inline float silu_grad_f(float x) {
    const float s = sigmoidf(x);
    return s * (1.0f + x * (1.0f - s));
}

} // namespace rp
