// Fused causal grouped-query attention, flash style (online softmax, no [Tq x Tk] matrix is ever stored).
// The forward saves only the per-row logsumexp; the backward recomputes the probabilities from it.
// Memory is O(T * D) for any sequence length. An optional first visible key per query makes the mask
// block-diagonal causal (packed sequences: each document attends only to itself).
#pragma once

#include "ggml_rp/ops/attention_shape.h"

#include <cstddef>
#include <cstdint>

namespace rp::cpu {

using rp::AttentionShape;  // ops/attention_shape.h

// Contiguous layouts (d fastest): q, o, dq: [D, Hq, Tq, B]; k, v, dk, dv: [D, Hkv, Tk, B]; lse: [Hq, Tq, B].
// key_start (nullable): i32 [Tq, B], the first key each query sees (packed sequences: the start of its
// document), so query t of sequence b sees keys key_start[b*Tq + t] <= j <= t + (Tk - Tq); values are clamped
// into [0, t + Tk - Tq] (every query sees at least its own key). nullptr: every query sees keys from 0.
// s.window > 0 also hides keys j <= t + (Tk - Tq) - window (sliding window). sinks (nullable): f32 [Hq], one
// logit per query head in every row's softmax denominator (ops/attention.h); lse then includes it.
void attention_fwd(const AttentionShape & s, const float * q, const float * k, const float * v,
                   float * o, float * lse, const int32_t * key_start = nullptr, const float * sinks = nullptr);

// dq, dk, dv are overwritten (not accumulated). Deterministic for any thread count.
// The backward keeps the dS blocks of its first pass for its second while they take at most
// set_attention_kept_ds_bytes() (default 32 MiB), else recomputes them: the same bits either way (tests set 0
// to run the recompute).
// With sinks, dsinks [Hq] (overwritten) gets their gradient: -sum over the head's rows of p_sink * rowsum(dO O).
void attention_bwd(const AttentionShape & s, const float * q, const float * k, const float * v,
                   const float * o, const float * lse, const float * dout,
                   float * dq, float * dk, float * dv, const int32_t * key_start = nullptr,
                   const float * sinks = nullptr, float * dsinks = nullptr);
void set_attention_kept_ds_bytes(size_t bytes);
// The scratch attention_bwd takes (kernel_scratch.h): each row's rowsum(dO O) and the kept dS blocks.
size_t attention_bwd_scratch_bytes(const AttentionShape & s);

} // namespace rp::cpu
