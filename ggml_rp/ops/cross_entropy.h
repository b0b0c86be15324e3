// Fused LM head + cross-entropy (kernel: rp::cpu::lm_head_ce, chunked over the vocabulary with an online
// logsumexp, so the [V x T] logits are never stored).
//
//   h: f32 [C, T] hidden states; W: head weight [C, V] (any dequantizable type, mul_mat orientation);
//   labels: i32 [T], each in [0, V) or -1 (masked: no loss, no gradient).
//   loss = sum_t loss_scale * (logsumexp(W^T h_t) - (W^T h_t)[label_t])    -> f32 [1]
//
// softcap > 0 (Gemma 2's final logit soft-capping): every logit is softcap * tanh(logit / softcap) first.
// Pass loss_scale = 1 / (unmasked tokens in the whole batch) for a mean that does not depend on how the
// batch is split into micro-batches. chunk = vocabulary rows per chunk (memory O(chunk * T)).
// The node also writes, after the loss (aux), each token's logsumexp (T floats) then its 1 - p_label (T floats:
// the other tokens' probabilities summed apart from the label, the gradient's exact label entry).
// Backward: lm_head_ce_back gives dh (and accumulates dW when W is trained): it reads the forward node's
// logsumexps (the forward is its source) and recomputes the logits once, chunk by chunk, or, when the forward
// formed the gradient (lm_head_forms_grad), scales the forward's.
#pragma once

#include "ggml_rp/core/context.h"
#include "ggml_rp/core/graph.h"
#include "ggml_rp/ops/lm_head_state.h"  // the state's layout (lm_head_state_layout)

namespace rp {

Tensor * lm_head_ce(Context & ctx, Tensor * h, Tensor * W, Tensor * labels, float loss_scale, int64_t chunk, float softcap = 0.0f);

// The same head, per token: f32 [T], element t = logsumexp(W^T h_t) - (W^T h_t)[label_t], the token's negative
// log-likelihood (0 for a masked label). For sequence-level objectives (preference_loss): its backward takes a
// gradient per token. One LM_HEAD_CE node (op param 3 = 1), loss_scale 1.
Tensor * lm_head_token_nll(Context & ctx, Tensor * h, Tensor * W, Tensor * labels, int64_t chunk, float softcap = 0.0f);
// Whether an LM_HEAD_CE or LM_HEAD_CE_BACK node is the per-token form.
inline bool lm_head_per_token(const Tensor * node) { return node->param_i32(3) != 0; }

// The gradient formed in the forward (op param 4 of LM_HEAD_CE): the backward rule asks for it when the head's
// weight needs no gradient (LoRA, QLoRA: the head frozen). The forward's one pass over the vocabulary then also
// writes each token's unit gradient d(token loss)/dh ([C, T] in the aux bytes, after the logsumexps, 256-byte
// aligned), and lm_head_ce_back only scales it: one logits GEMM fewer per step (the paper's "gradient formed
// inside the forward", roundpipe.md section 7). A trained head keeps the two passes (its dW needs the final
// logsumexps: the second pass is needed anyway).
inline bool lm_head_forms_grad(const Tensor * ce) { return ce->param_i32(4) != 0; }
// Floats of an LM_HEAD_CE node's aux before the unit gradients, T tokens: the logsumexps, then 1 - p_label.
inline size_t lm_head_aux_floats(int64_t T) { return 2 * static_cast<size_t>(T); }
// Byte offset, for node::aux, of an LM_HEAD_CE node's 1 - p_label (after its T logsumexps at offset 0).
inline size_t lm_head_rest_offset(const Tensor * ce) { return static_cast<size_t>(ce->src[0]->ne[1]) * sizeof(float); }
// Byte offset, for node::aux, of the unit gradients of an LM_HEAD_CE node that forms them.
size_t lm_head_unit_dh_offset(const Tensor * ce);

// dh = dloss * d loss / dh (a node shaped like h); dloss is an f32 scalar, or for the per-token form f32 [T]
// (token t's loss weighted by dloss[t]). With dW_into != nullptr (f32 [C, V], contiguous), also
// dW_into += dloss * d loss / dW, as a side effect of this node: read dW_into through after(dW_into, node).
Tensor * lm_head_ce_back(Context & ctx, Tensor * ce, Tensor * dloss, Tensor * dW_into);

// ---- A streamed head: the vocabulary in ranges that are never on the device together ----
// When the head's weight cannot stay on a device, each range of its rows is uploaded for a graph of its own
// (RoundPipe's least-memory plans: MicroBatchInfo::vocab_on_host). Each token's running state then lives in a
// buffer that outlives the graphs (lm_head_state_layout): lm_head_ce_range folds one range of the vocabulary
// into it, and lm_head_ce_streamed, an LM_HEAD_CE node read from the state instead of W, finishes the loss and,
// when it forms the gradient, the unit gradients its backward (the same rule, lm_head_ce_back) scales. The
// arithmetic is the unstreamed op's chunk loop, so ranges that start at multiples of `chunk` give the bits of
// lm_head_ce / lm_head_token_nll with the same chunk. The head weight is frozen: a streamed head forms its
// gradient in the forward or has none (evaluation).

// Folds vocabulary rows [v0, v0 + W_range->ne[1]) of a head of V rows into `state` (f32, at least
// lm_head_state_layout(C, T, forms_grad).bytes, contiguous), chunk rows at a time; v0 == 0 starts the state. A
// side effect on state's memory: the node (f32 [1], nothing in it) orders it; mark it an output of its graph.
Tensor * lm_head_ce_range(Context & ctx, Tensor * h, Tensor * W_range, Tensor * labels, Tensor * state, int64_t v0, int64_t V,
                          int64_t chunk, float softcap, bool forms_grad);
// The LM_HEAD_CE node of a head whose ranges were folded into `state` (every range of [0, V), in order, by the
// graphs before this one): the loss (per_token: each token's NLL) and aux bytes of lm_head_ce / lm_head_token_nll.
// forms_grad as the ranges'; its backward gives h's gradient (not W's).
Tensor * lm_head_ce_streamed(Context & ctx, Tensor * h, Tensor * state, Tensor * labels, int64_t V, float loss_scale, int64_t chunk,
                             float softcap, bool per_token, bool forms_grad);
// Whether an LM_HEAD_CE node is the streamed form (its src[1] the state, not W); the vocabulary of any of them.
inline bool lm_head_streamed(const Tensor * node) { return node->param_i32(5) > 0; }
inline int64_t lm_head_vocab(const Tensor * node) { return lm_head_streamed(node) ? node->param_i32(5) : node->src[1]->ne[1]; }

// Sets loss_scale on every lm_head_ce and lm_head_ce_back node of g (not the per-token form's): a graph built once and replayed for
// another batch, whose scale (1 / its unmasked tokens) is the only thing about it that changes.
void set_lm_head_ce_loss_scale(const Graph & g, float loss_scale);

class Backward;
namespace rules {
// The backward rule of LM_HEAD_CE (the op table's, core/ops.def).
void backward_cross_entropy(Backward & b, Tensor * node);
// LM_HEAD_CE_RANGE's: none (a streamed head's gradient flows through its LM_HEAD_CE node); asking is an error.
void backward_lm_head_range(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
