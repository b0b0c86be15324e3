// ====================================================================================================
//   mul_mat ORIENTATION — the one rule (as in ggml):
//
//       W [ne0 = in, ne1 = out]  x  X [ne0 = in, ne1 = tokens]  ->  Y [ne0 = out, ne1 = tokens]
//
//       Y[n, t] = sum_k W[k, n] * X[k, t]       (each of W's `out` rows holds `in` contiguous values)
//
//   So a GGUF weight `blk.0.attn_q.weight` with ne [n_embd, n_q] maps hidden states [n_embd, T] to
//   queries [n_q, T]. Batched over dims 2 and 3 with broadcast: X [in, T, b2, b3] with b2 % W.ne2 == 0
//   and b3 % W.ne3 == 0; batch (i2, i3) uses W batch (i2 / (b2 / W.ne2), i3 / (b3 / W.ne3)).
// ====================================================================================================
// W may be f32, f16, bf16 or a GGUF block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K), dequantized in
// tiles inside the kernel (rp::cpu::matmul_fwd). X and Y are f32. A non-f32 X, or an X whose elements are
// not adjacent (a transposed view), is copied to a contiguous f32 tensor first.
// Backward: dX = mul_mat_back_x(W, dY) always; dW = out_prod(X, dY) only for f32 W (a quantized or half
// weight marked as a param is an error: see set_param).
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

// With into != nullptr (contiguous f32 of Y's shape, read by nothing after this node) the product is added in place
// into `into`, the GEMM's own accumulation (the node is a view of it): a LoRA branch's B (s A x) added to W x without
// a buffer of its own or an add's pass over both; its gradient passes dY on to `into` as it is.
Tensor * mul_mat(Context & ctx, Tensor * W, Tensor * X, Tensor * into = nullptr);

// dX[k, t] = sum_n W[k, n] * dY[n, t], shaped like x_like ([in, T, b2, b3]); with into, added in place into it (an
// activation's gradient summed over the products that read it, without an add's pass per product).
Tensor * mul_mat_back_x(Context & ctx, Tensor * W, Tensor * dY, const Tensor * x_like, Tensor * into = nullptr);

// dW[k, n] = sum over tokens and broadcast batches of X[k, t] * dY[n, t], shaped like w_like (f32).
// With into != nullptr the sum is added in place into `into` (the node is a view of it).
Tensor * out_prod(Context & ctx, Tensor * into, Tensor * X, Tensor * dY, const Tensor * w_like);

class Backward;
namespace rules {
// The backward rule of MUL_MAT (the op table's, core/ops.def).
void backward_mul_mat(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
