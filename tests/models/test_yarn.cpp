// YaRN rope scaling read from a model file (rope.scaling.type = yarn, its factor and training context): our
// logits equal llama.cpp's (rp-oracle logits) on a qwen3 with a 4x extension of a 512-token context, within
// the F32 bound of the other logit tests (1e-4 x the logit range), and differ from the same model without
// the scaling (so the keys are read).
#include "models_test_util.h"

#include "models/arch/hparams.h"
#include "tests/oracle/oracle_run.h"

#include <gtest/gtest.h>

using namespace models_test;

namespace {

// A random qwen3 with the Qwen vocabulary, and the same file with YaRN keys.
void write_models(const TempDir & d) {
    rp::SynthSpec s;
    s.arch = "qwen3";
    s.vocab_from = model_path("vocab/ggml-vocab-qwen2.gguf");
    s.n_embd = 64, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 16, s.n_ff = 96, s.n_layer = 2, s.n_ctx_train = 2048;
    s.rope_base = 1e6f;
    rp::write_synth_model(s, d.file("plain.gguf"));
    Variant v;
    v.edit_kvs = [](gguf::Writer & w) {
        w.set_string("qwen3.rope.scaling.type", "yarn");
        w.set_f32("qwen3.rope.scaling.factor", 4.0f);
        w.set_u32("qwen3.rope.scaling.original_context_length", 512);
    };
    write_variant(d.file("plain.gguf"), d.file("yarn.gguf"), v);
}

} // namespace

TEST(ModelYarn, LogitsEqualLlamaCpps) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    write_models(d);
    const auto model = rp::Model::load(d.file("yarn.gguf"));
    const rp::HParams & hp = model->hparams();
    EXPECT_EQ(hp.rope_freq_scale, 0.25f);
    EXPECT_EQ(hp.rope_ext_factor, 1.0f);
    EXPECT_EQ(hp.rope_n_ctx_orig, 512u);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 40; ++i) tokens.push_back(100 + 37 * i % 5000);
    const std::vector<float> ours = forward_all(*model, tokens);
    std::string ids;
    for (int32_t t : tokens) ids += (ids.empty() ? "" : std::string(" ")) + std::to_string(t);
    const auto res = rp::oracle::run("logits " + rp::oracle::quote(d.file("yarn.gguf")) + " --tokens " + rp::oracle::quote(ids) + " --out " +
                                     rp::oracle::quote(d.file("ref.f32")));
    ASSERT_EQ(res.status, 0);
    const std::vector<float> ref = read_f32(d.file("ref.f32"), ours.size());
    ASSERT_EQ(ref.size(), ours.size());
    const float diff = max_abs_diff(ours, ref), range = value_range(ref);
    const std::vector<float> plain = forward_all(*rp::Model::load(d.file("plain.gguf")), tokens);
    const float unscaled = max_abs_diff(plain, ref);
    std::printf("[ yarn ] max |ours - llama.cpp| = %.3g (range %.2f); without the scaling %.3g\n", diff, range, unscaled);
    EXPECT_LE(diff, 1e-4f * range);
    EXPECT_GT(unscaled, 100 * diff) << "the scaling changes the logits";
}
