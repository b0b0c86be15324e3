// rp-finetune: LoRA or full finetuning of a GGUF model, on the host (CPU) or pipelined by the RoundPipe
// runtime over N devices. The run is models/train/ (finetune_job.h: the options and their rules,
// session.h: the steps, run_loop.h: evaluation, checkpoints, stops); this program declares the flags
// (tools/finetune_options.cpp), prints progress and the summary.
//
//   rp-finetune -m BASE.gguf --data FILE -o OUT.gguf [options]     (see --help)
//   rp-finetune --config RUN.toml [options]                          (a run file: examples/runs/*.toml)
//
// Output: OUT.gguf (a llama.cpp LoRA adapter, or with --full the whole model), OUT.gguf.metrics.jsonl (one
// line per step and per evaluation), OUT.gguf.loss.svg (train and validation loss), OUT.gguf.config.toml
// (the effective configuration, a run file), and the checkpoint OUT.gguf.ckpt.gguf (written every
// --save-every steps and at the end, with the configuration; --resume continues it bit for bit). Files are
// written to a temporary name and renamed: an error leaves only what earlier steps completed.
#include "tools/finetune_options.h"

#include "base/error.h"
#include "ggml_rp/cpu/op_profile.h"
#include "ggml_rp/dist/mpi_world.h"
#include "ggml_rp/roundpipe/trace.h"
#include "ggml_rp/runtime/arena.h"
#include "ggml_rp/runtime/clock.h"
#include "models/arch/hparams.h"
#include "models/text/tokenizer.h"
#include "models/train/checkpoint.h"
#include "models/train/finetune_report.h"

#include <signal.h>

#include <csignal>
#include <chrono>
#include <cstdio>
#include <span>
#include <string>
#include <thread>

namespace {

const char * const kUsage = "usage: rp-finetune -m BASE.gguf --data FILE -o OUT.gguf [options]\n"
                            "       rp-finetune --config RUN.toml [options]     (the flags override the file; examples/runs/*.toml)\n";

// SIGINT / SIGTERM: the first asks the loop to stop after the step (SA_RESETHAND: a second one kills).
volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_interrupt(int sig) { g_interrupted = sig; }

void catch_interrupts() {
    struct sigaction sa {};
    sa.sa_handler = on_interrupt, sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

// What the loop reports, as progress lines (rank 0 prints).
struct Progress : rp::RunObserver {
    FILE * out = nullptr;
    bool perplexity = true;  // the loss is a token cross-entropy (not a preference loss)
    void print(const char * fmt, auto... xs) {
        if (out) std::fprintf(out, fmt, xs...);
    }
    void step(const rp::StepReport & r, const rp::RunProgress & p) override {
        const std::string norm_of = r.grad_norm_step > 0 && r.grad_norm_step != r.step ? " (step " + std::to_string(r.grad_norm_step) + ")" : "";
        print("step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f%s | %.0f tok/s | ETA %.1fs\n", static_cast<long long>(r.step),
              static_cast<long long>(p.total), r.loss, r.lr, r.grad_norm, norm_of.c_str(), static_cast<double>(r.tokens) / r.seconds,
              p.elapsed / static_cast<double>(r.step - p.first) * static_cast<double>(p.end - r.step));
        if (const auto & pr = r.preference; pr && pr->unpaired)
            print("  rewards desirable %.4f undesirable %.4f margin %.4f kl %.4f | logps desirable %.2f undesirable %.2f\n", pr->reward_chosen,
                  pr->reward_rejected, pr->margin, pr->kl, pr->logp_chosen, pr->logp_rejected);
        else if (pr)
            print("  rewards chosen %.4f rejected %.4f margin %.4f accuracy %.3f | logps chosen %.2f rejected %.2f\n", pr->reward_chosen,
                  pr->reward_rejected, pr->margin, pr->accuracy, pr->logp_chosen, pr->logp_rejected);
        if (const auto & g = r.grpo) {
            std::string each;
            for (const auto & [name, mean] : g->rewards) each += "; " + name + " " + std::to_string(mean).substr(0, 6);
            print("  reward %.4f (std %.4f%s) | zero-std groups %.2f | completions %.1f tokens [%lld, %lld], %.0f%% at the limit | kl %.4f clip %.3f\n",
                  g->reward, g->reward_std, each.c_str(), g->frac_reward_zero_std, g->completion_mean, static_cast<long long>(g->completion_min),
                  static_cast<long long>(g->completion_max), 100.0 * g->clipped_ratio, g->kl, g->clip_ratio);
            if (g->iteration > 0)
                print("  update %d on the rollouts of step %lld | completion: %s\n", g->iteration + 1,
                      static_cast<long long>(r.step - g->iteration), g->sample.substr(0, 160).c_str());
            else
                print("  rollouts %.2f s (%.0f tok/s, %.0f%% of the step) | completion: %s\n", g->rollout_seconds,
                      g->rollout_seconds > 0 ? static_cast<double>(g->rollout_tokens) / g->rollout_seconds : 0.0,
                      r.seconds > 0 ? 100.0 * g->rollout_seconds / r.seconds : 0.0, g->sample.substr(0, 160).c_str());
        }
        if (r.skipped)
            print("warning: step %lld skipped (%s, gradient norm %g, %lld trained tokens)\n", static_cast<long long>(r.grad_norm_step),
                  r.skip_reason.c_str(), r.grad_norm, static_cast<long long>(r.trained_tokens));
    }
    void eval(int64_t step, double loss, const rp::EvalProgress & ep, bool best) override {
        char best_text[96] = " (best)";
        if (!best) std::snprintf(best_text, sizeof best_text, "; best %.4f at step %lld", ep.best_loss, static_cast<long long>(ep.best_step));
        const std::string ppl = perplexity ? ", ppl " + rp::format_perplexity(loss) : "";
        print("eval step %lld: val loss %.4f%s%s\n", static_cast<long long>(step), loss, ppl.c_str(), best_text);
    }
    void eval_preference(int64_t step, const rp::PreferenceStats & p) override {
        if (p.unpaired)
            print("eval step %lld: %lld KTO examples: rewards desirable %.4f undesirable %.4f margin %.4f kl %.4f\n", static_cast<long long>(step),
                  static_cast<long long>(p.pairs), p.reward_chosen, p.reward_rejected, p.margin, p.kl);
        else
            print("eval step %lld: %lld pairs: rewards chosen %.4f rejected %.4f margin %.4f accuracy %.3f\n", static_cast<long long>(step),
                  static_cast<long long>(p.pairs), p.reward_chosen, p.reward_rejected, p.margin, p.accuracy);
    }
    void sample(int64_t step, const std::string & prompt, const std::string & completion) override {
        print("%s", ("sample step " + std::to_string(step) + ": " + prompt + " -> " + completion + "\n").c_str());
    }
};

// GRPO's setup line: the prompts, the rollouts, the rewards and the loss.
void grpo_setup(Progress & say, const rp::FinetuneJob & job, const rp::PromptSet & prompts, const rp::RewardSet & rewards, const rp::GrpoOptions & g,
                bool row_dots) {
    std::string names;
    for (size_t i = 0; i < rewards.size(); ++i) {
        char w[32];
        std::snprintf(w, sizeof w, " x %g", rewards.weight(i));
        names += (i ? ", " : "") + rewards.function(i).name() + w;
    }
    const char * products = row_dots ? "with row dots" : "with the training graphs' arithmetic";
    say.print("%s: %zu prompts (%zu cut to --max-prompt-len), %d completions each of up to %d tokens (sequences of %lld), decoded %lld at a time "
              "(%s); rewards: %s; loss %s, epsilon %g / %g, beta %g, %s advantages; temperature %g, top-p %g, top-k %d\n",
              job.data_path.c_str(), prompts.size(), prompts.n_truncated(), g.group, g.max_completion_len, static_cast<long long>(job.seq_len),
              static_cast<long long>(g.decoded_together()), products,
              names.c_str(), rp::grpo_loss_type_name(g.loss_type), g.loss.epsilon_low, g.loss.epsilon_high, g.loss.beta,
              g.scale_rewards ? "group-scaled" : "unscaled (Dr. GRPO)", static_cast<double>(g.temperature), static_cast<double>(g.top_p), g.top_k);
}

// "x 64 MiB", or each device's size: "of 64 MiB, 8 MiB, 64 MiB, 8 MiB".
std::string device_sizes(const rp::DeviceSetOptions & d) {
    if (d.memories.empty()) return "x " + rp::format_bytes(d.memory_each);
    std::string s = "of ";
    for (size_t i = 0; i < d.memories.size(); ++i) s += (i ? ", " : "") + rp::format_bytes(d.memories[i]);
    return s;
}

// The setup lines: what trains on what, and how.
void print_setup(Progress & say, const rp::FinetuneJob & job, const rp::SessionOptions & o, const rp::TrainingSession & run,
                 const rp::Dataset & data) {
    if (o.pipelined) {
        say.print("RoundPipe: %d %s devices %s%s, schedule %s, %s steps, recompute %s\n", o.devices.count,
                  o.devices.backend == "cuda" ? "CUDA" : "CPU", device_sizes(o.devices).c_str(),
                  o.devices.link ? (", link " + o.devices.link->to_string()).c_str() : "", rp::schedule_name(o.pipeline.schedule),
                  o.pipeline.async ? "async" : "sync", o.pipeline.grain == rp::RecomputeGrain::Layer ? "layer" : "stage");
        say.print("memory plan: device peak %s = %s; plan %s\n", rp::format_bytes(run.planned().memory.peak()).c_str(),
                  run.planned().memory.describe().c_str(), run.planned().plan.describe().c_str());
        say.print("host: %s\n", run.pipeline()->frozen_pinning().describe().c_str());
    }
    say.print("%s: %zu sequences of %lld tokens (%zu train%s, %zu validation), %zu trainable tensors, %lld steps\n", job.data_path.c_str(),
              data.size(), static_cast<long long>(job.seq_len), run.split().train.size(), data.group() == 1 ? "" : data.rollouts() ? " prompts" : data.pairs() ? " pairs" : " KTO examples", run.split().val.size(),
              run.trainer().params().size(), static_cast<long long>(run.total_steps()));
    if (const rp::FinetuneConfig & fc = run.trainer().config(); !fc.start_adapter.empty())
        say.print("starting from adapter %s: rank %lld, alpha %g, %zu LoRA pairs\n", fc.start_adapter.c_str(),
                  static_cast<long long>(fc.lora_rank), static_cast<double>(fc.lora_alpha), fc.lora_targets.size());
    say.print("CPU threads: %d (%s)\n", o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
              rp::cli::omp_wait_setting().c_str());
    const rp::DatasetStats & ds = data.stats();
    if (data.rollouts()) return;  // (GRPO: its own line, grpo_setup)
    if (const auto & pp = o.finetune.preference) {
        char layout[160];
        if (data.packed())
            std::snprintf(layout, sizeof layout, "packed, up to %d pairs a sequence, into %zu sequences: padding %.1f%% -> %.1f%%",
                          data.answer_slots() / 2, data.size(), 100.0 * ds.unpacked_padding_fraction(), 100.0 * ds.padding_fraction());
        else
            std::snprintf(layout, sizeof layout, "%zu sequences, padding %.1f%%", data.size(), 100.0 * ds.padding_fraction());
        say.print("%s: %zu %s %s), %zu truncated "
                  "(--max-prompt-len %lld, then --seq-len %lld); method %s, %s %g%s\n",
                  job.data_path.c_str(), ds.n_examples,
                  data.kto() ? "KTO examples (prompt + completion, and the prompt with the next example's completion for the KL term:"
                             : "preference pairs (prompt + chosen, prompt + rejected:",
                  layout, ds.n_truncated,
                  static_cast<long long>(job.max_prompt_len), static_cast<long long>(job.seq_len), job.method.c_str(),
                  pp->method == rp::PreferenceMethod::Orpo ? "lambda" : "beta", pp->beta,
                  pp->method == rp::PreferenceMethod::Simpo ? (", gamma " + std::to_string(pp->gamma)).c_str() : "");
        return;
    }
    char padding[160];
    if (ds.n_unpacked == 0) return;  // JSONL: what packing saved
    if (data.packed())
        std::snprintf(padding, sizeof padding, "packed into %zu sequences: padding %.1f%% -> %.1f%% (unpacked: %zu sequences)", data.size(),
                      100.0 * ds.unpacked_padding_fraction(), 100.0 * ds.padding_fraction(), ds.n_unpacked);
    else
        std::snprintf(padding, sizeof padding, "one sequence each: padding %.1f%% (--pack shares sequences)", 100.0 * ds.padding_fraction());
    say.print("%s: %zu examples %s; %zu longer than --seq-len %lld (cut to it), %zu skipped (no trained token left)\n", job.data_path.c_str(),
              ds.n_examples, padding, ds.n_truncated, static_cast<long long>(job.seq_len), ds.n_skipped);
}

// The summary of a finished run: devices' memory, throughput and loss, the op profile.
// Model FLOPs per token (ggml_rp/ops/flops.h: the forward and the backward once, no recompute) of two --seq-len
// sequences (a preference pair's answers), for the summary's GFLOP/s: what an MFU divides by the machine's peak.
// Counted before the run, so that a failure to count stops it with nothing written. 0 for GRPO, whose rollouts'
// generation it would not count.
double model_flops_per_token(const rp::FinetuneJob & job, rp::TrainingSession & run) {
    if (job.method == "grpo" || job.seq_len <= 0) return 0.0;
    rp::MicroBatchInfo mb;
    mb.seq_len = job.seq_len;
    mb.n_seq = 2;
    mb.packed = job.packed_data();  // (the shapes alone: no positions)
    return run.trainer().model_flops(mb) / static_cast<double>(mb.tokens());
}

void print_summary(Progress & say, const rp::FinetuneJob & job, const rp::TrainingSession & run, const rp::RunOutcome & outcome,
                   double flops_per_token) {
    const rp::SessionOptions & o = run.options();
    if (o.pipelined) {  // planned vs measured, per device; the jobs each ran and its speed as the dispatcher saw it
        const std::vector<int64_t> jobs = run.pipeline()->jobs_per_device();
        const std::vector<double> speeds = run.pipeline()->device_speeds();
        for (size_t i = 0; i < run.devices().size(); ++i) {
            const rp::DeviceMemoryPlan u = run.pipeline()->device_regions_used(static_cast<int>(i));
            // (a later call's plan, e.g. from measured layer times, may carve more than the first call's)
            const size_t planned = run.planned().regions_of(static_cast<int>(i)).peak();
            const size_t carved = run.pipeline()->device_regions(static_cast<int>(i)).peak();
            const std::string later = carved > planned ? ", carved " + std::to_string(carved) + " for a later call's plan" : std::string();
            say.print("memory %s: high-water %zu bytes, planned %zu%s (used: resident %zu, weights %zu, activations %zu, graph %zu); "
                      "weights sent %zu bytes; %lld jobs, speed %.2f (%s)\n",
                      run.devices()[i]->name().c_str(), run.devices()[i]->high_water(), planned, later.c_str(), u.resident, u.weight_slot,
                      u.activations, u.graph, run.pipeline()->device_weight_bytes_uploaded(static_cast<int>(i)),
                      static_cast<long long>(jobs[i]), speeds[i], o.pipeline.device_speed.empty() ? "measured" : "given");
        }
    }
    const rp::TrainCurve & curve = run.curve();
    const double secs = outcome.seconds;
    const auto & tl = curve.train_loss;
    say.print("done: %lld steps in %.2f s, %.0f tok/s (%.0f trained tok/s); loss %.4f -> %.4f", static_cast<long long>(run.steps_done() - outcome.first),
              secs, secs > 0 ? outcome.tokens / secs : 0.0, secs > 0 ? outcome.trained_tokens / secs : 0.0, tl.empty() ? 0.0 : tl.front(),
              tl.empty() ? 0.0 : tl.back());
    if (!curve.eval_loss.empty()) {
        say.print("; val loss %.4f -> %.4f", curve.eval_loss.front(), curve.eval_loss.back());
        if (say.perplexity)
            say.print(" (ppl %s -> %s)", rp::format_perplexity(curve.eval_loss.front()).c_str(), rp::format_perplexity(curve.eval_loss.back()).c_str());
        const rp::EvalProgress ep = rp::eval_progress(curve);
        if (ep.best_step == curve.eval_step.front())
            say.print(" -- validation never improved on its first value: the run overfits or the lr is too high");
        else if (ep.since_best > 0)
            say.print(" -- best %.4f at step %lld%s", ep.best_loss, static_cast<long long>(ep.best_step),
                      job.loop.save_best ? (" (" + job.loop.best_path() + ")").c_str() : "");
    }
    say.print("; peak graph %.1f KiB, peak RSS %.1f MiB\nwrote %s\n", static_cast<double>(run.trainer().peak_graph_bytes()) / 1024.0,
              static_cast<double>(rp::process_peak_rss_bytes()) / 1048576.0, job.loop.out_path.c_str());
    if (flops_per_token > 0 && outcome.step_seconds > 0)
        say.print("model FLOPs: %.3f GFLOP per token (forward + backward at seq %lld), %.1f GFLOP/s over the steps\n", flops_per_token / 1e9,
                  static_cast<long long>(job.seq_len), flops_per_token * outcome.tokens / outcome.step_seconds / 1e9);
    if (!job.profile_ops) return;  // the op profile
    rp::cpu::set_op_profiling(false);
    const std::vector<rp::cpu::OpTime> rows = rp::cpu::op_profile();
    double in_ops = 0;
    for (const rp::cpu::OpTime & t : rows) in_ops += t.seconds;
    say.print("op profile: %.3f s of training steps, %.3f s in graph nodes%s\n%s", outcome.step_seconds, in_ops,
              o.pipelined ? " (summed over the devices' threads)" : "",
              rp::cpu::format_op_profile(rows, o.pipelined ? 0 : std::max(0.0, outcome.step_seconds - in_ops)).c_str());
}

int finetune(int argc, char ** argv, rp::Communicator * world) {
    const int rank = world ? world->rank() : 0, ranks = world ? world->size() : 1;
    Progress say;
    say.out = rank == 0 ? stderr : nullptr;  // rank 0 prints and writes; the other ranks only compute
    rp::FinetuneJob job;
    rp::cli::Options opts("rp-finetune", kUsage);
    rp::cli::declare_finetune_options(opts, job);
    // A checkpoint's recorded options are the defaults of its resume (a run file, then the flags, override them).
    std::map<std::string, std::string> recorded;
    const auto resume = rp::cli::Options::find(argc, argv, "--resume");
    const std::string recorded_config = resume ? rp::checkpoint_run_config(*resume) : "";
    if (!recorded_config.empty()) {
        opts.read_recorded_text(recorded_config, *resume + " (its rp.ckpt.run_config)");
        recorded = opts.values(true);
    }
    if (!opts.parse(argc, argv)) return 0;
    const std::string config = opts.run_file();
    if (opts.print_config()) return rank == 0 ? std::fputs(config.c_str(), stdout), 0 : 0;
    if (job.dp.required && !world)
        throw rp::Error(rp::MpiWorld::available() ? "--dp: this process was not launched by mpirun (mpirun -np R rp-finetune ... --dp)"
                                                  : "--dp needs a build with MPI (apt-get install libopenmpi-dev openmpi-bin; cmake -DRP_MPI=ON)");
    job.validate(world != nullptr);
    rp::SessionOptions o = job.session_options();
    o.run_config = config;  // in every checkpoint, and beside the result
    if (world) {
        rp::CommOptions co;
        co.timeout_s = job.dp.timeout_s;
        if (!job.dp.link.empty()) co.link = rp::LinkModel::parse(job.dp.link);
        world->set_options(co);
        o.comm = world;
        o.replica_check_every = job.dp.check_every;
    }
    // The frozen weights' pinning, unless asked for: a pinned copy when the plan with it fits the host memory.
    auto choose_pinning = [&](const rp::Model & m, size_t limit) {
        const bool asked = o.pipeline.frozen_pinning.has_value();
        o.pipeline.frozen_pinning = rp::choose_frozen_pinning(m, job.plan_options(o), rp::process_rss_bytes(), limit);
        return !asked && o.pipelined && *o.pipeline.frozen_pinning != rp::default_frozen_pinning(o.devices.backend != "cpu");
    };
    if (job.plan_only) {  // a dry run: metadata and tensor infos only
        auto model = rp::Model::load(job.model_path);
        const size_t host_limit = job.host_memory_limit().first;
        const bool registered = choose_pinning(*model, host_limit);
        const int64_t chunk = rp::host_fitting_token_chunk(*model, job.plan_options(o), rp::process_rss_bytes(), host_limit);
        if (chunk > 0) o.pipeline.token_chunk = chunk;
        if (rank == 0) {
            if (registered)
                std::printf("note: the frozen weights are registered in place (--pin register): a pinned copy would not fit the host memory\n");
            if (chunk > 0)
                std::printf("note: token chunk %lld: the plan with every token in one graph has smaller stages, so more boundary checkpoints, "
                            "than fit the host memory (--host-mem, --token-chunk)\n",
                            static_cast<long long>(chunk));
            std::fputs(rp::plan_run(*model, job.plan_options(o)).report().c_str(), stdout);
            // What the plan read of the weights: the tensor data's pages present in this process (the peak RSS
            // beside it also counts the heap, whose huge pages and arenas vary with the machine).
            const gguf::Reader & file = model->file();
            const size_t data_bytes = static_cast<size_t>(file.file_size() - file.data_offset());
            const std::optional<size_t> read = file.resident_bytes(file.bytes() + file.data_offset(), data_bytes);
            std::printf("plan rss: %zu bytes (this process)\n", rp::process_peak_rss_bytes());
            if (read)
                std::printf("tensor data resident: %zu of %zu bytes (the weights were mapped, not read)\n", *read, data_bytes);
        }
        return 0;
    }
    // Data parallel: absolute times, shifted to a moment every rank agrees on (after a collective) so that
    // rp-trace can merge the ranks' files; each rank writes its own (TRACE.rankR.json).
    rp::TraceRecorder recorder(ranks > 1);
    if (!job.trace_path.empty()) {
        o.devices.hook = recorder.hook();
        // every device by name, so that one the dispatch left idle still counts (busy 0%, 0 jobs, in the bubble)
        for (int d = 0; d < o.devices.count; ++d) recorder.name_device(d, "device " + std::to_string(d));
        if (world) {
            rp::CommOptions co = world->options();
            co.trace = recorder.hook();
            co.trace_device = o.devices.count;
            world->set_options(co);
            recorder.name_device(o.devices.count, "all-reduce");
        }
    }
    // Setup: everything that can fail on bad input happens before any file is written.
    auto model = rp::Model::load(job.model_path);
    const rp::Tokenizer tok(model->file());
    // GRPO: the prompts, their frame (a prompt and its group of completions a unit), the rewards and the objective.
    const bool grpo = job.method == "grpo";
    std::unique_ptr<rp::PromptSet> prompts;
    rp::RewardSet rewards;
    const rp::GrpoOptions grpo_opt = grpo ? job.grpo_options() : rp::GrpoOptions{};
    if (grpo) {
        prompts = std::make_unique<rp::PromptSet>(rp::PromptSet::load(job.data_path, tok, job.dataset_options(*model, tok)));
        job.seq_len = rp::grpo_seq_len(*prompts, grpo_opt);
        if (job.seq_len > static_cast<int64_t>(model->hparams().n_ctx_train))
            throw rp::Error(job.data_path + ": the longest prompt (" + std::to_string(prompts->max_tokens()) + " tokens) and --max-completion-len " +
                            std::to_string(grpo_opt.max_completion_len) + " exceed the model's context of " +
                            std::to_string(model->hparams().n_ctx_train));
        rewards = job.make_rewards();
    }
    const rp::Dataset data =
        grpo ? prompts->frame(static_cast<int32_t>(job.seq_len), grpo_opt.group) : rp::Dataset::load(job.data_path, tok, job.dataset_options(*model, tok));
    std::unique_ptr<rp::GrpoObjective> objective;
    if (grpo) {
        objective = std::make_unique<rp::GrpoObjective>(*model, tok, *prompts, rewards, grpo_opt);
        o.objective = objective.get();
    }
    // The host side of the plan, before anything is allocated (the devices' side: the session); said once the
    // session is up, so that a bad input's error is the first line.
    const auto [host_limit, host_source] = job.host_memory_limit();
    if (choose_pinning(*model, host_limit))
        say.print("the frozen weights are registered in place (--pin register): a pinned copy of them would not fit the host memory\n");
    const size_t held = rp::process_rss_bytes();
    if (const int64_t chunk = rp::host_fitting_token_chunk(*model, job.plan_options(o), held, host_limit); chunk > 0) {
        o.pipeline.token_chunk = chunk;
        say.print("token chunk %lld: the plan with every token in one graph has smaller stages, so more boundary checkpoints, "
                  "than fit the host memory (--host-mem, --token-chunk)\n",
                  static_cast<long long>(chunk));
    }
    const size_t host_planned = rp::require_host_memory(*model, job.plan_options(o), held, host_limit, host_source);
    if (o.pipelined)  // the devices and the pinned host memory: seconds to minutes for a large model
        say.print("starting %d %s devices %s; pinning the frozen weights (%s)...\n", o.devices.count, o.devices.backend.c_str(),
                  device_sizes(o.devices).c_str(),
                  rp::frozen_pinning_name(*o.pipeline.frozen_pinning));
    rp::TrainingSession run(*model, data, o);
    double trace_t0 = 0;
    if (world && ranks > 1) {  // every rank has built its session: the common origin of the traces
        const uint64_t zero = 0;
        world->allgather(std::span<const uint64_t>(&zero, 1), "clock origin");
        trace_t0 = rp::clock_us();
        const int64_t M = run.options().micro_batches;
        say.print("data parallel: rank 0 of %d (each rank computes %lld of %lld micro-batches per step%s), timeout %g s, replica check every "
                  "%lld steps%s\n",
                  ranks, static_cast<long long>((M + ranks - 1) / ranks), static_cast<long long>(M),
                  o.micro_batches == 0 ? ": --micro-batches defaults to one per rank, a step is the same --batch sequences" : "",
                  job.dp.timeout_s, static_cast<long long>(job.dp.check_every),
                  job.dp.link.empty() ? "" : (", link " + world->options().link->to_string()).c_str());
    }
    if (resume) {
        say.print("%s\n", run.resume(*resume).c_str());
        std::string changed;
        for (const auto & [key, value] : opts.values(true))
            if (!recorded.empty() && recorded.count(key) && recorded[key] != value)
                changed += (changed.empty() ? "" : ", ") + key + " = " + value + " (was " + recorded[key] + ")";
        if (!changed.empty()) say.print("resume: options changed since the checkpoint: %s\n", changed.c_str());
    }
    say.print("host memory: plan %s beside %s held, of %s (%s)\n", rp::format_bytes(host_planned).c_str(), rp::format_bytes(held).c_str(),
              host_limit == SIZE_MAX ? "no limit" : rp::format_bytes(host_limit).c_str(), host_source.c_str());
    print_setup(say, job, o, run, data);
    if (grpo) grpo_setup(say, job, *prompts, rewards, grpo_opt, objective->rollouts_use_row_dots(run.trainer()));
    say.perplexity = !o.finetune.preference && !o.finetune.grpo;
    if (const auto t0 = std::chrono::steady_clock::now(); run.reference_pass())
        say.print("reference pass: the log-probabilities of %zu answers under the starting model, %s, %.1f s (kept in the checkpoint)\n",
                  data.n_answers(), o.pipelined ? "through the devices" : "on the host",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    rp::RunLoopOptions loop = job.loop;
    loop.writes = rank == 0;
    loop.tokenizer = &tok;
    loop.interrupted = [] { return g_interrupted != 0; };
    loop.rss_bytes = rp::process_rss_bytes;
    loop.before_step = rp::rank_fault_hook(job.rank_fault, rank, run);
    if (job.profile_ops) rp::cpu::reset_op_profile(), rp::cpu::set_op_profiling(true);
    const double flops_per_token = model_flops_per_token(job, run);
    catch_interrupts();
    const rp::RunOutcome outcome = rp::run_training(run, loop, say);
    if (outcome.end == rp::RunEnd::Interrupted) {
        say.print("interrupted at step %lld; resume with the same command and --resume %s\n", static_cast<long long>(run.steps_done()),
                  loop.checkpoint_path().c_str());
        return 130;
    }
    if (outcome.end == rp::RunEnd::Diverged) {
        say.print("error: %s; stopped without writing %s%s\n", rp::cli::with_flag_names(outcome.stop, rp::cli::finetune_flag_names()).c_str(),
                  loop.out_path.c_str(), loop.save_every > 0 ? (" (the last checkpoint: " + loop.checkpoint_path() + ")").c_str() : "");
        return 1;
    }
    if (outcome.end == rp::RunEnd::EarlyStopped)
        say.print("early stop at step %lld: %lld evaluations without a better validation loss than %.4f (step %lld)\n",
                  static_cast<long long>(run.steps_done()), static_cast<long long>(outcome.at_stop.since_best), outcome.at_stop.best_loss,
                  static_cast<long long>(outcome.at_stop.best_step));
    run.synchronize();
    if (!job.trace_path.empty()) {
        rp::Trace trace = recorder.snapshot();
        if (ranks > 1)
            for (rp::TraceEvent & e : trace.events) e.ts_us -= trace_t0;
        const std::string path = rp::rank_trace_path(job.trace_path, rank, ranks);
        rp::write_chrome_trace(path, trace);
        const rp::TraceStats ts = rp::analyse_trace(trace);
        say.print("trace %s: %zu operations on %d devices, bubble ratio %.1f%%, exposed communication %.1f%%\n", path.c_str(),
                  trace.events.size(), ts.devices, 100.0 * ts.bubble_ratio, 100.0 * ts.exposed_comm_fraction);
    }
    print_summary(say, job, run, outcome, flops_per_token);
    return 0;
}

} // namespace

int main(int argc, char ** argv) {
    // mpirun -np R: every rank one data-parallel node. Launched by mpirun without MPI in this build, R copies
    // would each train alone and write the same files: refused.
    std::unique_ptr<rp::Communicator> world;
    int ranks = 1, rank = 0;
    try {
        if (rp::MpiWorld::launched()) {
            if (rp::MpiWorld::available()) {
                world = rp::MpiWorld::init(&argc, &argv, rp::CommOptions{});
                rank = world->rank();
                ranks = world->size();
            } else if (rp::MpiWorld::launched_size() > 1) {
                throw rp::Error("launched by mpirun with " + std::to_string(rp::MpiWorld::launched_size()) +
                                " ranks, but this rp-finetune was built without MPI: each rank would train alone "
                                "(apt-get install libopenmpi-dev openmpi-bin; cmake -DRP_MPI=ON)");
            }
        }
        const int rc = finetune(argc, argv, world.get());
        world.reset();
        rp::MpiWorld::finalize();
        return rc;
    } catch (const std::exception & e) {
        const std::string msg = rp::cli::with_flag_names(e.what(), rp::cli::finetune_flag_names());
        if (ranks > 1) {
            // The peers may be blocked on this rank: end the whole job (mpirun reports it).
            std::fprintf(stderr, "rank %d: error: %s\n", rank, msg.c_str());
            std::fflush(stderr);
            rp::MpiWorld::abort(1);
        }
        std::fprintf(stderr, "error: %s\n", msg.c_str());
        world.reset();
        rp::MpiWorld::finalize();
        return 1;
    }
}
