// The run of a finetune job around TrainingSession::step() (what rp-finetune runs): the evaluation cadence
// (step 0, every eval_every steps, the end), early stopping, the best result (OUT.best.gguf), samples,
// periodic checkpoints, the stop on a run of non-finite steps, an interrupt that writes the checkpoint, and
// the final save; the metrics log (OUT.metrics.jsonl) and the loss curve (OUT.loss.svg) beside the result.
// The loop decides; a RunObserver hears what happened (a tool prints it).
#pragma once

#include "models/train/finetune_report.h"
#include "models/train/session.h"
#include "models/text/tokenizer.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace rp {

struct RunLoopOptions {
    std::string out_path;           // the result; OUT.ckpt.gguf, OUT.best.gguf, OUT.metrics.jsonl, OUT.loss.svg, OUT.config.toml
    int64_t stop_at = 0;            // > 0: stop after this step (checkpoint written), keeping the schedule
    int64_t eval_every = 0;         // validation loss at step 0, every N steps and at the end (with a validation split)
    int64_t early_stop = 0;         // > 0: N evaluations in a row without a better validation loss end the run
    bool save_best = false;         // the result of the best evaluation in OUT.best.gguf (rewritten when beaten)
    int64_t save_every = 0;         // > 0: the checkpoint every N steps (it is also written at the end)
    int64_t sample_every = 0;       // > 0: greedy completions of sample_prompts every N steps and at the end
    std::vector<std::string> sample_prompts;
    int64_t sample_tokens = 32;
    const Tokenizer * tokenizer = nullptr;  // samples
    bool writes = true;             // this process writes the files (data parallel: rank 0)
    // Asked to stop (SIGINT / SIGTERM); the ranks of a data-parallel run agree at each step.
    std::function<bool()> interrupted;
    // Called before each step with its number (fault injection in tests).
    std::function<void(int64_t)> before_step;
    // The process's resident bytes, logged with each step (0: not logged).
    std::function<size_t()> rss_bytes;

    std::string checkpoint_path() const { return out_path + ".ckpt.gguf"; }
    std::string best_path() const { return out_path + ".best.gguf"; }
    // Written with the result when SessionOptions::run_config is set.
    std::string config_path() const { return out_path + ".config.toml"; }
    // Throws rp::Error naming the field (early_stop / save_best without evaluations, samples without prompts):
    // before the session is built, so that nothing is loaded for a run that cannot start.
    void validate(const SessionOptions & session) const;
};

// This process's resident memory now and at its peak (Linux /proc and getrusage; 0 where unknown), for the
// metrics log and the run's summary.
size_t process_rss_bytes();
size_t process_peak_rss_bytes();

struct RunProgress {
    int64_t first = 0;   // steps done before this run (a resume)
    int64_t end = 0;     // the last step this run takes (stop_at or the schedule's end)
    int64_t total = 0;   // the schedule's steps
    double elapsed = 0;  // seconds since the loop started
};

class RunObserver {
public:
    virtual ~RunObserver() = default;
    virtual void step(const StepReport &, const RunProgress &) {}
    // `loss` is the value the curve keeps; `best`: this evaluation is the best so far.
    virtual void eval(int64_t step, double loss, const EvalProgress & progress, bool best) {}
    // Preference training: the evaluated pairs' metrics, right after eval().
    virtual void eval_preference(int64_t step, const PreferenceStats & stats) {}
    virtual void sample(int64_t step, const std::string & prompt, const std::string & completion) {}
};

enum class RunEnd { Completed, EarlyStopped, Interrupted, Diverged };

struct RunOutcome {
    RunEnd end = RunEnd::Completed;
    int64_t first = 0;           // steps done before the run
    std::string stop;            // Diverged: why (StepReport::stop)
    EvalProgress at_stop;        // EarlyStopped: the best evaluation
    double tokens = 0, trained_tokens = 0;
    double seconds = 0;          // wall time of the loop
    double step_seconds = 0;     // of it, in the sessions' steps
};

RunOutcome run_training(TrainingSession & run, const RunLoopOptions & options, RunObserver & observer);

} // namespace rp
