// Gemma 3 (#34): generated gemma3 models (embeddings times sqrt(n_embd), q/k norms, RMSNorms on the attention's
// and the feed-forward's outputs, GeGLU with GELU's tanh approximation, a sliding window on five layers of six
// with their own unscaled RoPE base, the global layers' linear RoPE scaling, a tied head) run as llama.cpp runs
// them: every position's logits within the bound of llama.cpp's fp16 GELU table (below) at 1, 37 and 300 tokens
// (windows smaller than the prompt), tied and untied, head_dim 64 over n_embd 80; the greedy continuation is
// llama.cpp's; the KV cache gives the full-sequence logits; each piece moves the logits far beyond the bound.
#include "arch_test_util.h"

#include "ggml_rp/cpu/backend.h"
#include "models/arch/hparams.h"
#include "models/arch/inference.h"
#include "models/arch/layer.h"
#include "models/arch/lora.h"
#include "models/text/tokenizer.h"
#include "tests/oracle/oracle_run.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace models_test;

namespace {

rp::SynthSpec gemma3(uint32_t embd, uint32_t heads, uint32_t heads_kv, uint32_t head_dim, uint32_t window, uint32_t layers, uint64_t seed,
                     bool tied = true, float linear = 0.0f) {
    rp::SynthSpec s;
    s.arch = "gemma3";
    s.vocab_from = model_path("vocab/ggml-vocab-llama-spm.gguf");
    s.n_embd = embd, s.n_head = heads, s.n_head_kv = heads_kv, s.head_dim = head_dim, s.n_layer = layers, s.n_ff = 96;
    s.n_swa = window, s.n_ctx_train = 4096, s.rope_base = 1e6f, s.rope_linear = linear, s.tied = tied, s.seed = seed;
    return s;
}

std::vector<int32_t> gemma_tokens(size_t n, int32_t salt) { return some_tokens(n, salt, 30000); }

// llama.cpp's CPU GeGLU reads GELU from an fp16 table indexed by the input rounded to fp16; InferenceSession
// reads the same table (OpGgmlOracle.GegluAgainstGgmlsGegluSplit: equal to ggml's op on every input). The table
// is a step function: where our f32 input and llama.cpp's differ by one rounding and straddle an fp16 rounding
// boundary, that activation differs by one fp16 step (2^-11 relative), and later layers carry the step on. One
// layer, or seven with the feed-forward's output zeroed, stays at ~2e-7 of the range like the other
// architectures; seven whole layers reach 1e-7..5.5e-5 at 1 token depending on the token (flips are rare and
// input dependent), 1.1e-4 at 37 and 1.5e-4 at 300. The bound, 1e-3, covers a different CPU's f32 rounding
// flipping other steps; every piece of the architecture moves the logits 48+ times further (EveryPieceChanges...).
constexpr double kGeluTableBound = 1e-3;

double vs_llama_cpp(const std::string & file, const std::vector<int32_t> & tokens, const std::string & what) {
    return models_test::compare_logits("gemma3", file, tokens, what);
}

} // namespace

TEST(Gemma3, LoadsItsTensorsAndHyperParameters) {
    TempDir d;
    rp::write_synth_model(gemma3(64, 4, 2, 32, 8, 7, 1, true, 8.0f), d.file("m.gguf"));
    const auto model = rp::Model::load(d.file("m.gguf"));
    const rp::HParams & hp = model->hparams();
    EXPECT_EQ(hp.arch->arch, rp::Arch::Gemma3);
    EXPECT_EQ(hp.n_swa, 8u);
    for (uint32_t il = 0; il < 7; ++il) EXPECT_EQ(hp.is_swa(il), il != 5) << il;  // five windowed layers of six
    EXPECT_EQ(hp.rope(0).freq_base, 10000.0f);                                       // windowed: 10000, unscaled
    EXPECT_EQ(hp.rope(0).freq_scale, 1.0f);
    EXPECT_EQ(hp.rope(5).freq_base, 1e6f);                                           // global: the file's base and scale
    EXPECT_EQ(hp.rope(5).freq_scale, 1.0f / 8.0f);
    EXPECT_EQ(hp.rope(5).mode, rp::RopeMode::Neox);
    EXPECT_EQ(hp.embd_scale, std::sqrt(64.0f));
    EXPECT_EQ(hp.attn_scale, 1.0f / std::sqrt(32.0f));
    EXPECT_EQ(hp.rms_eps, 1e-6f);
    const rp::LayerWeights & L = model->layers[1];
    for (const rp::Tensor * t : {L.q_norm, L.k_norm, L.attn_post_norm, L.ffn_norm, L.ffn_post_norm}) ASSERT_NE(t, nullptr);
    EXPECT_EQ(L.attn_post_norm->name, "blk.1.post_attention_norm.weight");
    EXPECT_EQ(L.ffn_post_norm->name, "blk.1.post_ffw_norm.weight");
    EXPECT_TRUE(model->tied_output());

    // The 27B model (62 layers) scales its queries by 1/sqrt(n_embd / n_head), as llama.cpp does.
    rp::SynthSpec big = rp::synth_preset("gemma-3-27b");
    big.weights = false;
    big.n_vocab = 256;
    rp::write_synth_model(big, d.file("27b.gguf"));
    const rp::HParams hp27 = rp::Model::load(d.file("27b.gguf"))->hparams();
    EXPECT_EQ(hp27.head_dim, 128u);
    EXPECT_EQ(hp27.attn_scale, 1.0f / std::sqrt(5376.0f / 32.0f));
}

TEST(Gemma3, MissingPiecesAreNamed) {
    TempDir d;
    rp::write_synth_model(gemma3(64, 4, 2, 16, 8, 2, 2), d.file("m.gguf"));
    const std::string m = d.file("m.gguf"), bad = d.file("bad.gguf");
    expect_load_fails(m, bad, without_tensor("blk.1.post_ffw_norm.weight"), "blk.1.post_ffw_norm.weight");
    expect_load_fails(m, bad, without_tensor("blk.0.attn_q_norm.weight"), "blk.0.attn_q_norm.weight");
    Variant no_window;
    no_window.edit_kvs = [](gguf::Writer & w) { w.remove("gemma3.attention.sliding_window"); };
    expect_load_fails(m, bad, no_window, "soft-capping");
}

TEST(Gemma3, LogitsEqualLlamaCpps) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    rp::write_synth_model(gemma3(96, 4, 2, 32, 8, 7, 11), d.file("m.gguf"));
    for (size_t n : {1, 37}) EXPECT_LE(vs_llama_cpp(d.file("m.gguf"), gemma_tokens(n, 1), "7 layers, tied, window 8"), kGeluTableBound);
}

// head_dim 64 with n_embd 80 (not a multiple of the 4 heads' 256), an untied head, linear RoPE scaling 8 on the
// global layers, a window of 16 under a 300-token prompt.
TEST(Gemma3, LogitsEqualLlamaCppsUntiedLongPrompt) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    rp::write_synth_model(gemma3(80, 4, 2, 64, 16, 6, 12, false, 8.0f), d.file("m.gguf"));
    EXPECT_LE(vs_llama_cpp(d.file("m.gguf"), gemma_tokens(300, 2), "hd64 n_embd 80 untied window 16 linear 8"), kGeluTableBound);
}

// Each piece of the architecture, taken out of our graph, moves the logits more than 20 times the bound above
// away from llama.cpp's (so the tests above would see any of them missing or wrong).
TEST(Gemma3, EveryPieceChangesTheLogits) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string file = d.file("m.gguf");
    rp::write_synth_model(gemma3(96, 4, 2, 32, 6, 7, 15, true, 8.0f), file);
    const PieceRemoval r(file, gemma_tokens(24, 4), kGeluTableBound);
    struct Piece {
        const char * what;
        std::function<void(rp::HParams &, rp::ArchTraits &, rp::ModelWeights &)> take_out;
    };
    const std::vector<Piece> pieces = {
        {"the embedding scale", [](rp::HParams & hp, rp::ArchTraits &, rp::ModelWeights &) { hp.embd_scale = 1.0f; }},
        {"the sliding window", [](rp::HParams & hp, rp::ArchTraits &, rp::ModelWeights &) { hp.n_swa = 0; }},
        {"the windowed layers' RoPE base", [](rp::HParams & hp, rp::ArchTraits &, rp::ModelWeights &) { hp.rope_freq_base_swa = hp.rope_freq_base; }},
        {"the global layers' RoPE scaling", [](rp::HParams & hp, rp::ArchTraits &, rp::ModelWeights &) { hp.rope_freq_scale = 1.0f; }},
        {"GELU (SiLU instead)", [](rp::HParams &, rp::ArchTraits & at, rp::ModelWeights &) { at.glu = rp::GluKind::Silu; }},
        {"the post-attention norms", [](rp::HParams &, rp::ArchTraits &, rp::ModelWeights & w) { for (auto & l : w.layers) l.attn_post_norm = nullptr; }},
        {"the post-feed-forward norms", [](rp::HParams &, rp::ArchTraits &, rp::ModelWeights & w) { for (auto & l : w.layers) l.ffn_post_norm = nullptr; }},
        {"the q/k norms", [](rp::HParams &, rp::ArchTraits &, rp::ModelWeights & w) { for (auto & l : w.layers) l.q_norm = l.k_norm = nullptr; }},
    };
    for (const Piece & p : pieces) {
        rp::HParams hp = r.model->hparams();
        rp::ArchTraits at = *hp.arch;
        hp.arch = &at;
        rp::ModelWeights w = r.as_built;
        p.take_out(hp, at, w);
        r.expect_moves("gemma3", p.what, hp, w);
    }
}

// An adapter we write on every matrix of every layer (attention and GeGLU), applied by llama.cpp (--lora),
// gives our logits with it.
TEST(Gemma3, AdaptersAsLlamaCppAppliesThem) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string base = d.file("base.gguf");
    rp::write_synth_model(gemma3(96, 4, 2, 32, 8, 7, 17, true, 8.0f), base);
    expect_adapter_as_llama_cpp(base, layer_targets(7, {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}),
                                gemma_tokens(24, 6), d.file("a.gguf"), 3, kGeluTableBound, 20);
}

// Token by token through the KV cache (the windowed layers' mask over the cache) gives the logits of the whole
// sequence at once, past the window.
TEST(Gemma3, KvCacheMatchesTheFullSequence) {
    TempDir d;
    rp::write_synth_model(gemma3(64, 4, 2, 16, 3, 7, 13), d.file("m.gguf"));
    const auto model = rp::Model::load(d.file("m.gguf"));
    const std::vector<int32_t> tokens = gemma_tokens(12, 3);
    expect_kv_cache_matches_full_sequence(*model, tokens);
}

TEST(Gemma3, GreedyGenerationMatchesLlamaCpp) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    rp::write_synth_model(gemma3(96, 4, 2, 32, 6, 7, 14), d.file("m.gguf"));
    expect_greedy_equals_llama_cpp(d.file("m.gguf"));
}
