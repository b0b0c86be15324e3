// Fused causal grouped-query attention (flash style: online softmax, no [Tq x Tk] matrix, O(T*D) memory).
//
//   q: f32 [D, Hq, Tq, B]    k, v: f32 [D, Hkv, Tk, B]    ->    o: f32 [D, Hq, Tq, B]
//   o[:, h, t, b] = sum_j softmax_j(scale * q[:, h, t, b] . k[:, h/(Hq/Hkv), j, b]) v[:, h/(Hq/Hkv), j, b]
//   over keys j <= t + (Tk - Tq) (causal; Tk > Tq when earlier keys come from a KV cache).
//
// key_start (optional, i32 [Tq, B] or [Tq * B], contiguous): the first key each query sees, so query t of
// sequence b attends over keys key_start[t + b*Tq] <= j <= t + (Tk - Tq) (values clamped into that range). A
// packed sequence passes the start of each token's document: every document attends only to itself
// (block-diagonal causal), and the kernels skip the key blocks no query of a block sees. No gradient.
//
// window (optional, > 0): sliding-window attention, query t sees only keys j > t + (Tk - Tq) - window as well
// (gpt-oss's and Gemma's local layers; llama.cpp's standard SWA mask). Composes with key_start.
//
// sinks (optional, f32 [Hq], contiguous): one learned logit per query head that joins every row's softmax
// denominator without a value (gpt-oss's attention sinks, llama.cpp's ggml_soft_max_add_sinks): o = sum_j
// p_j v_j with p_j = exp(s_j) / (sum_j exp(s_j) + exp(sink_h)); the sink is not scaled. It has a gradient.
//
// softcap (optional, > 0): Gemma 2's logit soft-capping, each scaled logit x becomes softcap * tanh(x / softcap)
// before the softmax (llama.cpp's attn_soft_cap: tanh of q . k * scale / cap, times cap). Op param 3.
//
// Hq % Hkv == 0 (GQA); D <= 256. Non-contiguous inputs are copied first. The forward also stores the
// per-row logsumexp lse [Hq, Tq, B] right after o (o's aux bytes; attention_lse() gives a view of it), and
// the backward recomputes the probabilities from it. Kernels: rp::cpu::attention_fwd / attention_bwd.
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

// `accelerated`: the element type an accelerator's kernels may round q, k, v (and the backward's dout) to, for
// its matrix units: BF16 / F16 run the CUDA kernels on tensor cores (f32 accumulation, probabilities rounded
// like FlashAttention); F32 keeps the f32 kernels. The CPU kernels always compute in f32 (the reference).
// Stored as op param 1 (the window is param 2); attention_back inherits them and the soft-cap. key_start is src 3 and sinks
// src 4 (attention_back: src 6 and 7).
Tensor * attention(Context & ctx, Tensor * q, Tensor * k, Tensor * v, float scale, DType accelerated = DType::F32,
                   Tensor * key_start = nullptr, Tensor * sinks = nullptr, int64_t window = 0, float softcap = 0.0f);
// The logsumexp saved by the attention node o: f32 [Hq, Tq, B].
Tensor * attention_lse(Context & ctx, Tensor * o);

struct AttentionGrads {
    Tensor * dq;
    Tensor * dk;
    Tensor * dv;
    Tensor * dsinks;  // nullptr without sinks
};
// Gradients of q, k, v (and the sinks) from dout, given the forward node o (its inputs and saved lse). dq is
// the node; dk, dv and dsinks are views of its aux bytes.
AttentionGrads attention_back(Context & ctx, Tensor * o, Tensor * dout);

class Backward;
namespace rules {
// The backward rule of ATTENTION (the op table's, core/ops.def).
void backward_attention(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
