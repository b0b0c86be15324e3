// Finetune checkpoints: everything a run needs to continue bit for bit, in one GGUF file written to a
// temporary file and renamed.
//
//   general.type = "rp.finetune.checkpoint", general.architecture = the base's
//   rp.ckpt.base_fingerprint (u64)  names, types and shapes of the base tensors (a foreign base is refused)
//   rp.ckpt.full (bool), rp.ckpt.lora_rank (u32), rp.ckpt.lora_alpha (f32), rp.ckpt.lora_targets (strings)
//   rp.ckpt.step (u64)              completed optimizer steps
//   rp.ckpt.data_seed, rp.ckpt.data_fingerprint, rp.ckpt.data_consumed (u64): the batcher position
//   rp.ckpt.train_loss / rp.ckpt.eval_step / rp.ckpt.eval_loss (arrays): the curve so far (for the SVG), and
//            rp.ckpt.reward_chosen / rp.ckpt.reward_rejected for preference training
//   rp.ckpt.last_norm_bits (u64: the f64's bits), rp.ckpt.last_norm_step (i64), rp.ckpt.last_skip (string),
//   rp.ckpt.bad_run (u64): what the next step reports
//   rp.ckpt.reference_logps (f32 array, preference training with a reference): every sequence's reference
//            log-probability, so a resume does not run the reference pass again
//   rp.ckpt.objective.ints / .floats / .text (i32 array, f32 array, string; when non-empty): the step objective's
//            state (GRPO: the rollout batch its next steps train on again)
//   rp.ckpt.run_config (string, when the run gave one): the tool's effective configuration (a TOML run file),
//            which a resume reuses and compares with its own
//   tensors: every trainable tensor under its own name (f32), the optimizer state arrays under
//            "<param>.adam_m" / ".adam_v" / ".momentum", and for an async pipeline run "<param>.working".
#pragma once

#include "ggml_rp/optim/optimizer.h"
#include "models/data/dataset.h"
#include "models/train/trainer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace rp {

struct TrainCurve {
    std::vector<float> train_loss;   // one per completed step
    std::vector<int32_t> eval_step;  // steps at which the validation loss was measured
    std::vector<float> eval_loss;
    // Preference training: each step's mean rewards of the chosen and the rejected answers (empty otherwise).
    std::vector<float> reward_chosen, reward_rejected;
    // GRPO: each step's mean reward of its completions (empty otherwise).
    std::vector<float> reward;
};

// The best validation loss of a curve and how many evaluations came after it without beating it (early
// stopping; derived from the curve, so a resumed run continues the count). best_step -1 without evaluations.
struct EvalProgress {
    int64_t best_step = -1;
    double best_loss = 0;
    int64_t since_best = 0;
};
EvalProgress eval_progress(const TrainCurve & c);

// The last update a run computed, as the next step reports it: its gradient norm and step, why it was not
// applied ("" = applied), and the run of non-finite steps up to it (TrainingSession stops at max_bad_steps).
// Kept in the checkpoint, so that a resumed run reports and stops as an uninterrupted one.
struct StepHealth {
    double last_norm = 0;
    int64_t last_norm_step = -1;
    std::string last_skip;
    int64_t bad_run = 0;
};

// What a step objective (session.h StepObjective) keeps between steps, opaque to the checkpoint: GRPO's rollout
// batch while it trains several steps on it.
struct ObjectiveState {
    std::vector<int32_t> ints;
    std::vector<float> floats;
    std::string text;
    bool empty() const { return ints.empty() && floats.empty() && text.empty(); }
};

struct CheckpointState {
    int64_t step = 0;
    DataPosition data;
    TrainCurve curve;
    // An async pipeline run: the weights its next step computes at (the update before the last one; empty
    // otherwise), so that a resumed run equals an uninterrupted one.
    std::vector<std::vector<float>> working;
    // Saving: the same weights where they are (the pipeline's working copies), so that a save holds no copy of
    // them; used instead of `working` when set.
    std::vector<const float *> working_at;
    StepHealth health;
    // The gradient grouping of the run (data parallel: the world size; single process: its accumulate_groups,
    // 1 by default): the order the gradients were summed in, so a resume with another is refused.
    int64_t grad_groups = 1;
    std::string run_config;  // SessionOptions::run_config of the run that wrote it
    std::vector<float> reference_logps;  // preference training: per dataset sequence (empty: none computed)
    ObjectiveState objective;            // the step objective's (empty: none, or nothing kept)
};

// Hash of the base model's tensor names, types and shapes.
uint64_t base_fingerprint(const Model & model);

void save_checkpoint(const std::string & path, const Trainer & tr, const Optimizer & opt, const CheckpointState & st);

// Restores the trainable tensors and the optimizer state; returns the rest. Throws rp::Error naming the file
// when it is not a checkpoint, belongs to another base model or another configuration (full / LoRA rank,
// alpha, targets), or lacks a tensor.
CheckpointState load_checkpoint(const std::string & path, Trainer & tr, Optimizer & opt);

// The run configuration a checkpoint records ("" when `path` is no checkpoint or records none); reads only
// the metadata. Throws rp::Error naming the file when it cannot be read as GGUF.
std::string checkpoint_run_config(const std::string & path);

} // namespace rp
