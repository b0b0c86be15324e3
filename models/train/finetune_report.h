// What a finetune run leaves besides its result: the metrics as JSON Lines, and the loss curve as a small
// hand-written SVG (train loss per step, validation loss at its evaluation steps). Both are written through
// temporary files and renamed (base/atomic_file.h).
#pragma once

#include "base/atomic_file.h"
#include "models/train/checkpoint.h"
#include "models/train/session.h"

#include <cstdint>
#include <optional>
#include <string>

namespace rp {

// The loss curve: train loss per step, validation loss at its evaluation steps (each point's value on hover,
// the best one ringed: what --save-best keeps), y ticks at round values; with `lr`, the learning rate of
// every step as a faint dashed line on a second axis at the right; for preference training (the curve's rewards),
// a panel below with each step's rewards/chosen, rewards/rejected and their margin.
void write_loss_svg(const std::string & path, const TrainCurve & curve, const LrSchedule * lr = nullptr);

// The perplexity exp(loss) of a mean token loss, as every report prints it: 3 decimals up to 10^6, then
// scientific ("1.234e+08"), "inf" past a double's range.
std::string format_perplexity(double loss);

// A JSON number, or null when v is not finite (JSON has no NaN or infinity).
std::string json_number(double v, const char * format = "%.6f");

// One JSON object per line: {"step":..,"loss":..,"lr":..,"grad_norm":..,"grad_norm_step":..,"tokens_per_s":..}
// per step ("grad_norm_step" says which step's gradient the norm is: an earlier one in async pipeline runs;
// "skipped":"<reason>" when that step's update was not applied), and {"step":..,"val_loss":..,"val_ppl":..}
// per evaluation. Written to PATH.tmp as the run goes (flushed per line) and renamed to PATH by commit().
class MetricsLog {
public:
    // append: continue an existing PATH (a resumed run starts from its lines).
    MetricsLog(const std::string & path, bool append);
    // rss_bytes > 0: the process's resident memory after the step (soak runs watch it).
    void step(const StepReport & r, size_t rss_bytes = 0);
    // Preference training adds its metrics under TRL's names ("rewards/chosen", ...; "eval_" before them in eval).
    void eval(int64_t step, double loss, const std::optional<PreferenceStats> & preference = std::nullopt);
    // A completion sampled during training (rp-finetune --sample-every).
    void sample(int64_t step, const std::string & prompt, const std::string & completion);
    void commit() { f_.commit(); }
    // The lines so far in place at the path (atomically), the log going on: at every checkpoint, so that a
    // run killed later resumes with the log of its checkpoint.
    void save_copy();

private:
    AtomicFile f_;
};

} // namespace rp
