#include "models/arch/layer.h"

#include "ggml_rp/ops/ops.h"
#include "models/arch/layer_util.h"
#include "models/arch/lora.h"

#include <algorithm>
#include <cmath>

namespace rp {

void LoraSet::add(const LoraAdapter & adapter, float user_scale) {
    for (const LoraTensor & t : adapter.tensors()) add(t.base_weight, LoraDelta{t.a, t.b, adapter.scale(t, user_scale)});
}

const std::vector<LoraDelta> * LoraSet::find(const Tensor * base) const {
    auto it = map_.find(base);
    return it == map_.end() ? nullptr : &it->second;
}

namespace {

uint64_t name_hash(const std::string & s) {  // FNV-1a: a stable module id for the dropout key
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

} // namespace

Tensor * build_linear(Context & ctx, Tensor * W, Tensor * x, const LoraSet * lora) {
    const std::vector<LoraDelta> * ds = lora ? lora->find(W) : nullptr;
    if (!ds || ds->empty()) return mul_mat(ctx, W, x);
    // Each adapter's A x first (with dropout, of its own dropped-out copy of x), then W x, into which every B (s A x)
    // is added by its GEMM (lora_up's into), in lora_linear's order (ggml_rp/ops/lora.h says why).
    std::vector<Tensor *> us(ds->size());
    for (size_t i = 0; i < ds->size(); ++i) {
        Tensor * xin = x;
        if (lora->dropout.p > 0.0f) {
            const LoraDropout & dp = lora->dropout;
            const uint64_t key = rng_key(dp.seed, static_cast<uint64_t>(dp.step), name_hash(W->name), i);
            const uint64_t offset = (static_cast<uint64_t>(dp.seq_offset) * static_cast<uint64_t>(dp.seq_len) +
                                     static_cast<uint64_t>(dp.token_offset)) * static_cast<uint64_t>(x->ne[0]);
            xin = dropout(ctx, x, dp.p, key, offset);
        }
        us[i] = mul_mat(ctx, (*ds)[i].a, xin);
    }
    Tensor * y = mul_mat(ctx, W, x);
    for (size_t i = 0; i < ds->size(); ++i) y = lora_up(ctx, (*ds)[i].b, us[i], (*ds)[i].scale, y);
    return y;
}

Tensor * build_linear_id(Context & ctx, Tensor * W, Tensor * x, Tensor * ids, const LoraSet * lora) {
    Tensor * y = mul_mat_id(ctx, W, x, ids);
    const std::vector<LoraDelta> * ds = lora ? lora->find(W) : nullptr;
    if (!ds) return y;
    for (size_t i = 0; i < ds->size(); ++i) {
        const LoraDelta & d = (*ds)[i];
        Tensor * xin = x;
        if (lora->dropout.p > 0.0f) {  // as build_linear: the branch reads its own dropped-out copy of x
            const LoraDropout & dp = lora->dropout;
            const uint64_t key = rng_key(dp.seed, static_cast<uint64_t>(dp.step), name_hash(W->name), i);
            const uint64_t offset = (static_cast<uint64_t>(dp.seq_offset) * static_cast<uint64_t>(dp.seq_len) +
                                     static_cast<uint64_t>(dp.token_offset)) * static_cast<uint64_t>(x->ne[0] * x->ne[1]);
            xin = dropout(ctx, x, dp.p, key, offset);
        }
        // Each expert's own pair: A [in, r, n_expert] then B [r, out, n_expert], both indexed by the token's experts.
        Tensor * u = mul_mat_id(ctx, d.a, xin, ids);
        y = add(ctx, y, mul_mat_id(ctx, d.b, d.scale == 1.0f ? u : scale(ctx, u, d.scale), ids));
    }
    return y;
}

namespace {

// Writes `src` (contiguous f32 [D, H, T, B]) into rows [n_past, n_past + T) of sequences [0, B) of `cache` (f32
// [D, H, n_ctx, n_seq]).
Tensor * cache_write(Context & ctx, Tensor * cache, Tensor * src, int64_t n_past) {
    const int64_t B = src->ne[3];
    const int64_t ne[4] = {src->ne[0], src->ne[1], src->ne[2], B};
    const size_t nb[4] = {cache->nb[0], cache->nb[1], cache->nb[2], B > 1 ? cache->nb[3] : cache->nb[2] * static_cast<size_t>(src->ne[2])};
    return copy_into(ctx, view(ctx, cache, ne, nb, static_cast<size_t>(n_past) * cache->nb[2]), src);
}

// Keys or values [0, n_past + T) of sequences [0, B) of the cache, read after `write` has stored the new ones.
Tensor * cache_read(Context & ctx, Tensor * cache, Tensor * write, int64_t n, int64_t B) {
    const int64_t ne[4] = {cache->ne[0], cache->ne[1], n, B};
    const size_t nb[4] = {cache->nb[0], cache->nb[1], cache->nb[2], B > 1 ? cache->nb[3] : cache->nb[2] * static_cast<size_t>(n)};
    return after(ctx, view(ctx, cache, ne, nb, 0), write);
}

using layer_detail::lname;
using layer_detail::rows_of;

// gpt-oss's clamped SwiGLU (llama.cpp's LLM_FFN_SWIGLU_OAI_MOE).
constexpr float kSwigluOaiAlpha = 1.702f, kSwigluOaiLimit = 7.0f;

} // namespace

void packed_key_starts(const int32_t * positions, int64_t T, int64_t B, int32_t * out) {
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
            const int64_t p = positions[b * T + t];
            out[b * T + t] = static_cast<int32_t>(p < 0 || p > t ? 0 : t - p);
        }
}

Tensor * build_layer(Context & ctx, const HParams & hp, const LayerWeights & w, int il, Tensor * x, const TokenPositions & pos,
                     const LoraSet * lora, const LayerKv * kv, DType attention_type) {
    return ffn_block(ctx, hp, w, il, attention_block(ctx, hp, w, il, x, pos, lora, kv, attention_type), lora);
}

Tensor * attention_block(Context & ctx, const HParams & hp, const LayerWeights & w, int il, Tensor * x, const TokenPositions & pos,
                         const LoraSet * lora, const LayerKv * kv, DType attention_type) {
    if (hp.is_recurrent(static_cast<uint32_t>(il))) {
        if (kv && !kv->state) throw Error(lname(il, "kv") + ": a Gated DeltaNet layer keeps a recurrent state, not a KV cache");
        return delta_net_block(ctx, hp, w, il, x, pos, lora, kv ? kv->state : nullptr);
    }
    const int64_t D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv, T = x->ne[1], B = x->ne[2];
    if (x->ne[0] != hp.n_embd || x->ne[3] != 1)
        throw Error(lname(il, "input") + ": hidden states " + describe(x) + " must be [n_embd=" +
                    std::to_string(hp.n_embd) + ", T, B]");
    if (kv && (B > kv->k->ne[3] || kv->k->type != DType::F32))
        throw Error(lname(il, "kv") + ": a cache " + describe(kv->k) + " (f32 [head_dim, n_head_kv, n_ctx, n_seq]) for " + std::to_string(B) + " sequences");

    // 1-2: attention input norm and projections (+ qwen2 biases).
    Tensor * n1 = set_name(rms_norm(ctx, x, w.attn_norm, hp.rms_eps), lname(il, "attn_in"));
    Tensor * q = nullptr, * k = nullptr, * v = nullptr;
    if (w.wqkv) {  // phi3: one projection (and its LoRA, as llama.cpp applies it), its rows split into q, k, v
        Tensor * qkv = build_linear(ctx, w.wqkv, n1, lora);
        q = rows_of(ctx, qkv, 0, D * Hq);
        k = rows_of(ctx, qkv, D * Hq, D * Hkv);
        v = rows_of(ctx, qkv, D * (Hq + Hkv), D * Hkv);
    } else {
        q = build_linear(ctx, w.wq, n1, lora);
        k = build_linear(ctx, w.wk, n1, lora);
        v = build_linear(ctx, w.wv, n1, lora);
    }
    Tensor * gate = nullptr;
    if (hp.arch->attn_output_gate) {  // qwen35: per head, head_dim query rows then head_dim rows of the output gate
        Tensor * qg = reshape(ctx, q, 2 * D, Hq, T, B);
        const int64_t ne[4] = {D, Hq, T, B};
        q = cont(ctx, view(ctx, qg, ne, qg->nb, 0));
        gate = reshape(ctx, cont(ctx, view(ctx, qg, ne, qg->nb, static_cast<size_t>(D) * qg->nb[0])), D * Hq, T, B);
    }
    if (w.bq) q = add(ctx, q, w.bq);
    if (w.bk) k = add(ctx, k, w.bk);
    if (w.bv) v = add(ctx, v, w.bv);
    q = reshape(ctx, q, D, Hq, T, B);
    k = reshape(ctx, k, D, Hkv, T, B);
    v = reshape(ctx, v, D, Hkv, T, B);

    // 3: qwen3 and gemma3 normalise each head of q and k over head_dim, before RoPE.
    if (w.q_norm) q = rms_norm(ctx, q, w.q_norm, hp.rms_eps);
    if (w.k_norm) k = rms_norm(ctx, k, w.k_norm, hp.rms_eps);

    // 4: RoPE (normal for llama, neox for qwen; from the architecture traits; a windowed layer's own base; Llama 3's
    // and phi3's frequency factors).
    const RopeParams rope_p = hp.rope(static_cast<uint32_t>(il));
    q = set_name(rope(ctx, q, pos.pos, hp.rope_query(static_cast<uint32_t>(il)), w.rope_freqs), lname(il, "q"));
    k = set_name(rope(ctx, k, pos.pos, rope_p, w.rope_freqs), lname(il, "k"));
    set_name(v, lname(il, "v"));

    // 5: causal GQA attention, scale 1/sqrt(head_dim) (the Gemma 27Bs: 1/sqrt(n_embd / n_head)); with a cache, over
    // every position so far (gpt-oss, gemma2, gemma3: a sliding window on some layers; gpt-oss: per-head sink logits;
    // gemma2: soft-capped logits).
    if (kv) {
        const int64_t n = kv->n_past + T;
        k = cache_read(ctx, kv->k, cache_write(ctx, kv->k, k, kv->n_past), n, B);
        v = cache_read(ctx, kv->v, cache_write(ctx, kv->v, v, kv->n_past), n, B);
    }
    if (kv && pos.key_start) throw Error(lname(il, "kv") + ": a KV cache serves one unpacked sequence (no key_start)");
    const int64_t window = hp.is_swa(static_cast<uint32_t>(il)) ? hp.n_swa : 0;
    Tensor * o = attention(ctx, q, k, v, hp.attn_scale, attention_type, pos.key_start, w.attn_sinks, window, hp.attn_softcap);
    o = reshape(ctx, o, D * Hq, T, B);
    if (gate) o = mul(ctx, o, sigmoid(ctx, gate));  // qwen35's gated attention

    // 6: output projection (+ gpt-oss's bias; gemma3's post-attention norm) and residual.
    Tensor * proj = build_linear(ctx, w.wo, o, lora);
    if (w.bo) proj = add(ctx, proj, w.bo);
    if (w.attn_post_norm) proj = rms_norm(ctx, proj, w.attn_post_norm, hp.rms_eps);
    return set_name(add(ctx, x, proj), lname(il, "attn_out"));
}

namespace {

// The selected experts' biases (gpt-oss; llama.cpp's ggml_add_id): y[:, s, t] + b[:, ids[s, t]], b [n, n_expert].
Tensor * add_expert_bias(Context & ctx, Tensor * y, Tensor * b, Tensor * ids) {
    return b ? add(ctx, y, get_rows(ctx, b, ids)) : y;
}

// The mixture-of-experts feed-forward (llama.cpp's build_moe_ffn): router logits over the experts (+ gpt-oss's
// bias), each token's top k, their softmax probabilities renormalised over the k (qwen3moe; for gpt-oss the
// same as its softmax over the selected logits); each selected expert a SwiGLU (gpt-oss: clamped, with the
// experts' biases) on its slice of the *_exps tensors; the outputs summed with those weights.
// n2 [n_embd, T...] -> [n_embd, T...].
Tensor * moe_ffn(Context & ctx, const HParams & hp, const LayerWeights & w, int il, Tensor * n2, const LoraSet * lora) {
    const int64_t E = n2->ne[0], T = n2->nelements() / n2->ne[0], k = hp.n_expert_used;
    Tensor * x = reshape(ctx, n2, E, 1, T);
    Tensor * logits = build_linear(ctx, w.ffn_gate_inp, reshape(ctx, n2, E, T), lora);
    if (w.ffn_gate_inp_b) logits = add(ctx, logits, w.ffn_gate_inp_b);
    set_name(logits, lname(il, "moe_logits"));
    Tensor * ids = set_name(moe_topk(ctx, logits, static_cast<int32_t>(k)), lname(il, "moe_experts"));
    Tensor * wts = moe_weights(ctx, logits, ids, hp.expert_weights_norm, hp.expert_weights_scale, hp.moe_aux);
    Tensor * g = add_expert_bias(ctx, build_linear_id(ctx, w.ffn_gate_exps, x, ids, lora), w.ffn_gate_exps_b, ids);  // [n_ff_exp, k, T]
    Tensor * u = add_expert_bias(ctx, build_linear_id(ctx, w.ffn_up_exps, x, ids, lora), w.ffn_up_exps_b, ids);
    Tensor * act = hp.arch->swiglu_oai ? swiglu_oai(ctx, g, u, kSwigluOaiAlpha, kSwigluOaiLimit) : swiglu(ctx, g, u);
    Tensor * d = add_expert_bias(ctx, build_linear_id(ctx, w.ffn_down_exps, act, ids, lora), w.ffn_down_exps_b, ids);  // [n_embd, k, T]
    // sum_s w[s, t] * d[:, s, t]: the weights broadcast over n_embd, then summed over the k slots.
    Tensor * weighted = mul(ctx, d, reshape(ctx, wts, 1, k, T));
    Tensor * like = reshape(ctx, n2, E, 1, T);
    Tensor * out = sum_to(ctx, weighted, like);
    return reshape(ctx, out, n2->ne[0], n2->ne[1], n2->ne[2], n2->ne[3]);
}

} // namespace

Tensor * ffn_block(Context & ctx, const HParams & hp, const LayerWeights & w, int il, Tensor * h, const LoraSet * lora,
                   bool residual) {
    // 7-8: gated feed-forward (SwiGLU; gemma3: GeGLU) or the mixture of experts (+ gemma3's post-feed-forward
    // norm), and residual.
    Tensor * n2 = rms_norm(ctx, h, w.ffn_norm, hp.rms_eps);
    Tensor * f = nullptr;
    if (w.ffn_gate_inp) {
        f = moe_ffn(ctx, hp, w, il, n2, lora);
        if (w.ffn_up_shexp) {  // qwen35moe's shared expert, scaled by sigmoid of its gate's logit (one per token)
            Tensor * shared = build_linear(ctx, w.ffn_down_shexp,
                                           swiglu(ctx, build_linear(ctx, w.ffn_gate_shexp, n2, lora), build_linear(ctx, w.ffn_up_shexp, n2, lora)),
                                           lora);
            Tensor * gate = sigmoid(ctx, mul_mat(ctx, reshape(ctx, w.ffn_gate_inp_shexp, n2->ne[0], 1), n2));  // [1, T, B]
            f = add(ctx, f, mul(ctx, shared, gate));
        }
    } else {
        Tensor * g = nullptr, * u = nullptr;
        if (w.ffn_gate) {
            g = build_linear(ctx, w.ffn_gate, n2, lora);
            u = build_linear(ctx, w.ffn_up, n2, lora);
        } else {  // phi3: one projection to [2 n_ff]: the gate's rows, then the up rows
            Tensor * gu = build_linear(ctx, w.ffn_up, n2, lora);
            const int64_t F = gu->ne[0] / 2;
            g = rows_of(ctx, gu, 0, F);
            u = rows_of(ctx, gu, F, F);
        }
        Tensor * act = hp.arch->glu == GluKind::GeluTanh ? geglu(ctx, g, u, hp.gelu_fp16_table) : swiglu(ctx, g, u);
        f = build_linear(ctx, w.ffn_down, act, lora);
    }
    if (w.ffn_post_norm) f = rms_norm(ctx, f, w.ffn_post_norm, hp.rms_eps);
    return residual ? set_name(add(ctx, h, f), lname(il, "out")) : f;
}

Tensor * build_decoder(Context & ctx, const HParams & hp, const ModelWeights & w, Tensor * ids, const TokenPositions & pos,
                       const LoraSet * lora, const std::vector<LayerKv> * kv, DType boundary) {
    auto at_boundary = [&](Tensor * y) { return boundary == DType::F32 ? y : cast(ctx, cast(ctx, y, boundary), DType::F32); };
    Tensor * x = at_boundary(build_embedding(ctx, hp, w.tok_embd, ids, lora));
    for (uint32_t il = 0; il < hp.n_layer; ++il)
        x = at_boundary(build_layer(ctx, hp, w.layers[il], static_cast<int>(il), x, pos, lora, kv ? &(*kv)[il] : nullptr));
    return x;
}

Tensor * build_embedding(Context & ctx, const HParams & hp, Tensor * tok_embd, Tensor * ids, const LoraSet * lora, Tensor * looked_up) {
    Tensor * e = looked_up ? looked_up : get_rows(ctx, tok_embd, ids);
    const std::vector<LoraDelta> * ds = lora ? lora->find(tok_embd) : nullptr;
    if (ds)
        for (const LoraDelta & d : *ds) {
            // Roles swapped (formats.md §5.3): gather token t's r-vector from A [r, n_vocab], then B [r, n_embd], added
            // into the looked-up rows by the GEMM (as build_linear's branches).
            e = lora_up(ctx, d.b, get_rows(ctx, d.a, ids), d.scale, e);
        }
    if (hp.embd_scale != 1.0f) e = scale(ctx, e, hp.embd_scale);  // gemma3: after the adapter, as llama.cpp
    return set_name(e, "embd");
}

Tensor * build_head_logits(Context & ctx, const HParams & hp, const ModelWeights & w, Tensor * x, const LoraSet * lora) {
    Tensor * h = rms_norm(ctx, x, w.output_norm, hp.rms_eps);
    // A tied head shares token_embd, whose LoRA pair (if any) has the embedding's roles: not applicable here.
    Tensor * logits = build_linear(ctx, w.output, h, w.tied_output() ? nullptr : lora);
    if (hp.final_softcap > 0.0f) logits = softcap(ctx, logits, hp.final_softcap);  // gemma2
    return set_name(logits, "logits");
}

Tensor * build_head_ce(Context & ctx, const HParams & hp, const ModelWeights & w, Tensor * x, Tensor * labels,
                       float loss_scale, int64_t chunk, const LoraSet * lora) {
    if (lora && !w.tied_output() && lora->find(w.output))
        throw Error("LoRA on output.weight is not supported with the fused LM-head cross-entropy");
    Tensor * h = rms_norm(ctx, x, w.output_norm, hp.rms_eps);
    h = reshape(ctx, h, h->ne[0], h->ne[1] * h->ne[2] * h->ne[3]);
    return set_name(lm_head_ce(ctx, h, w.output, labels, loss_scale, chunk, hp.final_softcap), "loss");
}

Tensor * build_head_range(Context & ctx, const HParams & hp, const ModelWeights & w, Tensor * x, Tensor * W_range, Tensor * labels,
                          Tensor * state, int64_t v0, int64_t chunk, bool forms_grad) {
    Tensor * h = rms_norm(ctx, x, w.output_norm, hp.rms_eps);
    h = reshape(ctx, h, h->ne[0], h->ne[1] * h->ne[2] * h->ne[3]);
    return lm_head_ce_range(ctx, h, W_range, labels, state, v0, w.output->ne[1], chunk, hp.final_softcap, forms_grad);
}

Tensor * build_head_streamed(Context & ctx, const HParams & hp, const ModelWeights & w, Tensor * x, Tensor * state, Tensor * labels,
                             float loss_scale, int64_t chunk, bool per_token, bool forms_grad) {
    Tensor * h = rms_norm(ctx, x, w.output_norm, hp.rms_eps);
    h = reshape(ctx, h, h->ne[0], h->ne[1] * h->ne[2] * h->ne[3]);
    Tensor * l = lm_head_ce_streamed(ctx, h, state, labels, w.output->ne[1], loss_scale, chunk, hp.final_softcap, per_token, forms_grad);
    return set_name(l, per_token ? "token_nll" : "loss");
}

Tensor * build_head_token_nll(Context & ctx, const HParams & hp, const ModelWeights & w, Tensor * x, Tensor * labels, int64_t chunk) {
    Tensor * h = rms_norm(ctx, x, w.output_norm, hp.rms_eps);
    h = reshape(ctx, h, h->ne[0], h->ne[1] * h->ne[2] * h->ne[3]);
    return set_name(lm_head_token_nll(ctx, h, w.output, labels, chunk, hp.final_softcap), "token_nll");
}

Tensor * build_sequence_logps(Context & ctx, Tensor * token_nll, int64_t T, int64_t B) {
    Tensor * per_seq = sum_to(ctx, reshape(ctx, token_nll, T, B), ctx.new_tensor(DType::F32, 1, B));
    return set_name(scale(ctx, reshape(ctx, per_seq, B), -1.0f), "sequence_logps");
}

Tensor * build_answer_logps(Context & ctx, Tensor * token_nll, Tensor * slot_ids, int64_t B, int64_t slots) {
    return set_name(scale(ctx, segment_sum(ctx, token_nll, slot_ids, B * slots), -1.0f), "answer_logps");
}

void answer_slot_ids(const int32_t * positions, int64_t T, int64_t B, int64_t slots, int32_t * out) {
    for (int64_t b = 0; b < B; ++b) {
        int64_t doc = -1;
        for (int64_t t = 0; t < T; ++t) {
            if (positions[b * T + t] == 0 || doc < 0) ++doc;
            out[b * T + t] = static_cast<int32_t>(b * slots + std::min(doc, slots - 1));
        }
    }
}

} // namespace rp
