#include "models/train/grpo.h"

#include "base/error.h"
#include "ggml_rp/core/json.h"
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
    if (opt_.iterations < 1) throw Error("iterations must be at least 1");
    if (opt_.iterations > 1 && opt_.loss.on_policy)
        throw Error("iterations " + std::to_string(opt_.iterations) + ": the later updates train on the sampling policy's log-probabilities (loss.on_policy false)");
    if (opt_.rollout_batch < 0) throw Error("rollout_batch must be >= 0");
}

namespace {

// RolloutMatvec::Auto's test: the rollouts read a quantized base (most weight bytes in block types), not the f32
// masters of a full finetune.
bool quantized_base(const Model & model, const Trainer & tr) {
    if (tr.config().full) return false;
    size_t quantized = 0, all = 0;
    for (const Tensor * t : model.weights()) {
        all += t->nbytes();
        if (dtype_is_quantized(t->type)) quantized += t->nbytes();
    }
    return 2 * quantized > all;
}

// The completions of a batch: each sequence's labels, in order (the prompt's are masked).
std::vector<std::vector<int32_t>> labelled(const Batch & bt) {
    std::vector<std::vector<int32_t>> out(static_cast<size_t>(bt.n_seq));
    for (int64_t i = 0; i < bt.n_seq; ++i)
        for (int64_t t = 0; t < bt.seq_len; ++t) {
            const int32_t l = bt.labels[static_cast<size_t>(i * bt.seq_len + t)];
            if (l != kIgnoreLabel) out[static_cast<size_t>(i)].push_back(l);
        }
    return out;
}

json::Value number(double x) {
    json::Value v;
    v.type = json::Value::Type::Number;
    v.number = x;
    return v;
}

// A checkpoint's copy of the rollout statistics (json::dump writes each double exactly).
std::string stats_json(const GrpoStats & g) {
    json::Value o;
    o.type = json::Value::Type::Object;
    auto add = [&](const char * k, json::Value v) { o.object.push_back({k, std::move(v)}); };
    add("reward", number(g.reward));
    add("reward_std", number(g.reward_std));
    json::Value rewards;
    rewards.type = json::Value::Type::Object;
    for (const auto & [name, mean] : g.rewards) rewards.object.push_back({name, number(mean)});
    add("rewards", rewards);
    add("frac_reward_zero_std", number(g.frac_reward_zero_std));
    add("completion_mean", number(g.completion_mean));
    add("completion_min", number(static_cast<double>(g.completion_min)));
    add("completion_max", number(static_cast<double>(g.completion_max)));
    add("clipped_ratio", number(g.clipped_ratio));
    json::Value sample;
    sample.type = json::Value::Type::String;
    sample.string = g.sample;
    add("sample", sample);
    return json::dump(o);
}

GrpoStats stats_from_json(const std::string & text) {
    const json::Value o = json::parse(text, "the checkpoint's GRPO statistics");
    auto num = [&](const char * k) {
        const json::Value * v = o.find(k);
        if (!v || !v->is_number()) throw Error(std::string("the checkpoint's GRPO statistics have no number \"") + k + "\"");
        return v->number;
    };
    GrpoStats g;
    g.reward = num("reward");
    g.reward_std = num("reward_std");
    const json::Value * rewards = o.find("rewards");
    if (!rewards || !rewards->is_object()) throw Error("the checkpoint's GRPO statistics have no rewards");
    for (const json::Member & m : rewards->object) {
        if (!m.second.is_number()) throw Error("the checkpoint's GRPO statistics: reward \"" + m.first + "\" is not a number");
        g.rewards.emplace_back(m.first, m.second.number);
    }
    g.frac_reward_zero_std = num("frac_reward_zero_std");
    g.completion_mean = num("completion_mean");
    g.completion_min = static_cast<int64_t>(num("completion_min"));
    g.completion_max = static_cast<int64_t>(num("completion_max"));
    g.clipped_ratio = num("clipped_ratio");
    const json::Value * sample = o.find("sample");
    if (!sample || !sample->is_string()) throw Error("the checkpoint's GRPO statistics have no sample");
    g.sample = sample->string;
    return g;
}

} // namespace

void GrpoObjective::share_rollouts(const BatchShare & share, int64_t step, Batch & bt, std::vector<double> & reward,
                                   std::vector<std::vector<double>> & each) {
    // One sum over the ranks: each sequence's tokens, labels, rewards and end from the rank that sampled it, zeros
    // from the others (exact: integers and doubles plus zeros).
    const size_t n = static_cast<size_t>(bt.n_seq), NT = n * static_cast<size_t>(bt.seq_len), F = each.size();
    std::vector<double> buf(2 * NT + n * (2 + F), 0.0);
    double * in = buf.data(), * lab = in + NT, * rew = lab + NT, * fin = rew + n, * fn = fin + n;
    for (size_t i = 0; i < n; ++i) {
        if (!share.owns(static_cast<int64_t>(i))) continue;
        const size_t T = static_cast<size_t>(bt.seq_len);
        for (size_t t = 0; t < T; ++t) {
            in[i * T + t] = bt.inputs[i * T + t];
            lab[i * T + t] = bt.labels[i * T + t];
        }
        rew[i] = reward[i];
        fin[i] = finished_[i];
        for (size_t f = 0; f < F; ++f) fn[f * n + i] = each[f][i];
    }
    share.comm->allreduce_sum(buf.data(), buf.size(), "GRPO rollouts of step " + std::to_string(step + 1));
    for (size_t k = 0; k < NT; ++k) {
        bt.inputs[k] = static_cast<int32_t>(in[k]);
        bt.labels[k] = static_cast<int32_t>(lab[k]);
    }
    for (size_t i = 0; i < n; ++i) {
        reward[i] = rew[i];
        finished_[i] = static_cast<uint8_t>(fin[i]);
        for (size_t f = 0; f < F; ++f) each[f][i] = fn[f * n + i];
    }
    completions_ = labelled(bt);
}

std::vector<float> GrpoObjective::token_logps(Trainer & tr, int64_t step, const Batch & bt, const BatchShare & share, bool reference) {
    if (!share.comm) return tr.token_logps(bt.inputs.data(), bt.labels.data(), bt.seq_len, bt.n_seq, opt_.threads, nullptr, reference);
    // This rank's runs of sequences, then a sum over the ranks (each token's from the rank that owns it).
    const int64_t T = bt.seq_len;
    std::vector<double> all(static_cast<size_t>(bt.n_seq * T), 0.0);
    for (int64_t lo = 0; lo < bt.n_seq;) {
        if (!share.owns(lo)) {
            ++lo;
            continue;
        }
        int64_t hi = lo;
        while (hi < bt.n_seq && share.owns(hi)) ++hi;
        const std::vector<float> lp = tr.token_logps(bt.inputs.data() + lo * T, bt.labels.data() + lo * T, T, hi - lo, opt_.threads, nullptr, reference);
        std::copy(lp.begin(), lp.end(), all.begin() + lo * T);
        lo = hi;
    }
    share.comm->allreduce_sum(all.data(), all.size(), std::string(reference ? "reference" : "sampling policy") + " log-probabilities of step " + std::to_string(step + 1));
    return std::vector<float>(all.begin(), all.end());
}

std::vector<float> GrpoObjective::again(int64_t step, Batch & bt) {
    const int64_t sampled = step - step % opt_.iterations;
    if (held_.step != sampled)
        throw Error("GRPO: step " + std::to_string(step + 1) + " trains again on the rollouts of step " + std::to_string(sampled + 1) +
                    ", which this run does not hold (resumed from a checkpoint without them?)");
    bt = held_.batch;
    completions_ = labelled(bt);
    stats_ = held_.stats;
    stats_.iteration = static_cast<int32_t>(step - sampled);
    stats_.rollout_seconds = 0;
    stats_.rollout_tokens = 0;
    return held_.values;
}

ObjectiveState GrpoObjective::state() const {
    ObjectiveState st;
    if (opt_.iterations == 1 || held_.step < 0) return st;
    const Batch & b = held_.batch;
    st.ints = {static_cast<int32_t>(held_.step), b.n_seq, b.seq_len};
    st.ints.insert(st.ints.end(), b.inputs.begin(), b.inputs.end());
    st.ints.insert(st.ints.end(), b.labels.begin(), b.labels.end());
    for (const uint32_t u : b.units) st.ints.push_back(static_cast<int32_t>(u));
    st.floats = held_.values;
    st.text = stats_json(held_.stats);
    return st;
}

void GrpoObjective::restore(const ObjectiveState & st) {
    held_ = Held{};
    if (st.empty()) return;
    const char * what = "the checkpoint's GRPO rollout batch";
    if (opt_.iterations == 1) throw Error(std::string(what) + " is for iterations > 1; this run updates once per batch");
    if (st.ints.size() < 3) throw Error(std::string(what) + " is cut short");
    const int64_t n_seq = st.ints[1], T = st.ints[2];
    if (st.ints[0] < 0 || n_seq < opt_.group || n_seq % opt_.group != 0 || T < 2 ||
        st.ints.size() != static_cast<size_t>(3 + 2 * n_seq * T + n_seq / opt_.group) ||
        st.floats.size() != static_cast<size_t>(kTokenValues * n_seq * T))
        throw Error(std::string(what) + " does not hold whole groups of " + std::to_string(opt_.group) + " completions");
    if (T != grpo_seq_len(prompts_, opt_))
        throw Error(std::string(what) + " has sequences of " + std::to_string(T) + " tokens; this run's are " + std::to_string(grpo_seq_len(prompts_, opt_)) +
                    " (the longest prompt and max_completion_len)");
    Held h;
    h.step = st.ints[0];
    Batch & b = h.batch;
    b.n_seq = static_cast<int32_t>(n_seq);
    b.seq_len = static_cast<int32_t>(T);
    auto it = st.ints.begin() + 3;
    b.inputs.assign(it, it + n_seq * T);
    b.labels.assign(it + n_seq * T, it + 2 * n_seq * T);
    for (auto u = it + 2 * n_seq * T; u != st.ints.end(); ++u) {
        if (*u < 0 || static_cast<size_t>(*u) >= prompts_.size()) throw Error(std::string(what) + " names prompt " + std::to_string(*u) + " of " + std::to_string(prompts_.size()));
        b.units.push_back(static_cast<uint32_t>(*u));
    }
    h.values = st.floats;
    h.stats = stats_from_json(st.text);
    held_ = std::move(h);
}

bool GrpoObjective::rollouts_use_row_dots(const Trainer & trainer) const {
    return opt_.rollout_matvec == RolloutMatvec::Fast || (opt_.rollout_matvec == RolloutMatvec::Auto && quantized_base(model_, trainer));
}

std::vector<float> GrpoObjective::prepare(Trainer & tr, int64_t step, Batch & bt, const BatchShare & share) {
    if (step % opt_.iterations != 0) return again(step, bt);
    const int64_t T = bt.seq_len, G = opt_.group, n_prompts = static_cast<int64_t>(bt.units.size());
    if (bt.n_seq != n_prompts * G) throw Error("GRPO: a batch of " + std::to_string(bt.n_seq) + " sequences for " + std::to_string(n_prompts) +
                                               " prompts of " + std::to_string(G) + " completions");
    completions_.assign(static_cast<size_t>(bt.n_seq), {});
    finished_.assign(static_cast<size_t>(bt.n_seq), 0);
    std::vector<RewardInput> inputs;
    const auto t0 = std::chrono::steady_clock::now();
    // Rollouts: the completions of a prompt decoded together, `chunk` at a time (each weight read once per token for
    // all of them), from the prompt evaluated once; a chunk's sequences advance in step, the finished ones idle along
    // (their tokens computed, not used) until the last ends.
    const int64_t chunk = opt_.decoded_together();
    const int64_t V = model_.hparams().n_vocab;
    InferenceSession s(model_, T, opt_.threads, &tr.lora(), &tr.graph_weights(), chunk);
    s.set_row_dots(rollouts_use_row_dots(tr));
    std::vector<float> logits(static_cast<size_t>(chunk * V));
    std::vector<int32_t> next(static_cast<size_t>(chunk));
    for (int64_t b = 0; b < n_prompts; ++b) {
        if (!share.owns(b * G)) continue;  // (data parallel: another rank's prompt; a group is never split)
        const Prompt & p = prompts_[bt.units[static_cast<size_t>(b)]];
        const int64_t P = static_cast<int64_t>(p.tokens.size());
        if (P + opt_.max_completion_len > T) throw Error("GRPO: prompt line " + std::to_string(p.line) + " and its completion exceed the sequence");
        std::vector<float> prompt_logits;
        for (int64_t j0 = 0; j0 < G; j0 += chunk) {
            const int64_t n = std::min(chunk, G - j0);
            if (j0 == 0) {
                s.reset();
                prompt_logits = s.eval_shared(p.tokens);
            } else {
                s.reset(P);
                s.share_first(P);
            }
            std::vector<Sampler> samplers;
            std::vector<std::string> texts(static_cast<size_t>(n));  // (only kept with stop strings)
            std::vector<uint8_t> active(static_cast<size_t>(n), 1);
            for (int64_t j = j0; j < j0 + n; ++j) {
                samplers.emplace_back(SamplerParams{opt_.temperature, opt_.top_k, opt_.top_p,
                                                    mix_seed(mix_seed(mix_seed(opt_.seed, static_cast<uint64_t>(step)), static_cast<uint64_t>(b)), static_cast<uint64_t>(j))});
                std::copy(prompt_logits.begin(), prompt_logits.end(), logits.begin() + (j - j0) * V);
            }
            for (int64_t left = n;;) {
                for (int64_t q = 0; q < n; ++q) {
                    if (!active[static_cast<size_t>(q)]) continue;
                    const size_t i = static_cast<size_t>(b * G + j0 + q);
                    std::vector<int32_t> & c = completions_[i];
                    const int32_t id = samplers[static_cast<size_t>(q)].sample(logits.data() + q * V, V);
                    c.push_back(id);
                    bool end = static_cast<int64_t>(c.size()) == opt_.max_completion_len;
                    if (tok_.is_eog(id)) {
                        finished_[i] = 1;
                        end = true;
                    } else if (!opt_.stop.empty()) {
                        std::string & text = texts[static_cast<size_t>(q)];
                        const size_t before = text.size();
                        text += tok_.token_to_piece(id, false);
                        if (std::any_of(opt_.stop.begin(), opt_.stop.end(), [&](const std::string & st) {
                                // a match that ends in the new piece (one that ended earlier would have stopped it)
                                return text.find(st, before >= st.size() ? before - st.size() + 1 : 0) != std::string::npos;
                            })) {
                            finished_[i] = 1;
                            end = true;
                        }
                    }
                    next[static_cast<size_t>(q)] = id;
                    if (end) {
                        active[static_cast<size_t>(q)] = 0;
                        --left;
                    }
                }
                if (left == 0) break;
                // (the idle sequences, and those past n, repeat a token of theirs: computed, never read)
                logits = s.eval(next);
            }
        }
        for (int64_t j = 0; j < G; ++j) {
            const size_t i = static_cast<size_t>(b * G + j);
            const std::vector<int32_t> & c = completions_[i];
            // The sequence: prompt + completion, labels on the completion (its end token included).
            int32_t * in = bt.inputs.data() + static_cast<int64_t>(i) * T;
            int32_t * lab = bt.labels.data() + static_cast<int64_t>(i) * T;
            std::fill(in, in + T, in[0]);
            std::fill(lab, lab + T, kIgnoreLabel);
            const int64_t len = P + static_cast<int64_t>(c.size());
            for (int64_t t = 0; t + 1 < len; ++t) {
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
    std::vector<std::vector<double>> each_mine;
    const std::vector<double> reward_mine = rewards_.score(inputs, &each_mine);
    // Every sequence's rewards (data parallel: this rank's, then the others' shared with them, with the sequences).
    std::vector<double> reward(static_cast<size_t>(bt.n_seq), 0.0);
    std::vector<std::vector<double>> each(rewards_.size(), reward);
    for (int64_t i = 0, k = 0; i < bt.n_seq; ++i) {
        if (!share.owns(i)) continue;
        reward[static_cast<size_t>(i)] = reward_mine[static_cast<size_t>(k)];
        for (size_t f = 0; f < each.size(); ++f) each[f][static_cast<size_t>(i)] = each_mine[f][static_cast<size_t>(k)];
        ++k;
    }
    if (share.comm) share_rollouts(share, step, bt, reward, each);
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
    for (const int32_t id : completions_[0])
        if (!tok_.is_eog(id)) stats_.sample += tok_.token_to_piece(id, false);
    stats_.rollout_seconds = rollout_seconds;
    stats_.rollout_tokens = total;

    // Each token's values: its sequence's advantage, the sampling policy's log-probability (iterations > 1), the
    // reference's (beta > 0) and its weight.
    std::vector<float> ref, old;
    if (opt_.loss.beta > 0) ref = token_logps(tr, step, bt, share, true);
    if (opt_.iterations > 1) old = token_logps(tr, step, bt, share, false);
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
            vk[kOldLogp] = old.empty() ? 0.0f : old[static_cast<size_t>(k)];
            vk[kTokenWeight] = static_cast<float>(w);
        }
    }
    if (opt_.iterations > 1) held_ = Held{step, bt, v, stats_};
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
