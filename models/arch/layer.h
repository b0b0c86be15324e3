// Graph builders of the decoder forward pass of every architecture in hparams.h (formats.md §3.4). They only record nodes; a
// backend runs them. The same decoder-layer builder serves inference (with a KV cache), training stages and
// recompute (without a cache: gradients then flow through k and v like through any other node).
//
// Shapes (ne order): hidden states x [n_embd, T, B]; token ids i32 [T] or [T, B]; positions i32 [T] (shared
// by the B sequences) or [T * B]; logits [n_vocab, T, B].
#pragma once

#include "ggml_rp/core/context.h"
#include "models/arch/hparams.h"
#include "models/arch/model.h"

#include <unordered_map>
#include <vector>

namespace rp {

class LoraAdapter;

// One low-rank update of a base weight: W x + scale * B (A x) (token_embd: E[tok] + scale * B A[:, tok]).
struct LoraDelta {
    Tensor * a;
    Tensor * b;
    float scale;
};

// LoRA dropout in training graphs (PEFT: y = W x + scale * B(A(dropout(x))), one independent mask per module).
// The mask is a pure function of (seed, step, the base weight's name, the element's position in the step's
// batch), drawn from a counter-based generator: a recompute on another device, or a different split of the
// batch into micro-batches, sees the same mask (roundpipe.md §4). p = 0: no dropout (inference, evaluation).
struct LoraDropout {
    float p = 0.0f;
    uint64_t seed = 0;
    int64_t step = 0;
    int64_t seq_offset = 0;  // index of the graph's first sequence in the step's batch
    int64_t seq_len = 0;
    int64_t token_offset = 0;  // a graph over a token range of its micro-batch: the range's first (flattened) token
};

// The LoRA updates active in a graph, keyed by the base weight they modify. Several adapters add up.
// Holds pointers only: the adapters (or trainable A/B tensors) must outlive it.
class LoraSet {
public:
    LoraDropout dropout;

    // Every pair of `adapter`, with scale = user_scale * alpha / r (user_scale when alpha = 0).
    void add(const LoraAdapter & adapter, float user_scale = 1.0f);
    void add(const Tensor * base, const LoraDelta & d) { map_[base].push_back(d); }
    // The updates of a base weight, or nullptr.
    const std::vector<LoraDelta> * find(const Tensor * base) const;
    bool empty() const { return map_.empty(); }

private:
    std::unordered_map<const Tensor *, std::vector<LoraDelta>> map_;
};

// y = W x plus the LoRA updates of W in `lora` (nullptr: none). W [in, out], x [in, T, ...] -> [out, T, ...].
Tensor * build_linear(Context & ctx, Tensor * W, Tensor * x, const LoraSet * lora);
// The experts' version (ops/moe.h mul_mat_id): W [in, out, n_expert], x [in, 1 or k, T], ids [k, T] ->
// [out, k, T], plus each expert's LoRA update (A [in, r, n_expert], B [r, out, n_expert], as llama.cpp applies
// adapters on *_exps tensors).
Tensor * build_linear_id(Context & ctx, Tensor * W, Tensor * x, Tensor * ids, const LoraSet * lora);

struct LayerState;

// Inference only: the layer's K/V cache (f32 [head_dim, n_head_kv, n_ctx, n_seq] each). The layer's B <= n_seq
// sequences are the cache's first B, all at the same position: each writes its new keys and values at positions
// [n_past, n_past + T) and attends over its own [0, n_past + T) (the sequences' keys are read in place, a cache
// length apart).
struct LayerKv {
    Tensor * k;
    Tensor * v;
    int64_t n_past;
    LayerState * state = nullptr;  // a recurrent layer's (then k and v are unused)
};

// Inference only: a recurrent (Gated DeltaNet) layer's state before the graph's tokens, the conv state f32
// [conv channels, d_conv - 1, B] and the delta rule's f32 [Dk, Dv, Hv, B] (nullptr: a fresh sequence, zeros). The
// builder sets conv_out and ssm_out to the states after the tokens (views of the nodes' aux bytes), for the caller
// to copy back.
struct LayerState {
    Tensor * conv = nullptr;
    Tensor * ssm = nullptr;
    Tensor * conv_out = nullptr;
    Tensor * ssm_out = nullptr;
};

// Where the tokens of a graph sit: their RoPE positions (i32 [T] shared by the B sequences, or [T * B]) and,
// for packed sequences (several examples in one sequence, positions restarting at each), the first key each
// token's attention sees (i32 [T * B]: the start of its example), so no example attends to another. Built
// implicitly from a positions tensor: an unpacked graph passes just that.
struct TokenPositions {
    Tensor * pos = nullptr;
    Tensor * key_start = nullptr;  // nullptr: every earlier token of the sequence (plain causal)
    TokenPositions(Tensor * positions, Tensor * first_key = nullptr) : pos(positions), key_start(first_key) {}  // NOLINT(google-explicit-constructor)
};

// Packed sequences: the first key of every token from its position, t - positions[t] (positions restart at
// 0 at each example and count up by one; a position above t is clamped to the sequence's start).
// positions and out: [B][T].
void packed_key_starts(const int32_t * positions, int64_t T, int64_t B, int32_t * out);

// One pre-norm decoder layer: x [n_embd, T, B] -> x' [n_embd, T, B]. attention_type: the type an accelerator
// may round the attention inputs to (ops/attention.h; the CPU computes in f32 whatever it is).
Tensor * build_layer(Context & ctx, const HParams & hp, const LayerWeights & w, int il, Tensor * x, const TokenPositions & pos,
                     const LoraSet * lora = nullptr, const LayerKv * kv = nullptr, DType attention_type = DType::F32);

// The layer's two halves, build_layer = ffn_block(attention_block(x)). The feed-forward half is per token, so
// a training program may run it over token ranges of x (models/train/layer_programs.cpp: the token-chunked MLP):
//   attention_block  x -> h = x + attn_output(attention(rope(q, k), v)) over every token of x;
//   ffn_block        h [n_embd, ...] -> h + ffn_down(swiglu(ffn_gate(n), ffn_up(n))), n = rms_norm(h) (gemma3:
//                    GeGLU, and the term's own RMSNorm); without `residual` only the ffn_down(...) term.
Tensor * attention_block(Context & ctx, const HParams & hp, const LayerWeights & w, int il, Tensor * x, const TokenPositions & pos,
                         const LoraSet * lora = nullptr, const LayerKv * kv = nullptr, DType attention_type = DType::F32);
Tensor * ffn_block(Context & ctx, const HParams & hp, const LayerWeights & w, int il, Tensor * h, const LoraSet * lora,
                   bool residual = true);
// qwen35's Gated DeltaNet layers in place of attention_block (models/arch/delta_net_block.cpp): x -> x + ssm_out(
// gated_norm(delta_rule(conv(...)))); packed sequences (pos.key_start) restart the convolution and the state at each
// example. attention_block calls it for the layers hp.is_recurrent names (its kv then carries `state`).
Tensor * delta_net_block(Context & ctx, const HParams & hp, const LayerWeights & w, int il, Tensor * x, const TokenPositions & pos,
                         const LoraSet * lora = nullptr, LayerState * state = nullptr);

// Token embeddings: ids i32 [T] or [T, B] -> [n_embd, T, B] (get_rows, plus token_embd LoRA with the role
// swap of formats.md §5.3; gemma3: then times sqrt(n_embd)).
// looked_up: the table's lookup already made elsewhere (f32 [n_embd, T, B]: a streamed embedding gathers its rows
// on the host); tok_embd then keys its LoRA pair only.
Tensor * build_embedding(Context & ctx, const HParams & hp, Tensor * tok_embd, Tensor * ids, const LoraSet * lora = nullptr,
                         Tensor * looked_up = nullptr);
inline Tensor * build_embedding(Context & ctx, const Model & model, Tensor * ids, const LoraSet * lora = nullptr) {
    return build_embedding(ctx, model.hparams(), model.tok_embd, ids, lora);
}

// The whole decoder of a model before its head: embedding, then every layer. ids i32 [T] or [T, B] ->
// [n_embd, T, B]. kv: one cache per layer (inference; nullptr in training graphs). boundary: the embedding's and
// every layer's output rounded to this type (BF16) and back, as training's per-layer programs keep it between layers
// (FinetuneConfig::boundary_type); F32: as computed.
Tensor * build_decoder(Context & ctx, const HParams & hp, const ModelWeights & w, Tensor * ids, const TokenPositions & pos,
                       const LoraSet * lora = nullptr, const std::vector<LayerKv> * kv = nullptr, DType boundary = DType::F32);

// Final RMSNorm and LM head: x [n_embd, T, B] -> logits [n_vocab, T, B]. For a tied head (output ==
// token_embd) the token_embd LoRA pair is not applied (its roles are those of the embedding).
Tensor * build_head_logits(Context & ctx, const HParams & hp, const ModelWeights & w, Tensor * x, const LoraSet * lora = nullptr);
inline Tensor * build_head_logits(Context & ctx, const Model & model, Tensor * x, const LoraSet * lora = nullptr) {
    return build_head_logits(ctx, model.hparams(), model.graph_weights(), x, lora);
}

// Final RMSNorm and the fused LM head + cross-entropy (training): x [n_embd, T, B] (contiguous), labels i32
// [T * B] (-1 = masked) -> loss f32 [1] = loss_scale * sum of the unmasked token losses. `chunk` = vocabulary
// rows per chunk. LoRA on the (untied) LM head is not supported on this path (throws).
Tensor * build_head_ce(Context & ctx, const HParams & hp, const ModelWeights & w, Tensor * x, Tensor * labels,
                       float loss_scale, int64_t chunk = 4096, const LoraSet * lora = nullptr);
inline Tensor * build_head_ce(Context & ctx, const Model & model, Tensor * x, Tensor * labels, float loss_scale,
                              int64_t chunk = 4096, const LoraSet * lora = nullptr) {
    return build_head_ce(ctx, model.hparams(), model.graph_weights(), x, labels, loss_scale, chunk, lora);
}

// A streamed head (ops/cross_entropy.h): the final norm of x [n_embd, n] and the fold of head rows [v0, v0 +
// W_range->ne[1]) (W_range: those rows of w.output) into state; then, once every range is folded, the loss (per_token:
// each token's NLL, as build_head_token_nll) from the state, with the unit gradients its backward scales when
// forms_grad (the ranges' too). The same bits as build_head_ce / build_head_token_nll with the same chunk.
Tensor * build_head_range(Context & ctx, const HParams & hp, const ModelWeights & w, Tensor * x, Tensor * W_range, Tensor * labels,
                          Tensor * state, int64_t v0, int64_t chunk, bool forms_grad);
Tensor * build_head_streamed(Context & ctx, const HParams & hp, const ModelWeights & w, Tensor * x, Tensor * state, Tensor * labels,
                             float loss_scale, int64_t chunk, bool per_token, bool forms_grad);

// Final norm + the fused head per token: each token's negative log-likelihood of its label (0 when masked),
// f32 [T * B] (ops/cross_entropy.h lm_head_token_nll). For sequence-level objectives.
Tensor * build_head_token_nll(Context & ctx, const HParams & hp, const ModelWeights & w, Tensor * x, Tensor * labels, int64_t chunk);
// The summed log-probability of each sequence's labelled tokens, f32 [B], from build_head_token_nll's [T * B].
Tensor * build_sequence_logps(Context & ctx, Tensor * token_nll, int64_t T, int64_t B);
// The same per answer slot of packed sequences (models/data/dataset.h AnswerSlot): f32 [B * slots], slot j of
// sequence b at b * slots + j, from the tokens' slot ids (answer_slot_ids; i32 [T * B]); zero in empty slots.
Tensor * build_answer_logps(Context & ctx, Tensor * token_nll, Tensor * slot_ids, int64_t B, int64_t slots);
// Each token's answer slot in packed sequences (positions [B][T], restarting at 0 at each document): b * slots +
// its document's index in sequence b, the padding run after the last document in the last slot (its labels are
// masked: it adds nothing).
void answer_slot_ids(const int32_t * positions, int64_t T, int64_t B, int64_t slots, int32_t * out);

} // namespace rp
