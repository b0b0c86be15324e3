// Fused, chunked LM head + cross-entropy. Logits are computed chunk by chunk of the vocabulary with an online
// logsumexp; the full [V x T] logits matrix is never stored (peak extra memory O(chunk * T)).
#pragma once

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

// h: [C, T] floats (column t at h + t*C). W: head weight ne = [C, V] of type wtype (row stride w_row_bytes).
// labels[t] in [0, V) or -1 (ignored). loss_scale multiplies every token's loss and gradient (pass
// 1 / (number of unmasked tokens in the whole batch) for a mean that does not depend on how the batch is split).
// Returns sum_t loss_scale * (logsumexp(logits_t) - logits_t[label_t]) in double.
// dh (nullable) is overwritten with d(result)/dh; dW (nullable, f32 [C, V], row stride dw_row floats) is
// accumulated with d(result)/dW. Deterministic for any thread count.
// lse_out (nullable, T floats) receives each token's logsumexp. lse_in (nullable): the logsumexps a forward
// call wrote for the same h, W and labels: the first pass over the vocabulary is skipped (the gradients are
// the same bits, since pass 1 computes the same floats) and the result is 0 (the loss is the forward's).
// token_loss (nullable, T floats) receives each token's loss_scale * (logsumexp - label logit), 0 when masked.
// token_scale (nullable, T floats): token t's gradient is also multiplied by token_scale[t] (a per-token dloss).
double lm_head_ce(const LmHeadCEShape & s, const float * h, const void * W, gguf::TensorType wtype,
                  size_t w_row_bytes, const int32_t * labels, float loss_scale,
                  float * dh, float * dW, int64_t dw_row, float * lse_out = nullptr, const float * lse_in = nullptr,
                  float * token_loss = nullptr, const float * token_scale = nullptr);

} // namespace rp::cpu
