// Element-wise unary ops on f32 tensors (any strides; results contiguous).
//   scale(x, s) = x s                   softcap(x, c) = c tanh(x / c) (Gemma 2's final logits): the SCALE op with
//                                       param 1 = c (0: none); its gradient 1 - tanh^2 from the output, by MUL / SCALE / ADD
//   silu(x) = x * sigmoid(x)            silu'(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x)))
//   sigmoid(x) = 1 / (1 + exp(-x))      sigmoid' = y (1 - y), from the output by MUL / ADD
//   softplus(x) = log(1 + exp(x))       (x above 20: x); softplus' = sigmoid(x)
//   swiglu(g, u) = silu(g) * u          (the gated FFN of Llama/Qwen; g and u have the same shape)
//   swiglu_oai(g, u, alpha, limit)      gpt-oss's clamped form (unary_math.h): min(g, limit) sigmoid(alpha min(g, limit))
//                                       x (clamp(u, -limit, limit) + 1); the SWIGLU op with params 0..2 = 1, alpha, limit
//   geglu(g, u) = gelu(g) * u           Gemma's gated FFN, GELU with the tanh approximation (unary_math.h gelu_tanh_f);
//                                       the SWIGLU op with param 0 = 2; with fp16_table, GELU as llama.cpp's CPU
//                                       backend reads it from a table: gelu(fp16(g)) rounded to fp16 (0 below -10,
//                                       g above 10), param 0 = 3 (inference: no gradient, CPU only)
// The gated forms are one op, SWIGLU, whose param 0 is the GluKind.
// The formulas are in unary_math.h, shared with the CUDA kernels (each computes exp(-x) its own way: the CPU
// with vec_exp, about 2e-7 relative to expf).
#pragma once

#include "ggml_rp/core/context.h"
#include "ggml_rp/ops/unary_math.h"

namespace rp {

Tensor * scale(Context & ctx, Tensor * x, float s);
Tensor * softcap(Context & ctx, Tensor * x, float cap);
Tensor * silu(Context & ctx, Tensor * x);
Tensor * sigmoid(Context & ctx, Tensor * x);
Tensor * softplus(Context & ctx, Tensor * x);
// dx = dy * silu'(x)
Tensor * silu_back(Context & ctx, Tensor * x, Tensor * dy);
Tensor * swiglu(Context & ctx, Tensor * gate, Tensor * up);
Tensor * swiglu_oai(Context & ctx, Tensor * gate, Tensor * up, float alpha, float limit);
Tensor * geglu(Context & ctx, Tensor * gate, Tensor * up, bool fp16_table = false);
// which = 0: d gate = dy * up * act'(gate); which = 1: d up = dy * act(gate). `like`: the SWIGLU node whose
// gradient this is (its kind, and the clamped form's alpha and limit, are carried over), or nullptr for SiLU.
Tensor * swiglu_back(Context & ctx, Tensor * gate, Tensor * up, Tensor * dy, int which, const Tensor * like = nullptr);

class Backward;
namespace rules {
// The backward rule of SCALE, SILU, SWIGLU, SIGMOID, SOFTPLUS (the op table's, core/ops.def).
void backward_unary(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
