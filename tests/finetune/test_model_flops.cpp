// Trainer::model_flops (ggml_rp/ops/flops.h) against the closed form of a dense decoder, counted by hand here:
// per token, every linear layer's 2 in out for the forward, as much for the input gradient, as much again
// for the weight gradients when the weights train (full), the LM head's 2 C V as a linear layer (a frozen head
// forms dh in its forward: the same count), each LoRA pair's 2 r (in + out) three times (forward, input and
// weight gradients); per sequence and layer, attention's 4 D heads over the causal pairs, three times (the
// backward is twice the forward). Recomputes and token chunks do not count.
#include "small_models.h"

#include <gtest/gtest.h>

#include <string>

namespace {

struct Dense {
    double linear = 0;  // sum over layers of in * out of every projection
    double head = 0;    // C * V
    double attention = 0;  // per sequence: sum over layers of 4 D H pairs
};

Dense closed_form(const rp::Model & model, int64_t T) {
    const rp::HParams & hp = model.hparams();
    const double E = double(hp.n_embd), Q = double(hp.n_head * hp.head_dim), KV = double(hp.n_head_kv * hp.head_dim),
                 F = double(hp.n_ff);
    Dense d;
    d.linear = double(hp.n_layer) * (E * Q + 2 * E * KV + Q * E + 3 * E * F);
    d.head = E * double(hp.n_vocab);
    d.attention = double(hp.n_layer) * 4.0 * Q * double(T) * double(T + 1) / 2.0;
    return d;
}

double model_flops(const rp::Model & model, rp::FinetuneConfig cfg, int64_t T, int64_t B, int64_t token_chunk) {
    rp::Trainer tr(model, cfg);
    rp::MicroBatchInfo mb;
    mb.seq_len = T;
    mb.n_seq = B;
    mb.token_chunk = token_chunk;
    return tr.model_flops(mb);
}

} // namespace

TEST(ModelFlops, FullFinetuneIsThreeForwardsOfTheLinearLayersAndThreeOfAttention) {
    const rp::Model & model = *ft_test::SmallModels::get().llama;
    rp::FinetuneConfig full;
    full.full = true;
    for (const auto & [T, B] : {std::pair<int64_t, int64_t>{48, 1}, {40, 3}}) {
        const Dense d = closed_form(model, T);
        const double want = double(T * B) * 3.0 * 2.0 * (d.linear + d.head) + 3.0 * double(B) * d.attention;
        const double got = model_flops(model, full, T, B, 0);
        EXPECT_NEAR(got, want, 1e-9 * want) << "T=" << T << " B=" << B;
        EXPECT_EQ(model_flops(model, full, T, B, 16), got) << "a token chunk only adds recompute";
    }
}

TEST(ModelFlops, LoraCountsTheFrozenWeightsTwiceAndItsPairsThrice) {
    const rp::Model & model = *ft_test::SmallModels::get().llama;
    rp::FinetuneConfig lora;
    lora.lora_rank = 4;
    const int64_t T = 40, B = 2;
    rp::Trainer tr(model, lora);
    ASSERT_TRUE(tr.adapter());
    double pairs = 0;
    for (const rp::LoraTensor & t : tr.adapter()->tensors())
        pairs += 2.0 * double(t.rank()) * double(t.base_weight->ne[0] + t.base_weight->ne[1]);
    ASSERT_GT(pairs, 0);
    const Dense d = closed_form(model, T);
    const double want = double(T * B) * (2.0 * 2.0 * (d.linear + d.head) + 3.0 * pairs) + 3.0 * double(B) * d.attention;
    EXPECT_NEAR(model_flops(model, lora, T, B, 0), want, 1e-9 * want);
}
