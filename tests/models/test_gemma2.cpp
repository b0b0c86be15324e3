// Gemma 2 (#34): gemma3's decoder without the q/k norms, with a window on every other layer (one RoPE base for
// all) and logit soft-capping, cap tanh(x / cap), of the attention (attn_logit_softcapping, default 50) and of the
// final logits (final_logit_softcapping, default 30). Generated gemma2 models (caps small enough to bend these
// models' logits: 2 and 5, and the defaults) run as llama.cpp runs them, within the bound of its fp16 GELU table
// (test_gemma3.cpp); each piece moves the logits far beyond it; adapters apply as llama.cpp applies them.
#include "arch_test_util.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace models_test;

namespace {

// llama.cpp's CPU GeGLU reads GELU from an fp16 table (test_gemma3.cpp's kGeluTableBound).
constexpr double kGeluTableBound = 1e-3;

rp::SynthSpec gemma2(uint32_t window, uint32_t layers, uint64_t seed, float attn_cap = 2.0f, float final_cap = 5.0f) {
    rp::SynthSpec s;
    s.arch = "gemma2";
    s.vocab_from = model_path("vocab/ggml-vocab-llama-spm.gguf");
    s.n_embd = 96, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32, s.n_layer = layers, s.n_ff = 96;
    s.n_swa = window, s.n_ctx_train = 4096, s.tied = true, s.seed = seed;
    s.attn_softcap = attn_cap, s.final_softcap = final_cap;
    return s;
}

std::vector<int32_t> gemma_tokens(size_t n, int32_t salt) { return some_tokens(n, salt, 30000); }

} // namespace

TEST(Gemma2, LoadsItsTensorsAndHyperParameters) {
    TempDir d;
    const auto model = load_synth(d, gemma2(8, 5, 1), false);
    const rp::HParams & hp = model->hparams();
    EXPECT_EQ(hp.arch->arch, rp::Arch::Gemma2);
    EXPECT_EQ(hp.n_swa, 8u);
    for (uint32_t il = 0; il < 5; ++il) EXPECT_EQ(hp.is_swa(il), il % 2 == 0) << il;  // every other layer, from the first
    EXPECT_EQ(hp.rope(0).freq_base, hp.rope(1).freq_base);                          // one RoPE base
    EXPECT_EQ(hp.attn_softcap, 2.0f);
    EXPECT_EQ(hp.final_softcap, 5.0f);
    EXPECT_EQ(hp.embd_scale, std::sqrt(96.0f));
    EXPECT_EQ(hp.attn_scale, 1.0f / std::sqrt(32.0f));
    const rp::LayerWeights & L = model->layers[1];
    EXPECT_EQ(L.q_norm, nullptr);
    for (const rp::Tensor * t : {L.attn_post_norm, L.ffn_norm, L.ffn_post_norm}) ASSERT_NE(t, nullptr);
    // Without the keys, llama.cpp's defaults: a 4096-token window and caps of 50 and 30.
    Variant bare;
    bare.edit_kvs = [](gguf::Writer & w) {
        for (const char * k : {"gemma2.attention.sliding_window", "gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping"}) w.remove(k);
    };
    write_variant(d.file("m.gguf"), d.file("bare.gguf"), bare);
    const rp::HParams hb = rp::Model::load(d.file("bare.gguf"))->hparams();
    EXPECT_EQ(hb.n_swa, 4096u);
    EXPECT_EQ(hb.attn_softcap, 50.0f);
    EXPECT_EQ(hb.final_softcap, 30.0f);
    // The 27B model (46 layers) scales its queries by 1/sqrt(n_embd / n_head), as llama.cpp does.
    rp::SynthSpec big = rp::synth_preset("gemma-2-27b");
    big.weights = false;
    big.n_vocab = 256;
    rp::write_synth_model(big, d.file("27b.gguf"));
    EXPECT_EQ(rp::Model::load(d.file("27b.gguf"))->hparams().attn_scale, 1.0f / std::sqrt(4608.0f / 32.0f));
    // Its head is token_embd: a file with an output.weight is refused, as llama.cpp refuses it.
    Variant untied;
    untied.extra = [](gguf::Writer & w) {
        const int64_t ne[2] = {96, 32000};
        w.add_tensor("output.weight", gguf::TensorType::F32, 2, ne, gguf::Writer::Fill{});
    };
    expect_load_fails(d.file("m.gguf"), d.file("untied.gguf"), untied, "output.weight: unexpected tensor, not used by the gemma2 graph");
    // A cap that is not a positive number is refused by name.
    Variant bad;
    bad.edit_kvs = [](gguf::Writer & w) { w.set_f32("gemma2.final_logit_softcapping", -1.0f); };
    expect_load_fails(d.file("m.gguf"), d.file("bad.gguf"), bad, "gemma2.final_logit_softcapping");
}

TEST(Gemma2, LogitsEqualLlamaCpps) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    rp::write_synth_model(gemma2(6, 5, 11), d.file("m.gguf"));
    for (size_t n : {1, 37})
        EXPECT_LE(compare_logits("gemma2", d.file("m.gguf"), gemma_tokens(n, 1), "5 layers, tied, window 6, caps 2 and 5"), kGeluTableBound);
    // llama.cpp's default caps (50, 30).
    rp::write_synth_model(gemma2(6, 5, 12, 0.0f, 0.0f), d.file("d.gguf"));
    EXPECT_LE(compare_logits("gemma2", d.file("d.gguf"), gemma_tokens(37, 2), "5 layers, default caps"), kGeluTableBound);
}

// Each piece of the architecture, taken out of our graph, moves the logits more than 20 times the bound away from
// llama.cpp's.
TEST(Gemma2, EveryPieceChangesTheLogits) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string file = d.file("m.gguf");
    rp::write_synth_model(gemma2(6, 5, 15), file);
    const PieceRemoval r(file, gemma_tokens(24, 4), kGeluTableBound);
    rp::HParams no_attn_cap = r.model->hparams(), no_final_cap = r.model->hparams(), no_window = r.model->hparams();
    no_attn_cap.attn_softcap = 0.0f;
    no_final_cap.final_softcap = 0.0f;
    no_window.n_swa = 0;
    r.expect_moves("gemma2", "the attention's soft-cap", no_attn_cap, r.as_built);
    r.expect_moves("gemma2", "the final soft-cap", no_final_cap, r.as_built);
    r.expect_moves("gemma2", "the sliding window", no_window, r.as_built);
    rp::ModelWeights no_post = r.as_built;
    for (rp::LayerWeights & l : no_post.layers) l.attn_post_norm = l.ffn_post_norm = nullptr;
    r.expect_moves("gemma2", "the post norms", r.model->hparams(), no_post);
}

TEST(Gemma2, AdaptersAsLlamaCppAppliesThem) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string base = d.file("base.gguf");
    rp::write_synth_model(gemma2(6, 5, 17), base);
    expect_adapter_as_llama_cpp(base, layer_targets(5, {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}),
                                gemma_tokens(24, 6), d.file("a.gguf"), 3, kGeluTableBound, 20);
}

TEST(Gemma2, KvCacheAndGreedyEqualLlamaCpp) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const auto model = load_synth(d, gemma2(3, 5, 13));
    const std::vector<int32_t> tokens = gemma_tokens(12, 3);
    expect_kv_cache_matches_full_sequence(*model, tokens);
    expect_greedy_equals_llama_cpp(d.file("m.gguf"));
}
