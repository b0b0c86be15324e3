#include "models/arch/inference.h"

#include "ggml_rp/core/graph.h"
#include "ggml_rp/cpu/kernel_scratch.h"
#include "ggml_rp/cpu/matvec_dot.h"
#include "ggml_rp/ops/ops.h"
#include "models/text/tokenizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

namespace rp {

InferenceSession::InferenceSession(const Model & model, int64_t n_ctx, int n_threads, const LoraSet * lora,
                                   const ModelWeights * weights, int64_t n_seq)
    : model_(model), hp_(model.hparams()), lora_(lora ? *lora : LoraSet()),
      have_lora_(lora && !lora->empty()), n_seq_(n_seq), n_threads_(n_threads) {
    lora_.dropout = LoraDropout{};
    hp_.gelu_fp16_table = true;
    const HParams & hp = model.hparams();
    if (n_ctx < 0) throw Error("context size must be >= 0 (got " + std::to_string(n_ctx) + ")");
    if (n_ctx == 0) n_ctx = std::min<int64_t>(hp.n_ctx_train, 4096);
    if (n_ctx > hp.n_ctx_train)
        throw Error("context " + std::to_string(n_ctx) + " is longer than the model's " + std::to_string(hp.n_ctx_train) +
                    " (" + arch_key(hp, "context_length") + " of " + model.path() + ")");
    n_ctx_ = n_ctx;
    if (n_seq < 1) throw Error("sequences must be >= 1 (got " + std::to_string(n_seq) + ")");
    weights_ = weights ? *weights : model.graph_weights(n_ctx);  // the context chooses phi3's LongRoPE factors
    const bool any_recurrent = std::any_of(hp.recurrent.begin(), hp.recurrent.end(), [](uint8_t r) { return r != 0; });
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const bool rec = hp.is_recurrent(il);
        for (auto * list : {&k_cache_, &v_cache_}) {
            Tensor * c = nullptr;
            if (!rec) {
                c = cache_ctx_.new_tensor(DType::F32, hp.head_dim, hp.n_head_kv, n_ctx_, n_seq_);
                c->name = "cache_" + std::string(list == &k_cache_ ? "k" : "v") + std::to_string(il);
                cache_ctx_.alloc_data(c);
            }
            list->push_back(c);
        }
        if (!any_recurrent) continue;
        Tensor * conv = nullptr, * ssm = nullptr;
        if (rec) {
            conv = cache_ctx_.new_tensor(DType::F32, hp.ssm_conv_dim(), hp.ssm_d_conv - 1, n_seq_);
            ssm = cache_ctx_.new_tensor(DType::F32, hp.ssm_d_state, hp.ssm_head_v(), hp.ssm_dt_rank, n_seq_);
            conv->name = "conv_state" + std::to_string(il);
            ssm->name = "ssm_state" + std::to_string(il);
            cache_ctx_.alloc_data(conv);
            cache_ctx_.alloc_data(ssm);
        }
        conv_state_.push_back(conv);
        ssm_state_.push_back(ssm);
    }
    history_.resize(static_cast<size_t>(n_seq_));
    zero_states();
}

void InferenceSession::zero_states() {
    for (auto * list : {&conv_state_, &ssm_state_})
        for (Tensor * t : *list)
            if (t) std::memset(t->data, 0, t->nbytes());
}

void InferenceSession::reset(int64_t n_past) {
    if (n_past < 0 || n_past > n_past_)
        throw Error("reset: position " + std::to_string(n_past) + " is outside [0, " + std::to_string(n_past_) + "]");
    if (recurrent() && n_past != n_past_) {
        const int64_t target = n_past;
        zero_states();
        n_past_ = 0;
        if (target > 0 && target == saved_at_) {  // the states saved after the shared prompt
            size_t i = 0;
            for (auto * list : {&conv_state_, &ssm_state_})
                for (Tensor * t : *list)
                    if (t) std::memcpy(t->data, saved_[i++].data(), t->nbytes());
        } else if (target > 0) {  // evaluate every sequence's first `target` tokens again
            std::vector<int32_t> tokens;
            for (const std::vector<int32_t> & h : history_) tokens.insert(tokens.end(), h.begin(), h.begin() + target);
            run(tokens, false, n_seq_);
        }
        for (std::vector<int32_t> & h : history_) h.resize(static_cast<size_t>(target));
        if (target < saved_at_) saved_at_ = -1;  // the saved states belong to a history being rewritten
    }
    n_past_ = n_past;
}

struct InferenceSession::EvalGraph {
    int64_t T = 0;
    bool all_logits = false;
    int64_t B = 1;
    Context ctx;
    Tensor * ids = nullptr;
    Tensor * pos = nullptr;
    Tensor * logits = nullptr;
    Graph g;
    AllocPlan plan;
    std::vector<Tensor *> cache_views;  // the nodes that are views of a cache (n_past moves them)
};

InferenceSession::~InferenceSession() = default;

std::unique_ptr<InferenceSession::EvalGraph> InferenceSession::build_graph(int64_t T, bool all_logits, int64_t B) const {
    const HParams & hp = hp_;
    auto eg = std::make_unique<EvalGraph>();
    eg->T = T;
    eg->all_logits = all_logits;
    eg->B = B;
    Context & ctx = eg->ctx;
    eg->ids = set_name(ctx.new_tensor(DType::I32, T, B), "tokens");
    eg->pos = set_name(ctx.new_tensor(DType::I32, T), "positions");
    ctx.alloc_data(eg->ids);
    ctx.alloc_data(eg->pos);
    const LoraSet * lora = have_lora_ ? &lora_ : nullptr;
    std::vector<LayerKv> kv;
    // Recurrent layers read the first B sequences' states and write the new ones back (after the layer's nodes).
    std::vector<LayerState> states(hp.n_layer);
    auto first_b = [&](Tensor * t, int axis) {  // the sequences' axis: 2 of a conv state, 3 of a delta rule's
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        ne[axis] = B;
        return view(ctx, t, ne, t->nb, 0);
    };
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        kv.push_back({k_cache_[il], v_cache_[il], n_past_});
        if (hp.is_recurrent(il)) {
            states[il].conv = first_b(conv_state_[il], 2);
            states[il].ssm = first_b(ssm_state_[il], 3);
            kv.back().state = &states[il];
        }
    }
    Tensor * x = build_decoder(ctx, hp, weights_, eg->ids, eg->pos, lora, &kv);
    std::vector<Tensor *> state_writes;
    for (uint32_t il = 0; il < hp.n_layer; ++il)
        if (hp.is_recurrent(il)) {
            state_writes.push_back(copy_into(ctx, first_b(conv_state_[il], 2), states[il].conv_out));
            state_writes.push_back(copy_into(ctx, first_b(ssm_state_[il], 3), states[il].ssm_out));
        }
    if (!all_logits && T > 1) {
        // Only the last position feeds the head (the other rows of the LM head would be wasted work).
        const int64_t ne[4] = {x->ne[0], 1, B, 1};
        const size_t nb[4] = {x->nb[0], x->nb[1], x->nb[2], x->nb[3]};
        x = view(ctx, x, ne, nb, static_cast<size_t>(T - 1) * x->nb[1]);
    }
    eg->logits = build_head_logits(ctx, hp, weights_, x, lora);
    eg->logits->flags |= kFlagOutput;
    build_forward(eg->g, eg->logits);
    for (Tensor * w : state_writes) build_forward(eg->g, w);
    for (Tensor * n : eg->g.nodes)
        if (n->view_src && (std::find(k_cache_.begin(), k_cache_.end(), n->view_src) != k_cache_.end() ||
                            std::find(v_cache_.begin(), v_cache_.end(), n->view_src) != v_cache_.end()))
            eg->cache_views.push_back(n);
    eg->plan = cpu::plan_cpu_graph(eg->g);
    return eg;
}

std::vector<float> InferenceSession::run(const std::vector<int32_t> & tokens, bool all_logits, int64_t B) {
    const HParams & hp = model_.hparams();
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n == 0) throw Error("eval: no tokens");
    if (n % B != 0)
        throw Error("eval: " + std::to_string(n) + " tokens do not divide among " + std::to_string(B) + " sequences");
    const int64_t T = n / B;
    if (n_past_ + T > n_ctx_)
        throw Error("eval: " + std::to_string(n_past_) + " past + " + std::to_string(T) + " new tokens exceed the context size " +
                    std::to_string(n_ctx_));
    for (int64_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= static_cast<int64_t>(hp.n_vocab))
            throw Error("eval: token id " + std::to_string(tokens[i]) + " at position " + std::to_string(n_past_ + i % T) +
                        (B > 1 ? " of sequence " + std::to_string(i / T) : std::string()) + " is outside the vocabulary [0, " +
                        std::to_string(hp.n_vocab) + ")");

    std::unique_ptr<EvalGraph> & slot = graphs_[B == n_seq_ ? 0 : 1];
    if (!replay_ || !slot || slot->T != T || slot->all_logits != all_logits || slot->B != B) slot = build_graph(T, all_logits, B);
    EvalGraph & eg = *slot;
    tensor_set_i32(eg.ids, tokens);
    for (int64_t i = 0; i < T; ++i) eg.pos->data_as<int32_t>()[i] = static_cast<int32_t>(n_past_ + i);
    // The cache views at this position: the writes (CPY views) at row n_past, the reads (views, and the
    // views that order them after the writes) over rows [0, n_past + T).
    for (Tensor * v : eg.cache_views) {
        if (v->op == Op::CPY) move_window(v, static_cast<size_t>(n_past_) * v->view_src->nb[2]);
        else move_window(v, v->view_offs, n_past_ + T);
    }
    backend_.allocate(eg.g, eg.plan);  // (points the views at their new places)
    // (a decode step's sequences, however many: each gets its bits alone; a prompt keeps the exact arithmetic)
    std::optional<cpu::RowDotScope> dots;
    if (row_dots_ >= 0) dots.emplace(row_dots_ != 0 && T == 1, B);
    backend_.compute(eg.g, n_threads_);
    return tensor_get_f32(eg.logits);
}

std::vector<float> InferenceSession::eval(const std::vector<int32_t> & tokens, bool all_logits) {
    std::vector<float> logits = run(tokens, all_logits, n_seq_);
    const int64_t T = static_cast<int64_t>(tokens.size()) / n_seq_;
    if (recurrent())
        for (int64_t b = 0; b < n_seq_; ++b)
            history_[static_cast<size_t>(b)].insert(history_[static_cast<size_t>(b)].end(), tokens.begin() + b * T, tokens.begin() + (b + 1) * T);
    n_past_ += T;
    return logits;
}

std::vector<float> InferenceSession::eval_shared(const std::vector<int32_t> & tokens, bool all_logits) {
    std::vector<float> logits = run(tokens, all_logits, 1);
    n_past_ += static_cast<int64_t>(tokens.size());
    if (recurrent()) history_[0].insert(history_[0].end(), tokens.begin(), tokens.end());
    copy_rows(n_past_ - static_cast<int64_t>(tokens.size()), static_cast<int64_t>(tokens.size()));  // (and the history)
    if (recurrent()) {
        saved_.clear();
        for (auto * list : {&conv_state_, &ssm_state_})
            for (Tensor * t : *list)
                if (t) saved_.emplace_back(static_cast<const uint8_t *>(t->data), static_cast<const uint8_t *>(t->data) + t->nbytes());
        saved_at_ = n_past_;
    }
    return logits;
}

void InferenceSession::share_first(int64_t n) {
    if (n < 0 || n > n_past_) throw Error("share_first: " + std::to_string(n) + " positions, " + std::to_string(n_past_) + " evaluated");
    copy_rows(0, n);
}

void InferenceSession::copy_rows(int64_t from, int64_t n) {
    if (recurrent()) {
        if (from + n != n_past_)
            throw Error("share_first: a model with recurrent layers shares the first sequence's state at its last position (" +
                        std::to_string(n_past_) + "), not at " + std::to_string(from + n));
        for (auto * list : {&conv_state_, &ssm_state_})
            for (Tensor * t : *list) {
                if (!t) continue;
                char * base = static_cast<char *>(t->data);
                const size_t per_seq = t->nbytes() / static_cast<size_t>(n_seq_);
                for (int64_t s = 1; s < n_seq_; ++s) std::memcpy(base + static_cast<size_t>(s) * per_seq, base, per_seq);
            }
        for (int64_t s = 1; s < n_seq_; ++s) history_[static_cast<size_t>(s)] = history_[0];
    }
    for (auto * caches : {&k_cache_, &v_cache_})
        for (Tensor * c : *caches) {
            if (!c) continue;
            const size_t at = static_cast<size_t>(from) * c->nb[2], bytes = static_cast<size_t>(n) * c->nb[2];
            char * base = static_cast<char *>(c->data);
            for (int64_t s = 1; s < n_seq_; ++s) std::memcpy(base + static_cast<size_t>(s) * c->nb[3] + at, base + at, bytes);
        }
}

std::vector<int32_t> complete_greedy(InferenceSession & session, const Tokenizer & tok, const std::vector<int32_t> & prompt,
                                     int64_t max_tokens) {
    std::vector<int32_t> out;
    if (prompt.empty() || max_tokens <= 0) return out;
    if (session.n_past() + static_cast<int64_t>(prompt.size()) > session.n_ctx())
        throw Error("complete: the prompt's " + std::to_string(prompt.size()) + " tokens do not fit the context of " +
                    std::to_string(session.n_ctx()));
    Sampler greedy(SamplerParams{0.0f, 0, 1.0f, 0});
    std::vector<float> logits = session.eval(prompt, false);
    while (static_cast<int64_t>(out.size()) < max_tokens) {
        const int32_t next = greedy.sample(logits.data(), session.n_vocab());
        if (tok.is_eog(next)) break;
        out.push_back(next);
        if (static_cast<int64_t>(out.size()) == max_tokens || session.n_past() >= session.n_ctx()) break;
        logits = session.eval({next}, false);
    }
    return out;
}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::sample(const float * logits, int64_t n_vocab) {
    if (n_vocab <= 0) throw Error("sample: empty vocabulary");
    if (!(p_.temperature > 0.0f)) {
        int64_t best = 0;
        for (int64_t i = 1; i < n_vocab; ++i)
            if (logits[i] > logits[best]) best = i;
        return static_cast<int32_t>(best);
    }
    if ((p_.top_k <= 0 || p_.top_k >= n_vocab) && p_.top_p >= 1.0f) {
        // Nothing cut: no order needed, the draw walks the vocabulary by id (a sort of 152k candidates was a quarter
        // of a batched rollout's time).
        prob_.resize(static_cast<size_t>(n_vocab));
        float mx = logits[0];
        for (int64_t i = 1; i < n_vocab; ++i) mx = std::max(mx, logits[i]);
        double sum = 0.0;
        for (int64_t i = 0; i < n_vocab; ++i) {
            prob_[i] = std::exp((static_cast<double>(logits[i]) - mx) / p_.temperature);
            sum += prob_[i];
        }
        const double u = uniform() * sum;
        double cum = 0.0;
        int64_t last = 0;
        for (int64_t i = 0; i < n_vocab; ++i) {
            if (prob_[i] == 0.0) continue;
            cum += prob_[i];
            last = i;
            if (u < cum) return static_cast<int32_t>(i);
        }
        return static_cast<int32_t>(last);  // u within rounding of the sum
    }
    // Candidates sorted by logit, descending; ties by id so the order is fully determined.
    idx_.resize(static_cast<size_t>(n_vocab));
    for (int64_t i = 0; i < n_vocab; ++i) idx_[i] = static_cast<int32_t>(i);
    auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    int64_t n = n_vocab;
    if (p_.top_k > 0 && p_.top_k < n) {
        n = p_.top_k;
        std::partial_sort(idx_.begin(), idx_.begin() + n, idx_.end(), by_logit);
    } else {
        std::sort(idx_.begin(), idx_.end(), by_logit);
    }
    // Softmax at the temperature, in double.
    prob_.resize(static_cast<size_t>(n));
    const double mx = logits[idx_[0]];
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        prob_[i] = std::exp((static_cast<double>(logits[idx_[i]]) - mx) / p_.temperature);
        sum += prob_[i];
    }
    for (int64_t i = 0; i < n; ++i) prob_[i] /= sum;
    // Nucleus: the smallest prefix whose mass reaches top_p (at least one token).
    if (p_.top_p < 1.0f) {
        double cum = 0.0;
        int64_t keep = n;
        for (int64_t i = 0; i < n; ++i) {
            cum += prob_[i];
            if (cum >= p_.top_p) { keep = i + 1; break; }
        }
        n = keep;
        double s = 0.0;
        for (int64_t i = 0; i < n; ++i) s += prob_[i];
        for (int64_t i = 0; i < n; ++i) prob_[i] /= s;
    }
    const double u = uniform();
    double cum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        cum += prob_[i];
        if (u < cum) return idx_[i];
    }
    return idx_[n - 1];  // u within rounding of 1
}

} // namespace rp
