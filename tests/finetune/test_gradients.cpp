// Analytic gradients of the per-layer training graphs (checkpoint + recompute, fused head) against central
// finite differences of the double-precision reference loss in ref_model.h, for every trainable tensor of a
// full finetune and every LoRA factor (B initialised non-zero), on stories260K and both synthetic qwen models.
#include "ft_test_util.h"
#include "ref_model.h"

#include "ggml_rp/ggml_rp.h"
#include "models/train/trainer.h"
#include "models/convert/synth_model.h"
#include "tests/common/temp_dir.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

namespace {

using ft_ref::RefModel;
using ft_ref::W;

W to_w(const rp::Tensor * t) {
    W w;
    w.ne0 = t->ne[0];
    w.ne1 = t->ne[1];
    w.ne2 = t->ne[2];
    const std::vector<float> f = rp::tensor_get_f32(t);
    w.v.assign(f.begin(), f.end());
    return w;
}

struct Sample {
    std::vector<std::vector<int32_t>> ids, labels;  // per sequence
    size_t n_trained = 0;
};

// Random tokens, labels = the next token with a few positions masked (and the last one).
Sample make_sample(int64_t n_vocab, int64_t T, int n_seq, uint64_t seed) {
    std::mt19937_64 rng(seed);
    Sample s;
    for (int b = 0; b < n_seq; ++b) {
        std::vector<int32_t> ids(static_cast<size_t>(T + 1)), lab(static_cast<size_t>(T));
        for (auto & i : ids) i = static_cast<int32_t>(rng() % static_cast<uint64_t>(n_vocab));
        for (int64_t t = 0; t < T; ++t) {
            const bool masked = t % 5 == 1 || t == T - 1;
            lab[static_cast<size_t>(t)] = masked ? -1 : ids[static_cast<size_t>(t + 1)];
            s.n_trained += masked ? 0 : 1;
        }
        ids.pop_back();
        s.ids.push_back(ids);
        s.labels.push_back(lab);
    }
    return s;
}

// Which layer a tensor name belongs to (restart point of the reference forward); n_layer for the head.
int first_layer(const std::string & n, int n_layer) {
    if (n.rfind("blk.", 0) == 0) return std::stoi(n.substr(4));
    if (n.rfind("token_embd", 0) == 0) return 0;
    return n_layer;
}

// aux > 0: the MoE load-balancing loss (FinetuneConfig::moe_aux_loss) joins the reference objective (one graph
// per sequence: needs micro_batches).
void check_gradients(const std::string & path, bool full, bool micro_batches, std::vector<std::string> targets = {}, float aux = 0,
                     int64_t context = 0) {
    auto model = rp::Model::load(path);
    const rp::HParams & hp = model->hparams();
    rp::FinetuneConfig cfg;
    cfg.full = full;
    cfg.lora_rank = 4;
    cfg.lora_alpha = 8.0f;
    cfg.ce_chunk = 100;  // several chunks over the vocabulary
    if (!targets.empty()) cfg.lora_targets = targets;
    cfg.moe_aux_loss = aux;
    cfg.context = context;
    rp::Trainer tr(*model, cfg);

    // LoRA: non-zero B (and A) so every factor has a gradient.
    std::mt19937_64 rng(7);
    if (!full)
        for (const auto & p : tr.params()) {
            std::vector<float> v(static_cast<size_t>(p.t->nelements()));
            for (float & x : v) x = static_cast<float>((static_cast<double>(rng() >> 11) * 0x1.0p-53 - 0.5) * 0.2);
            rp::tensor_set_f32(p.t, v);
        }

    const int64_t T = 12;
    const Sample s = make_sample(hp.n_vocab, T, 2, 11);
    const float loss_scale = 1.0f / static_cast<float>(s.n_trained);
    tr.zero_grads();
    double loss = 0;
    if (micro_batches) {
        for (size_t b = 0; b < 2; ++b)
            loss += tr.accumulate(s.ids[b].data(), s.labels[b].data(), T, 1, loss_scale, 1);
    } else {
        std::vector<int32_t> ids, lab;
        for (size_t b = 0; b < 2; ++b) {
            ids.insert(ids.end(), s.ids[b].begin(), s.ids[b].end());
            lab.insert(lab.end(), s.labels[b].begin(), s.labels[b].end());
        }
        loss = tr.accumulate(ids.data(), lab.data(), T, 2, loss_scale, 1);
    }
    tr.collect_grads();

    // The reference: base weights in double; trained tensors replace them (full) or add B A (LoRA).
    RefModel m;
    m.hp = hp;
    m.neox = hp.arch->rope_mode == rp::RopeMode::Neox;
    for (const rp::Tensor * t : model->weights()) m.w[t->name] = to_w(t);
    if (const rp::Tensor * ff = tr.graph_weights().layers[0].rope_freqs) m.rope_factors = ff->name;
    std::map<std::string, W> base = m.w, lora;  // lora: the factor values by param name
    for (const auto & p : tr.params()) (full ? m.w[p.name] : lora[p.name]) = to_w(p.t);
    auto refresh = [&](const std::string & base_name) {  // W_eff = W + s * B A (embedding: roles swapped)
        if (full) return;
        const rp::LoraTensor * lt = tr.adapter()->find(base_name);
        const W & A = lora.at(base_name + ".lora_a");
        const W & B = lora.at(base_name + ".lora_b");
        const double sc = tr.adapter()->scale(*lt);
        W & w = m.w[base_name];
        w = base.at(base_name);
        const int64_t r = B.ne0;
        if (lt->embedding) {  // e[tok][c] += s * sum_k B[c][k] A[tok][k]
            for (int64_t tok = 0; tok < w.ne1; ++tok)
                for (int64_t c = 0; c < w.ne0; ++c) {
                    double d = 0;
                    for (int64_t k = 0; k < r; ++k) d += B.v[static_cast<size_t>(c * r + k)] * A.v[static_cast<size_t>(tok * r + k)];
                    w.v[static_cast<size_t>(tok * w.ne0 + c)] += sc * d;
                }
        } else {  // W[e][o][i] += s * sum_k B[e][o][k] A[e][k][i] (e: the expert; 0 for a plain matrix)
            for (int64_t e = 0; e < w.ne2; ++e)
                for (int64_t o = 0; o < w.ne1; ++o)
                    for (int64_t i = 0; i < w.ne0; ++i) {
                        double d = 0;
                        for (int64_t k = 0; k < r; ++k)
                            d += B.v[static_cast<size_t>((e * w.ne1 + o) * r + k)] * A.v[static_cast<size_t>((e * r + k) * w.ne0 + i)];
                        w.v[static_cast<size_t>((e * w.ne1 + o) * w.ne0 + i)] += sc * d;
                    }
        }
    };
    if (!full)
        for (const rp::LoraTensor & lt : tr.adapter()->tensors()) refresh(lt.base);

    std::vector<std::vector<std::vector<double>>> states;
    for (size_t b = 0; b < 2; ++b) {
        m.seq = static_cast<int>(b);
        states.push_back(ft_ref::forward_states(m, s.ids[b]));  // (records the routing at the base point)
    }
    m.replay_routing = true;
    // with_aux: plus the load-balancing sum of the layers from `first` on (the earlier ones do not move when
    // layer `first` is perturbed), scaled like the trainer's: coefficient x n_expert x loss_scale.
    auto ref_loss = [&](int first, bool with_aux = true) {
        double sum = 0, aux_sum = 0;
        for (size_t b = 0; b < 2; ++b) {
            m.seq = static_cast<int>(b);
            const auto xs = first == 0 ? ft_ref::forward_states(m, s.ids[b], 0, {}, &aux_sum)
                                       : ft_ref::forward_states(m, s.ids[b], first, states[b], &aux_sum);
            sum += ft_ref::ce_sum(m, xs.back(), s.labels[b]);
        }
        return (sum + (with_aux ? static_cast<double>(aux) * hp.n_expert * aux_sum : 0.0)) / static_cast<double>(s.n_trained);
    };
    const double l0 = ref_loss(0, false);
    EXPECT_NEAR(loss, l0, 1e-5 * std::abs(l0)) << path;

    double worst = 0;
    for (const auto & p : tr.params()) {
        const std::vector<float> g = rp::tensor_get_f32(p.t->grad);
        // Samples: the two largest analytic entries and two random ones.
        std::vector<size_t> idx(g.size());
        for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
        std::partial_sort(idx.begin(), idx.begin() + 2, idx.end(), [&](size_t a, size_t b) { return std::abs(g[a]) > std::abs(g[b]); });
        std::vector<size_t> pick = {idx[0], idx[1]};
        for (int k = 0; k < 2; ++k) pick.push_back(static_cast<size_t>(rng() % g.size()));

        const std::string base_name = full ? p.name : p.name.substr(0, p.name.size() - 7);
        W & target = full ? m.w.at(p.name) : lora.at(p.name);
        const int first = first_layer(p.name, static_cast<int>(hp.n_layer));
        std::vector<double> fd(pick.size());
        double fd_max = 0;
        for (size_t k = 0; k < pick.size(); ++k) {
            const double eps = 1e-4, keep = target.v[pick[k]];
            target.v[pick[k]] = keep + eps;
            refresh(base_name);
            const double lp = ref_loss(first);
            target.v[pick[k]] = keep - eps;
            refresh(base_name);
            const double lm = ref_loss(first);
            target.v[pick[k]] = keep;
            fd[k] = (lp - lm) / (2 * eps);
            fd_max = std::max(fd_max, std::abs(fd[k]));
        }
        refresh(base_name);
        // Relative error; entries far below the tensor's largest sampled gradient are judged against 1% of it.
        double err = 0;
        for (size_t k = 0; k < pick.size(); ++k)
            err = std::max(err, std::abs(g[pick[k]] - fd[k]) / std::max({std::abs(fd[k]), 1e-2 * fd_max, 1e-9}));
        std::printf("  %-34s |g|max %.3e  rel err %.2e\n", p.name.c_str(), fd_max, err);
        EXPECT_LT(err, 1e-3) << path << " " << p.name;
        EXPECT_GT(fd_max, 0.0) << p.name << ": no gradient at all";
        worst = std::max(worst, err);
    }
    std::printf("%s %s: %zu tensors, loss %.6f (ref %.6f), max rel err %.2e\n", path.c_str(), full ? "full" : "lora",
                tr.params().size(), loss, l0, worst);
}

TEST(FinetuneGradients, Stories260KFull) { check_gradients(ft_test::stories(), true, true); }
TEST(FinetuneGradients, Stories260KLora) {
    auto t = rp::default_lora_targets();
    t.push_back("token_embd");
    check_gradients(ft_test::stories(), false, true, t);
}
TEST(FinetuneGradients, Stories260KQ8LoraFrozenQuantBase) { check_gradients(ft_test::model_path("derived/stories260K-Q8_0.gguf"), false, false); }
TEST(FinetuneGradients, Qwen2Full) { check_gradients(ft_test::model_path("synthetic/tiny-random-qwen2.gguf"), true, false); }
TEST(FinetuneGradients, Qwen2Lora) {
    auto t = rp::default_lora_targets();
    t.push_back("token_embd");
    check_gradients(ft_test::model_path("synthetic/tiny-random-qwen2.gguf"), false, false, t);
}
TEST(FinetuneGradients, Qwen3FullTied) { check_gradients(ft_test::model_path("synthetic/tiny-random-qwen3.gguf"), true, true); }
TEST(FinetuneGradients, Qwen3Lora) { check_gradients(ft_test::model_path("synthetic/tiny-random-qwen3.gguf"), false, true); }

// `s` written to dir/`name`: the path of the model the gradient checks load.
std::string written(rp_test::TempDir & dir, const rp::SynthSpec & s, const std::string & name) {
    const std::string path = dir.file(name);
    rp::write_synth_model(s, path);
    return path;
}

// qwen3moe (8 experts, top 2; head_dim 12 != n_embd / n_head): every tensor of a full finetune (the router,
// each expert stack, attention, norms) and LoRA on attention, the experts (one pair per expert) and the router.
std::string moe_model(rp_test::TempDir & dir, bool tied) {
    rp::SynthSpec s;
    s.arch = "qwen3moe";
    s.vocab_from = ft_test::model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 12, s.n_layer = 2, s.n_ff = 48;
    s.n_expert = 8, s.n_expert_used = 2, s.n_ff_exp = 24, s.tied = tied, s.seed = 41;
    return written(dir, s, tied ? "moe-tied.gguf" : "moe.gguf");
}
TEST(FinetuneGradients, Qwen3MoeFull) {
    rp_test::TempDir dir;
    check_gradients(moe_model(dir, false), true, true);
}
TEST(FinetuneGradients, Qwen3MoeFullWithLoadBalancingLoss) {
    rp_test::TempDir dir;
    check_gradients(moe_model(dir, false), true, true, {}, 0.5f);
}
// gpt-oss (8 experts, top 2; head_dim 12; windows of 5 on the even layers under 12 tokens): every tensor of a
// full finetune (sinks, q/k/v/o biases, the router and its bias, each expert stack and its bias, norms), and
// LoRA on attention, the experts and the router.
std::string gpt_oss_model(rp_test::TempDir & dir) {
    rp::SynthSpec s;
    s.arch = "gpt-oss";
    s.vocab_from = ft_test::model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 12, s.n_layer = 3, s.n_ff = 48;
    s.n_expert = 8, s.n_expert_used = 2, s.n_ff_exp = 24, s.n_swa = 5, s.seed = 42;
    return written(dir, s, "gpt-oss.gguf");
}
TEST(FinetuneGradients, GptOssFull) {
    rp_test::TempDir dir;
    check_gradients(gpt_oss_model(dir), true, true);
}
TEST(FinetuneGradients, GptOssLoraAttentionExpertsAndRouter) {
    rp_test::TempDir dir;
    auto t = rp::default_lora_targets();
    t.push_back("ffn_gate_inp");
    check_gradients(gpt_oss_model(dir), false, false, t);
}

// gemma3 (six layers: five with a window of 5 under 12 tokens and their own RoPE base, the sixth global with
// linear RoPE scaling; embeddings times sqrt(n_embd), q/k norms, post-attention and post-feed-forward norms, GeGLU
// with GELU's tanh approximation, a tied head): every tensor of a full finetune, and LoRA on every target.
std::string gemma3_model(rp_test::TempDir & dir) {
    rp::SynthSpec s;
    s.arch = "gemma3";
    s.vocab_from = ft_test::model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 12, s.n_layer = 6, s.n_ff = 40;
    s.n_swa = 5, s.rope_linear = 4.0f, s.tied = true, s.seed = 43;
    return written(dir, s, "gemma3.gguf");
}
TEST(FinetuneGradients, Gemma3Full) {
    rp_test::TempDir dir;
    check_gradients(gemma3_model(dir), true, true);
}
TEST(FinetuneGradients, Gemma3Lora) {
    rp_test::TempDir dir;
    check_gradients(gemma3_model(dir), false, true);
}

// mistral3 (a llama with the attention temperature of Llama 4: the queries of positions 4..11 scaled by
// log(floor(pos / 4) + 1) * 0.1 + 1): every tensor of a full finetune, and LoRA on every target.
std::string mistral3_model(rp_test::TempDir & dir) {
    rp::SynthSpec s;
    s.arch = "mistral3";
    s.vocab_from = ft_test::model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 12, s.n_layer = 2, s.n_ff = 40;
    s.n_ctx_train = 4, s.attn_temp_scale = 0.1f, s.seed = 44;
    return written(dir, s, "mistral3.gguf");
}
TEST(FinetuneGradients, Mistral3Full) {
    rp_test::TempDir dir;
    check_gradients(mistral3_model(dir), true, true);
}
TEST(FinetuneGradients, Mistral3Lora) {
    rp_test::TempDir dir;
    check_gradients(mistral3_model(dir), false, false);
}

// Llama 3's RoPE factors (a 4-token original context, factor 8: most pairs slowed) on a llama: every tensor of a
// full finetune (the factors are not one) and LoRA on every target.
std::string llama3_model(rp_test::TempDir & dir) {
    rp::SynthSpec s;
    s.vocab_from = ft_test::model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 8, s.n_layer = 2, s.n_ff = 40;
    s.llama3_rope = 8.0f, s.llama3_rope_ctx = 4, s.seed = 45;
    return written(dir, s, "llama3.gguf");
}
TEST(FinetuneGradients, Llama3RopeFactorsFull) {
    rp_test::TempDir dir;
    check_gradients(llama3_model(dir), true, true);
}
TEST(FinetuneGradients, Llama3RopeFactorsLora) {
    rp_test::TempDir dir;
    check_gradients(llama3_model(dir), false, false);
}

// phi3: the fused attn_qkv and gate/up ffn_up (their rows' gradients gathered from the split), LongRoPE from an
// original context of 8 tokens (its attn_factor 1.27): a full finetune with the short factors (context 12) and
// LoRA on the fused matrices with the long ones (context 16).
std::string phi3_model(rp_test::TempDir & dir) {
    rp::SynthSpec s;
    s.arch = "phi3";
    s.vocab_from = ft_test::model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 8, s.n_layer = 2, s.n_ff = 40;
    s.n_ctx_train = 128, s.long_rope_ctx = 8, s.seed = 46;
    return written(dir, s, "phi3.gguf");
}
TEST(FinetuneGradients, Phi3FullShortFactors) {
    rp_test::TempDir dir;
    check_gradients(phi3_model(dir), true, true, {}, 0, 8);
}
TEST(FinetuneGradients, Phi3LoraLongFactors) {
    rp_test::TempDir dir;
    check_gradients(phi3_model(dir), false, false, {}, 0, 16);
}

// gemma2: the attention's and the final logits' soft-caps (1.5 and 3: they bend these logits), windows on every
// other layer: every tensor of a full finetune, and LoRA on every target.
std::string gemma2_model(rp_test::TempDir & dir) {
    rp::SynthSpec s;
    s.arch = "gemma2";
    s.vocab_from = ft_test::model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 8, s.n_layer = 3, s.n_ff = 40, s.n_swa = 5;
    s.attn_softcap = 1.5f, s.final_softcap = 3.0f, s.tied = true, s.seed = 47;
    return written(dir, s, "gemma2.gguf");
}
TEST(FinetuneGradients, Gemma2Full) {
    rp_test::TempDir dir;
    check_gradients(gemma2_model(dir), true, true);
}
TEST(FinetuneGradients, Gemma2Lora) {
    rp_test::TempDir dir;
    check_gradients(gemma2_model(dir), false, false);
}

// qwen35: two Gated DeltaNet layers (2 key heads, 4 value heads of 8, conv kernel 4) around a gated full attention
// layer (4 heads over 2, 8 of 12 dimensions rotated): every tensor of a full finetune (the decay's A and bias, the
// conv kernel, the gated norm), and LoRA on every projection of both kinds (the defaults).
std::string qwen35_model(rp_test::TempDir & dir) {
    rp::SynthSpec s;
    s.arch = "qwen35";
    s.vocab_from = ft_test::model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 12, s.n_rot = 8, s.n_layer = 3, s.n_ff = 40;
    s.ssm_k_heads = 2, s.ssm_v_heads = 4, s.ssm_head_dim = 8, s.full_attn_interval = 2, s.seed = 48;
    return written(dir, s, "qwen35.gguf");
}
TEST(FinetuneGradients, Qwen35Full) {
    rp_test::TempDir dir;
    check_gradients(qwen35_model(dir), true, true);
}
TEST(FinetuneGradients, Qwen35Lora) {
    rp_test::TempDir dir;
    check_gradients(qwen35_model(dir), false, false);
}

// qwen35moe: the same hybrid with 6 experts, top 2, and a shared expert gated per token: every tensor of a full
// finetune (the router, the shared expert's gate vector) and LoRA on the defaults (the routed and the shared experts).
std::string qwen35moe_model(rp_test::TempDir & dir) {
    rp::SynthSpec s;
    s.arch = "qwen35moe";
    s.vocab_from = ft_test::model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 12, s.n_rot = 8, s.n_layer = 3, s.n_ff = 24;
    s.n_expert = 6, s.n_expert_used = 2, s.n_ff_exp = 16;
    s.ssm_k_heads = 2, s.ssm_v_heads = 4, s.ssm_head_dim = 8, s.full_attn_interval = 2, s.seed = 49;
    return written(dir, s, "qwen35moe.gguf");
}
TEST(FinetuneGradients, Qwen35MoeFull) {
    rp_test::TempDir dir;
    check_gradients(qwen35moe_model(dir), true, true);
}
TEST(FinetuneGradients, Qwen35MoeLora) {
    rp_test::TempDir dir;
    check_gradients(qwen35moe_model(dir), false, false);
}

TEST(FinetuneGradients, Qwen3MoeLoraExpertsAndRouter) {
    rp_test::TempDir dir;
    auto t = rp::default_lora_targets();
    t.push_back("ffn_gate_inp");
    check_gradients(moe_model(dir, true), false, false, t);
}

} // namespace
