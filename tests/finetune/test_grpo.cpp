// GRPO through a TrainingSession (models/train/grpo.h): prompts from JSONL, rollouts sampled with the current
// weights, rewards (built-ins and a reward program), group-normalised advantages and the clipped policy loss. A toy
// task learns (stories260K rewarded for completions that say "dog"); the same seed gives the same rollouts and
// bytes; a resumed run ends with the uninterrupted run's bytes; the pipeline (2 CPU devices) equals the host bit
// for bit; the advantages and token weights are TRL's; bad setups are refused.
#include "base/error.h"
#include "base/read_file.h"
#include "models/train/grpo.h"
#include "tests/common/temp_dir.h"
#include "tests/finetune/ft_test_util.h"
#include "tests/finetune/stories_fixture.h"
#include "tests/finetune/trainer_checks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

namespace {

ft_test::StoriesFixture & fx() { return ft_test::StoriesFixture::get(); }

std::string toy_prompts() {
    const char * names[] = {"Tom", "Lily", "Ben", "Sue", "Max", "Anna", "Tim", "Mia"};
    std::string out;
    for (int i = 0; i < 8; ++i)
        out += "{\"prompt\": \"Once upon a time, " + std::string(names[i]) + " had a pet. It was a big\", \"id\": " + std::to_string(i) + "}\n";
    return out;
}

rp::PromptSet prompts(const std::string & jsonl) {
    rp::DatasetOptions o;
    o.seq_len = 1;  // (prompts have no sequence length of their own)
    return rp::PromptSet::from_jsonl(jsonl, "prompts.jsonl", fx().tok, o);
}

rp::GrpoOptions grpo_options() {
    rp::GrpoOptions g;
    g.group = 6;
    g.max_completion_len = 8;
    g.seed = 5;
    g.threads = 1;
    return g;
}

rp::SessionOptions session_options(rp::StepObjective * objective, const rp::GrpoOptions & g, int64_t steps) {
    rp::SessionOptions o;
    o.finetune.lora_rank = 8;
    o.finetune.grpo = g.loss;
    o.objective = objective;
    o.batch = 2;  // prompts
    o.micro_batches = 2;
    o.steps = steps;
    o.threads = 1;
    o.lr.lr_max = 5e-3;
    o.lr.warmup_steps = 0;
    return o;
}

// A GRPO run: its session, objective and rewards, over prompts p.
struct GrpoRun {
    rp::RewardSet rewards;
    rp::GrpoOptions g;
    rp::Dataset frame;
    rp::GrpoObjective objective;
    rp::TrainingSession session;
    GrpoRun(const rp::PromptSet & p, const rp::GrpoOptions & opt, int64_t steps, std::unique_ptr<rp::RewardFunction> reward,
        const std::function<void(rp::SessionOptions &)> & edit = {})
        : g(opt), frame(p.frame(rp::grpo_seq_len(p, opt), opt.group)), objective(*fx().model, fx().tok, p, add(std::move(reward)), g),
          session(*fx().model, frame, options(edit, steps)) {}
    rp::RewardSet & add(std::unique_ptr<rp::RewardFunction> f) {
        rewards.add(std::move(f), 1.0);
        return rewards;
    }
    rp::SessionOptions options(const std::function<void(rp::SessionOptions &)> & edit, int64_t steps) {
        rp::SessionOptions o = session_options(&objective, g, steps);
        if (edit) edit(o);
        return o;
    }
};


} // namespace

// The toy task: the reward is 1 when the completion says "dog". The mean reward of the last steps is well above
// the first steps'.
TEST(Grpo, AToyTaskLearnsToSayTheRewardedWord) {
    const rp::PromptSet p = prompts(toy_prompts());
    rp::GrpoOptions g = grpo_options();
    g.group = 8;
    const int64_t steps = 20;
    GrpoRun run(p, g, steps, rp::make_builtin_reward("regex:dog"));
    std::vector<double> reward;
    for (int64_t s = 0; s < steps; ++s) {
        const rp::StepReport r = run.session.step();
        ASSERT_TRUE(r.grpo.has_value());
        ASSERT_TRUE(std::isfinite(r.loss));
        reward.push_back(r.grpo->reward);
    }
    auto mean = [&](size_t a, size_t b) { return std::accumulate(reward.begin() + a, reward.begin() + b, 0.0) / static_cast<double>(b - a); };
    std::string curve;
    for (size_t s = 0; s < reward.size(); s += 5) {
        char buf[400];
        std::snprintf(buf, sizeof buf, " %zu-%zu: %.3f;", s + 1, s + 5, mean(s, s + 5));
        curve += buf;
    }
    std::printf("[ grpo ] toy reward (mean per 5 steps):%s\n", curve.c_str());
    EXPECT_GT(mean(15, 20), mean(0, 5) + 0.3);
}

// The same seed samples the same completions and ends with the same bytes; another seed samples others. A resumed
// run (checkpoint at step 2 of 4) ends with the uninterrupted run's bytes and rewards (the sampler is stateless: it
// is keyed by the step).
TEST(Grpo, ReproducibleAndResumesBitExact) {
    rp_test::TempDir dir;
    const rp::PromptSet p = prompts(toy_prompts());
    const rp::GrpoOptions g = grpo_options();
    GrpoRun a(p, g, 4, rp::make_builtin_reward("regex:dog")), b(p, g, 4, rp::make_builtin_reward("regex:dog"));
    std::vector<double> ra;
    for (int i = 0; i < 4; ++i) {
        ra.push_back(a.session.step().grpo->reward);
        b.session.step();
        EXPECT_EQ(a.objective.completions(), b.objective.completions()) << "step " << i + 1;
    }
    EXPECT_EQ(ft_test::first_different_master(a.session.trainer(), b.session.trainer()), "");
    rp::GrpoOptions other = g;
    other.seed = 6;
    GrpoRun c(p, other, 1, rp::make_builtin_reward("regex:dog"));
    c.session.step();
    GrpoRun first(p, g, 4, rp::make_builtin_reward("regex:dog"));
    first.session.step();
    EXPECT_NE(c.objective.completions(), first.objective.completions());
    first.session.step();
    first.session.save_checkpoint(dir.file("ckpt.gguf"));
    GrpoRun second(p, g, 4, rp::make_builtin_reward("regex:dog"));
    second.session.resume(dir.file("ckpt.gguf"));
    std::vector<double> rs;
    for (int i = 0; i < 2; ++i) rs.push_back(second.session.step().grpo->reward);
    EXPECT_EQ(rs, (std::vector<double>{ra[2], ra[3]}));
    EXPECT_EQ(second.session.curve().reward, a.session.curve().reward);  // (the checkpoint keeps the reward curve)
    EXPECT_EQ(second.objective.completions(), a.objective.completions());
    EXPECT_EQ(ft_test::first_different_master(a.session.trainer(), second.session.trainer()), "");
}

// The completions of a prompt decoded together (the whole group of 6, or 4 then 2) are those decoded one at a time,
// and the runs end with the same bytes: batched decoding changes no logit, the samplers are keyed by completion.
// With the training graphs' arithmetic (auto on this f32 model) and with row dots (fast: each sequence its own bits).
TEST(Grpo, BatchedRolloutsEqualOneAtATime) {
    for (const rp::RolloutMatvec mv : {rp::RolloutMatvec::Auto, rp::RolloutMatvec::Fast}) {
        SCOPED_TRACE(mv == rp::RolloutMatvec::Fast ? "fast" : "auto");
        const rp::PromptSet p = prompts(toy_prompts());
        rp::GrpoOptions g = grpo_options();
        g.rollout_matvec = mv;
        g.max_completion_len = 16;
        g.stop = {"."};  // (completions of several lengths)
        g.rollout_batch = 1;
        GrpoRun one(p, g, 2, rp::make_builtin_reward("regex:a"));
        g.rollout_batch = 0;
        GrpoRun all(p, g, 2, rp::make_builtin_reward("regex:a"));
        g.rollout_batch = 4;
        GrpoRun four(p, g, 2, rp::make_builtin_reward("regex:a"));
        for (int i = 0; i < 2; ++i) {
            const rp::StepReport r = one.session.step(), ra = all.session.step(), r4 = four.session.step();
            EXPECT_EQ(all.objective.completions(), one.objective.completions()) << "step " << i + 1;
            EXPECT_EQ(four.objective.completions(), one.objective.completions()) << "step " << i + 1;
            EXPECT_EQ(ra.loss, r.loss);
            EXPECT_EQ(r4.loss, r.loss);
            std::set<size_t> lengths;
            for (const auto & c : one.objective.completions()) lengths.insert(c.size());
            EXPECT_GT(lengths.size(), 1u) << "completions of one length: nothing idled while the others decoded";
        }
        EXPECT_EQ(ft_test::first_different_master(one.session.trainer(), all.session.trainer()), "");
        EXPECT_EQ(ft_test::first_different_master(one.session.trainer(), four.session.trainer()), "");
    }
}

// --rollout-matvec auto: row dots for a quantized base (a LoRA run on stories260K's Q8_0), the training graphs'
// arithmetic for float weights and for a full finetune (its rollouts read the f32 masters); fast and exact as named.
TEST(Grpo, AutoRolloutsUseRowDotsForAQuantizedBase) {
    const auto q8 = rp::Model::load(ft_test::shared_dir() + "/models/derived/stories260K-Q8_0.gguf");
    const rp::PromptSet p = prompts(toy_prompts());
    rp::RewardSet rewards;
    rewards.add(rp::make_builtin_reward("regex:a"), 1.0);
    auto decides = [&](const rp::Model & m, rp::RolloutMatvec mv, bool full) {
        rp::GrpoOptions g = grpo_options();
        g.rollout_matvec = mv;
        rp::GrpoObjective o(m, fx().tok, p, rewards, g);
        rp::FinetuneConfig c;
        c.full = full;
        c.grpo = rp::GrpoParams{};
        rp::Trainer tr(m, c);
        return o.rollouts_use_row_dots(tr);
    };
    EXPECT_TRUE(decides(*q8, rp::RolloutMatvec::Auto, false));
    EXPECT_FALSE(decides(*fx().model, rp::RolloutMatvec::Auto, false));
    EXPECT_FALSE(decides(*fx().model, rp::RolloutMatvec::Auto, true));
    EXPECT_TRUE(decides(*fx().model, rp::RolloutMatvec::Fast, false));
    EXPECT_FALSE(decides(*q8, rp::RolloutMatvec::Exact, false));
}

// iterations 2 (TRL's num_iterations): step 1 samples a rollout batch, its old log-probabilities those of the
// sampling policy (the initial weights, bit for bit); step 2 trains on the same batch, its loss the clipped ratio
// against them at the weights after step 1 (summed here from the per-token closed form); step 3 samples the data's
// next batch; an epoch counts 2 steps a batch. On-policy at step 1 (ratio 1 up to rounding): the loss of a run that
// updates once per batch.
TEST(Grpo, IterationsTrainAgainOnTheHeldRollouts) {
    const rp::PromptSet p = prompts(toy_prompts());
    rp::GrpoOptions g = grpo_options();
    g.iterations = 2;
    g.loss.on_policy = false;
    g.loss.beta = 0.04;
    g.loss.epsilon_low = g.loss.epsilon_high = 0.02;  // (a tight clip: step 2's ratios reach it)
    GrpoRun a(p, g, 4, rp::make_builtin_reward("regex:a"));
    GrpoRun initial(p, g, 4, rp::make_builtin_reward("regex:a"));  // (never steps: the sampling policy of step 1)
    rp::GrpoOptions once = grpo_options();
    once.loss.beta = g.loss.beta;
    once.loss.epsilon_low = once.loss.epsilon_high = 0.02;
    GrpoRun on_policy(p, once, 4, rp::make_builtin_reward("regex:a"));

    const rp::StepReport r1 = a.session.step(), o1 = on_policy.session.step();
    ASSERT_TRUE(r1.grpo.has_value());
    EXPECT_EQ(r1.grpo->iteration, 0);
    EXPECT_GT(r1.grpo->rollout_tokens, 0);
    EXPECT_EQ(a.objective.completions(), on_policy.objective.completions());
    EXPECT_NEAR(r1.loss, o1.loss, 1e-6 * std::max(1.0, std::fabs(o1.loss)));
    ASSERT_NE(a.objective.held_batch(), nullptr);
    const rp::Batch held = *a.objective.held_batch();
    const std::vector<float> values = a.objective.held_values();
    const std::vector<std::vector<int32_t>> c1 = a.objective.completions();
    auto logps = [&](const GrpoRun & run) {
        return const_cast<rp::Trainer &>(run.session.trainer()).token_logps(held.inputs.data(), held.labels.data(), held.seq_len, held.n_seq, 1);
    };
    const std::vector<float> old = logps(initial), now = logps(a);
    double want = 0;
    int64_t tokens = 0;
    for (size_t k = 0; k < old.size(); ++k) {
        const float * v = values.data() + rp::kTokenValues * k;
        if (v[rp::kTokenWeight] == 0) continue;
        ++tokens;
        EXPECT_EQ(v[rp::kOldLogp], old[k]) << "token " << k;
        want += rp::grpo_token_loss(g.loss, now[k], v).loss;
    }
    ASSERT_GT(tokens, 0);

    const rp::StepReport r2 = a.session.step();
    EXPECT_EQ(r2.grpo->iteration, 1);
    EXPECT_EQ(r2.grpo->rollout_tokens, 0);
    EXPECT_EQ(a.objective.completions(), c1);
    EXPECT_EQ(r2.grpo->reward, r1.grpo->reward);
    EXPECT_NEAR(r2.loss, want, 1e-5 * std::max(1.0, std::fabs(want)));
    std::printf("[ grpo ] iterations 2: step 1 loss %.9g (on-policy run %.9g), step 2 loss %.9g (closed form %.9g), clipped %.3f\n", r1.loss,
                o1.loss, r2.loss, want, r2.grpo->clip_ratio);
    EXPECT_GT(r2.grpo->clip_ratio, 0.0);  // the ratio moved off 1 (on-policy it stays 1: nothing clips)

    const rp::StepReport r3 = a.session.step();
    EXPECT_EQ(r3.grpo->iteration, 0);
    EXPECT_NE(a.objective.held_batch()->units, held.units);
    GrpoRun epoch(p, g, 0, rp::make_builtin_reward("regex:a"));
    EXPECT_EQ(epoch.session.total_steps(), 8);  // 8 prompts in batches of 2, 2 steps each
}

// A run of iterations 2 resumed between the two updates of a rollout batch (the checkpoint holds the batch, its
// values and statistics) ends with the uninterrupted run's bytes; a run that updates once per batch refuses that
// checkpoint.
TEST(Grpo, IterationsResumeMidBatchBitExact) {
    rp_test::TempDir dir;
    const rp::PromptSet p = prompts(toy_prompts());
    rp::GrpoOptions g = grpo_options();
    g.iterations = 2;
    g.loss.on_policy = false;
    GrpoRun a(p, g, 4, rp::make_builtin_reward("regex:a"));
    std::vector<rp::StepReport> want;
    for (int i = 0; i < 4; ++i) want.push_back(a.session.step());
    GrpoRun first(p, g, 4, rp::make_builtin_reward("regex:a"));
    first.session.step();
    first.session.save_checkpoint(dir.file("ckpt.gguf"));
    GrpoRun second(p, g, 4, rp::make_builtin_reward("regex:a"));
    second.session.resume(dir.file("ckpt.gguf"));
    for (int i = 1; i < 4; ++i) {
        const rp::StepReport r = second.session.step();
        EXPECT_EQ(r.loss, want[size_t(i)].loss) << "step " << i + 1;
        EXPECT_EQ(r.grpo->reward, want[size_t(i)].grpo->reward);
        EXPECT_EQ(r.grpo->completion_mean, want[size_t(i)].grpo->completion_mean);
        EXPECT_EQ(r.grpo->sample, want[size_t(i)].grpo->sample);
        EXPECT_EQ(r.grpo->iteration, want[size_t(i)].grpo->iteration);
    }
    EXPECT_EQ(ft_test::first_different_master(a.session.trainer(), second.session.trainer()), "");
    GrpoRun once(p, grpo_options(), 4, rp::make_builtin_reward("regex:a"));
    try {
        once.session.resume(dir.file("ckpt.gguf"));
        ADD_FAILURE() << "a run of one update per batch took a held rollout batch";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find(dir.file("ckpt.gguf") + ": the checkpoint's GRPO rollout batch is for iterations > 1"),
                  std::string::npos) << e.what();
    }
    // A state cut short or naming a prompt the run lacks is refused, and nothing of it is kept.
    rp::ObjectiveState cut = first.objective.state();
    cut.ints.pop_back();
    EXPECT_THROW(second.objective.restore(cut), rp::Error);
    rp::ObjectiveState stranger = first.objective.state();
    stranger.ints.back() = 99;
    EXPECT_THROW(second.objective.restore(stranger), rp::Error);
    EXPECT_EQ(second.objective.held_batch(), nullptr);
    // Another sequence length: the session refuses the checkpoint's data position first; the objective its batch.
    rp::GrpoOptions longer = g;
    longer.max_completion_len += 1;
    GrpoRun other(p, longer, 4, rp::make_builtin_reward("regex:a"));
    EXPECT_THROW(other.session.resume(dir.file("ckpt.gguf")), rp::Error);
    try {
        other.objective.restore(first.objective.state());
        ADD_FAILURE() << "a held batch of other sequences was taken";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("has sequences of"), std::string::npos) << e.what();
    }
}

// Through RoundPipe (2 CPU devices, sync; RoundPipe and GPipe schedules): the rollouts read the masters, the heads
// read each token's values, and the steps are the host's bits; also with bf16 boundaries (FinetuneConfig::
// boundary_type) on both paths.
TEST(Grpo, ThePipelineEqualsTheHostBitForBit) {
    const rp::PromptSet p = prompts(toy_prompts());
    rp::GrpoOptions g = grpo_options();
    g.loss.beta = 0.04;  // the reference's log-probabilities too
    g.loss.epsilon_high = 0.28;
    for (const rp::DType boundary : {rp::DType::F32, rp::DType::BF16}) {
        auto boundaries = [boundary](rp::SessionOptions & o) { o.finetune.boundary_type = boundary; };
        GrpoRun host(p, g, 3, rp::make_builtin_reward("regex:a"), boundaries);  // (rewards that differ within groups: the policy moves)
        std::vector<rp::StepReport> want;
        for (int i = 0; i < 3; ++i) want.push_back(host.session.step());
        for (const rp::ScheduleKind schedule : {rp::ScheduleKind::RoundPipe, rp::ScheduleKind::GPipe}) {
            if (boundary == rp::DType::BF16 && schedule != rp::ScheduleKind::RoundPipe) continue;
            SCOPED_TRACE(std::to_string(static_cast<int>(schedule)) + " " + rp::dtype_name(boundary));
            GrpoRun pipe(p, g, 3, rp::make_builtin_reward("regex:a"), [&](rp::SessionOptions & o) {
                boundaries(o);
                o.pipelined = true;
                o.devices.count = 2;
                o.devices.memory_each = size_t(64) << 20;
                o.pipeline.schedule = schedule;
            });
            for (int i = 0; i < 3; ++i) {
                const rp::StepReport r = pipe.session.step();
                EXPECT_EQ(r.loss, want[size_t(i)].loss) << "step " << i + 1;
                ASSERT_TRUE(r.grpo.has_value());
                EXPECT_EQ(r.grpo->reward, want[size_t(i)].grpo->reward);
                EXPECT_EQ(r.grpo->kl, want[size_t(i)].grpo->kl);
            }
            pipe.session.synchronize();
            EXPECT_EQ(ft_test::first_different_master(host.session.trainer(), pipe.session.trainer()), "");
        }
        EXPECT_GT(want[2].grpo->kl, 0.0);  // the policy has moved from the reference
    }
}

// A reward program in the loop (a shell script: 1 for a completion with an "a", else 0), its scores in the step's
// rewards; and the step's advantages are TRL's: per group (r - mean) / (std + 1e-4), every token of a completion
// weighted 1 / (the batch's completion tokens) (bnpo).
TEST(Grpo, RewardProgramAdvantagesAndWeights) {
    rp_test::TempDir dir;
    std::ofstream(dir.file("a.sh")) << "while IFS= read -r line; do case \"$line\" in *'\"completion\": \"'*a*) echo 1 ;; *) echo 0 ;; esac; done\n";
    const rp::PromptSet p = prompts(toy_prompts());
    const rp::GrpoOptions g = grpo_options();
    GrpoRun run(p, g, 1, rp::make_reward_program("sh " + dir.file("a.sh"), 30));
    rp::Trainer & tr = const_cast<rp::Trainer &>(run.session.trainer());
    rp::Batch bt = rp::make_batch(run.frame, std::vector<uint32_t>{0, 3});
    const std::vector<float> v = run.objective.prepare(tr, 0, bt);
    const int64_t T = bt.seq_len, G = g.group;
    int64_t tokens = 0;
    for (int32_t l : bt.labels) tokens += l != rp::kIgnoreLabel;
    ASSERT_EQ(v.size(), size_t(rp::kTokenValues * T * bt.n_seq));
    // the rewards the program gave, recomputed from the completions' texts
    std::vector<double> r(static_cast<size_t>(bt.n_seq));
    for (size_t i = 0; i < r.size(); ++i) {
        std::string text;
        for (int32_t id : run.objective.completions()[i])
            if (!fx().tok.is_eog(id)) text += fx().tok.token_to_piece(id, false);
        r[i] = text.find('a') != std::string::npos ? 1.0 : 0.0;
    }
    for (int64_t b = 0; b < 2; ++b) {
        double mean = 0, var = 0;
        for (int64_t j = 0; j < G; ++j) mean += r[size_t(b * G + j)];
        mean /= double(G);
        for (int64_t j = 0; j < G; ++j) var += (r[size_t(b * G + j)] - mean) * (r[size_t(b * G + j)] - mean) / double(G - 1);
        for (int64_t j = 0; j < G; ++j) {
            const int64_t i = b * G + j;
            const double want = (r[size_t(i)] - mean) / (std::sqrt(var) + 1e-4);
            int64_t n = 0;
            for (int64_t t = 0; t < T; ++t) {
                const float * vt = v.data() + rp::kTokenValues * (i * T + t);
                if (bt.labels[size_t(i * T + t)] == rp::kIgnoreLabel) {
                    EXPECT_EQ(vt[rp::kTokenWeight], 0.0f);
                    continue;
                }
                ++n;
                EXPECT_FLOAT_EQ(vt[rp::kAdvantage], static_cast<float>(want)) << "completion " << i;
                EXPECT_FLOAT_EQ(vt[rp::kTokenWeight], 1.0f / static_cast<float>(tokens));
            }
            EXPECT_EQ(n, static_cast<int64_t>(run.objective.completions()[size_t(i)].size()));
        }
    }
    const rp::StepReport s = run.session.step();
    ASSERT_TRUE(s.grpo.has_value());
    ASSERT_EQ(s.grpo->rewards.size(), 1u);
    EXPECT_EQ(s.grpo->rewards[0].first, "cmd:sh " + dir.file("a.sh"));
}

// Stop strings: a completion ends at the token that completes one (the string in its text), finished; the others
// run to the limit or an end token; length:N then rewards the short ones.
TEST(Grpo, StopStringsEndCompletions) {
    const rp::PromptSet p = prompts(toy_prompts());
    rp::GrpoOptions g = grpo_options();
    g.max_completion_len = 24;
    g.stop = {"."};
    GrpoRun run(p, g, 1, rp::make_builtin_reward("length:24"));
    rp::Trainer & tr = const_cast<rp::Trainer &>(run.session.trainer());
    rp::Batch bt = rp::make_batch(run.frame, std::vector<uint32_t>{0, 1});
    run.objective.prepare(tr, 0, bt);
    int stopped = 0;
    for (const std::vector<int32_t> & c : run.objective.completions()) {
        std::string text, before_last;
        for (size_t k = 0; k < c.size(); ++k) {
            if (k + 1 == c.size()) before_last = text;
            if (!fx().tok.is_eog(c[k])) text += fx().tok.token_to_piece(c[k], false);
        }
        EXPECT_EQ(before_last.find('.'), std::string::npos) << text;  // nothing ran past a stop
        if (text.find('.') != std::string::npos) ++stopped;
        else EXPECT_TRUE(c.size() == 24 || fx().tok.is_eog(c.back())) << text;
    }
    EXPECT_GT(stopped, 0);
    rp::GrpoOptions bad = g;
    bad.stop = {""};
    rp::RewardSet one;
    one.add(rp::make_builtin_reward("regex:dog"), 1.0);
    EXPECT_THROW(rp::GrpoObjective(*fx().model, fx().tok, p, one, bad), rp::Error);
}

TEST(Grpo, RefusesWhatItCannotRun) {
    const rp::PromptSet p = prompts(toy_prompts());
    rp::GrpoOptions g = grpo_options();
    rp::RewardSet none;
    EXPECT_THROW(rp::GrpoObjective(*fx().model, fx().tok, p, none, g), rp::Error);  // no reward
    rp::RewardSet one;
    one.add(rp::make_builtin_reward("regex:dog"), 1.0);
    g.group = 1;
    EXPECT_THROW(rp::GrpoObjective(*fx().model, fx().tok, p, one, g), rp::Error);  // nothing to compare
    g = grpo_options();
    g.temperature = 0;
    EXPECT_THROW(rp::GrpoObjective(*fx().model, fx().tok, p, one, g), rp::Error);  // greedy: a group of equal completions
    // The objective must match the data: a frame needs the objective; the objective a frame.
    g = grpo_options();
    rp::GrpoObjective obj(*fx().model, fx().tok, p, one, g);
    const rp::Dataset frame = p.frame(rp::grpo_seq_len(p, g), g.group);
    rp::SessionOptions o = session_options(&obj, g, 1);
    o.objective = nullptr;
    EXPECT_THROW(rp::TrainingSession(*fx().model, frame, o), rp::Error);
    o = session_options(&obj, g, 1);
    EXPECT_THROW(rp::TrainingSession(*fx().model, fx().data, o), rp::Error);
    o.val_split = 0.25;
    EXPECT_THROW(rp::TrainingSession(*fx().model, frame, o), rp::Error);
    // Prompt lines: errors name the line; a sequence that leaves no room for a completion is refused.
    EXPECT_THROW(prompts("{\"prompt\": \"a\"}\n{\"question\": \"b\"}\n"), rp::Error);
    try {
        prompts("{\"prompt\": \"a\"}\n{\"prompt\": \"\"}\n");
        ADD_FAILURE() << "no error";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("prompts.jsonl line 2: the prompt is empty"), std::string::npos) << e.what();
    }
    EXPECT_THROW(p.frame(static_cast<int32_t>(p.max_tokens()), 4), rp::Error);
}

// rp-finetune --method grpo: the setup line, each step's rewards in the log and TRL's names in the metrics, a reward
// program through --reward-cmd; a program that fails mid-run stops it (exit 1) naming the program, with the last
// checkpoint intact and no result written; a GRPO flag on another method, and a missing reward, are refused.
TEST(GrpoTool, TrainsFromTheCommandLineAndStopsOnAFailingRewardProgram) {
    rp_test::TempDir dir;
    {
        std::ofstream(dir.file("prompts.jsonl")) << toy_prompts();
        std::ofstream(dir.file("dog.sh")) << "while IFS= read -r l; do case \"$l\" in *'\"completion\": \"'*dog*) echo 1 ;; *) echo 0 ;; esac; done\n";
        // answers two batches (2 prompts x 4 completions each), then exits
        std::ofstream(dir.file("two.sh")) << "n=0; while IFS= read -r l; do n=$((n + 1)); echo 0.5; if [ $n -ge 16 ]; then exit 7; fi; done\n";
    }
    const std::string base = ft_test::tool("rp-finetune") + " -m " + ft_test::stories() + " --data " + dir.file("prompts.jsonl") +
                             " --method grpo --group 4 --max-completion-len 6 --batch 2 -t 1 --lr 5e-3";
    std::string out;
    ASSERT_EQ(ft_test::run(base + " --steps 3 --reward regex:dog --reward-cmd 'sh " + dir.file("dog.sh") + "' --reward-weights 1,0.5 --rollout-matvec fast -o " +
                               dir.file("a.gguf"),
                           &out),
              0)
        << out;
    EXPECT_NE(out.find("8 prompts (0 cut to --max-prompt-len), 4 completions each of up to 6 tokens"), std::string::npos) << out;
    EXPECT_NE(out.find("decoded 4 at a time (with row dots)"), std::string::npos) << out;
    EXPECT_NE(out.find("rewards: regex:dog x 1, cmd:sh " + dir.file("dog.sh") + " x 0.5; loss bnpo"), std::string::npos) << out;
    EXPECT_NE(out.find("step 3/3 | loss"), std::string::npos) << out;
    EXPECT_NE(out.find("  reward "), std::string::npos) << out;
    EXPECT_TRUE(std::filesystem::exists(dir.file("a.gguf")));
    const std::string metrics = rp::read_file(dir.file("a.gguf.metrics.jsonl"));
    for (const char * key : {"\"reward\":", "\"reward_std\":", "\"rewards/regex:dog/mean\":", "\"frac_reward_zero_std\":", "\"completions/mean_length\":",
                             "\"kl\":", "\"clip_ratio/region_mean\":", "\"completion\":"})
        EXPECT_NE(metrics.find(key), std::string::npos) << key << "\n" << metrics;
    // Two updates per rollout batch, 3 completions decoded together: steps 2 and 4 train again on steps 1 and 3's.
    ASSERT_EQ(ft_test::run(base + " --steps 4 --reward regex:dog --iterations 2 --rollout-batch 3 -o " + dir.file("c.gguf"), &out), 0) << out;
    EXPECT_NE(out.find("4 completions each of up to 6 tokens (sequences of 27), decoded 3 at a time (with the training graphs' arithmetic)"),
              std::string::npos) << out;  // (auto on an f32 model)
    EXPECT_NE(out.find("  update 2 on the rollouts of step 1 |"), std::string::npos) << out;
    EXPECT_NE(out.find("  update 2 on the rollouts of step 3 |"), std::string::npos) << out;
    const std::string iterated = rp::read_file(dir.file("c.gguf.metrics.jsonl"));
    EXPECT_NE(iterated.find("\"iteration\":1,"), std::string::npos) << iterated;
    // The program exits during step 3: exit 1 naming it; step 2's checkpoint stays, no result.
    EXPECT_NE(ft_test::run(base + " --steps 4 --save-every 1 --reward-cmd 'sh " + dir.file("two.sh") + "' -o " + dir.file("b.gguf"), &out), 0);
    EXPECT_NE(out.find("reward program 'sh " + dir.file("two.sh") + "'"), std::string::npos) << out;
    EXPECT_NE(out.find("exited with status 7"), std::string::npos) << out;
    EXPECT_FALSE(std::filesystem::exists(dir.file("b.gguf")));
    EXPECT_TRUE(std::filesystem::exists(dir.file("b.gguf.ckpt.gguf"))) << out;
    // Refusals.
    EXPECT_NE(ft_test::run(base + " --steps 1 -o " + dir.file("x.gguf"), &out), 0);
    EXPECT_NE(out.find("grpo needs a reward: --reward"), std::string::npos) << out;
    EXPECT_NE(ft_test::run(base + " --steps 1 --reward regex:a --reward-weights 1,2 -o " + dir.file("x.gguf"), &out), 0);
    EXPECT_NE(out.find("--reward-weights: 2 weights for 1 reward function(s)"), std::string::npos) << out;
    EXPECT_NE(ft_test::run(ft_test::tool("rp-finetune") + " -m " + ft_test::stories() + " --data " + ft_test::model_path("reference/train.txt") +
                               " --reward regex:a --steps 1 -o " + dir.file("x.gguf"),
                           &out),
              0);
    EXPECT_NE(out.find("--reward, --reward-cmd and --reward-weights are for --method grpo"), std::string::npos) << out;
    EXPECT_FALSE(std::filesystem::exists(dir.file("x.gguf")));
}
