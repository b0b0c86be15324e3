// Element-wise unary ops on f32 tensors (any strides; results contiguous).
//   silu(x) = x * sigmoid(x)            silu'(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x)))
//   swiglu(g, u) = silu(g) * u          (the gated FFN of Llama/Qwen; g and u have the same shape)
//   swiglu_oai(g, u, alpha, limit)      gpt-oss's clamped form (unary_math.h): min(g, limit) sigmoid(alpha min(g, limit))
//                                       x (clamp(u, -limit, limit) + 1); the SWIGLU op with params 0..2 = 1, alpha, limit
// The formulas are in unary_math.h, shared with the CUDA kernels (each computes exp(-x) its own way: the CPU
// with vec_exp, about 2e-7 relative to expf).
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

Tensor * scale(Context & ctx, Tensor * x, float s);
Tensor * silu(Context & ctx, Tensor * x);
// dx = dy * silu'(x)
Tensor * silu_back(Context & ctx, Tensor * x, Tensor * dy);
Tensor * swiglu(Context & ctx, Tensor * gate, Tensor * up);
Tensor * swiglu_oai(Context & ctx, Tensor * gate, Tensor * up, float alpha, float limit);
// which = 0: d gate = dy * up * silu'(gate); which = 1: d up = dy * silu(gate). `like`: the SWIGLU node whose
// gradient this is (its clamped form's alpha and limit are carried over), or nullptr for the plain form.
Tensor * swiglu_back(Context & ctx, Tensor * gate, Tensor * up, Tensor * dy, int which, const Tensor * like = nullptr);

} // namespace rp
