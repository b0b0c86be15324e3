// GRPO (reinforcement learning with verifiable rewards) as a TrainingSession's step objective: each step samples
// `group` completions of each of the batch's prompts with the current weights, scores them (models/train/rewards.h),
// turns the rewards into group-normalised advantages and trains on the completions with GRPO's clipped policy loss
// (ops/grpo_loss.h; FinetuneConfig::grpo).
//
// Rollouts: through the KV-cache inference path on the host (InferenceSession: the prompt once, then the group's
// completions from it, decoded together: `rollout_batch` sequences a batch, each weight read once per token for all
// of them); token k of completion j of prompt b at step s is drawn with a Sampler seeded by mix_seed(seed, s, b, j)
// alone and the logits do not depend on how many sequences decode together (InferenceSession), so a run is
// reproducible bit for bit, whatever its rollout batch, and a resumed one samples what the uninterrupted one did. A completion ends at an end-of-generation token (kept: it is trained, the model learns to
// stop), at the token that completes one of the stop strings in its text (kept, the string in the reward's text),
// or at max_completion_len tokens.
// Advantages, as TRL's GRPOTrainer: A = r - mean(group), divided by (std(group) + 1e-4) when scale_rewards (std
// unbiased; Dr. GRPO: not divided). Token weights by loss type over the completion tokens (1 + prompt-free
// labels): grpo 1 / (the sequence's tokens x sequences), bnpo 1 / (the batch's tokens), dr_grpo 1 / (sequences x
// max_completion_len). One update per rollout batch (on-policy: the old log-probabilities are the policy's own,
// ratio 1), or `iterations` (TRL's num_iterations): the rollout batch of step s (s a multiple of it) trains steps s to
// s + iterations - 1, its old log-probabilities those of the policy that sampled it (a forward pass after the
// rollouts); the checkpoint keeps the batch, its values and its statistics while steps remain (state()). With beta > 0 the reference is the base model without the adapter (full finetuning: the model file's weights),
// its token log-probabilities computed on the host before the step.
// Data parallel: each rank samples, scores (its own reward program) and passes through the reference and sampling
// policy only the prompts of the micro-batches it trains (BatchShare), then the ranks share what they made (one sum
// each), so that every rank holds the whole batch, its rewards and values, and the step equals the single process's
// bit for bit (the logits and log-probabilities of a sequence do not depend on the others computed with it).
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

// How the rollouts' decode steps compute their products (InferenceSession::set_row_dots): Fast, per-row dot products
// with the activations in the weights' format (llama.cpp's arithmetic); Exact, the training graphs' arithmetic; Auto,
// Fast for a quantized base (QLoRA: its blocks decoded once per row and token, not per GEMM panel) and Exact for
// float weights, which the GEMM reads as fast once more than a few sequences decode together
// (bench/finetune/grpo.sh). Each is deterministic and every sequence gets its bits whatever --rollout-batch; only
// which tokens are sampled can differ: the loss reads the training graphs' log-probabilities.
enum class RolloutMatvec { Auto, Fast, Exact };

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
    int32_t rollout_batch = 0;        // completions of a prompt decoded together (0: the whole group; 1: one at a time)
    RolloutMatvec rollout_matvec = RolloutMatvec::Auto;
    // Updates per rollout batch (TRL's num_iterations): > 1 trains that many steps on one batch of rollouts, against
    // the log-probabilities of the policy that sampled them (loss.on_policy false).
    int32_t iterations = 1;

    // Completions decoded together (rollout_batch, at most the group).
    int32_t decoded_together() const { return rollout_batch > 0 && rollout_batch < group ? rollout_batch : group; }
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
    std::vector<float> prepare(Trainer & trainer, int64_t step, Batch & bt, const BatchShare & share = {}) override;
    void report(const std::vector<float> & results, const std::vector<float> & values, StepReport & r) override;
    int64_t steps_per_batch() const override { return opt_.iterations; }
    ObjectiveState state() const override;
    void restore(const ObjectiveState & st) override;

    // Whether the rollouts of a run training `trainer` decode with row dots (GrpoOptions::rollout_matvec resolved).
    bool rollouts_use_row_dots(const Trainer & trainer) const;
    // The completions of the last prepare(), in batch order (tests, samples).
    const std::vector<std::vector<int32_t>> & completions() const { return completions_; }
    // iterations > 1: the rollout batch the current steps train on and its token values (nullptr before the first).
    const Batch * held_batch() const { return held_.step >= 0 ? &held_.batch : nullptr; }
    const std::vector<float> & held_values() const { return held_.values; }

private:
    const Model & model_;
    const Tokenizer & tok_;
    const PromptSet & prompts_;
    RewardSet & rewards_;
    GrpoOptions opt_;
    std::vector<std::vector<int32_t>> completions_;
    std::vector<uint8_t> finished_;
    GrpoStats stats_;  // prepare()'s part: the rewards and lengths
    // iterations > 1: the rollout batch the next steps train on again, the step that sampled it, its values and
    // statistics.
    struct Held {
        int64_t step = -1;
        Batch batch;
        std::vector<float> values;
        GrpoStats stats;
    };
    Held held_;
    std::vector<float> again(int64_t step, Batch & bt);  // a step that trains on the held batch
    // Data parallel: the other ranks' sequences, rewards and ends into this rank's batch and arrays.
    void share_rollouts(const BatchShare & share, int64_t step, Batch & bt, std::vector<double> & reward, std::vector<std::vector<double>> & each);
    // Every labelled token's log-probability (reference: the base's), data parallel each rank its own sequences'.
    std::vector<float> token_logps(Trainer & tr, int64_t step, const Batch & bt, const BatchShare & share, bool reference);
};

} // namespace rp
