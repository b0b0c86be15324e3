#include "models/train/run_loop.h"

#include "base/atomic_file.h"
#include "base/error.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include <chrono>
#include <optional>

namespace rp {

size_t process_rss_bytes() {
    long pages = 0, resident = 0;
    if (FILE * f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        std::fclose(f);
    }
    return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

size_t process_peak_rss_bytes() {
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<size_t>(ru.ru_maxrss) * 1024;
}


void RunLoopOptions::validate(const SessionOptions & session) const {
    if (out_path.empty()) throw Error("out_path: no output path");
    if ((sample_every > 0) != !sample_prompts.empty())
        throw Error(sample_every > 0 ? "sample_every needs sample_prompt" : "sample_prompt needs sample_every N");
    if ((early_stop > 0 || save_best) && (eval_every <= 0 || !(session.val_split > 0)))
        throw Error(std::string(early_stop > 0 ? "early_stop" : "save_best") + " needs evaluations: val_split F (> 0) and eval_every N");
}

RunOutcome run_training(TrainingSession & run, const RunLoopOptions & o, RunObserver & obs) {
    o.validate(run.options());
    if (o.sample_every > 0 && !o.tokenizer) throw Error("sample_every: no tokenizer to sample with");
    RunOutcome out;
    RunProgress pr;
    pr.first = out.first = run.steps_done();
    pr.total = run.total_steps();
    pr.end = o.stop_at > 0 ? std::min<int64_t>(o.stop_at, pr.total) : pr.total;
    Communicator * comm = run.options().comm;
    const bool many = comm && comm->size() > 1;

    // Only the writing process keeps the log (the other ranks' would be the same lines).
    std::optional<MetricsLog> metrics;
    if (o.writes) metrics.emplace(o.out_path + ".metrics.jsonl", pr.first > 0);
    auto save_checkpoint = [&] {
        if (o.writes) run.save_checkpoint(o.checkpoint_path());
        else run.synchronize();
    };
    // The log and curve so far: a stopped or interrupted run keeps them (a resume continues them).
    auto keep_log = [&] {
        if (o.writes) write_loss_svg(o.out_path + ".loss.svg", run.curve(), &run.options().lr);
        if (metrics) metrics->commit();
    };
    auto evaluate = [&](int64_t step) {
        if (!run.has_validation()) return;
        run.record_eval(step, run.evaluate());
        const double kept = run.curve().eval_loss.back();
        if (metrics) metrics->eval(step, kept, run.eval_preference());
        const EvalProgress ep = eval_progress(run.curve());
        const bool best = ep.best_step == step && ep.since_best == 0;
        obs.eval(step, kept, ep, best);
        if (run.eval_preference()) obs.eval_preference(step, *run.eval_preference());
        if (best && o.save_best && o.writes) run.save_result(o.best_path());
    };
    auto sample = [&](int64_t step) {
        if (!o.writes) return;
        for (const std::string & p : o.sample_prompts) {
            const std::string c = run.sample(*o.tokenizer, p, o.sample_tokens);
            obs.sample(step, p, c);
            if (metrics) metrics->sample(step, p, c);
        }
    };
    auto early_stopped = [&] {
        if (o.early_stop <= 0) return false;
        const EvalProgress ep = eval_progress(run.curve());
        return ep.best_step >= 0 && ep.since_best >= o.early_stop;
    };

    if (pr.first == 0 && o.eval_every > 0) evaluate(0);
    const auto t0 = std::chrono::steady_clock::now();
    auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    while (run.steps_done() < pr.end) {
        // Data parallel: stop together (each rank may see the signal at another step).
        double stop = o.interrupted && o.interrupted() ? 1.0 : 0.0;
        if (many) comm->allreduce_sum(&stop, 1, "interrupt flag");
        if (o.before_step) o.before_step(run.steps_done() + 1);
        if (stop > 0) {
            save_checkpoint();
            keep_log();
            out.end = RunEnd::Interrupted;
            out.seconds = seconds();
            return out;
        }
        const StepReport r = run.step();
        out.tokens += static_cast<double>(r.tokens);
        out.trained_tokens += static_cast<double>(r.trained_tokens);
        out.step_seconds += r.seconds;
        if (metrics) metrics->step(r, o.rss_bytes ? o.rss_bytes() : 0);
        if (!r.stop.empty()) {  // diverged: nothing more is written; the last checkpoint is the last good state
            keep_log();
            out.end = RunEnd::Diverged;
            out.stop = r.stop;
            out.seconds = seconds();
            return out;
        }
        pr.elapsed = seconds();
        obs.step(r, pr);
        if (o.sample_every > 0 && r.step % o.sample_every == 0 && r.step != pr.end) sample(r.step);
        if (o.eval_every > 0 && r.step % o.eval_every == 0 && r.step != pr.end) {
            evaluate(r.step);
            if (early_stopped()) {
                out.end = RunEnd::EarlyStopped;
                out.at_stop = eval_progress(run.curve());
                break;
            }
        }
        if (o.save_every > 0 && r.step % o.save_every == 0 && r.step != pr.end) {
            save_checkpoint();
            if (metrics) metrics->save_copy();  // the log as of the checkpoint: a run killed later resumes with it
        }
    }
    const TrainCurve & curve = run.curve();
    if (o.eval_every > 0 && (curve.eval_step.empty() || curve.eval_step.back() != run.steps_done())) evaluate(run.steps_done());
    if (o.sample_every > 0) sample(run.steps_done());
    run.synchronize();
    if (many) run.check_replicas("at the end");
    save_checkpoint();
    if (o.writes) run.save_result(o.out_path);
    // The configuration that made the result, beside it (a run file the tool can read back).
    if (o.writes && !run.options().run_config.empty()) write_file_atomically(o.config_path(), run.options().run_config);
    keep_log();
    out.seconds = seconds();
    return out;
}

} // namespace rp
