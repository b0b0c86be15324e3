// Inference: a KV-cached session that turns tokens into logits on the CPU backend, and a sampler.
//
// eval() records a graph (embedding, every layer with its cache, the head), plans it and runs it; while the
// calls keep its shape (the token count, and whether every position's logits are kept: one token at a time
// while generating) the graph is replayed: only its inputs change and its cache views move (where the new
// keys and values are written, how many keys attention reads), with no building and no planning (the same
// bits as building it again; with stories260K the building was a third of a generated token's time). The
// cache is f32 (like the reference runs of llama.cpp), [head_dim, n_head_kv, n_ctx] per layer for K and V.
// Where llama.cpp's CPU backend computes an activation its own way (gemma3's GELU, from an fp16 table) the
// session does the same, so that its logits are llama.cpp's; training graphs keep the exact function.
#pragma once

#include "ggml_rp/core/context.h"
#include "ggml_rp/cpu/backend.h"
#include "models/arch/layer.h"
#include "models/arch/model.h"

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

namespace rp {

class InferenceSession {
public:
    // n_ctx: cache size in tokens (0: the model's context_length, at most 4096). Throws rp::Error when n_ctx
    // exceeds the model's context_length. n_threads 0: OpenMP's default. `lora` (may be nullptr) is copied,
    // without its dropout (inference never drops); the adapters it points to must outlive the session.
    // `weights` (nullptr: the model's): other tensors of the same shapes to read, e.g. the fp32 masters of a
    // full finetune in progress (Trainer::graph_weights()); they must outlive the session.
    // n_seq: sequences decoded together (batched decoding: each weight read once for all of them), each with its
    // own cache of n_ctx tokens, all at the same position.
    InferenceSession(const Model & model, int64_t n_ctx = 0, int n_threads = 0, const LoraSet * lora = nullptr,
                     const ModelWeights * weights = nullptr, int64_t n_seq = 1);

    // Evaluates `tokens` at positions [n_past, n_past + n) of every sequence and advances n_past: n tokens of each
    // sequence, sequence after sequence ([n_seq][n]). Returns logits row-major [sequence][position][n_vocab] for
    // all n positions (all_logits) or for the last one only. Throws when the tokens do not fit in the cache, do
    // not divide among the sequences or an id is outside the vocabulary (nothing is changed then).
    std::vector<float> eval(const std::vector<int32_t> & tokens, bool all_logits = false);
    // The same `tokens` in every sequence (a common prompt): computed once, in the first sequence, whose new keys
    // and values are then copied to the others. Returns the logits of one sequence ([position][n_vocab]).
    std::vector<float> eval_shared(const std::vector<int32_t> & tokens, bool all_logits = false);
    // Copies positions [0, n) of the first sequence's cache to the others (n <= n_past): after a reset(n), every
    // sequence continues from the first one's prefix.
    void share_first(int64_t n);

    int64_t n_past() const { return n_past_; }
    int64_t n_ctx() const { return n_ctx_; }
    int64_t n_seq() const { return n_seq_; }
    int64_t n_vocab() const { return model_.hparams().n_vocab; }
    // Forgets the positions from `n_past` on (0: start over). A model with recurrent layers (qwen35's Gated DeltaNet)
    // keeps one state per layer and sequence, not one per position: its state at n_past is the one saved after the
    // last eval_shared when that ended there, else the tokens [0, n_past) of each sequence are evaluated again.
    void reset(int64_t n_past = 0);
    void set_threads(int n_threads) { n_threads_ = n_threads; }
    // false: every eval() builds and plans its graph anew (tests compare that with the replays).
    void set_graph_replay(bool on) { replay_ = on; }
    // A decode step's products (one token of each sequence) as per-row dot products with the activations in the
    // weights' format (ggml_rp/cpu/matvec_dot.h: llama.cpp's arithmetic, deterministic; every sequence gets the bits
    // it gets alone, however many decode together), or the prompt batch's exact arithmetic (prompts always), in this
    // session's evals whatever the process-wide switch (cpu::set_row_dots, which it follows until this is called).
    void set_row_dots(bool on) { row_dots_ = on ? 1 : 0; }

    InferenceSession(const InferenceSession &) = delete;
    InferenceSession & operator=(const InferenceSession &) = delete;
    ~InferenceSession();

private:
    struct EvalGraph;  // an eval's graph, with its inputs and plan
    std::unique_ptr<EvalGraph> build_graph(int64_t T, bool all_logits, int64_t B) const;
    // Checks the tokens, evaluates them in sequences [0, B) ([B][T]) and returns the logits; does not advance.
    std::vector<float> run(const std::vector<int32_t> & tokens, bool all_logits, int64_t B);
    // Copies positions [from, from + n) of the first sequence's cache to the others (and, with recurrent layers, the
    // first sequence's states, which must be at from + n = n_past).
    void copy_rows(int64_t from, int64_t n);
    bool recurrent() const { return !conv_state_.empty(); }
    void zero_states();
    const Model & model_;
    HParams hp_;  // the model's, with llama.cpp's inference arithmetic where it differs (HParams::gelu_fp16_table)
    ModelWeights weights_;
    LoraSet lora_;
    bool have_lora_;
    int64_t n_ctx_;
    int64_t n_seq_;
    int n_threads_;
    int64_t n_past_ = 0;
    Context cache_ctx_;
    std::vector<Tensor *> k_cache_, v_cache_;  // nullptr for a recurrent layer
    // Recurrent layers' states (nullptr for an attention layer): conv [channels, d_conv - 1, n_seq] and the delta
    // rule's [Dk, Dv, Hv, n_seq]; the tokens of each sequence so far (to evaluate again on a rewind), and the states
    // saved after the last eval_shared (at position saved_at_, -1: none).
    std::vector<Tensor *> conv_state_, ssm_state_;
    std::vector<std::vector<int32_t>> history_;
    std::vector<std::vector<uint8_t>> saved_;
    int64_t saved_at_ = -1;
    CpuBackend backend_;
    bool replay_ = true;
    int row_dots_ = -1;  // -1: the process-wide switch
    std::unique_ptr<EvalGraph> graphs_[2];  // the last graph of all the sequences, and of the first alone (eval_shared)
};

class Tokenizer;

// The greedy continuation of `prompt` (token ids, evaluated from the session's current position): up to
// max_tokens ids, ending before an end-of-generation token or when the cache is full.
std::vector<int32_t> complete_greedy(InferenceSession & session, const Tokenizer & tok, const std::vector<int32_t> & prompt,
                                     int64_t max_tokens);

// Token sampling: temperature <= 0 is greedy (argmax, lowest id on ties). Otherwise, in this order: keep the
// top_k largest logits (0: all), softmax at `temperature`, keep the smallest prefix of the sorted
// candidates whose probability reaches top_p (1: all), renormalise and draw. With nothing cut (top_k all, top_p 1)
// the candidates are not sorted: the draw walks the vocabulary by id (the same distribution). The random stream is
// std::mt19937_64 (fully specified by the standard) with our own mapping to [0, 1), so the same seed gives
// the same tokens on every platform.
struct SamplerParams {
    float temperature = 0.8f;
    int32_t top_k = 40;
    float top_p = 0.95f;
    uint64_t seed = 0;
};

class Sampler {
public:
    explicit Sampler(const SamplerParams & p) : p_(p), rng_(p.seed) {}
    int32_t sample(const float * logits, int64_t n_vocab);
    // The next uniform number in [0, 1): the top 53 bits of the generator's output, scaled by 2^-53.
    double uniform();

private:
    SamplerParams p_;
    std::mt19937_64 rng_;
    std::vector<int32_t> idx_;
    std::vector<double> prob_;
};

} // namespace rp
