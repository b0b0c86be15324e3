// Fused causal grouped-query attention, flash style (online softmax, no [Tq x Tk] matrix is ever stored).
// The forward saves only the per-row logsumexp; the backward recomputes the probabilities from it.
// Memory is O(T * D) for any sequence length.
#pragma once

#include "ggml_rp/ops/attention_shape.h"

#include <cstdint>

namespace rp::cpu {

using rp::AttentionShape;  // ops/attention_shape.h

// Contiguous layouts (d fastest): q, o, dq: [D, Hq, Tq, B]; k, v, dk, dv: [D, Hkv, Tk, B]; lse: [Hq, Tq, B].
void attention_fwd(const AttentionShape & s, const float * q, const float * k, const float * v,
                   float * o, float * lse);

// dq, dk, dv are overwritten (not accumulated). Deterministic for any thread count.
void attention_bwd(const AttentionShape & s, const float * q, const float * k, const float * v,
                   const float * o, const float * lse, const float * dout,
                   float * dq, float * dk, float * dv);

} // namespace rp::cpu
