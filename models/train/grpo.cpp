#include "models/train/grpo.h"

#include "base/error.h"
#include "models/text/tokenizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <climits>
#include <numeric>

namespace rp {

GrpoLossType parse_grpo_loss_type(const std::string & s) {
    if (s == "grpo") return GrpoLossType::Grpo;
    if (s == "bnpo") return GrpoLossType::Bnpo;
    if (s == "dr_grpo") return GrpoLossType::DrGrpo;
    throw Error("loss type \"" + s + "\" is not one of grpo, bnpo, dr_grpo");
}

const char * grpo_loss_type_name(GrpoLossType t) {
    switch (t) {
    case GrpoLossType::Grpo: return "grpo";
    case GrpoLossType::Bnpo: return "bnpo";
    case GrpoLossType::DrGrpo: return "dr_grpo";
    }
    return "?";
}

int32_t grpo_seq_len(const PromptSet & prompts, const GrpoOptions & opt) {
    return static_cast<int32_t>(prompts.max_tokens()) + opt.max_completion_len;
}

GrpoObjective::GrpoObjective(const Model & model, const Tokenizer & tok, const PromptSet & prompts, RewardSet & rewards, const GrpoOptions & opt)
    : model_(model), tok_(tok), prompts_(prompts), rewards_(rewards), opt_(opt) {
    if (opt_.group < 2) throw Error("group " + std::to_string(opt_.group) + ": GRPO compares at least 2 completions of a prompt");
    if (opt_.max_completion_len < 1) throw Error("max_completion_len must be at least 1");
    if (rewards_.size() == 0) throw Error("GRPO needs a reward (a built-in or a reward program)");
    if (!(opt_.temperature > 0)) throw Error("temperature must be > 0: GRPO samples its completions");
    if (!(opt_.top_p > 0 && opt_.top_p <= 1)) throw Error("top_p must be in (0, 1]");
    if (opt_.top_k < 0) throw Error("top_k must be >= 0");
    for (const std::string & st : opt_.stop)
        if (st.empty()) throw Error("stop: a stop string is empty");
}

std::vector<float> GrpoObjective::prepare(Trainer & tr, int64_t step, Batch & bt) {
    const int64_t T = bt.seq_len, G = opt_.group, n_prompts = static_cast<int64_t>(bt.units.size());
    if (bt.n_seq != n_prompts * G) throw Error("GRPO: a batch of " + std::to_string(bt.n_seq) + " sequences for " + std::to_string(n_prompts) +
                                               " prompts of " + std::to_string(G) + " completions");
    completions_.assign(static_cast<size_t>(bt.n_seq), {});
    finished_.assign(static_cast<size_t>(bt.n_seq), 0);
    std::vector<RewardInput> inputs;
    const auto t0 = std::chrono::steady_clock::now();
    // Rollouts: each prompt once through the cache, each completion from there.
    for (int64_t b = 0; b < n_prompts; ++b) {
        const Prompt & p = prompts_[bt.units[static_cast<size_t>(b)]];
        const int64_t P = static_cast<int64_t>(p.tokens.size());
        if (P + opt_.max_completion_len > T) throw Error("GRPO: prompt line " + std::to_string(p.line) + " and its completion exceed the sequence");
        InferenceSession s(model_, P + opt_.max_completion_len, opt_.threads, &tr.lora(), &tr.graph_weights());
        const std::vector<float> prompt_logits = s.eval(p.tokens, false);
        for (int64_t j = 0; j < G; ++j) {
            const size_t i = static_cast<size_t>(b * G + j);
            s.reset(P);
            Sampler sampler(SamplerParams{opt_.temperature, opt_.top_k, opt_.top_p,
                                          mix_seed(mix_seed(mix_seed(opt_.seed, static_cast<uint64_t>(step)), static_cast<uint64_t>(b)), static_cast<uint64_t>(j))});
            std::vector<int32_t> & c = completions_[i];
            std::vector<float> logits = prompt_logits;
            std::string text;  // (only kept with stop strings)
            for (;;) {
                const int32_t next = sampler.sample(logits.data(), s.n_vocab());
                c.push_back(next);
                if (tok_.is_eog(next)) {
                    finished_[i] = 1;
                    break;
                }
                if (!opt_.stop.empty()) {
                    const size_t before = text.size();
                    text += tok_.token_to_piece(next, false);
                    if (std::any_of(opt_.stop.begin(), opt_.stop.end(), [&](const std::string & st) {
                            // a match that ends in the new piece (one that ended earlier would have stopped it)
                            return text.find(st, before >= st.size() ? before - st.size() + 1 : 0) != std::string::npos;
                        })) {
                        finished_[i] = 1;
                        break;
                    }
                }
                if (static_cast<int64_t>(c.size()) == opt_.max_completion_len) break;
                logits = s.eval({next}, false);
            }
            // The sequence: prompt + completion, labels on the completion (its end token included).
            int32_t * in = bt.inputs.data() + static_cast<int64_t>(i) * T;
            int32_t * lab = bt.labels.data() + static_cast<int64_t>(i) * T;
            std::fill(in, in + T, in[0]);
            std::fill(lab, lab + T, kIgnoreLabel);
            const int64_t n = P + static_cast<int64_t>(c.size());
            for (int64_t t = 0; t + 1 < n; ++t) {
                in[t] = t < P ? p.tokens[static_cast<size_t>(t)] : c[static_cast<size_t>(t - P)];
                if (t + 1 >= P) lab[t] = c[static_cast<size_t>(t + 1 - P)];
            }
            RewardInput r;
            r.prompt = p.text;
            for (const int32_t id : c)
                if (!tok_.is_eog(id)) r.completion += tok_.token_to_piece(id, false);
            r.example = &p.example;
            r.where = prompts_.source() + " line " + std::to_string(p.line);
            r.tokens = static_cast<int64_t>(c.size()) - finished_[i];
            r.finished = finished_[i] != 0;
            inputs.push_back(std::move(r));
        }
    }
    const double rollout_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<std::vector<double>> each;
    const std::vector<double> reward = rewards_.score(inputs, &each);
    // Advantages, group by group; the step's reward statistics.
    std::vector<double> adv(reward.size());
    stats_ = {};
    int64_t zero_std = 0;
    for (int64_t b = 0; b < n_prompts; ++b) {
        const double * r = reward.data() + b * G;
        const double mean = std::accumulate(r, r + G, 0.0) / static_cast<double>(G);
        double var = 0;
        for (int64_t j = 0; j < G; ++j) var += (r[j] - mean) * (r[j] - mean);
        const double sd = std::sqrt(var / static_cast<double>(G - 1));
        zero_std += std::all_of(r, r + G, [&](double x) { return x == r[0]; });
        for (int64_t j = 0; j < G; ++j) adv[static_cast<size_t>(b * G + j)] = opt_.scale_rewards ? (r[j] - mean) / (sd + 1e-4) : r[j] - mean;
    }
    const double n = static_cast<double>(reward.size());
    stats_.reward = std::accumulate(reward.begin(), reward.end(), 0.0) / n;
    double var = 0;
    for (const double x : reward) var += (x - stats_.reward) * (x - stats_.reward);
    stats_.reward_std = reward.size() > 1 ? std::sqrt(var / (n - 1)) : 0.0;
    for (size_t f = 0; f < each.size(); ++f)
        stats_.rewards.emplace_back(rewards_.function(f).name(), std::accumulate(each[f].begin(), each[f].end(), 0.0) / n);
    stats_.frac_reward_zero_std = static_cast<double>(zero_std) / static_cast<double>(n_prompts);
    int64_t total = 0, unfinished = 0;
    stats_.completion_min = INT64_MAX;
    for (size_t i = 0; i < completions_.size(); ++i) {
        const int64_t len = static_cast<int64_t>(completions_[i].size());
        total += len;
        stats_.completion_min = std::min(stats_.completion_min, len);
        stats_.completion_max = std::max(stats_.completion_max, len);
        unfinished += !finished_[i];
    }
    stats_.completion_mean = static_cast<double>(total) / n;
    stats_.clipped_ratio = static_cast<double>(unfinished) / n;
    stats_.sample = inputs.empty() ? "" : inputs[0].completion;
    stats_.rollout_seconds = rollout_seconds;
    stats_.rollout_tokens = total;

    // Each token's values: its sequence's advantage, the reference's log-probability (beta > 0) and its weight.
    std::vector<float> ref;
    if (opt_.loss.beta > 0) ref = tr.token_logps(bt.inputs.data(), bt.labels.data(), T, bt.n_seq, opt_.threads, nullptr, true);
    std::vector<float> v(static_cast<size_t>(kTokenValues * T * bt.n_seq), 0.0f);
    for (int64_t i = 0; i < bt.n_seq; ++i) {
        const double len = static_cast<double>(completions_[static_cast<size_t>(i)].size());
        const double w = opt_.loss_type == GrpoLossType::Bnpo ? 1.0 / static_cast<double>(total)
                         : opt_.loss_type == GrpoLossType::Grpo ? 1.0 / (len * static_cast<double>(bt.n_seq))
                                                                : 1.0 / (static_cast<double>(bt.n_seq) * opt_.max_completion_len);
        for (int64_t t = 0; t < T; ++t) {
            const int64_t k = i * T + t;
            if (bt.labels[static_cast<size_t>(k)] == kIgnoreLabel) continue;
            float * vk = v.data() + kTokenValues * k;
            vk[kAdvantage] = static_cast<float>(adv[static_cast<size_t>(i)]);
            vk[kRefLogp] = ref.empty() ? 0.0f : ref[static_cast<size_t>(k)];
            vk[kTokenWeight] = static_cast<float>(w);
        }
    }
    return v;
}

void GrpoObjective::report(const std::vector<float> & results, const std::vector<float> & values, StepReport & r) {
    GrpoStats s = stats_;
    double kl = 0;
    int64_t tokens = 0, clipped = 0;
    for (size_t k = 0; k < results.size(); ++k) {
        const float * v = values.data() + kTokenValues * k;
        if (v[kTokenWeight] == 0) continue;
        const GrpoTokenLoss t = grpo_token_loss(opt_.loss, results[k], v);
        kl += t.kl;
        clipped += t.clipped;
        ++tokens;
    }
    s.kl = tokens ? kl / static_cast<double>(tokens) : 0.0;
    s.clip_ratio = tokens ? static_cast<double>(clipped) / static_cast<double>(tokens) : 0.0;
    r.grpo = s;
}

} // namespace rp
