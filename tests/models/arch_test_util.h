// The checks every architecture's test file (test_gpt_oss.cpp, test_gemma3.cpp, ...) runs against llama.cpp:
// its logits of every position, a file missing a piece refused by name, an adapter as llama.cpp applies it,
// the KV cache against the whole sequence, and the greedy continuation.
#pragma once

#include "models_test_util.h"

#include "base/error.h"
#include "ggml_rp/cpu/backend.h"
#include "models/arch/layer.h"
#include "models/arch/lora.h"
#include "models/text/tokenizer.h"
#include "tests/common/cpu_forward.h"
#include "tests/oracle/oracle_run.h"

#include <gtest/gtest.h>

#include <random>

namespace models_test {

// n token ids from 100 up, spread over `span` ids, shifted by `salt`.
inline std::vector<int32_t> some_tokens(size_t n, int32_t salt, int32_t span = 20000) {
    std::vector<int32_t> t;
    for (size_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(100 + (37 * i + 11 * salt) % span));
    return t;
}

// llama.cpp's logits of every position (n values), with `lora` applied when given; empty if it failed.
// step > 0: llama.cpp decodes `step` tokens at a time (1: recurrent layers in their one-token form).
inline std::vector<float> oracle_logits(const std::string & file, const std::vector<int32_t> & tokens, size_t n,
                                        const std::string & lora = "", int step = 0) {
    TempDir d;
    const auto res = rp::oracle::run("logits " + rp::oracle::quote(file) + " --tokens " + rp::oracle::quote(rp::oracle::id_list(tokens)) +
                                     (lora.empty() ? "" : " --lora " + rp::oracle::quote(lora)) +
                                     (step > 0 ? " --step " + std::to_string(step) : "") + " --out " +
                                     rp::oracle::quote(d.file("ref.f32")));
    EXPECT_EQ(res.status, 0) << file;
    if (res.status != 0) return {};
    return read_f32(d.file("ref.f32"), n);
}

// Our logits of every position against llama.cpp's, printed under `tag`; returns max |diff| / range.
inline double compare_logits(const char * tag, const std::string & file, const std::vector<int32_t> & tokens, const std::string & what,
                             int step = 0) {
    const auto model = rp::Model::load(file);
    const std::vector<float> ours = forward_all(*model, tokens);
    const std::vector<float> ref = oracle_logits(file, tokens, ours.size(), "", step);
    EXPECT_EQ(ref.size(), ours.size()) << what;
    if (ref.size() != ours.size()) return 1.0;
    const double diff = max_abs_diff(ours, ref), range = value_range(ref);
    std::printf("[ %s ] %s, %zu tokens: max |ours - llama.cpp| = %.3g of a %.2f range (%.2g)\n", tag, what.c_str(), tokens.size(), diff,
                range, diff / range);
    return diff / range;
}

// Loading the variant `v` of `src` (written to `dst`) fails with an error that contains `needle`.
inline void expect_load_fails(const std::string & src, const std::string & dst, const Variant & v, const std::string & needle) {
    write_variant(src, dst, v);
    try {
        rp::Model::load(dst);
        ADD_FAILURE() << "loaded without " << needle;
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

// A variant of a file without the tensor `name`.
inline Variant without_tensor(const std::string & name) {
    Variant v;
    v.keep = [name](const gguf::TensorInfo & t) { return t.name != name; };
    return v;
}

// Every LoRA factor uniform in [-amplitude, amplitude] (seeded): B non-zero, so the adapter moves the logits.
inline void randomize_adapter(rp::LoraAdapter & ad, uint64_t seed, double amplitude) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-amplitude, amplitude);
    for (const rp::LoraTensor & t : ad.tensors())
        for (rp::Tensor * x : {t.a, t.b}) {
            std::vector<float> v(static_cast<size_t>(x->nelements()));
            for (float & e : v) e = static_cast<float>(u(rng));
            rp::tensor_set_f32(x, v);
        }
}

// Our logits of every position with the graph built from `hp` and `w` (the model's own, or with a piece taken
// out: the tests that show each piece matters).
inline std::vector<float> logits_with(const rp::HParams & hp, const rp::ModelWeights & w, const std::vector<int32_t> & tokens) {
    rp::Context ctx;
    const TokenLeaves in = token_leaves(ctx, tokens);
    return rp_test::forward_on_cpu(rp::build_head_logits(ctx, hp, w, rp::build_decoder(ctx, hp, w, in.ids, in.pos)));
}

// The tests that show each piece of an architecture matters: llama.cpp's logits of `tokens` on `file`, ours as
// built (the weights of a context of n_ctx tokens) within `bound` of their range, and ours with a piece taken out (the
// graph built from other hyper-parameters, traits or weights) more than `times` that tolerance away.
struct PieceRemoval {
    std::unique_ptr<rp::Model> model;
    rp::ModelWeights as_built;
    std::vector<int32_t> tokens;
    std::vector<float> ref;
    float tol = 0;
    PieceRemoval(const std::string & file, std::vector<int32_t> toks, double bound, int64_t n_ctx = 0)
        : model(rp::Model::load(file)), as_built(model->graph_weights(n_ctx)), tokens(std::move(toks)) {
        ref = oracle_logits(file, tokens, tokens.size() * model->hparams().n_vocab);
        EXPECT_FALSE(ref.empty()) << file;
        tol = static_cast<float>(bound) * value_range(ref);
        EXPECT_LE(diff(model->hparams(), as_built), tol) << "as built";
    }
    float diff(const rp::HParams & hp, const rp::ModelWeights & w) const {
        return ref.empty() ? 0.0f : max_abs_diff(logits_with(hp, w, tokens), ref);
    }
    void expect_moves(const char * tag, const std::string & what, const rp::HParams & hp, const rp::ModelWeights & w, float times = 20) const {
        const float d = diff(hp, w);
        std::printf("[ %s ] without %s: max |ours - llama.cpp| = %.3g (tolerance %.3g)\n", tag, what.c_str(), d, tol);
        EXPECT_GT(d, times * tol) << what;
    }
};

// The model `s` written to d/`name` (with weights = false every weight a hole: a sparse file of shapes) and loaded.
inline std::unique_ptr<rp::Model> load_synth(const TempDir & d, rp::SynthSpec s, bool weights = true, const std::string & name = "m.gguf") {
    s.weights = weights;
    rp::write_synth_model(s, d.file(name));
    return rp::Model::load(d.file(name));
}

// Every "blk.<il>.<kind>.weight" for il < n_layer, in layer order.
inline std::vector<std::string> layer_targets(uint32_t n_layer, std::initializer_list<const char *> kinds) {
    std::vector<std::string> t;
    for (uint32_t il = 0; il < n_layer; ++il)
        for (const char * k : kinds) t.push_back("blk." + std::to_string(il) + "." + k + ".weight");
    return t;
}

// A random adapter (rank 4, alpha 8, factors in [-0.1, 0.1]) on `targets`, saved to `adapter_path`, then read
// back and applied by us and by llama.cpp (--lora) to every position of `tokens`: our logits with it within `bound`
// of llama.cpp's range, and without it (the adapter's own effect) more than `times` that away.
inline void expect_adapter_as_llama_cpp(const std::string & base, const std::vector<std::string> & targets,
                                        const std::vector<int32_t> & tokens, const std::string & adapter_path, uint64_t seed,
                                        double bound = 1e-4, double times = 100) {
    const auto model = rp::Model::load(base);
    auto ad = rp::LoraAdapter::create(*model, targets, 4, 8.0f);
    randomize_adapter(*ad, seed, 0.1);
    ad->save(adapter_path);
    const auto loaded = rp::LoraAdapter::load(adapter_path, *model);
    rp::LoraSet lora;
    lora.add(*loaded);
    const std::vector<float> ours = forward_all(*model, tokens, &lora);
    const std::vector<float> ref = oracle_logits(base, tokens, ours.size(), adapter_path);
    ASSERT_EQ(ref.size(), ours.size()) << base;
    const float diff = max_abs_diff(ours, ref), range = value_range(ref), without = max_abs_diff(forward_all(*model, tokens), ref);
    std::printf("[ adapter ] %s: max |ours - llama.cpp| = %.3g of a %.2f range (%.2g); without it %.3g\n", base.c_str(), diff, range,
                diff / range, without);
    EXPECT_LE(diff, bound * range) << base;
    EXPECT_GT(without, times * bound * range) << base;
}

// Token by token through the KV cache gives the logits of the whole sequence at once (checked against
// llama.cpp's by each architecture's logits test) within 1e-4 of their range.
inline void expect_kv_cache_matches_full_sequence(const rp::Model & model, const std::vector<int32_t> & tokens) {
    const std::vector<float> all = forward_all(model, tokens);
    rp::InferenceSession s(model, static_cast<int64_t>(tokens.size()), 1);
    const size_t V = model.hparams().n_vocab;
    float worst = 0.0f;
    for (size_t i = 0; i < tokens.size(); ++i) {
        const std::vector<float> step = s.eval({tokens[i]});
        ASSERT_EQ(step.size(), V) << "position " << i;
        for (size_t v = 0; v < V; ++v) worst = std::max(worst, std::fabs(step[v] - all[i * V + v]));
    }
    EXPECT_LE(worst, 1e-4f * value_range(all));
}

// Our greedy continuation of `prompt` (n_new tokens) equals llama.cpp's.
inline void expect_greedy_equals_llama_cpp(const std::string & file, int n_new = 24,
                                           const std::string & prompt = "Once upon a time there was a little robot who") {
    const std::vector<int32_t> ref = rp::oracle::greedy_continuation(file, prompt, n_new);
    ASSERT_FALSE(ref.empty());
    auto model = rp::Model::load(file);
    rp::Tokenizer tok(model->file());
    const std::vector<int32_t> ids = tok.encode(prompt, true, false);
    rp::InferenceSession s(*model, static_cast<int64_t>(ids.size()) + n_new, 1);
    EXPECT_EQ(rp::complete_greedy(s, tok, ids, n_new), ref);
}

} // namespace models_test
