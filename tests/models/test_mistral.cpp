// Mistral's models (#34). The older ones are llama files: Mistral Nemo's shape (head_dim 128 over n_embd 5120 / 32
// heads = 160: the head size is not n_embd / n_head), its RoPE base of 1e6 and its tekken vocabulary, run as
// llama.cpp runs them, here scaled down (head_dim 16 over n_embd 96 / 4 heads = 24): every position's
// logits within llama.cpp's float bound, the greedy continuation equal, and the prompt tokenized as llama.cpp
// tokenizes it. Ministral 3 is mistral3: a llama with YaRN (its cos / sin scale divided by the one of
// yarn_log_multiplier) whose queries carry Llama 4's attention temperature, log(floor(pos / n_ctx_orig) + 1) *
// scale + 1; generated mistral3 models with a training context far below the prompt run as llama.cpp runs them.
#include "arch_test_util.h"

#include "ggml_rp/cpu/backend.h"
#include "models/arch/layer.h"

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

// Our logits of every position with the graph built from `hp` (the model's, or with a piece taken out).
std::vector<float> logits_with(const rp::Model & m, const rp::HParams & hp, const std::vector<int32_t> & tokens) {
    const int64_t T = static_cast<int64_t>(tokens.size());
    rp::Context ctx;
    rp::Tensor * ids = ctx.new_tensor(rp::DType::I32, T);
    rp::Tensor * pos = ctx.new_tensor(rp::DType::I32, T);
    ctx.alloc_data(ids);
    ctx.alloc_data(pos);
    rp::tensor_set_i32(ids, tokens);
    for (int64_t i = 0; i < T; ++i) pos->data_as<int32_t>()[i] = static_cast<int32_t>(i);
    const rp::ModelWeights w = m.graph_weights();
    rp::Tensor * logits = rp::build_head_logits(ctx, hp, w, rp::build_decoder(ctx, hp, w, ids, pos));
    rp::Graph g;
    rp::build_forward(g, logits);
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g);
    return rp::tensor_get_f32(logits);
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
    const auto model = rp::Model::load(file);
    const std::vector<int32_t> tokens = some_tokens(40, 4, 100000);
    const std::vector<float> ref = oracle_logits(file, tokens, tokens.size() * model->hparams().n_vocab);
    ASSERT_FALSE(ref.empty());
    const float tol = 1e-4f * value_range(ref);
    EXPECT_LE(max_abs_diff(logits_with(*model, model->hparams(), tokens), ref), tol);
    rp::HParams no_temp = model->hparams();
    no_temp.attn_temp_scale = 0.0f;
    rp::HParams scaled = model->hparams();
    scaled.rope_attn_factor = 1.0f;
    for (const auto & [what, hp] : {std::pair<const char *, rp::HParams>{"the attention temperature", no_temp},
                                    {"the log multiplier", scaled}}) {
        const float diff = max_abs_diff(logits_with(*model, hp, tokens), ref);
        std::printf("[ mistral ] without %s: max |ours - llama.cpp| = %.3g (tolerance %.3g)\n", what, diff, tol);
        EXPECT_GT(diff, 20 * tol) << what;
    }
}

TEST(Mistral, Mistral3GreedyAndKvCacheEqualLlamaCpp) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    rp::write_synth_model(ministral_like(tekken_vocab(d), 33, 4.0f, 0.1f, true), d.file("m.gguf"));
    const auto model = rp::Model::load(d.file("m.gguf"));
    const std::vector<int32_t> tokens = some_tokens(40, 5, 100000);
    EXPECT_LE(kv_cache_vs_full_sequence(*model, tokens), 1e-4f * value_range(forward_all(*model, tokens)));
    expect_greedy_equals_llama_cpp(d.file("m.gguf"), "Once upon a time there was a little robot who", 24);
}

// An adapter we write on every matrix of every layer, applied by llama.cpp (--lora), gives our logits with it.
TEST(Mistral, Mistral3AdaptersAsLlamaCppAppliesThem) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string base = d.file("base.gguf");
    rp::write_synth_model(ministral_like(tekken_vocab(d), 34, 4.0f, 0.1f, false, 1.0f), base);
    const auto model = rp::Model::load(base);
    std::vector<std::string> targets;
    for (int il = 0; il < 3; ++il)
        for (const char * k : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"})
            targets.push_back("blk." + std::to_string(il) + "." + k + ".weight");
    auto ad = rp::LoraAdapter::create(*model, targets, 4, 8.0f);
    randomize_adapter(*ad, 5, 0.1);
    ad->save(d.file("a.gguf"));
    const auto loaded = rp::LoraAdapter::load(d.file("a.gguf"), *model);
    rp::LoraSet lora;
    lora.add(*loaded);
    const std::vector<int32_t> tokens = some_tokens(40, 6, 100000);
    const std::vector<float> ours = forward_all(*model, tokens, &lora);
    const std::vector<float> ref = oracle_logits(base, tokens, ours.size(), d.file("a.gguf"));
    ASSERT_FALSE(ref.empty());
    const float diff = max_abs_diff(ours, ref), range = value_range(ref);
    const float without = max_abs_diff(forward_all(*model, tokens), ref);
    std::printf("[ mistral ] with the adapter: max |ours - llama.cpp| = %.3g of a %.2f range (%.2g); without it %.3g\n", diff, range,
                diff / range, without);
    EXPECT_LE(diff, 1e-4f * range);
    EXPECT_GT(without, 100 * 1e-4f * range);
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
    expect_greedy_equals_llama_cpp(file, "Once upon a time there was a little robot who", 16);
}

