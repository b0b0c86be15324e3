// Phi-3, Phi-3.5 and Phi-4 (#34): llama.cpp's phi3. A llama with NEOX RoPE whose q, k and v rows sit in one
// attn_qkv matrix and whose gate and up rows sit in one ffn_up [n_embd, 2 n_ff], and, for the 128k models
// (Phi-3.5-mini), LongRoPE: per-pair frequency factors, rope_factors_short up to the original context
// (rope.scaling.original_context_length) and rope_factors_long beyond it, chosen by the context the model runs in
// (llama.cpp: n_ctx; ours: the session's context, the trainer's longest sequence), with every cos / sin times
// rope.scaling.attn_factor. Generated phi3 models run as llama.cpp runs them with either set of factors, each piece
// moving the logits far beyond the bound; adapters on the fused matrices apply as llama.cpp applies them.
#include "arch_test_util.h"

#include "models/data/dataset.h"
#include "models/text/tokenizer.h"
#include "models/train/session.h"
#include "models/train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace models_test;

namespace {

// A phi3 with LongRoPE from `orig` tokens to 4096 (0: none). llama.cpp runs our tests' prompts in a 512-token
// context: orig 1024 gives the short factors on both sides, orig 16 the long ones for prompts past 16 tokens.
rp::SynthSpec phi3_like(uint64_t seed, uint32_t orig, bool tied = false, uint32_t n_rot = 0) {
    rp::SynthSpec s;
    s.arch = "phi3";
    s.vocab_from = model_path("vocab/ggml-vocab-llama-spm.gguf");
    s.n_embd = 96, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 24, s.n_ff = 128, s.n_layer = 3, s.tied = tied;
    s.n_ctx_train = 4096, s.long_rope_ctx = orig, s.seed = seed, s.n_rot = n_rot;
    return s;
}

} // namespace

TEST(Phi3, LoadsItsFusedTensorsAndLongRope) {
    TempDir d;
    const auto model = load_synth(d, phi3_like(1, 16), false);
    const rp::HParams & hp = model->hparams();
    EXPECT_EQ(hp.arch->arch, rp::Arch::Phi3);
    EXPECT_EQ(hp.arch->rope_mode, rp::RopeMode::Neox);
    EXPECT_EQ(hp.rope_n_ctx_orig, 16u);
    EXPECT_FLOAT_EQ(hp.rope_attn_factor, static_cast<float>(std::sqrt(1.0 + std::log(4096.0 / 16) / std::log(16.0))));
    const rp::LayerWeights & l = model->layers[1];
    ASSERT_NE(l.wqkv, nullptr);
    EXPECT_EQ(l.wqkv->ne[1], 96 + 2 * 48);
    EXPECT_EQ(l.wq, nullptr);
    EXPECT_EQ(l.ffn_gate, nullptr);
    EXPECT_EQ(l.ffn_up->ne[1], 256);
    EXPECT_EQ(l.rope_freqs, model->find("rope_factors_short.weight"));
    EXPECT_EQ(model->rope_factors_long, model->find("rope_factors_long.weight"));
    // The context chooses: up to the original context the short factors, beyond it the long ones.
    EXPECT_EQ(model->graph_weights(16).layers[2].rope_freqs, model->find("rope_factors_short.weight"));
    EXPECT_EQ(model->graph_weights(17).layers[2].rope_freqs, model->find("rope_factors_long.weight"));
    // The default LoRA targets select the fused matrices, once each.
    const std::vector<std::string> t = rp::expand_lora_targets(*model, rp::default_lora_targets());
    EXPECT_EQ(t, (std::vector<std::string>{"blk.0.attn_qkv.weight", "blk.1.attn_qkv.weight", "blk.2.attn_qkv.weight",
                                           "blk.0.attn_output.weight", "blk.1.attn_output.weight", "blk.2.attn_output.weight",
                                           "blk.0.ffn_up.weight", "blk.1.ffn_up.weight", "blk.2.ffn_up.weight",
                                           "blk.0.ffn_down.weight", "blk.1.ffn_down.weight", "blk.2.ffn_down.weight"}));
}

// A trainer uses the factors of its longest sequence (FinetuneConfig::context; a session sets it to the data's
// sequence length), and a full finetune trains neither set.
TEST(Phi3, TheTrainerTakesTheFactorsOfItsContext) {
    TempDir d;
    const auto model = load_synth(d, phi3_like(1, 16), false);
    rp::FinetuneConfig cfg;
    cfg.full = true;
    for (const auto & [context, factors] : {std::pair<int64_t, const char *>{0, "rope_factors_short.weight"}, {16, "rope_factors_short.weight"},
                                            {17, "rope_factors_long.weight"}}) {
        cfg.context = context;
        const rp::Trainer tr(*model, cfg, rp::TrainerData::ShapesOnly);
        for (const rp::LayerWeights & l : tr.graph_weights().layers) EXPECT_EQ(l.rope_freqs->name, factors) << context;
        EXPECT_EQ(tr.params().size(), model->weights().size() - 2) << "the two sets of factors are not trained";
    }
    for (const char * factors : {"rope_factors_short.weight", "rope_factors_long.weight"}) {
        cfg.full_tensors = {"blk.0.attn_qkv.weight", factors};
        try {
            const rp::Trainer bad(*model, cfg, rp::TrainerData::ShapesOnly);
            ADD_FAILURE() << "trained " << factors;
        } catch (const rp::Error & e) {
            EXPECT_NE(std::string(e.what()).find(std::string("'") + factors + "' holds the RoPE frequency factors"), std::string::npos) << e.what();
        }
    }
}

// A training session takes the factors of its data's sequences: up to the original 16 tokens the short ones,
// beyond them the long ones.
TEST(Phi3, ASessionTakesTheFactorsOfItsSequences) {
    TempDir d;
    const auto model = load_synth(d, phi3_like(1, 16), false);
    const rp::Tokenizer tok(model->file());
    std::string text;
    for (int i = 0; i < 40; ++i) text += "Once upon a time there was a little robot who liked to count. ";
    for (const auto & [seq_len, factors] : {std::pair<int32_t, const char *>{16, "rope_factors_short.weight"}, {24, "rope_factors_long.weight"}}) {
        rp::DatasetOptions o;
        o.seq_len = seq_len;
        const rp::Dataset data = rp::Dataset::from_text(text, "text", tok, o);
        rp::SessionOptions so;
        so.batch = 1;
        so.steps = 1;
        const rp::TrainingSession s(*model, data, so);
        EXPECT_EQ(s.trainer().graph_weights().layers[0].rope_freqs->name, factors) << "seq_len " << seq_len;
    }
}

TEST(Phi3, MissingPiecesAreNamed) {
    TempDir d;
    load_synth(d, phi3_like(1, 16), false);
    expect_load_fails(d.file("m.gguf"), d.file("bad.gguf"), without_tensor("rope_factors_long.weight"),
                      "rope_factors_short.weight without rope_factors_long.weight");
    Variant half;
    half.reshape = [](gguf::TensorInfo & t) {
        if (t.name == "blk.1.ffn_up.weight") t.ne[1] = 128;
    };
    expect_load_fails(d.file("m.gguf"), d.file("bad.gguf"), half, "blk.1.ffn_up.weight: expected [96, 256]");
    expect_load_fails(d.file("m.gguf"), d.file("bad.gguf"), without_tensor("blk.2.attn_qkv.weight"), "missing tensor 'blk.2.attn_q.weight'");
}

TEST(Phi3, LogitsEqualLlamaCpps) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    for (const auto & [orig, tied, n_rot, what] :
         {std::tuple<uint32_t, bool, uint32_t, const char *>{0, false, 0, "phi3 (no LongRoPE)"},
          {1024, false, 0, "phi3, LongRoPE, the short factors"},
          {16, true, 0, "phi3, LongRoPE, the long factors, tied"},
          {16, true, 16, "phi3, 16 of 24 dimensions rotated (Phi-4-mini's partial RoPE), LongRoPE, tied"}}) {
        const std::string file = d.file("m" + std::to_string(orig) + "-" + std::to_string(n_rot) + ".gguf");
        rp::write_synth_model(phi3_like(51, orig, tied, n_rot), file);
        // One token runs in a 1-token context here and a 512-token one in llama.cpp: only the 40-token prompt is
        // past the long factors' 16 tokens on both sides.
        for (size_t n : {1, 40}) {
            if (orig == 16 && n <= 16) continue;
            EXPECT_LE(compare_logits("phi3", file, some_tokens(n, 3, 30000), what), 1e-4);
        }
    }
}

// Without the factors, with the other set of them, or without the attn_factor, our logits move far from
// llama.cpp's.
TEST(Phi3, EveryPieceChangesTheLogits) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string file = d.file("m.gguf");
    rp::write_synth_model(phi3_like(52, 16), file);
    const PieceRemoval r(file, some_tokens(40, 4, 30000), 1e-4, 40);
    rp::ModelWeights none = r.as_built;
    for (rp::LayerWeights & l : none.layers) l.rope_freqs = nullptr;
    rp::HParams unscaled = r.model->hparams();
    unscaled.rope_attn_factor = 1.0f;
    r.expect_moves("phi3", "the factors", r.model->hparams(), none);
    r.expect_moves("phi3", "the long factors (the short ones)", r.model->hparams(), r.model->graph_weights(16));
    r.expect_moves("phi3", "the attn_factor", unscaled, r.as_built);
}

TEST(Phi3, GreedyAndKvCacheEqualLlamaCpp) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const auto model = load_synth(d, phi3_like(53, 1024));
    const std::vector<int32_t> tokens = some_tokens(40, 5, 30000);
    expect_kv_cache_matches_full_sequence(*model, tokens);
    expect_greedy_equals_llama_cpp(d.file("m.gguf"));
}

// An adapter on the fused matrices (and the others) of every layer, applied by llama.cpp, gives our logits.
TEST(Phi3, AdaptersAsLlamaCppAppliesThem) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string base = d.file("base.gguf");
    rp::write_synth_model(phi3_like(54, 16), base);
    expect_adapter_as_llama_cpp(base, layer_targets(3, {"attn_qkv", "attn_output", "ffn_up", "ffn_down"}), some_tokens(40, 6, 30000),
                                d.file("a.gguf"), 5);
}
