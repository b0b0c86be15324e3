// qwen35 (Qwen3.5, #33): generated hybrid models, Gated DeltaNet layers (the short convolution, L2-normalised q and k,
// the decay and beta, two value heads per key head, the gated RMSNorm) between gated full attention layers (the
// sigmoid output gate, q/k norm, partial RoPE under M-RoPE sections), run as llama.cpp runs them: every position's
// logits within 1e-4 of the range of rp-oracle's at 1, 37 and 300 tokens (llama.cpp chunks its delta rule by 64
// tokens; ours runs the recurrence), each piece moving them far beyond that when taken out; the greedy continuation
// is llama.cpp's; the recurrent state and the KV cache give the whole sequence's logits token by token, and after a
// rewind (the saved state of a shared prompt, or the tokens evaluated again).
#include "arch_test_util.h"
#include "../finetune/ref_model.h"

#include "models/arch/hparams.h"
#include "models/arch/inference.h"
#include "models/convert/hf_export.h"
#include "models/convert/peft.h"
#include "models/train/trainer.h"
#include "models/text/tokenizer.h"
#include "tests/oracle/oracle_run.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

using namespace models_test;

namespace {

// A prompt across several of llama.cpp's 64-token delta-rule chunks (and its last one partial): 300 tokens, 130 under
// the sanitizers (still three chunks; the instrumented forward of 300 took 10 s a model).
#ifdef RP_SANITIZED
constexpr size_t kLongPrompt = 130;
#else
constexpr size_t kLongPrompt = 300;
#endif

rp::SynthSpec qwen35(uint32_t embd, uint32_t heads, uint32_t heads_kv, uint32_t head_dim, uint32_t n_rot, uint32_t layers, uint32_t k_heads,
                     uint32_t v_heads, uint32_t ssm_dim, uint64_t seed) {
    rp::SynthSpec s;
    s.arch = "qwen35";
    s.vocab_from = model_path("vocab/ggml-vocab-qwen2.gguf");
    s.n_embd = embd, s.n_head = heads, s.n_head_kv = heads_kv, s.head_dim = head_dim, s.n_rot = n_rot, s.n_layer = layers;
    s.n_ff = 96, s.n_ctx_train = 4096, s.rope_base = 1e7f, s.seed = seed;
    s.ssm_k_heads = k_heads, s.ssm_v_heads = v_heads, s.ssm_head_dim = ssm_dim, s.full_attn_interval = 4;
    return s;
}

// A generated qwen35 file of one layer, a DeltaNet layer (4 value heads of 16 over 2 key heads), loaded.
std::unique_ptr<rp::Model> one_delta_net_layer(TempDir & d) {
    rp::write_synth_model(qwen35(64, 4, 2, 16, 8, 1, 2, 4, 16, 5), d.file("m.gguf"));
    return rp::Model::load(d.file("m.gguf"));
}

} // namespace

TEST(Qwen35, LoadsItsTensorsAndHyperParameters) {
    TempDir d;
    rp::write_synth_model(qwen35(64, 4, 2, 32, 8, 8, 2, 4, 16, 1), d.file("m.gguf"));
    const auto model = rp::Model::load(d.file("m.gguf"));
    const rp::HParams & hp = model->hparams();
    EXPECT_EQ(hp.arch->arch, rp::Arch::Qwen35);
    for (uint32_t il = 0; il < 8; ++il) EXPECT_EQ(hp.is_recurrent(il), il != 3 && il != 7) << il;
    EXPECT_EQ(hp.ssm_d_conv, 4u);
    EXPECT_EQ(hp.ssm_n_group, 2u);
    EXPECT_EQ(hp.ssm_dt_rank, 4u);
    EXPECT_EQ(hp.ssm_head_v(), 16u);
    EXPECT_EQ(hp.ssm_conv_dim(), 2u * 2 * 16 + 4 * 16);
    EXPECT_EQ(hp.n_rot, 8u);
    const rp::LayerWeights & lin = model->layers[0];
    for (const rp::Tensor * t : {lin.wqkv, lin.ssm_gate, lin.ssm_beta, lin.ssm_alpha, lin.ssm_dt, lin.ssm_a, lin.ssm_conv1d, lin.ssm_norm, lin.ssm_out})
        ASSERT_NE(t, nullptr);
    EXPECT_EQ(lin.wq, nullptr);
    EXPECT_EQ(lin.ffn_norm->name, "blk.0.post_attention_norm.weight");
    // Two layer kinds: rp-simulate's uniform per-layer gradient bytes would be wrong, and are refused.
    EXPECT_THROW(rp::synth_grad_bytes(qwen35(64, 4, 2, 32, 8, 8, 2, 4, 16, 1), false, 8), rp::Error);
    const rp::LayerWeights & att = model->layers[3];
    EXPECT_EQ(att.wqkv, nullptr);
    EXPECT_EQ(att.wq->ne[1], 2 * 4 * 32);  // the queries and their gates
    ASSERT_NE(att.q_norm, nullptr);
}

TEST(Qwen35, MissingPiecesAreNamed) {
    TempDir d;
    rp::write_synth_model(qwen35(64, 4, 2, 16, 16, 4, 2, 2, 16, 2), d.file("m.gguf"));
    const std::string m = d.file("m.gguf"), bad = d.file("bad.gguf");
    expect_load_fails(m, bad, without_tensor("blk.1.ssm_a"), "blk.1.ssm_a");
    expect_load_fails(m, bad, without_tensor("blk.2.ssm_conv1d.weight"), "blk.2.ssm_conv1d.weight");
    expect_load_fails(m, bad, without_tensor("blk.3.attn_q_norm.weight"), "blk.3.attn_q_norm.weight");
    Variant no_conv;
    no_conv.edit_kvs = [](gguf::Writer & w) { w.remove("qwen35.ssm.conv_kernel"); };
    expect_load_fails(m, bad, no_conv, "qwen35.ssm.conv_kernel");
    Variant vision;  // M-RoPE sections that leave a rotated pair to the fourth (vision) position
    vision.edit_kvs = [](gguf::Writer & w) { w.set_i32_array("qwen35.rope.dimension_sections", {4, 2, 2, 0}); };
    expect_load_fails(m, bad, vision, "falls to the fourth section");
    // attention.recurrent_layers (one bool per block) is read in place of the interval: marking layer 2 a full attention
    // layer asks for its attention tensors; a wrong count is refused by name.
    auto recurrent_layers = [](std::vector<uint8_t> flags) {
        Variant v;
        v.edit_kvs = [flags](gguf::Writer & w) {
            gguf::KV kv;
            kv.key = "qwen35.attention.recurrent_layers";
            kv.type = gguf::ValueType::ARRAY;
            kv.arr_type = gguf::ValueType::BOOL;
            kv.count = flags.size();
            kv.data = flags;
            w.set_kv(kv);
        };
        return v;
    };
    write_variant(m, bad, recurrent_layers({1, 1, 1, 0}));
    EXPECT_NO_THROW(rp::Model::load(bad));
    expect_load_fails(m, bad, recurrent_layers({1, 1, 0, 1}), "blk.2.attn_q.weight");
    expect_load_fails(m, bad, recurrent_layers({1, 1, 1}), "qwen35.attention.recurrent_layers");
    Variant all_mtp;  // more multi-token prediction blocks than blocks
    all_mtp.edit_kvs = [](gguf::Writer & w) { w.set_u32("qwen35.nextn_predict_layers", 4); };
    expect_load_fails(m, bad, all_mtp, "qwen35.nextn_predict_layers");
    Variant uneven;  // value heads that do not share the key heads evenly
    uneven.edit_kvs = [](gguf::Writer & w) { w.set_u32("qwen35.ssm.time_step_rank", 3); };
    expect_load_fails(m, bad, uneven, "time_step_rank");
}

// Two value heads per key head (llama.cpp's order: value head h reads key head h % key heads), 4 attention heads
// over 2 kv heads with 8 of 32 dimensions rotated, one full attention layer among three DeltaNet layers.
TEST(Qwen35, LogitsEqualLlamaCpps) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    rp::write_synth_model(qwen35(64, 4, 2, 32, 8, 4, 2, 4, 16, 11), d.file("m.gguf"));
    for (size_t n : {1, 37}) EXPECT_LE(models_test::compare_logits("qwen35", d.file("m.gguf"), some_tokens(n, 1), "Hk 2 Hv 4"), 1e-4);
}

// kLongPrompt tokens: llama.cpp's chunks of 64 (and a partial one) against our recurrence; odd head counts (3 attention
// heads over 1 kv head, 3 key heads, 3 value heads), wider state (32), 8 layers (two full attention).
TEST(Qwen35, LogitsEqualLlamaCppsLongPromptOddHeads) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    rp::write_synth_model(qwen35(96, 3, 1, 32, 16, 8, 3, 3, 32, 12), d.file("m.gguf"));
    EXPECT_LE(models_test::compare_logits("qwen35", d.file("m.gguf"), some_tokens(kLongPrompt, 2), "odd heads"), 1e-4);
}

// An adapter on every projection of both layer kinds (the DeltaNet's attn_qkv, attn_gate, ssm_beta, ssm_alpha,
// ssm_out; the attention's q with its gate, k, v, output; the feed-forward), as llama.cpp applies it.
TEST(Qwen35, AdapterAsLlamaCppAppliesIt) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    rp::write_synth_model(qwen35(64, 4, 2, 16, 16, 4, 2, 4, 16, 25), d.file("m.gguf"));
    const auto model = rp::Model::load(d.file("m.gguf"));
    std::vector<std::string> targets;
    for (uint32_t il = 0; il < 4; ++il) {
        const bool rec = model->hparams().is_recurrent(il);
        std::vector<const char *> kinds = {"ffn_gate", "ffn_up", "ffn_down"};
        if (rec) kinds.insert(kinds.end(), {"attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_out"});
        else kinds.insert(kinds.end(), {"attn_q", "attn_k", "attn_v", "attn_output"});
        for (const char * k : kinds) targets.push_back("blk." + std::to_string(il) + "." + k + ".weight");
    }
    expect_adapter_as_llama_cpp(d.file("m.gguf"), targets, some_tokens(20, 5), d.file("a.gguf"), 3);
}

// The greedy continuation is llama.cpp's, and again after a rewind: to a position inside the prompt (its tokens
// evaluated again, the rest of the prompt then fed) and to the start.
TEST(Qwen35, GreedyContinuationEqualsLlamaCppsAlsoAfterARewind) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    rp::write_synth_model(qwen35(64, 4, 2, 16, 16, 4, 2, 4, 16, 21), d.file("m.gguf"));
    expect_greedy_equals_llama_cpp(d.file("m.gguf"));
    const std::string prompt = "Once upon a time there was a little robot who";
    const std::vector<int32_t> ref = rp::oracle::greedy_continuation(d.file("m.gguf"), prompt, 24);
    ASSERT_FALSE(ref.empty());
    const auto model = rp::Model::load(d.file("m.gguf"));
    rp::Tokenizer tok(model->file());
    const std::vector<int32_t> ids = tok.encode(prompt, true, false);
    ASSERT_GT(ids.size(), 4u);
    rp::InferenceSession s(*model, static_cast<int64_t>(ids.size()) + 24, 1);
    EXPECT_EQ(rp::complete_greedy(s, tok, ids, 24), ref);
    s.reset(4);  // inside the prompt: the first 4 tokens evaluated again
    EXPECT_EQ(rp::complete_greedy(s, tok, std::vector<int32_t>(ids.begin() + 4, ids.end()), 24), ref);
    s.reset(0);
    EXPECT_EQ(rp::complete_greedy(s, tok, ids, 24), ref);
}

// Each piece of the DeltaNet and of the gated attention moves the logits far from llama.cpp's: without the short
// convolution (its kernel a pass-through), the decay (A = 0), the gated norm's gate (z = 0) or the attention's output
// gate (its rows 0: every head's output halved).
TEST(Qwen35, EveryPieceChangesTheLogits) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string file = d.file("m.gguf");
    rp::write_synth_model(qwen35(64, 4, 2, 16, 16, 4, 2, 4, 16, 15), file);
    PieceRemoval pr(file, some_tokens(24, 4), 1e-4);
    const rp::HParams & hp = pr.model->hparams();
    rp::Context ctx;
    auto constant = [&](const rp::Tensor * like, float value) {
        rp::Tensor * t = ctx.new_tensor(rp::DType::F32, like->ne);
        ctx.alloc_data(t);
        rp::tensor_set_f32(t, std::vector<float>(static_cast<size_t>(like->nelements()), value));
        return t;
    };
    {
        rp::ModelWeights w = pr.as_built;
        for (uint32_t il = 0; il < hp.n_layer; ++il)
            if (hp.is_recurrent(il)) {  // a kernel that passes the current input through: weight 1 at tap K-1
                rp::Tensor * k = constant(w.layers[il].ssm_conv1d, 0.0f);
                float * v = k->data_as<float>();
                for (int64_t c = 0; c < k->ne[1]; ++c) v[c * k->ne[0] + k->ne[0] - 1] = 1.0f;
                w.layers[il].ssm_conv1d = k;
            }
        pr.expect_moves("qwen35", "the short convolution", hp, w);
    }
    {
        rp::ModelWeights w = pr.as_built;
        for (uint32_t il = 0; il < hp.n_layer; ++il)
            if (hp.is_recurrent(il)) w.layers[il].ssm_a = constant(w.layers[il].ssm_a, 0.0f);
        pr.expect_moves("qwen35", "the decay", hp, w);
    }
    {
        rp::ModelWeights w = pr.as_built;
        for (uint32_t il = 0; il < hp.n_layer; ++il)
            if (hp.is_recurrent(il)) w.layers[il].ssm_gate = constant(w.layers[il].ssm_gate, 0.0f);
        pr.expect_moves("qwen35", "the gated norm's gate", hp, w);
    }
    {
        // The attention's gate rows at +30: sigmoid 1, every head's output passes whole.
        rp::ModelWeights w = pr.as_built;
        for (uint32_t il = 0; il < hp.n_layer; ++il) {
            if (hp.is_recurrent(il)) continue;
            rp::Tensor * q = constant(w.layers[il].wq, 0.0f);
            const std::vector<float> orig = rp::tensor_get_f32(w.layers[il].wq);
            std::vector<float> v(orig);
            const int64_t E = q->ne[0], D = hp.head_dim;
            for (int64_t h = 0; h < hp.n_head; ++h)
                for (int64_t r = 0; r < D; ++r)
                    for (int64_t e = 0; e < E; ++e) v[static_cast<size_t>((h * 2 * D + D + r) * E + e)] = 0.0f;
            rp::tensor_set_f32(q, v);
            w.layers[il].wq = q;
        }
        pr.expect_moves("qwen35", "the attention's output gate (sigmoid 0.5)", hp, w);
    }
}

// The recurrent states and the KV cache: token by token, and with a prompt then one token at a time, the logits of
// the whole sequence; a rewind to a shared prompt (its saved states) and to another position (evaluated again)
// continues as a fresh run does.
TEST(Qwen35, StatesGiveTheWholeSequence) {
    TempDir d;
    const auto model = load_synth(d, qwen35(64, 4, 2, 16, 16, 4, 2, 4, 16, 31));
    const std::vector<int32_t> tokens = some_tokens(20, 3);
    expect_kv_cache_matches_full_sequence(*model, tokens);

    const size_t V = model->hparams().n_vocab;
    const std::vector<float> all = forward_all(*model, tokens);
    auto expect_rows = [&](const std::vector<float> & got, size_t first, const char * what) {
        ASSERT_EQ(got.size() % V, 0u) << what;
        float worst = 0.0f;
        for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - all[first * V + i]));
        EXPECT_LE(worst, 1e-4f * value_range(all)) << what;
    };
    // Two sequences sharing a 12-token prompt, then each a token; a rewind to the prompt (saved states) and to
    // position 5 (the tokens evaluated again) continue alike.
    rp::InferenceSession s(*model, 20, 1, nullptr, nullptr, 2);
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 12);
    expect_rows(s.eval_shared(prompt, true), 0, "shared prompt");
    std::vector<float> next = s.eval({tokens[12], tokens[12]});
    expect_rows(std::vector<float>(next.begin(), next.begin() + V), 12, "after the prompt, sequence 0");
    expect_rows(std::vector<float>(next.begin() + V, next.end()), 12, "after the prompt, sequence 1");
    s.reset(12);
    s.share_first(12);
    next = s.eval({tokens[12], tokens[12]});
    expect_rows(std::vector<float>(next.begin() + V, next.end()), 12, "rewound to the shared prompt");
    s.reset(5);
    std::vector<int32_t> rest;
    for (int b = 0; b < 2; ++b)
        for (size_t i = 5; i < 9; ++i) rest.push_back(tokens[i]);
    next = s.eval(rest, true);
    expect_rows(std::vector<float>(next.begin(), next.begin() + 4 * V), 5, "rewound to 5, sequence 0");
    expect_rows(std::vector<float>(next.begin() + 4 * V, next.end()), 5, "rewound to 5, sequence 1");
    EXPECT_THROW(s.share_first(4), rp::Error);  // a state exists at the last position only
}

// Three computations of one model agree: ours (the delta rule's recurrence), llama.cpp's prompt form (its delta rule
// over 64-token chunks) and its one-token form (--step 1: generation's path, through the recurrent state), all within
// 1e-4 of the logit range, and ours within 1e-5 of it from a double-precision reference (tests/finetune/ref_model.h).
// The M-RoPE sections are written as Qwen3.5 sets them (every rotated pair in one of the three text sections).
TEST(Qwen35, OursLlamaCppsPromptAndOneTokenFormsAndTheDoubleReferenceAgree) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    rp::SynthSpec s;
    s.arch = "qwen35";
    s.vocab_from = model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_layer = 4, s.n_embd = 128, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32, s.n_rot = 16, s.n_ff = 128;
    s.ssm_k_heads = 2, s.ssm_v_heads = 4, s.ssm_head_dim = 32, s.seed = 8;
    rp::write_synth_model(s, d.file("m.gguf"));
    const auto model = rp::Model::load(d.file("m.gguf"));
    const std::vector<int32_t> toks = some_tokens(96, 1, 160);
    // The double-precision reference's logits.
    ft_ref::RefModel m;
    m.hp = model->hparams();
    m.neox = true;
    for (const rp::Tensor * t : model->weights()) {
        ft_ref::W w;
        w.ne0 = t->ne[0], w.ne1 = t->ne[1], w.ne2 = t->ne[2];
        const std::vector<float> f = rp::tensor_get_f32(t);
        w.v.assign(f.begin(), f.end());
        m.w[t->name] = w;
    }
    const std::vector<std::vector<double>> states = ft_ref::forward_states(m, toks);
    const std::vector<double> & x = states.back();
    const int64_t C = m.hp.n_embd, V = m.hp.n_vocab, T = static_cast<int64_t>(toks.size());
    std::vector<double> exact(static_cast<size_t>(T * V)), h(static_cast<size_t>(C));
    for (int64_t t = 0; t < T; ++t) {
        ft_ref::rms_norm(&x[static_cast<size_t>(t * C)], h.data(), C, m.at("output_norm.weight"), m.hp.rms_eps);
        ft_ref::linear(m.at("output.weight"), h.data(), &exact[static_cast<size_t>(t * V)]);
    }
    const std::vector<float> ours = forward_all(*model, toks);
    const std::vector<float> prompt = oracle_logits(d.file("m.gguf"), toks, ours.size());
    const std::vector<float> one_by_one = oracle_logits(d.file("m.gguf"), toks, ours.size(), "", 1);
    ASSERT_EQ(prompt.size(), ours.size());
    ASSERT_EQ(one_by_one.size(), ours.size());
    double ours_exact = 0;
    for (size_t i = 0; i < ours.size(); ++i) ours_exact = std::max(ours_exact, std::fabs(ours[i] - exact[i]));
    const double range = value_range(prompt);
    std::printf("[ qwen35 ] of a %.2f range: ours - llama.cpp's prompt form %.3g, - its one-token form %.3g, - double reference %.3g\n", range,
                max_abs_diff(ours, prompt), max_abs_diff(ours, one_by_one), ours_exact);
    EXPECT_LE(max_abs_diff(ours, prompt), 1e-4 * range);
    EXPECT_LE(max_abs_diff(ours, one_by_one), 1e-4 * range);
    EXPECT_LE(ours_exact, 1e-5 * range);
}


namespace {

rp::SynthSpec qwen35moe(uint32_t experts, uint32_t used, uint64_t seed) {
    rp::SynthSpec s = qwen35(64, 4, 2, 16, 16, 4, 2, 4, 16, seed);
    s.arch = "qwen35moe";
    s.n_expert = experts, s.n_expert_used = used, s.n_ff_exp = 32, s.n_ff = 48;
    return s;
}

} // namespace

// qwen35moe: the routed experts (softmax, top k, renormalised) and the shared expert gated by sigmoid of its logit,
// under the DeltaNet and gated attention layers; 8 experts top 2 and 16 top 4 at 1, 37 and 300 tokens.
TEST(Qwen35Moe, LogitsEqualLlamaCpps) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    rp::write_synth_model(qwen35moe(8, 2, 41), d.file("a.gguf"));
    for (size_t n : {1, 37}) EXPECT_LE(models_test::compare_logits("qwen35moe", d.file("a.gguf"), some_tokens(n, 1), "E8 top2"), 1e-4);
    rp::write_synth_model(qwen35moe(16, 4, 42), d.file("b.gguf"));
    EXPECT_LE(models_test::compare_logits("qwen35moe", d.file("b.gguf"), some_tokens(kLongPrompt, 2), "E16 top4"), 1e-4);
}

TEST(Qwen35Moe, SharedExpertAndItsGateMatter) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string file = d.file("m.gguf");
    rp::write_synth_model(qwen35moe(8, 2, 43), file);
    PieceRemoval pr(file, some_tokens(24, 4), 1e-4);
    const rp::HParams & hp = pr.model->hparams();
    rp::Context ctx;
    {
        rp::ModelWeights w = pr.as_built;
        for (rp::LayerWeights & l : w.layers) l.ffn_up_shexp = nullptr;  // no shared expert
        pr.expect_moves("qwen35moe", "the shared expert", hp, w);
    }
    {
        rp::ModelWeights w = pr.as_built;  // its gate's logit 0: the shared expert at half weight
        for (rp::LayerWeights & l : w.layers) {
            rp::Tensor * z = ctx.new_tensor(rp::DType::F32, l.ffn_gate_inp_shexp->ne);
            ctx.alloc_data(z);
            rp::tensor_set_f32(z, std::vector<float>(static_cast<size_t>(z->nelements()), 0.0f));
            l.ffn_gate_inp_shexp = z;
        }
        pr.expect_moves("qwen35moe", "the shared expert's gate", hp, w);
    }
}

TEST(Qwen35Moe, LoadsItsExpertsAndSharedExpert) {
    TempDir d;
    rp::write_synth_model(qwen35moe(8, 2, 44), d.file("m.gguf"));
    const auto model = rp::Model::load(d.file("m.gguf"));
    const rp::HParams & hp = model->hparams();
    EXPECT_EQ(hp.arch->arch, rp::Arch::Qwen35Moe);
    EXPECT_EQ(hp.n_expert, 8u);
    EXPECT_EQ(hp.n_ff_shexp, 48u);
    for (const rp::LayerWeights & l : model->layers)
        for (const rp::Tensor * t : {l.ffn_gate_inp, l.ffn_gate_exps, l.ffn_up_exps, l.ffn_down_exps, l.ffn_gate_inp_shexp, l.ffn_gate_shexp,
                                     l.ffn_up_shexp, l.ffn_down_shexp})
            ASSERT_NE(t, nullptr);
    const std::string m = d.file("m.gguf"), bad = d.file("bad.gguf");
    expect_load_fails(m, bad, without_tensor("blk.2.ffn_gate_inp_shexp.weight"), "blk.2.ffn_gate_inp_shexp.weight");
}

// Multi-token prediction blocks (Qwen3.5's checkpoints carry one): counted by block_count, named by
// nextn_predict_layers, kept in the model's weights as the file holds them, never run: the logits are llama.cpp's
// main pass, and the LoRA defaults do not reach them.
TEST(Qwen35, MtpBlocksAreKeptNotRun) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    for (const char * arch : {"qwen35", "qwen35moe"}) {
        rp::SynthSpec s = qwen35(64, 4, 2, 16, 16, 4, 2, 4, 16, 51);
        s.arch = arch, s.mtp_layers = 1;
        if (std::string(arch) == "qwen35moe") s.n_expert = 4, s.n_expert_used = 2, s.n_ff_exp = 32;
        const std::string file = d.file(std::string(arch) + ".gguf");
        rp::write_synth_model(s, file);
        const auto model = rp::Model::load(file);
        EXPECT_EQ(model->hparams().n_layer, 4u) << arch;
        EXPECT_EQ(model->hparams().n_layer_nextn, 1u) << arch;
        EXPECT_EQ(model->layers.size(), 4u) << arch;
        ASSERT_FALSE(model->mtp.empty()) << arch;
        for (const rp::Tensor * t : model->mtp) EXPECT_EQ(t->name.rfind("blk.4.", 0), 0u) << t->name;
        EXPECT_NE(model->find("blk.4.nextn.eh_proj.weight"), nullptr) << arch;
        for (const std::string & n : rp::expand_lora_targets(*model, rp::default_lora_targets()))
            EXPECT_NE(n.rfind("blk.4.", 0), 0u) << arch << ": " << n;
        EXPECT_LE(models_test::compare_logits("qwen35", file, some_tokens(37, 3), std::string(arch) + " with an MTP block"), 1e-4);
    }
}

// The backward runs in the order its rules create the gradients (ops/autodiff.h): a forward value is read and freed
// as the reverse walk passes it. A depth-first walk from each weight's gradient in turn (the order before) computes
// what the first weight needs, the delta rule's backward included, while it holds what the others read (the gated
// norm's pieces). The same nodes in that order plan more memory; only the order and the memory differ.
TEST(Qwen35, BackwardInCreationOrderHoldsLessThanDepthFirst) {
    TempDir d;
    const auto m = one_delta_net_layer(d);
    const rp::HParams & hp = m->hparams();
    ASSERT_TRUE(hp.is_recurrent(0));
    const int64_t T = 512;
    rp::Context ctx;
    rp::Tensor * x = ctx.new_tensor(rp::DType::F32, hp.n_embd, T, 1);
    rp::Tensor * pos = ctx.new_tensor(rp::DType::I32, T);
    rp::Tensor * dy = ctx.new_tensor(rp::DType::F32, hp.n_embd, T, 1);
    x->flags |= rp::kFlagInput;
    pos->flags |= rp::kFlagInput;
    dy->flags |= rp::kFlagInput;
    rp::Tensor * y = rp::attention_block(ctx, hp, m->layers[0], 0, x, pos);
    rp::Graph g;
    rp::build_forward(g, y);
    std::vector<rp::Tensor *> params{x};
    for (rp::Tensor * l : g.leafs)
        if (l != x && l != pos && l->type == rp::DType::F32) params.push_back(l);
    ASSERT_GE(params.size(), 8u);   // the input and the block's weights: norms, projections, conv, decay, beta, A
    const size_t forward_nodes = g.nodes.size();
    rp::build_backward(ctx, g, y, dy, params);
    ASSERT_GT(g.nodes.size(), forward_nodes);

    // The depth-first order: the forward, then each parameter's last gradient node with what it reads.
    rp::Graph dfs;
    rp::build_forward(dfs, y);
    for (rp::Tensor * p : params) {
        rp::Tensor * last = nullptr;
        for (rp::Tensor * n : g.nodes)
            if (n->view_src == p->grad || n == p->grad) last = n;
        ASSERT_NE(last, nullptr) << rp::describe(p);
        rp::build_forward(dfs, last);
    }
    ASSERT_EQ(dfs.nodes.size(), g.nodes.size());

    const size_t creation = rp::plan_graph(g).size, depth_first = rp::plan_graph(dfs).size;
    std::printf("  a DeltaNet layer's forward + backward at T=%lld: %zu bytes in creation order, %zu depth first (%.2fx)\n",
                static_cast<long long>(T), creation, depth_first, double(depth_first) / double(creation));
    EXPECT_LT(double(creation), 0.9 * double(depth_first));
}

// The gated output norm is one op (ops/norm.h rms_norm_gated): a DeltaNet layer's training graph keeps o and z for
// it, not the normed rows and silu(z) (two [Dv, Hv, T] arrays); the same logits, which the llama.cpp comparisons
// above check. z's projection is built after the delta rule, so its backward takes dz before the delta rule's.
TEST(Qwen35, TheGatedNormIsOneOpAndZIsProjectedAfterTheDeltaRule) {
    TempDir d;
    const auto m = one_delta_net_layer(d);
    const rp::HParams & hp = m->hparams();
    ASSERT_TRUE(hp.is_recurrent(0));
    const int64_t T = 40, Hv = hp.ssm_dt_rank, Dv = hp.ssm_d_inner / Hv;
    rp::Context ctx;
    rp::Tensor * x = ctx.new_tensor(rp::DType::F32, hp.n_embd, T, 1);
    rp::Tensor * pos = ctx.new_tensor(rp::DType::I32, T);
    rp::Tensor * y = rp::attention_block(ctx, hp, m->layers[0], 0, x, pos);
    rp::Graph g;
    rp::build_forward(g, y);
    int gated = 0;
    size_t delta = 0, gate_proj = 0;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const rp::Tensor * n = g.nodes[i];
        gated += n->op == rp::Op::RMS_NORM_GATED;
        EXPECT_FALSE(n->op == rp::Op::RMS_NORM && n->ne[0] == Dv && n->ne[1] == Hv) << "an unfused per-head norm";
        EXPECT_FALSE(n->op == rp::Op::SILU && n->nelements() == Dv * Hv * T) << "silu(z) computed apart";
        if (n->op == rp::Op::DELTA_NET) delta = i;
        if (n->op == rp::Op::MUL_MAT && n->src[0] == m->layers[0].ssm_gate) gate_proj = i;
    }
    EXPECT_EQ(gated, 1);
    EXPECT_GT(delta, 0u);
    EXPECT_GT(gate_proj, delta);
}
