// LoRA linear layer: y = W x + s * B (A x)      (formats.md §5.2-5.3)
//   W [in, out] (frozen, any dtype), A [in, r], B [r, out] (the adapter GGUF's lora_a / lora_b shapes),
//   x [in, T] -> y [out, T]; s = user_scale * alpha / r.
// Built from mul_mat + scale, the branch's product added into W x by the GEMM itself (mul_mat's `into`: no add, no
// buffer of its own), so its backward is theirs: dA and dB when A and B are params. A x is built before W x: the
// backward runs in reverse creation order, so x's gradient is W^T dY first, with the branch's A^T (s B^T dY) added
// into it by its GEMM; a rank-r product (r <= 256, one of the GEMM's partial sums) added either way gives the bits of
// W x + B (s A x) summed by adds, forward and backward.
// The scale multiplies the rank-r intermediate A x (r floats per token, not `out`), before B: llama.cpp scales
// B (A x) instead; the bits are the same when s is a power of two (alpha / r of powers of two, the defaults),
// else they differ by the rounding of one product.
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

// The up half of a LoRA branch: B (s u), u = A x (or the embedding's gathered A rows) [r, T]; with into (W x, read
// by nothing else), added into it in place.
Tensor * lora_up(Context & ctx, Tensor * B, Tensor * u, float s, Tensor * into = nullptr);

Tensor * lora_linear(Context & ctx, Tensor * W, Tensor * A, Tensor * B, Tensor * x, float s);

} // namespace rp
