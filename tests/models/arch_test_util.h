// The checks every architecture's test file (test_gpt_oss.cpp, test_gemma3.cpp, ...) runs against llama.cpp:
// its logits of every position, a file missing a piece refused by name, an adapter as llama.cpp applies it,
// the KV cache against the whole sequence, and the greedy continuation.
#pragma once

#include "models_test_util.h"

#include "base/error.h"
#include "models/arch/lora.h"
#include "models/text/tokenizer.h"
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
inline std::vector<float> oracle_logits(const std::string & file, const std::vector<int32_t> & tokens, size_t n,
                                        const std::string & lora = "") {
    TempDir d;
    const auto res = rp::oracle::run("logits " + rp::oracle::quote(file) + " --tokens " + rp::oracle::quote(rp::oracle::id_list(tokens)) +
                                     (lora.empty() ? "" : " --lora " + rp::oracle::quote(lora)) + " --out " +
                                     rp::oracle::quote(d.file("ref.f32")));
    EXPECT_EQ(res.status, 0) << file;
    if (res.status != 0) return {};
    return read_f32(d.file("ref.f32"), n);
}

// Our logits of every position against llama.cpp's, printed under `tag`; returns max |diff| / range.
inline double compare_logits(const char * tag, const std::string & file, const std::vector<int32_t> & tokens, const std::string & what) {
    const auto model = rp::Model::load(file);
    const std::vector<float> ours = forward_all(*model, tokens);
    const std::vector<float> ref = oracle_logits(file, tokens, ours.size());
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

// Token by token through the KV cache: the largest difference from the logits of the whole sequence at once.
inline float kv_cache_vs_full_sequence(const rp::Model & model, const std::vector<int32_t> & tokens) {
    const std::vector<float> all = forward_all(model, tokens);
    rp::InferenceSession s(model, static_cast<int64_t>(tokens.size()), 1);
    const size_t V = model.hparams().n_vocab;
    float worst = 0.0f;
    for (size_t i = 0; i < tokens.size(); ++i) {
        const std::vector<float> step = s.eval({tokens[i]});
        EXPECT_EQ(step.size(), V);
        if (step.size() != V) return INFINITY;
        for (size_t v = 0; v < V; ++v) worst = std::max(worst, std::fabs(step[v] - all[i * V + v]));
    }
    return worst;
}

// Our greedy continuation of `prompt` (n_new tokens) equals llama.cpp's.
inline void expect_greedy_equals_llama_cpp(const std::string & file, const std::string & prompt, int n_new) {
    const std::vector<int32_t> ref = rp::oracle::greedy_continuation(file, prompt, n_new);
    ASSERT_FALSE(ref.empty());
    auto model = rp::Model::load(file);
    rp::Tokenizer tok(model->file());
    const std::vector<int32_t> ids = tok.encode(prompt, true, false);
    rp::InferenceSession s(*model, static_cast<int64_t>(ids.size()) + n_new, 1);
    EXPECT_EQ(rp::complete_greedy(s, tok, ids, n_new), ref);
}

} // namespace models_test
