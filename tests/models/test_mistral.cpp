// Mistral's models (#34). The older ones are llama files: Mistral Nemo's shape (head_dim 128 over n_embd 5120 / 32
// heads = 160: the head size is not n_embd / n_head), its RoPE base of 1e6 and its tekken vocabulary, run as
// llama.cpp runs them, here scaled down (head_dim 16 over n_embd 96 / 4 heads = 24): every position's
// logits within llama.cpp's float bound, the greedy continuation equal, and the prompt tokenized as llama.cpp
// tokenizes it. Ministral 3 is mistral3: a llama with YaRN (its cos / sin scale divided by the one of
// yarn_log_multiplier) whose queries carry Llama 4's attention temperature, log(floor(pos / n_ctx_orig) + 1) *
// scale + 1; generated mistral3 models with a training context far below the prompt run as llama.cpp runs them.
#include "arch_test_util.h"


#include <gtest/gtest.h>

#include <cmath>

using namespace models_test;

namespace {

// A vocabulary with tekken's pre-tokenizer (llama-bpe's 128k tokens, tokenizer.ggml.pre = "tekken").
std::string tekken_vocab(TempDir & d) {
    Variant v;
    v.edit_kvs = [](gguf::Writer & w) { w.set_string("tokenizer.ggml.pre", "tekken"); };
    write_variant(model_path("vocab/ggml-vocab-llama-bpe.gguf"), d.file("tekken.gguf"), v);
    return d.file("tekken.gguf");
}

rp::SynthSpec nemo_like(const std::string & vocab, uint64_t seed) {
    rp::SynthSpec s;
    s.arch = "llama";
    s.vocab_from = vocab;
    s.n_embd = 96, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 16, s.n_ff = 128, s.n_layer = 3, s.tied = true;
    s.n_ctx_train = 4096, s.rope_base = 1e6f, s.seed = seed;
    return s;
}

// A mistral3 whose YaRN context (16 tokens, factor `yarn`) and temperature floor sit far below a 40-token prompt.
rp::SynthSpec ministral_like(const std::string & vocab, uint64_t seed, float yarn, float temp, bool tied, float log_mul = 0.0f) {
    rp::SynthSpec s;
    s.arch = "mistral3";
    s.vocab_from = vocab;
    s.n_embd = 96, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32, s.n_ff = 128, s.n_layer = 3, s.tied = tied;
    s.n_ctx_train = 256, s.rope_base = 1e6f, s.seed = seed, s.attn_temp_scale = temp;
    if (yarn > 0.0f) s.yarn_factor = yarn, s.yarn_orig_ctx = 16, s.yarn_log_mul = log_mul;
    return s;
}

} // namespace

TEST(Mistral, Mistral3ReadsItsYarnAndTemperature) {
    TempDir d;
    rp::SynthSpec s = ministral_like(model_path("vocab/ggml-vocab-llama-bpe.gguf"), 1, 4.0f, 0.1f, false, 0.5f);
    s.weights = false;
    rp::write_synth_model(s, d.file("m.gguf"));
    const rp::HParams hp = rp::Model::load(d.file("m.gguf"))->hparams();
    EXPECT_EQ(hp.arch->arch, rp::Arch::Mistral3);
    EXPECT_EQ(hp.attn_temp_scale, 0.1f);
    EXPECT_EQ(hp.attn_temp_floor, 16u);  // the YaRN training context
    EXPECT_FLOAT_EQ(hp.rope_attn_factor, 1.0f / (1.0f + 0.05f * std::log(4.0f)));  // times YaRN's 1 + 0.1 ln 4: 1.1386 / 1.0693
    EXPECT_EQ(hp.rope_query(0).temp_scale, 0.1f);
    EXPECT_EQ(hp.rope(0).temp_scale, 0.0f);  // the keys' RoPE has no temperature
    // The 14B preset: its temperature floor is the YaRN training context.
    rp::SynthSpec big = rp::synth_preset("ministral-3-14b");
    big.weights = false;
    rp::write_synth_model(big, d.file("14b.gguf"));
    const auto m14 = rp::Model::load(d.file("14b.gguf"));
    EXPECT_EQ(m14->hparams().attn_temp_floor, 16384u);
}

// A query scale of its own (attention.scale) is refused by name, and so is a temperature without a context to
// count it from.
TEST(Mistral, Mistral3KeysWeDoNotRunAreNamed) {
    TempDir d;
    rp::SynthSpec s = ministral_like(model_path("vocab/ggml-vocab-llama-bpe.gguf"), 1, 0.0f, 0.1f, false);
    s.weights = false;
    rp::write_synth_model(s, d.file("m.gguf"));
    Variant scale;
    scale.edit_kvs = [](gguf::Writer & w) { w.set_f32("mistral3.attention.scale", 0.1f); };
    expect_load_fails(d.file("m.gguf"), d.file("bad.gguf"), scale, "mistral3.attention.scale");
    Variant no_ctx;
    no_ctx.edit_kvs = [](gguf::Writer & w) { w.set_u32("mistral3.context_length", 0); };
    expect_load_fails(d.file("m.gguf"), d.file("bad.gguf"), no_ctx, "mistral3.attention.temperature_scale");
}

TEST(Mistral, Mistral3LogitsEqualLlamaCpps) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string vocab = tekken_vocab(d);
    // untied without a log multiplier; tied with 1 (Ministral 3's: mscale = mscale_all_dim) and 0.5
    for (const auto & [tied, log_mul] : {std::pair<bool, float>{false, 0.0f}, {true, 1.0f}, {true, 0.5f}}) {
        const std::string file = d.file("m" + std::to_string(log_mul) + ".gguf");
        rp::write_synth_model(ministral_like(vocab, 31, 4.0f, 0.1f, tied, log_mul), file);
        const std::string what = std::string("mistral3 yarn 4 x 16, temperature 0.1, log_mul ") + std::to_string(log_mul) + (tied ? ", tied" : "");
        for (size_t n : {1, 40}) EXPECT_LE(compare_logits("mistral", file, some_tokens(n, 3, 100000), what), 1e-4);
    }
}

// Without the temperature or without the log multiplier's share of YaRN's cos / sin scale, our logits move far
// from llama.cpp's.
TEST(Mistral, Mistral3EveryPieceChangesTheLogits) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string file = d.file("m.gguf");
    rp::write_synth_model(ministral_like(tekken_vocab(d), 32, 4.0f, 0.1f, false, 0.5f), file);
    const PieceRemoval r(file, some_tokens(40, 4, 100000), 1e-4);
    rp::HParams no_temp = r.model->hparams();
    no_temp.attn_temp_scale = 0.0f;
    rp::HParams scaled = r.model->hparams();
    scaled.rope_attn_factor = 1.0f;
    r.expect_moves("mistral", "the attention temperature", no_temp, r.as_built);
    r.expect_moves("mistral", "the log multiplier", scaled, r.as_built);
}

TEST(Mistral, Mistral3GreedyAndKvCacheEqualLlamaCpp) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    rp::write_synth_model(ministral_like(tekken_vocab(d), 33, 4.0f, 0.1f, true), d.file("m.gguf"));
    const auto model = rp::Model::load(d.file("m.gguf"));
    const std::vector<int32_t> tokens = some_tokens(40, 5, 100000);
    expect_kv_cache_matches_full_sequence(*model, tokens);
    expect_greedy_equals_llama_cpp(d.file("m.gguf"));
}

// An adapter we write on every matrix of every layer, applied by llama.cpp (--lora), gives our logits with it.
TEST(Mistral, Mistral3AdaptersAsLlamaCppAppliesThem) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string base = d.file("base.gguf");
    rp::write_synth_model(ministral_like(tekken_vocab(d), 34, 4.0f, 0.1f, false, 1.0f), base);
    expect_adapter_as_llama_cpp(base, layer_targets(3, {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}),
                                some_tokens(40, 6, 100000), d.file("a.gguf"), 5);
}

TEST(Mistral, NemoShapedLlamaEqualsLlamaCpp) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string file = d.file("nemo.gguf");
    rp::write_synth_model(nemo_like(tekken_vocab(d), 21), file);
    const auto model = rp::Model::load(file);
    EXPECT_EQ(model->hparams().head_dim, 16u);
    EXPECT_NE(model->hparams().head_dim * model->hparams().n_head, model->hparams().n_embd);
    for (size_t n : {1, 40}) EXPECT_LE(compare_logits("mistral", file, some_tokens(n, 7, 100000), "nemo-shaped llama"), 1e-4);
    expect_greedy_equals_llama_cpp(file, 16);
}

