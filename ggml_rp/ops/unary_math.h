// Per-element math of the unary ops, one definition for the CPU and CUDA kernels.
#pragma once

#include <cmath>

#include "ggml_rp/core/host_device.h"

#include <cstdint>

namespace rp {

// The activation of a gated feed-forward: the SWIGLU op's param 0 (its backward's param 1). GeluTanhFp16 is GELU
// as llama.cpp's CPU backend computes it (from a table over fp16 inputs: cpu/unary.cpp), for inference that
// reproduces llama.cpp; it has no gradient and no CUDA kernel.
enum class GluKind : int32_t { Silu = 0, SiluOai = 1, GeluTanh = 2, GeluTanhFp16 = 3 };

// The formulas from e = exp(-x), which each backend computes its own way (CUDA: expf; the CPU: vec_exp over
// a row, in vectors).
RP_HD inline float sigmoid_of(float e) { return 1.0f / (1.0f + e); }
RP_HD inline float silu_of(float x, float e) { return x * sigmoid_of(e); }
RP_HD inline float silu_grad_of(float x, float e) {
    const float s = sigmoid_of(e);
    return s * (1.0f + x * (1.0f - s));
}

RP_HD inline float silu_f(float x) { return silu_of(x, expf(-x)); }
RP_HD inline float sigmoid_f(float x) { return sigmoid_of(expf(-x)); }
// log(1 + exp(x)), x itself above 20 (where they agree in f32), as ggml_softplus.
RP_HD inline float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
RP_HD inline float silu_grad_f(float x) { return silu_grad_of(x, expf(-x)); }

// gpt-oss's clamped SwiGLU (ggml_swiglu_oai): with x = min(g, limit) and y = clamp(u, -limit, limit),
//   out = x sigmoid(alpha x) (y + 1).
// Its gradients (zero where the clamp holds the value): d/dg = dy (y + 1) (s + alpha x s (1 - s)), s = sigmoid(alpha x),
// for g <= limit; d/du = dy x sigmoid(alpha x) for -limit <= u <= limit.
RP_HD inline float swiglu_oai_f(float g, float u, float alpha, float limit) {
    const float x = fminf(g, limit), y = fminf(fmaxf(u, -limit), limit);
    return x / (1.0f + expf(alpha * (-x))) * (y + 1.0f);
}
RP_HD inline float swiglu_oai_dgate(float g, float u, float dy, float alpha, float limit) {
    if (g > limit) return 0.0f;
    const float y = fminf(fmaxf(u, -limit), limit);
    const float s = 1.0f / (1.0f + expf(alpha * (-g)));
    return dy * (y + 1.0f) * (s + alpha * g * s * (1.0f - s));
}
RP_HD inline float swiglu_oai_dup(float g, float u, float dy, float alpha, float limit) {
    if (u < -limit || u > limit) return 0.0f;
    const float x = fminf(g, limit);
    return dy * (x / (1.0f + expf(alpha * (-x))));
}

// GELU with the tanh approximation (Gemma's gelu_pytorch_tanh; ggml_gelu's formula, in the same order):
//   gelu(x) = 0.5 x (1 + tanh(c x (1 + a x^2))),  c = sqrt(2 / pi), a = 0.044715;
//   gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2),  t = tanh(c x (1 + a x^2)).
constexpr float kGeluC = 0.79788456080286535587989211986876f, kGeluA = 0.044715f;
RP_HD inline float gelu_tanh_f(float x) { return 0.5f * x * (1.0f + tanhf(kGeluC * x * (1.0f + kGeluA * x * x))); }
RP_HD inline float gelu_tanh_grad_f(float x) {
    const float t = tanhf(kGeluC * x * (1.0f + kGeluA * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * x * x);
}

} // namespace rp
