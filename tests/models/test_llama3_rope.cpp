// Llama 3.1 / 3.2 / 3.3 files carry rope_freqs.weight: RoPE frequency factors that slow the low-frequency pairs
// (Meta's apply_scaling: factor 8 or 32 beyond the original 8192-token context's wavelength, a blend between).
// llama.cpp divides each pair's angle by its factor (ggml_rope_ext's c); so do we, from the one tensor every layer
// shares. Generated llama and mistral3 models with factors that matter at these lengths (an original context of 64
// tokens, head_dim 32: 11 of 16 pairs slowed 8 times, 3 blended) run as llama.cpp runs them, and without the factors their
// logits move far away. The factors are a constant of the model: a full finetune leaves them alone.
#include "arch_test_util.h"

#include "models/train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace models_test;

namespace {

rp::SynthSpec llama3_like(uint64_t seed, float factor, const std::string & arch = "llama", bool tied = false) {
    rp::SynthSpec s;
    s.arch = arch;
    s.vocab_from = model_path("vocab/ggml-vocab-llama-bpe.gguf");
    s.n_embd = 128, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32, s.n_ff = 160, s.n_layer = 3, s.tied = tied;
    s.n_ctx_train = 4096, s.rope_base = 10000.0f, s.seed = seed;
    s.llama3_rope = factor, s.llama3_rope_ctx = 64;
    return s;
}

} // namespace

TEST(Llama3Rope, EveryLayerReadsTheOneTensor) {
    TempDir d;
    const auto model = load_synth(d, llama3_like(1, 8.0f));
    rp::Tensor * f = model->find("rope_freqs.weight");
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->ne[0], 16);
    for (const rp::LayerWeights & l : model->layers) EXPECT_EQ(l.rope_freqs, f);
    // Meta's rule over a 64-token context (wavelengths 2 pi 10000^(i / 16): 6.3, 11.2, 19.9, 35.3, 62.8, 112, ...):
    // pairs 0 and 1, below 16 tokens, keep their frequency; 5 and up, beyond 64, are slowed 8 times; 2-4 blend.
    const std::vector<float> v = rp::tensor_get_f32(f);
    for (int i = 0; i < 2; ++i) EXPECT_EQ(v[i], 1.0f) << i;
    for (int i = 5; i < 16; ++i) EXPECT_EQ(v[i], 8.0f) << i;
    for (int i = 2; i < 5; ++i) EXPECT_TRUE(v[i] > v[i - 1] && v[i] < 8.0f) << i << ": " << v[i];
    // A file whose factors do not fit n_rot / 2 is refused by name.
    Variant bad;
    bad.reshape = [](gguf::TensorInfo & t) {
        if (t.name == "rope_freqs.weight") t.ne[0] = 8;
    };
    expect_load_fails(d.file("m.gguf"), d.file("bad.gguf"), bad, "rope_freqs.weight: expected [16]");
    // qwen3 does not read them (nor does llama.cpp): an unexpected tensor.
    Variant extra;
    extra.extra = [](gguf::Writer & w) {
        const int64_t ne[1] = {16};
        w.add_tensor("rope_freqs.weight", gguf::TensorType::F32, 1, ne, gguf::Writer::Fill{});
    };
    load_synth(d, llama3_like(1, 0.0f, "qwen3"), false, "q.gguf");
    expect_load_fails(d.file("q.gguf"), d.file("q2.gguf"), extra, "rope_freqs.weight: unexpected tensor, not used by the qwen3 graph");
}

TEST(Llama3Rope, LogitsEqualLlamaCpps) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    for (const auto & [arch, factor, tied] : {std::tuple<const char *, float, bool>{"llama", 8.0f, false}, {"llama", 32.0f, true},
                                              {"mistral3", 8.0f, false}}) {
        const std::string file = d.file(std::string(arch) + std::to_string(factor) + ".gguf");
        rp::write_synth_model(llama3_like(41, factor, arch, tied), file);
        const std::string what = std::string(arch) + ", Llama 3 RoPE factor " + std::to_string(factor) + (tied ? ", tied" : "");
        for (size_t n : {1, 40}) EXPECT_LE(compare_logits("llama3", file, some_tokens(n, 3, 100000), what), 1e-4);
    }
}

// Without the factors our logits move far from llama.cpp's.
TEST(Llama3Rope, TheFactorsChangeTheLogits) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string file = d.file("m.gguf");
    rp::write_synth_model(llama3_like(42, 8.0f), file);
    const PieceRemoval r(file, some_tokens(40, 4, 100000), 1e-4);
    rp::ModelWeights without = r.as_built;
    for (rp::LayerWeights & l : without.layers) l.rope_freqs = nullptr;
    r.expect_moves("llama3", "the RoPE factors", r.model->hparams(), without);
}

TEST(Llama3Rope, GreedyAndKvCacheEqualLlamaCpp) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const auto model = load_synth(d, llama3_like(43, 8.0f, "llama", true));
    const std::vector<int32_t> tokens = some_tokens(40, 5, 100000);
    expect_kv_cache_matches_full_sequence(*model, tokens);
    expect_greedy_equals_llama_cpp(d.file("m.gguf"));
}

// A full finetune trains every float tensor but the factors, and refuses to be told to train them.
TEST(Llama3Rope, AFullFinetuneLeavesTheFactorsAlone) {
    TempDir d;
    const auto model = load_synth(d, llama3_like(44, 8.0f), false);
    rp::FinetuneConfig cfg;
    cfg.full = true;
    const rp::Trainer tr(*model, cfg, rp::TrainerData::ShapesOnly);
    for (const rp::Trainer::Param & p : tr.params()) EXPECT_NE(p.name, "rope_freqs.weight");
    EXPECT_EQ(tr.params().size(), model->weights().size() - 1);
    cfg.full_tensors = {"blk.0.attn_q.weight", "rope_freqs.weight"};
    try {
        const rp::Trainer bad(*model, cfg, rp::TrainerData::ShapesOnly);
        ADD_FAILURE() << "trained the RoPE factors";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("'rope_freqs.weight' holds the RoPE frequency factors"), std::string::npos) << e.what();
    }
}
