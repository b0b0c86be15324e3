// A finetuning run as a library object (architecture.md §6): the trainer (its trainable tensors and per-layer
// programs), the data stream, the optimizer and learning-rate schedule, and where the steps run — on the host,
// or through the RoundPipe runtime on N devices. One step interface either way, and the same bits: a step on
// the host and a sync step through the pipeline give byte-identical masters.
//
//   step()             one optimizer step: the next batch, split into micro-batches once, forward + backward
//                      (accumulated), global-norm clipping, the update; returns what a progress line needs
//   evaluate()         the mean validation loss (pipeline runs are synchronized first)
//   save_checkpoint()  the trainable tensors, optimizer state, data position and loss curve (bit-exact resume)
//   resume()           from a checkpoint, or from an adapter's weights
//   save_result()      the adapter (LoRA) or the whole model (full)
//
// The tool (rp-finetune) parses flags, prints and writes the logs; everything that decides a number is here.
#pragma once

#include "ggml_rp/optim/lr_schedule.h"
#include "ggml_rp/optim/optimizer.h"
#include "ggml_rp/roundpipe/pipeline.h"
#include "ggml_rp/runtime/devices.h"
#include "ggml_rp/dist/communicator.h"
#include "models/train/checkpoint.h"
#include "models/train/data_parallel.h"
#include "models/train/grpo_stats.h"
#include "models/train/preference.h"
#include "models/data/dataset.h"
#include "models/train/trainer.h"
#include "models/arch/model.h"
#include "models/train/trainer.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace rp {

class StepObjective;

struct SessionOptions {
    FinetuneConfig finetune;
    OptimizerConfig optimizer;
    LrSchedule lr;                 // total_steps is set by the session (from steps or epochs)
    float clip = 1.0f;             // global gradient-norm clipping; 0 = off
    int64_t batch = 8;             // sequences per optimizer step
    // The batch split in this many parts, gradients accumulated; 0: one per data-parallel rank (1 in a single
    // process): a step is the same `batch` sequences either way.
    int64_t micro_batches = 0;
    int64_t epochs = 1;
    int64_t steps = 0;             // > 0: overrides epochs
    int threads = 0;               // CPU threads (0 = all)
    double val_split = 0.0;        // fraction of the sequences held out for validation
    std::string dump_grads;        // path: the first step's gradients (before clipping), batch, loss and logits
    // A step whose loss or gradient norm is not finite is not applied (masters and optimizer state untouched);
    // this many in a row stop the run (StepReport::stop).
    int max_bad_steps = 3;
    // Recorded in every checkpoint (rp.ckpt.run_config): the configuration the tool ran with (a TOML run
    // file), so that a resume can reuse and check it. Opaque to the session.
    std::string run_config;

    // Data parallelism (architecture.md §8, models/data_parallel.h): this process is rank comm->rank() of
    // comm->size(); it computes micro-batches rank, rank + size, ... of every step, the gradients are summed
    // over the ranks in rank order and every rank applies the same update. nullptr (or size 1): one process.
    Communicator * comm = nullptr;
    // One process: accumulate the micro-batches in this many groups (group g: g, g + G, ...) and add the
    // groups' sums in group order: the bit-exact reference of a data-parallel run of G ranks (host path only;
    // the pipeline equals the host bit for bit).
    int64_t accumulate_groups = 1;
    // Data parallel: compare every rank's masters and optimizer state after every N steps (0 = only when
    // check_replicas() is called).
    int64_t replica_check_every = 0;

    // The step objective of data that is a frame (Dataset::rollouts(): GRPO), not owned; it must outlive the
    // session. nullptr otherwise.
    StepObjective * objective = nullptr;

    // The RoundPipe runtime: devices.count > 0 runs every step through it.
    bool pipelined = false;
    DeviceSetOptions devices;
    PipelineOptions pipeline;
};

// What one step did.
struct StepReport {
    int64_t step = 0;            // 1-based number of this step
    double loss = 0;             // mean over the batch's trained tokens
    float lr = 0;
    int64_t tokens = 0;          // tokens of the batch (seq_len x n_seq)
    int64_t trained_tokens = 0;  // of those, the ones with a label
    double seconds = 0;
    // The gradient norm (before clipping) of step grad_norm_step. In async pipeline mode the update of a
    // step runs while the next step computes, so the newest known norm is usually the previous step's;
    // grad_norm_step < 0 (and grad_norm NaN) while no update has finished yet.
    double grad_norm = 0;
    int64_t grad_norm_step = -1;
    bool skipped = false;        // step grad_norm_step's update was not applied (see skip_reason)
    std::string skip_reason;     // "no trained tokens", "non-finite loss", "non-finite gradient norm"
    // Non-empty: max_bad_steps non-finite steps in a row; the run must stop (step() refuses to go on). Says
    // which steps; nothing of them reached the masters, so the last checkpoint is the last good state.
    std::string stop;
    std::optional<PreferenceStats> preference;  // preference training: the step's pairs (loss: their mean loss)
    std::optional<GrpoStats> grpo;              // GRPO: the step's rollouts (loss: the policy loss)
};

// An objective whose sequences are made at each step (GRPO's rollouts: models/train/grpo.h). The session's data is
// then a frame of units (PromptSet::frame: a prompt and the group of sequences its completions fill); before each
// step, on the host with the masters current, prepare() rewrites the batch's sequences (inputs, labels) and
// returns each sequence's values (TrainingProgram::sequence_values per sequence); after it, report() reads what
// the heads reported (head_results after the loss, per sequence) into the step's report.
// An objective may train several steps on one batch (GRPO's iterations): steps_per_batch() > 1 takes a batch of the
// data at steps 0, k, 2k, ... only; at the others prepare() gets an empty batch and fills it with its own (the epochs
// count k steps a batch). What it keeps between steps goes into checkpoints (state(), restore()).
// Data parallel, prepare() makes only the sequences this rank trains (its micro-batches: `share`) and shares them
// with the other ranks over share.comm, so that every rank ends with the whole batch and its values.
struct BatchShare {
    std::vector<uint8_t> mine;      // per sequence of the batch: 1 where this rank trains it (one process: all 1)
    Communicator * comm = nullptr;  // nullptr: one process
    bool owns(int64_t seq) const { return mine.empty() || mine[static_cast<size_t>(seq)] != 0; }
};

class StepObjective {
public:
    virtual ~StepObjective() = default;
    virtual std::vector<float> prepare(Trainer & trainer, int64_t step, Batch & bt, const BatchShare & share = {}) = 0;
    virtual void report(const std::vector<float> & results, const std::vector<float> & values, StepReport & r) = 0;
    virtual int64_t steps_per_batch() const { return 1; }
    virtual ObjectiveState state() const { return {}; }
    // Throws rp::Error when the state is not one this objective wrote.
    virtual void restore(const ObjectiveState &) {}
};

// The micro-batches a batch of n_seq sequences is split into: sequences [lo, hi) each (seq_offset = lo),
// sizes differing by one unit at most (a unit: `group` sequences, 2 for preference pairs, never split); the
// same split on the host and in the pipeline.
// micro_batches as a session resolves it (0: the number of data-parallel ranks of options.comm, or 1).
int64_t resolved_micro_batches(const SessionOptions & options);
std::vector<MicroBatchInfo> micro_batch_shapes(int64_t seq_len, int64_t n_seq, int64_t micro_batches, bool packed = false,
                                               int64_t group = 1);

class TrainingSession {
public:
    // model and data must outlive the session. Throws rp::Error for bad options (naming the option by its
    // field name: "micro_batches", "clip", ...), an empty training split, or devices that cannot be made;
    // MemoryError (roundpipe/call_planner.h) when a pipelined step cannot fit the devices.
    TrainingSession(const Model & model, const Dataset & data, SessionOptions options);
    ~TrainingSession();
    TrainingSession(const TrainingSession &) = delete;
    TrainingSession & operator=(const TrainingSession &) = delete;

    // Continues a checkpoint (general.type rp.finetune.checkpoint) or, for LoRA, starts from an adapter's
    // weights. Call before the first step. Returns what it did, for a log line.
    std::string resume(const std::string & path);

    StepReport step();
    // Mean loss over the unmasked tokens of the validation split (NaN without one; SFT through the devices when the
    // run has them in sync mode, the masters' weights, each micro-batch's loss summed in its own graph: equal to the
    // host's within rounding); preference training: the mean loss of its pairs (eval_preference() then holds their
    // metrics).
    double evaluate();
    std::optional<PreferenceStats> eval_preference() const { return eval_preference_; }
    // Preference training with a reference (DPO, IPO): every sequence's log-probability under the model as it
    // starts (the base, with the starting adapter when one was given: the reference is the step-0 policy), one
    // forward pass over the data (through the devices when pipelined: Pipeline::forward; else on the host),
    // once; a resumed run takes them from its checkpoint. The first step runs it when it has not run. Returns
    // false when there was nothing to compute.
    bool reference_pass();
    const std::vector<float> & reference_logps() const { return st_.reference_logps; }  // per dataset sequence
    bool has_validation() const { return !split_.val.empty(); }
    // The greedy completion of `prompt` (tokenized with BOS, special tokens not parsed) with the current
    // weights, as evaluate() sees them (pipeline: the masters), through the KV-cache inference path: up to
    // max_tokens tokens, as text.
    std::string sample(const Tokenizer & tok, const std::string & prompt, int64_t max_tokens);

    // Everything pending applied (pipeline: devices and optimizer idle, working weights = masters).
    void synchronize();
    // Data parallel: every rank's masters and optimizer state hashed and compared (after draining the
    // pipeline); throws PeerError naming the first tensor whose bits differ from rank 0's. `when` names the
    // point in the message ("after step 10").
    void check_replicas(const std::string & when);
    // The number of groups the step's gradients are summed in (ranks, or accumulate_groups).
    int64_t grad_groups() const { return groups_; }
    void save_checkpoint(const std::string & path);
    void save_result(const std::string & path);

    int64_t steps_done() const { return st_.step; }
    int64_t total_steps() const { return total_; }
    const TrainCurve & curve() const { return st_.curve; }
    void record_eval(int64_t step, double loss);
    const DatasetSplit & split() const { return split_; }
    const Trainer & trainer() const { return trainer_; }
    Trainer & trainer() { return trainer_; }  // (measuring builds programs: Trainer::model_flops)
    const Pipeline * pipeline() const { return pipe_.get(); }
    // Pipelined: the plan of the largest step and the device memory it takes (checked at construction).
    const CallPlan & planned() const { return planned_; }
    // The options as the session runs them (defaults resolved: micro_batches).
    const SessionOptions & options() const { return opt_; }
    const std::vector<std::unique_ptr<Device>> & devices() const { return devices_; }

private:
    // The micro-batches of bt as a step splits it (sequences [lo, hi) each, pointing into bt).
    std::vector<MicroBatch> micro_batches(const Batch & bt, int64_t step, float loss_scale = 1.0f) const;
    // Whether this process trains micro-batch i of a step (data parallel: i = rank mod R; else every one).
    bool trains(size_t micro_batch) const;
    // Clipping + the optimizer on the masters in one pass over the gradients, which a host step's update also
    // zeroes for the next step (pipeline: on its optimizer thread); the first step's dump.
    void update(int64_t step, const Batch & bt, float loss_scale, double loss);

    const Model & model_;
    const Dataset & data_;
    SessionOptions opt_;
    Trainer trainer_;
    DatasetSplit split_;
    Batcher batcher_;
    Optimizer optimizer_;
    std::vector<size_t> slots_;  // optimizer slot per trainer param
    int64_t total_ = 0;
    CheckpointState st_;       // the run's state; st_.health is the update's (under norm_m_)
    int64_t first_step_ = 0;

    int64_t groups_ = 1;                         // ranks, or accumulate_groups
    std::unique_ptr<Communicator> grad_comm_;    // the optimizer thread's duplicate of opt_.comm
    std::unique_ptr<GradientReducer> reducer_;   // over grad_comm_

    std::vector<std::unique_ptr<Device>> devices_;
    std::unique_ptr<Pipeline> pipe_;  // destroyed before the devices (declared after them)
    CallPlan planned_;

    std::optional<PreferenceStats> eval_preference_;

    bool grads_zero_ = false;  // host step: the last update zeroed every gradient as it read them
    std::mutex norm_m_;      // guards st_.health: the update may run on the pipeline's optimizer thread
    std::string stopped_;    // the StepReport::stop that ended the run
};

} // namespace rp
