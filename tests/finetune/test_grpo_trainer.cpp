// GRPO's training programs (FinetuneConfig::grpo): the head reads each token's advantage, rollout-policy and
// reference log-probabilities and weight, and reports each token's log-probability. Every trainable tensor's
// gradient against central differences of an independent loss (the whole-model forward's token log-probabilities
// and TRL's per-token loss in long double, tests/common/grpo_reference.h): off-policy with clipped tokens and the
// KL term, and on-policy (the policy-gradient estimator -sum_t w_t A_t grad log p_t, the old log-probabilities
// held where they were); the head's log-probabilities against the whole-model forward's; the objective's refusals.
#include "base/error.h"
#include "tests/common/grpo_reference.h"
#include "tests/finetune/preference_data.h"
#include "tests/finetune/trainer_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace pref_test;

namespace {

// Per token: its sequence's advantage, the old and reference log-probabilities (from lp0, the starting policy's, off
// by the given offsets), the weight (bnpo: 1 / the batch's completion tokens; 0 on prompt and padding).
std::vector<float> token_values(const rp::Batch & bt, const std::vector<float> & lp0, bool on_policy) {
    const int64_t T = bt.seq_len, B = bt.n_seq;
    const float advantage[] = {1.2f, -0.4f, 0.8f, -1.6f};
    int64_t completion = 0;
    for (int32_t l : bt.labels) completion += l != rp::kIgnoreLabel;
    std::vector<float> v(static_cast<size_t>(rp::kTokenValues * T * B), 0.0f);
    for (int64_t i = 0; i < T * B; ++i) {
        if (bt.labels[size_t(i)] == rp::kIgnoreLabel) continue;
        float * vi = v.data() + rp::kTokenValues * i;
        vi[rp::kAdvantage] = advantage[(i / T) % 4];
        // ratios e^0 = 1, e^0.5 = 1.65 and e^-0.5 = 0.61: inside, above and below the clip range
        const float off = on_policy ? 0.0f : (i % 3 == 0 ? 0.0f : i % 3 == 1 ? -0.5f : 0.5f);
        vi[rp::kOldLogp] = lp0[size_t(i)] + off;
        vi[rp::kRefLogp] = lp0[size_t(i)] - 0.3f;
        vi[rp::kTokenWeight] = 1.0f / static_cast<float>(completion);
    }
    return v;
}

} // namespace

TEST(GrpoTraining, GradientsMatchFiniteDifferences) {
    const rp::Dataset d = pairs(toy_pairs(2), 32);  // four sequences: a prompt and a completion trained on
    const std::vector<uint32_t> units = {0, 1};
    const rp::Batch bt = rp::make_batch(d, units);
    const int64_t B = bt.n_seq, T = bt.seq_len;
    struct M {
        const char * name;
        rp::GrpoParams p;
    };
    rp::GrpoParams off;
    off.on_policy = false;
    off.epsilon_high = 0.28;
    off.beta = 0.04;
    rp::GrpoParams on;  // one update per rollout batch, no KL: the policy-gradient estimator
    for (const M & m : {M{"off-policy, clip-higher, KL", off}, M{"on-policy", on}}) {
        SCOPED_TRACE(m.name);
        rp::FinetuneConfig cfg;
        cfg.lora_rank = 2;
        cfg.lora_targets = {"attn_q", "ffn_down"};
        cfg.grpo = m.p;
        rp::Trainer tr(*fx().model, cfg);
        ft_test::randomize_trainables(tr, 3);
        const std::vector<float> lp0 = tr.token_logps(bt.inputs.data(), bt.labels.data(), T, B, 1);
        const std::vector<float> v = token_values(bt, lp0, m.p.on_policy);
        // Independent: TRL's loss in long double over the whole-model forward's token log-probabilities; on-policy,
        // the old log-probabilities held at the starting policy's (TRL's detach), which is the off-policy formula.
        rp::GrpoParams held = m.p;
        held.on_policy = false;
        auto loss_at = [&]() {
            const std::vector<float> lp = tr.token_logps(bt.inputs.data(), bt.labels.data(), T, B, 1);
            return static_cast<double>(grpo_ref::loss(held, lp.data(), v.data(), T * B));
        };
        rp::MicroBatchInfo mb;
        mb.seq_len = T;
        mb.n_seq = B;
        mb.sequence_values = v.data();
        tr.zero_grads();
        std::vector<float> results(tr.head_results(mb));
        ASSERT_EQ(results.size(), size_t(1 + T * B));
        const double loss = tr.accumulate(bt.inputs.data(), bt.labels.data(), mb, 1, results.data());
        tr.collect_grads();
        EXPECT_NEAR(loss, loss_at(), 1e-6 * std::max(1.0, std::fabs(loss)));
        for (int64_t i = 0; i < T * B; ++i) EXPECT_NEAR(results[size_t(1 + i)], lp0[size_t(i)], 1e-5 * std::fabs(lp0[size_t(i)])) << "token " << i;
        int clipped = 0;
        for (int64_t i = 0; i < T * B; ++i) clipped += rp::grpo_token_loss(m.p, lp0[size_t(i)], v.data() + rp::kTokenValues * i).clipped;
        if (!m.p.on_policy) {
            EXPECT_GT(clipped, 4);
        }
        // h: 1.25% of the tensor's RMS, at most what moves the loss by 0.5% of max(1, L): a larger step takes some
        // tokens' ratios across the clip range's ends (measured: 5% does here), where the loss has kinks
        const double worst = ft_test::check_gradients_by_differences(tr, loss_at, loss, 0.0125, 0.005, 2e-3);
        std::printf("[ grpo ] %s: loss %.6f, %d clipped tokens, worst relative gradient error %.2e over %zu tensors\n", m.name, loss, clipped, worst,
                    tr.params().size());
    }
}

// The head needs the tokens' values; one objective at a time.
TEST(GrpoTraining, RefusesWhatItCannotTrain) {
    rp::FinetuneConfig cfg;
    cfg.grpo = rp::GrpoParams{};
    rp::Trainer tr(*fx().model, cfg);
    const rp::Dataset d = pairs(toy_pairs(1), 32);
    const rp::Batch bt = rp::make_batch(d, std::vector<uint32_t>{0});
    rp::MicroBatchInfo mb;
    mb.seq_len = bt.seq_len;
    mb.n_seq = bt.n_seq;
    try {
        tr.accumulate(bt.inputs.data(), bt.labels.data(), mb, 1);
        ADD_FAILURE() << "no error";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("GRPO needs each token's advantage"), std::string::npos) << e.what();
    }
    cfg.preference = rp::PreferenceParams{};
    EXPECT_THROW(rp::Trainer(*fx().model, cfg), rp::Error);
}
