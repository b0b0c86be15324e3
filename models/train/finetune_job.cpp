#include "models/train/finetune_job.h"

#include "base/error.h"
#include "ggml_rp/runtime/host_memory.h"
#include "ggml_rp/runtime/link_model.h"
#include "models/arch/model.h"
#include "models/text/chat_template.h"
#include "models/text/tokenizer.h"

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>

namespace rp {

FinetuneJob::FinetuneJob() { session.lr.lr_max = 1e-3; }

void FinetuneJob::validate(bool data_parallel) const {
    const SessionOptions & o = session;
    if (model_path.empty()) throw Error("no model given (model_path)");
    if (!data_parallel && (!dp.link.empty() || !rank_fault.kind.empty()))
        throw Error("dp.link and rank_fault need a data-parallel run");
    if (max_seq && !plan_only) throw Error("max_seq needs plan_only");
    if (token_chunk == -1 && !o.pipelined) throw Error("token_chunk auto needs devices.count (the memory it must fit)");
    if (!link.empty() && o.devices.backend == "cuda") throw Error("devices.link models the CPU devices' link; it does not apply to devices.backend cuda");
    const std::optional<PreferenceParams> pref = preference_objective();
    if (pref) {
        if (!(pref->beta > 0 && std::isfinite(pref->beta)))
            throw Error(pref->method == PreferenceMethod::Orpo ? "orpo_lambda must be a finite number > 0" : "beta must be a finite number > 0");
        if (!(preference.label_smoothing >= 0 && preference.label_smoothing < 0.5)) throw Error("label_smoothing must be in [0, 0.5)");
        if (preference.label_smoothing > 0 && pref->method != PreferenceMethod::Dpo && pref->method != PreferenceMethod::Simpo)
            throw Error("label_smoothing applies to dpo and simpo (the logistic losses), not " + method);
        if (!std::isfinite(preference.gamma)) throw Error("gamma must be finite");
        if (!(preference.desirable_weight > 0 && std::isfinite(preference.desirable_weight) && preference.undesirable_weight > 0 &&
              std::isfinite(preference.undesirable_weight)))
            throw Error("desirable_weight and undesirable_weight must be finite numbers > 0");
    }
    if (max_prompt_len < 0) throw Error("max_prompt_len must be >= 0");
    if (max_prompt_len > 0 && !pref && method != "grpo")
        throw Error("max_prompt_len truncates the prompts of preference pairs (method dpo, ipo, simpo or orpo) and of grpo");
    const bool grpo_given = !rewards.empty() || !reward_cmd.empty() || !reward_weights.empty();
    if (method != "grpo" && grpo_given) throw Error("rewards, reward_cmd and reward_weights are for method grpo");
    if (method == "grpo") {
        if (!(beta.value_or(0.0) >= 0 && std::isfinite(beta.value_or(0.0)))) throw Error("beta must be a finite number >= 0 (grpo: the KL term's weight)");
        if (!(grpo.loss.epsilon_low >= 0 && grpo.loss.epsilon_low < 1)) throw Error("epsilon must be in [0, 1)");
        if (!(grpo.loss.epsilon_high >= 0 && std::isfinite(grpo.loss.epsilon_high))) throw Error("epsilon_high must be a finite number >= 0");
        if (!(reward_timeout > 0)) throw Error("reward_timeout must be > 0 seconds");
        parse_grpo_loss_type(grpo_loss_type);
        if (session.val_split > 0) throw Error("val_split: grpo has no validation split (its steps report the rewards)");
        if (pack.value_or(false)) throw Error("pack: grpo trains one completion a sequence");
    }
    if (plan_only) {
        if (max_seq && !o.pipelined) throw Error("max_seq needs devices.count (the device memory it must fit)");
        return;
    }
    if (data_path.empty()) throw Error("no training data given (data_path)");
    if (loop.out_path.empty()) throw Error("no output given (out_path)");
    if (!o.pipelined && (!link.empty() || !trace_path.empty() || o.pipeline.async || o.pipeline.schedule != ScheduleKind::RoundPipe ||
                         o.devices.backend != "cpu" || !o.pipeline.device_speed.empty() || o.pipeline.dispatch != DispatchKind::Ready))
        throw Error("devices.link, trace_path, pipeline.async, pipeline.schedule, pipeline.dispatch, pipeline.device_speed and "
                    "devices.backend need devices.count (the RoundPipe runtime)");
    loop.validate(o);
}

std::optional<PreferenceParams> FinetuneJob::preference_objective() const {
    if (method == "sft" || method == "grpo") return std::nullopt;
    PreferenceParams p = preference;
    p.beta = beta.value_or(0.1);
    if (method == "dpo") p.method = PreferenceMethod::Dpo;
    else if (method == "ipo") p.method = PreferenceMethod::Ipo;
    else if (method == "simpo") p.method = PreferenceMethod::Simpo;
    else if (method == "orpo") p.method = PreferenceMethod::Orpo, p.beta = orpo_lambda;
    else if (method == "kto") p.method = PreferenceMethod::Kto;
    else throw Error("method \"" + method + "\" is not one of sft, dpo, ipo, simpo, orpo, kto, grpo");
    return p;
}

GrpoOptions FinetuneJob::grpo_options() const {
    GrpoOptions g = grpo;
    g.loss.beta = beta.value_or(0.0);
    g.loss.on_policy = g.iterations == 1;
    g.loss_type = parse_grpo_loss_type(grpo_loss_type);
    g.seed = session.finetune.seed;
    g.threads = session.threads;
    return g;
}

RewardSet FinetuneJob::make_rewards() const {
    const size_t n = rewards.size() + (reward_cmd.empty() ? 0 : 1);
    if (n == 0) throw Error("grpo needs a reward: rewards (exact:FIELD, regex:PATTERN, length:N) or reward_cmd");
    if (!reward_weights.empty() && reward_weights.size() != n)
        throw Error("reward_weights: " + std::to_string(reward_weights.size()) + " weights for " + std::to_string(n) + " reward function(s)");
    std::vector<double> w(n, 1.0);
    for (size_t i = 0; i < reward_weights.size(); ++i) {
        char * end = nullptr;
        w[i] = std::strtod(reward_weights[i].c_str(), &end);
        if (reward_weights[i].empty() || *end != '\0' || !std::isfinite(w[i])) throw Error("reward_weights: \"" + reward_weights[i] + "\" is not a number");
    }
    RewardSet set;
    for (size_t i = 0; i < rewards.size(); ++i) set.add(make_builtin_reward(rewards[i]), w[i]);
    if (!reward_cmd.empty()) set.add(make_reward_program(reward_cmd, reward_timeout), w.back());
    return set;
}

SessionOptions FinetuneJob::session_options() const {
    SessionOptions o = session;
    o.finetune.preference = preference_objective();
    if (method == "grpo") o.finetune.grpo = grpo_options().loss;
    if (token_chunk >= 0) o.finetune.token_chunk = token_chunk;
    o.pipeline.token_chunk = token_chunk == -2 ? -1 : token_chunk;
    if (!link.empty()) o.devices.link = LinkModel::parse(link);
    return o;
}

std::pair<size_t, std::string> FinetuneJob::host_memory_limit() const {
    if (host_memory > 0) return {host_memory, "host_memory"};
    const HostMemoryAvailable a = host_memory_available();
    if (a.source.empty()) return {SIZE_MAX, "no memory figure readable on this system"};
    return {static_cast<size_t>(static_cast<double>(a.bytes) * (1.0 - kHostMemoryMargin)), "95% of " + a.source};
}

bool FinetuneJob::packed_data() const { return packs() && data_path.ends_with(".jsonl"); }

DatasetOptions FinetuneJob::dataset_options(const Model & model, const Tokenizer & tok) const {
    DatasetOptions d;
    d.seq_len = static_cast<int32_t>(seq_len);
    d.n_ctx = model.hparams().n_ctx_train;
    d.allow_binary = allow_binary;
    // "messages" lines are rendered with the model's own template (or the one named); a model without one
    // leaves it unset, and the dataset refuses "messages" lines naming the line.
    if (!chat_template.empty() || !tok.chat_template().empty()) d.chat = chat_template_for(tok, chat_template);
    d.train_on_inputs = train_on_inputs;
    d.train_analysis = train_analysis;
    d.pack = pack.value_or(true);  // (the data decides which applies: the method may not match it, which the session reports)
    d.pack_preference = pack.value_or(false);
    d.max_prompt_len = static_cast<int32_t>(max_prompt_len);
    return d;
}

RunPlanOptions FinetuneJob::plan_options(const SessionOptions & session_resolved) const {
    RunPlanOptions po;
    po.session = session_resolved;
    po.seq_len = seq_len;
    po.packed = packed_data();
    if (method == "grpo") po.group = grpo.group;
    if (max_seq) po.max_seq_limit = 1 << 22;
    return po;
}

std::string rank_trace_path(const std::string & path, int rank, int ranks) {
    if (ranks <= 1) return path;
    const size_t dot = path.rfind('.');
    const std::string ext = dot == std::string::npos || path.find('/', dot) != std::string::npos ? "" : path.substr(dot);
    return path.substr(0, path.size() - ext.size()) + ".rank" + std::to_string(rank) + ext;
}

std::function<void(int64_t)> rank_fault_hook(const RankFault & fault, int rank, TrainingSession & run) {
    if (fault.kind.empty() || (fault.rank >= 0 && fault.rank != rank)) return {};
    return [fault, &run](int64_t step) {
        if (step != fault.step) return;
        if (fault.kind == "die") raise(SIGKILL);
        if (fault.kind == "hang")
            for (;;) pause();
        run.synchronize();  // corrupt: one bit of the first master
        auto * w = static_cast<unsigned char *>(run.trainer().params().front().t->data);
        w[0] ^= 1;
    };
}

} // namespace rp
