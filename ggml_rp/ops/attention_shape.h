// The shape of one fused attention call, shared by the CPU kernels (cpu/attention.h), the CUDA kernels
// (cuda/attention.cuh) and the node glue (ops/node_args.h). Plain data, no dependencies: nvcc includes it.
#pragma once

#include <cmath>
#include <cstdint>

namespace rp {

struct AttentionShape {
    int64_t D;     // head_dim (<= 256)
    int64_t Hq;    // query heads
    int64_t Hkv;   // key/value heads; Hq % Hkv == 0, query head h reads kv head h / (Hq / Hkv)
    int64_t Tq;    // queries per sequence
    int64_t Tk;    // keys per sequence (>= Tq); query t sees keys j <= t + (Tk - Tq) (causal, KV-cache aware)
    int64_t B;     // sequences
    float scale;   // usually 1 / sqrt(D)
    // Sliding window: > 0 lets query t see only the `window` keys up to its own, j > t + (Tk - Tq) - window
    // (llama.cpp's standard SWA: a key `window` or more positions back is masked). 0: no window.
    int64_t window = 0;
    // Logit soft-capping (Gemma 2): > 0 turns each scaled logit x into softcap * tanh(x / softcap) before the
    // softmax (llama.cpp's attn_soft_cap); 0: none.
    float softcap = 0.0f;
    // Keys between the starts of two sequences' keys (and values) in memory: > Tk when k and v are windows of a
    // KV cache of several sequences ([D, Hkv, n_ctx, B], each sequence's first Tk rows); 0: Tk (contiguous). The
    // forward kernels read such windows in place; the backward needs contiguous keys (0).
    int64_t kv_rows = 0;

#if defined(__CUDACC__)
    __host__ __device__
#endif
    int64_t kv_seq_rows() const { return kv_rows > 0 ? kv_rows : Tk; }
};

// The logit the softmax sees of a scaled q . k, and (t) the tanh it went through (0 without a cap): the backward
// multiplies by its derivative 1 - t^2.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline float attention_logit(float x, float softcap, float & t) {
    if (softcap > 0.0f) {
        t = tanhf(x / softcap);
        return softcap * t;
    }
    t = 0.0f;
    return x;
}

} // namespace rp
