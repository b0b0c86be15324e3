// Mixture-of-experts ops (qwen3moe: formats.md §3.4). The router math is in moe_math.h (shared with CUDA).
//
//   moe_topk(logits f32 [E, T], k) -> ids i32 [k, T]
//       each token's k experts with the largest router probabilities softmax(logits), descending (ties: the
//       lower expert first). No gradient.
//   moe_weights(logits [E, T], ids [k, T], normalize, scale) -> w f32 [k, T]
//       the selected probabilities, renormalised over the k (qwen3moe) and scaled; backward to the logits
//       through the softmax (moe_weights_back), plus, with aux != 0, the gradient of the load-balancing loss
//       of moe_math.h over the node's tokens (the forward is unchanged: the loss only shapes the gradient).
//   mul_mat_id(W [in, out, E], X [in, X1, T], ids i32 [k, T]) -> Y [out, k, T]
//       Y[:, s, t] = mul_mat(W[:, :, ids[s, t]], X[:, X1 == 1 ? 0 : s, t]): every token times each of its
//       experts. W of any weight type (quantized included); X1 is 1 (the token's vector, shared by its k
//       slots: gate / up) or k (one vector per slot: down). The kernels gather the (token, slot) pairs of each
//       expert in token order and run one GEMM per expert, so results do not depend on threads or devices.
//   Backward: dX = mul_mat_id_back_x(W, dY, ids) (summing the k slots in slot order when X1 == 1), and for
//   f32 W dW = out_prod_id(X, dY, ids) (each expert's outer products summed in token order).
// An id outside [0, E) is an error on the CPU; the CUDA kernels skip its pair (its output stays 0).
#pragma once

#include "ggml_rp/core/context.h"
#include "ggml_rp/ops/moe_math.h"

namespace rp {

Tensor * moe_topk(Context & ctx, Tensor * logits, int32_t k);
Tensor * moe_weights(Context & ctx, Tensor * logits, Tensor * ids, bool normalize, float scale = 0.0f, float aux = 0.0f);
// dlogits [E, T] from dw [k, T].
Tensor * moe_weights_back(Context & ctx, Tensor * logits, Tensor * ids, Tensor * dw, const MoeParams & p);
// The router parameters of a MOE_WEIGHTS / MOE_WEIGHTS_BACK node.
MoeParams moe_params(const Tensor * node);

Tensor * mul_mat_id(Context & ctx, Tensor * W, Tensor * X, Tensor * ids);
// dX shaped like x_like ([in, X1, T]).
Tensor * mul_mat_id_back_x(Context & ctx, Tensor * W, Tensor * dY, Tensor * ids, const Tensor * x_like);
// dW [in, out, E] (f32, shaped like w_like); with into != nullptr added in place into `into`.
Tensor * out_prod_id(Context & ctx, Tensor * into, Tensor * X, Tensor * dY, Tensor * ids, const Tensor * w_like);

class Backward;
namespace rules {
// The backward rules of these ops (the op table's, core/ops.def).
void backward_moe_weights(Backward & b, Tensor * node);  // MOE_WEIGHTS
void backward_mul_mat_id(Backward & b, Tensor * node);  // MUL_MAT_ID
} // namespace rules

} // namespace rp
