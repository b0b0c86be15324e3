// A finetune run as a user describes it (rp-finetune's options, or a run file): what to train and on what,
// the session's and the run loop's options, the data-parallel settings and the failure-test switches.
// validate() holds every rule between options (before anything is loaded); the functions below build what
// each part of the library takes from it, so that no tool copies them field by field.
#pragma once

#include "models/data/dataset.h"
#include "models/train/grpo.h"
#include "models/train/run_loop.h"
#include "models/train/run_plan.h"
#include "models/train/session.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>

namespace rp {

class Tokenizer;

// Data parallel over MPI (architecture.md §8).
struct DataParallelOptions {
    bool required = false;      // the run must be one rank of several
    double timeout_s = 300;     // a peer silent this long is an error on every rank
    int64_t check_every = 100;  // compare the replicas every N steps (and at the end)
    std::string link;           // an emulated inter-node link, LinkModel syntax ("" = none)
};

// A data-parallel rank's fault, at the start of step `step` (tests of the failure paths).
struct RankFault {
    std::string kind;  // "" = none, "die" (SIGKILL), "hang", "corrupt" (one bit of the first master)
    int rank = -1;     // -1 = every rank
    int64_t step = 0;
};

struct FinetuneJob {
    std::string model_path, data_path, resume_path, trace_path;
    std::string link;               // the CPU devices' link model, LinkModel syntax ("" = memcpy speed)
    int64_t seq_len = 64;
    bool allow_binary = false;      // DatasetOptions
    bool train_on_inputs = false;
    bool train_analysis = false;
    // JSONL only: several examples (preference pairs) per sequence; unset: SFT examples packed, pairs not (packed,
    // a pair's two answers share one sequence: models/data/dataset.h).
    std::optional<bool> pack;
    bool packs() const { return pack.value_or(method == "sft"); }
    // The objective: "sft", or a preference method ("dpo", "ipo", "simpo", "orpo", "kto": FinetuneConfig::preference,
    // with preference's beta, label smoothing, gamma and KTO's weights; ORPO's lambda is orpo_lambda).
    std::string method = "sft";
    PreferenceParams preference;    // (its beta: `beta`)
    std::optional<double> beta;     // preference: their beta (default 0.1); grpo: the KL term's weight (default 0)
    // GRPO ("grpo": FinetuneConfig::grpo; data_path holds prompts): its rollouts and loss (grpo.loss's beta: `beta`),
    // the built-in rewards (RewardSet specs), the reward program and its timeout, and the rewards' weights
    // (empty: 1 each; else one per reward, the built-ins first, then the program).
    GrpoOptions grpo;
    std::vector<std::string> rewards;
    std::string reward_cmd;
    double reward_timeout = 60;
    std::vector<std::string> reward_weights;
    std::string grpo_loss_type = "bnpo";
    double orpo_lambda = 0.1;
    int64_t max_prompt_len = 0;     // DatasetOptions::max_prompt_len
    std::string chat_template;      // "" = the model's own
    int64_t token_chunk = -2;       // -2: not given (host 0, pipeline the planner's); -1: the planner's (pipeline only)
    bool plan_only = false;         // print the memory plan and stop
    bool max_seq = false;           // with plan_only: the longest sequence that fits
    bool profile_ops = false;
    // Host memory the run may take (bytes); 0: what the system lets this process take (host_memory_available)
    // less kHostMemoryMargin of it. Checked against the plan's host peak before anything is allocated.
    size_t host_memory = 0;
    SessionOptions session;
    RunLoopOptions loop;            // loop.out_path is the result
    DataParallelOptions dp;
    RankFault rank_fault;

    FinetuneJob();

    // Throws rp::Error naming the fields at fault ("token_chunk auto needs devices.count"); data_parallel:
    // this process is one rank of several.
    void validate(bool data_parallel) const;
    // The session's options as the job resolves them (token chunk, link).
    SessionOptions session_options() const;
    DatasetOptions dataset_options(const Model & model, const Tokenizer & tok) const;
    // What plan_run() takes for this job: the session's options as the run resolved them (session_options(),
    // with its communicator: micro_batches 0 is one per rank), the sequence length and packing.
    RunPlanOptions plan_options(const SessionOptions & session_resolved) const;
    bool packed_data() const;       // JSONL data with packing on (packs())
    // The preference objective method names (nullopt: SFT or GRPO); throws rp::Error naming `method` otherwise.
    std::optional<PreferenceParams> preference_objective() const;
    // GRPO's options as the job resolves them (beta, loss type, seed, threads); the rewards it names, made.
    GrpoOptions grpo_options() const;
    RewardSet make_rewards() const;
    // host_memory resolved: the bytes and where they come from ("host_memory" when given).
    std::pair<size_t, std::string> host_memory_limit() const;
};

// The share of the available host memory a run leaves to everything else by default (page cache the run reads
// through, other processes' growth): a plan must fit 95% of it.
constexpr double kHostMemoryMargin = 0.05;

// The trace file of rank `rank` of a `ranks`-process run: TRACE.rankR.json (one process: `path` itself).
std::string rank_trace_path(const std::string & path, int rank, int ranks);

// RunLoopOptions::before_step that injects `fault` on rank `rank` (SIGKILL, a hang, or one flipped bit of
// the first master); an empty function when the fault is not this rank's.
std::function<void(int64_t)> rank_fault_hook(const RankFault & fault, int rank, TrainingSession & run);

} // namespace rp
