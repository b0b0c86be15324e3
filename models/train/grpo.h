// GRPO (reinforcement learning with verifiable rewards) as a TrainingSession's step objective: each step samples
// `group` completions of each of the batch's prompts with the current weights, scores them (models/train/rewards.h),
// turns the rewards into group-normalised advantages and trains on the completions with GRPO's clipped policy loss
// (ops/grpo_loss.h; FinetuneConfig::grpo).
//
// Rollouts: through the KV-cache inference path on the host (InferenceSession: the prompt once, then each completion
// from it), one completion at a time; token k of completion j of prompt b at step s is drawn with a Sampler seeded
// by mix_seed(seed, s, b, j) alone, so a run is reproducible bit for bit and a resumed one samples what the
// uninterrupted one did. A completion ends at an end-of-generation token (kept: it is trained, the model learns to
// stop), at the token that completes one of the stop strings in its text (kept, the string in the reward's text),
// or at max_completion_len tokens.
// Advantages, as TRL's GRPOTrainer: A = r - mean(group), divided by (std(group) + 1e-4) when scale_rewards (std
// unbiased; Dr. GRPO: not divided). Token weights by loss type over the completion tokens (1 + prompt-free
// labels): grpo 1 / (the sequence's tokens x sequences), bnpo 1 / (the batch's tokens), dr_grpo 1 / (sequences x
// max_completion_len). One update per rollout batch (on-policy: the old log-probabilities are the policy's own);
// with beta > 0 the reference is the base model without the adapter (full finetuning: the model file's weights),
// its token log-probabilities computed on the host before the step.
// Data parallel: every rank samples and scores the whole batch (the same seeds and masters: the same completions;
// a reward program runs on every rank) and trains its micro-batches; the rollouts are not split by prompt yet.
// Through RoundPipe the rollouts run on the host from the masters; the training steps run on the devices.
#pragma once

#include "models/arch/inference.h"
#include "models/data/dataset.h"
#include "models/train/rewards.h"
#include "models/train/session.h"

#include <cstdint>
#include <string>
#include <vector>

namespace rp {

class Tokenizer;

enum class GrpoLossType { Grpo, Bnpo, DrGrpo };

struct GrpoOptions {
    GrpoParams loss;                  // clip range and beta (on_policy: one update per rollout batch)
    int32_t group = 8;                // completions per prompt (TRL's num_generations), >= 2
    int32_t max_completion_len = 64;  // tokens, the end token included
    float temperature = 1.0f;         // the sampler (TRL's defaults: temperature 1, top_p 1, top_k all)
    float top_p = 1.0f;
    int32_t top_k = 0;
    GrpoLossType loss_type = GrpoLossType::Bnpo;
    bool scale_rewards = true;        // false: Dr. GRPO's unscaled advantages
    std::vector<std::string> stop;    // stop strings (none: the end-of-generation tokens and the length limit alone)
    uint64_t seed = 0;
    int threads = 0;
};

// "grpo", "bnpo", "dr_grpo"; throws rp::Error naming the text otherwise.
GrpoLossType parse_grpo_loss_type(const std::string & s);
const char * grpo_loss_type_name(GrpoLossType t);

// The sequence length a GRPO run trains at: the longest prompt and the longest completion.
int32_t grpo_seq_len(const PromptSet & prompts, const GrpoOptions & opt);

class GrpoObjective : public StepObjective {
public:
    // prompts, rewards and the model must outlive the objective; the rewards are scored in the order of the batch.
    GrpoObjective(const Model & model, const Tokenizer & tok, const PromptSet & prompts, RewardSet & rewards, const GrpoOptions & opt);
    std::vector<float> prepare(Trainer & trainer, int64_t step, Batch & bt) override;
    void report(const std::vector<float> & results, const std::vector<float> & values, StepReport & r) override;

    // The completions of the last prepare(), in batch order (tests, samples).
    const std::vector<std::vector<int32_t>> & completions() const { return completions_; }

private:
    const Model & model_;
    const Tokenizer & tok_;
    const PromptSet & prompts_;
    RewardSet & rewards_;
    GrpoOptions opt_;
    std::vector<std::vector<int32_t>> completions_;
    std::vector<uint8_t> finished_;
    GrpoStats stats_;  // prepare()'s part: the rewards and lengths
};

} // namespace rp
