// Fused causal grouped-query attention, flash style (online softmax, no [Tq x Tk] matrix is ever stored).
// The forward saves only the per-row logsumexp; the backward recomputes the probabilities from it.
// Memory is O(T * D) for any sequence length.
#pragma once

#include <cstdint>

namespace rp::cpu {

struct AttentionShape {
    int64_t D;     // head_dim (<= 256)
    int64_t Hq;    // query heads
    int64_t Hkv;   // key/value heads; Hq % Hkv == 0, query head h reads kv head h / (Hq / Hkv)
    int64_t Tq;    // queries per sequence
    int64_t Tk;    // keys per sequence; query t sees keys j <= t + (Tk - Tq) (causal, KV-cache aware)
    int64_t B;     // sequences
    float scale;   // usually 1 / sqrt(D)
};

// Contiguous layouts (d fastest): q, o, dq: [D, Hq, Tq, B]; k, v, dk, dv: [D, Hkv, Tk, B]; lse: [Hq, Tq, B].
void attention_fwd(const AttentionShape & s, const float * q, const float * k, const float * v,
                   float * o, float * lse);

// dq, dk, dv are overwritten (not accumulated). Deterministic for any thread count.
void attention_bwd(const AttentionShape & s, const float * q, const float * k, const float * v,
                   const float * o, const float * lse, const float * dout,
                   float * dq, float * dk, float * dv);

} // namespace rp::cpu
