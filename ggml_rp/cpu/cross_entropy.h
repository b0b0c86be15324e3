// Fused, chunked LM head + cross-entropy. Logits are computed chunk by chunk of the vocabulary with an online
// logsumexp; the full [V x T] logits matrix is never stored (peak extra memory O(chunk * T)).
#pragma once

#include "ggml_rp/ops/lm_head_state.h"
#include "gguf/types.h"

#include <cstddef>
#include <cstdint>

namespace rp::cpu {

struct LmHeadCEShape {
    int64_t C;       // hidden size (K of the head)
    int64_t V;       // vocabulary (N of the head)
    int64_t T;       // tokens
    int64_t chunk;   // vocabulary rows per chunk (>= 1; >= V means one chunk)
    float softcap = 0.0f;  // > 0: each logit l becomes softcap * tanh(l / softcap) (Gemma 2's final soft-capping)
};

// The optional inputs and outputs of lm_head_ce (each nullable; T floats unless said).
struct LmHeadCEAux {
    float * lse_out = nullptr;            // each token's logsumexp
    // each token's 1 - p_label, the other tokens' probabilities summed apart from the label (0 when masked):
    // the gradient's label entry, exact where p_label is near 1 (1 - a rounded p_label is not)
    float * rest_out = nullptr;
    // the logsumexps and 1 - p_label a forward call wrote for the same h, W and labels (both or neither)
    const float * lse_in = nullptr;
    const float * rest_in = nullptr;
    float * token_loss = nullptr;         // each token's loss_scale * (logsumexp - label logit), 0 when masked
    const float * token_scale = nullptr;  // token t's gradient is also multiplied by token_scale[t]
    // Forward: [C, T], each token's unit gradient d(logsumexp - label logit)/dh_t (0 when masked), formed in the
    // same pass over the vocabulary as the logsumexp (the backward then needs no pass of its own for dh).
    float * unit_dh_out = nullptr;
    // Backward: the unit gradients a forward call wrote for the same h, W and labels: dh = unit * loss_scale
    // (* token_scale[t]), with no pass over the vocabulary unless dW is asked for too.
    const float * unit_dh_in = nullptr;
};

// h: [C, T] floats (column t at h + t*C). W: head weight ne = [C, V] of type wtype (row stride w_row_bytes).
// labels[t] in [0, V) or -1 (ignored). loss_scale multiplies every token's loss and gradient (pass
// 1 / (number of unmasked tokens in the whole batch) for a mean that does not depend on how the batch is split).
// Returns sum_t loss_scale * (logsumexp(logits_t) - logits_t[label_t]) in double.
// dh (nullable) is overwritten with d(result)/dh; dW (nullable, f32 [C, V], row stride dw_row floats) is
// accumulated with d(result)/dW. Deterministic for any thread count.
// With aux.lse_in (and rest_in) the first pass over the vocabulary is skipped (the gradients are the same bits, since pass 1
// computes the same floats) and the result is 0 (the loss is the forward's).
// With aux.unit_dh_out the one pass also forms the unit gradients (online: the running sums are rescaled when a
// token's maximum grows); the loss and logsumexps are the same bits as without. Their rounding differs from
// pass 2's (a few ulps, in another order); the label's term is kept apart (1 - p_label = the other
// probabilities' sum), so a token the model is sure of keeps its small gradient's relative accuracy.
double lm_head_ce(const LmHeadCEShape & s, const float * h, const void * W, gguf::TensorType wtype,
                  size_t w_row_bytes, const int32_t * labels, float loss_scale,
                  float * dh, float * dW, int64_t dw_row, const LmHeadCEAux & aux = {});
// The scratch lm_head_ce takes (kernel_scratch.h): per-token sums and, when a pass over the vocabulary runs
// (tiles: no lse_in, or dW, or dh without unit_dh_in), a chunk x T tile of logits, a second for their gradients
// (with_g: pass 2, or pass 1 forming the unit gradients through a soft-cap), and the GEMMs' packs.
size_t lm_head_ce_scratch_bytes(const LmHeadCEShape & s, bool tiles, bool with_g);

// A streamed head's carried state (ops/lm_head_state.h: pointers into the caller's buffer); the gradient's parts
// (unit, label_rows) non-null when the ranges form it.
using LmHeadCEState = LmHeadState;

// Folds vocabulary rows [v0, v0 + nv) (W_range: those rows, row stride w_row_bytes; v0 a multiple of s.chunk,
// s.V the whole vocabulary) into st, s.chunk rows at a time, as lm_head_ce's pass 1 does: called for the ranges
// of [0, V) in order (v0 == 0 starts the state), then lm_head_ce_finish gives lm_head_ce's bits.
void lm_head_ce_range(const LmHeadCEShape & s, int64_t v0, int64_t nv, const float * h, const void * W_range, gguf::TensorType wtype,
                      size_t w_row_bytes, const int32_t * labels, const LmHeadCEState & st);
// The scratch lm_head_ce_range takes for nv rows: its tiles (the gradients' only when it forms them through a
// soft-cap) and the GEMMs' packs.
size_t lm_head_ce_range_scratch_bytes(const LmHeadCEShape & s, int64_t nv, bool forms_grad);
// The loss (returned), logsumexps, 1 - p_label, token losses and unit gradients (aux's lse_out, rest_out,
// token_loss, unit_dh_out; unit_dh_out needs st.unit) from the state of every range.
double lm_head_ce_finish(const LmHeadCEShape & s, const int32_t * labels, float loss_scale, const LmHeadCEState & st,
                         const LmHeadCEAux & aux);

} // namespace rp::cpu
