// LoRA linear layer: y = W x + s * B (A x)      (formats.md §5.2-5.3)
//   W [in, out] (frozen, any dtype), A [in, r], B [r, out] (the adapter GGUF's lora_a / lora_b shapes),
//   x [in, T] -> y [out, T]; s = user_scale * alpha / r.
// Built from mul_mat + scale + add, so its backward is theirs: dA and dB when A and B are params.
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

Tensor * lora_linear(Context & ctx, Tensor * W, Tensor * A, Tensor * B, Tensor * x, float s);

} // namespace rp
