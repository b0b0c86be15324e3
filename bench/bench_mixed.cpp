// rp-bench mixed: RoundPipe on a machine of mixed GPUs (issue #37) — the step time of the paper's fixed
// round-robin against dispatch by readiness (with the speeds given, and measured by the runtime itself), and
// against the ideal: the step's compute at speed 1 over the devices' summed speed (no bubble, no transfer),
// the compute being the round-robin run's (the planner's stages: stages sized by speed recompute more, and the
// ideal does not rise with it).
//
// The real runtime (dispatcher, transfer engine, events, optimizer thread) on CPU virtual devices with emulated
// compute (bench/timed_program.h: each layer's programs sleep for their measured times, the link scaled like
// PCIe 4.0 on an RTX 4090), each device computing at its speed (cpu_device.h: a device of speed s sleeps out
// 1/s of every launch). Mixes: all 1; half the devices at 0.5; one straggler at 0.25. Sync steps (each step ends
// with every device's last job, the straggler's too) and async steps (staleness 1: the next step's forward jobs
// overlap this one's backward, the paper's setting). The step time is the steady state's: the time between the
// starts of calls, over `steps` calls that follow the warm-up with no synchronize between (a long run pays one
// fill and one drain in all).
#include "bench/bench.h"
#include "bench/timed_program.h"

#include "ggml_rp/roundpipe/pipeline.h"
#include "ggml_rp/roundpipe/trace.h"
#include "ggml_rp/runtime/clock.h"
#include "models/arch/model.h"
#include "models/train/trainer.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

namespace {

using rp::bench::Measured;
using rp::bench::TimedProgram;

struct Mix {
    std::string name;
    std::vector<double> speeds;
};

std::vector<Mix> mixes(int G) {
    std::vector<Mix> m;
    m.push_back({"1:1", std::vector<double>(static_cast<size_t>(G), 1.0)});
    std::vector<double> half(static_cast<size_t>(G), 1.0);
    for (int d = G / 2; d < G; ++d) half[static_cast<size_t>(d)] = 0.5;
    m.push_back({"1:0.5", half});
    std::vector<double> straggler(static_cast<size_t>(G), 1.0);
    straggler.back() = 0.25;
    m.push_back({"straggler 0.25", straggler});
    return m;
}

int run_mixed(int argc, char ** argv) {
    std::string trace_dir;
    rp::bench::EmulatedWorkload w;
    int64_t devices = 0;
    int steps = 4, warmup = 5, micro = 0;
    std::string modes = "sync,async";
    rp::cli::Options opt("rp-bench mixed",
                         "usage: rp-bench mixed --model FILE.gguf [options]\n"
                         "  RoundPipe step time on mixed-speed devices: round-robin vs dispatch by readiness vs the ideal (LoRA)");
    w.declare(opt);
    opt.integer("--steps", steps, 1, 1 << 20, "steps timed (the steady state: one more runs after them, untimed)");
    opt.integer("--warmup", warmup, 0, 1 << 20, "steps before the timed ones (the measured speeds settle)");
    opt.integer("--micro-batches", micro, 0, 1 << 20, "micro-batches per step (default 0: 2 x devices)");
    opt.integer("--devices", devices, 0, 64, "one device count (default 0: 4 and 8)");
    opt.text("--trace-dir", trace_dir, "write each run's trace here", "DIR");
    opt.choice("--steps-mode", modes, {"sync", "async", "sync,async"}, "which optimizer steps to run (default both)", "MODE");
    if (!opt.parse(argc, argv)) return 0;
    w.require_model("mixed");
    const std::string & path = w.path;
    const int64_t T = w.T, B = w.B;
    const double gpu_tokens = w.gpu_tokens;

    rp::bench::MeasuredLora lora = rp::bench::measured_lora(path, w.rank, T, B);
    rp::TrainingProgram & real = lora.program();
    const rp::MicroBatchInfo & mb = lora.mb;
    const Measured & ms = lora.ms;
    const rp::bench::BlockTotals blocks = rp::bench::block_totals(real, ms);
    const rp::LinkModel link = rp::bench::pcie_4090_link(blocks.weight_bytes, blocks.forward_s, gpu_tokens);
    TimedProgram timed(real, ms.fwd, ms.bwd, ms.head);
    std::printf("model %s: %d layers; micro-batch %lld x %lld tokens; link %s; %d warm-up + %d timed steps\n\n", path.c_str(),
                real.num_layers(), static_cast<long long>(B), static_cast<long long>(T), link.to_string().c_str(), warmup, steps);
    // /same: the step against the round-robin step of the 1:1 mix (identical devices: the schedule's own fill,
    // drain and transfers) scaled to the mix's summed speed.
    std::printf("%-5s %-3s %-15s %-19s %10s %10s %9s %8s %8s  %s\n", "steps", "G", "mix", "dispatch", "step ms", "ideal ms", "/ideal", "/same",
                "vs rr", "jobs per device; speeds seen");

    const std::vector<int> counts = devices > 0 ? std::vector<int>{static_cast<int>(devices)} : std::vector<int>{4, 8};
    for (const bool async : {false, true}) {
    if (modes == (async ? "sync" : "async")) continue;
    for (int G : counts) {
        const int M = micro > 0 ? micro : 2 * G;
        const std::vector<int32_t> ids(static_cast<size_t>(T * B), 1);
        const std::vector<rp::MicroBatch> mbs = rp::bench::same_micro_batches(M, ids, mb);
        double uniform_ms = 0;  // the 1:1 mix's round-robin step (the first run)
        for (const Mix & mix : mixes(G)) {
            double rr_ms = 0, rr_work_ms = 0;
            struct Mode {
                const char * name;
                rp::DispatchKind kind;
                bool given;
            };
            for (const Mode & mode : {Mode{"round-robin", rp::DispatchKind::RoundRobin, true}, Mode{"ready (given)", rp::DispatchKind::Ready, true},
                                      Mode{"ready (measured)", rp::DispatchKind::Ready, false}}) {
                rp::TraceRecorder rec(/*keep_absolute_time=*/true);  // on rp::clock_us(), as the call starts below
                const rp::bench::BenchDevices devs = rp::bench::make_devices(G, link, rec.hook(), mix.speeds);
                for (int d = 0; d < G; ++d) rec.name_device(d, "device " + std::to_string(d));  // idle ones too
                rp::PipelineOptions po;
                po.layer_tf = ms.fwd;
                po.layer_tb = ms.bwd;
                po.dispatch = mode.kind;
                po.async = async;
                if (mode.given) po.device_speed = mix.speeds;
                // The steady state: the window from the start of the first timed call to the start of the call
                // after the last timed one, with no synchronize inside. A run of many steps pays the fill of its
                // first step and the drain of its last once; a window bounded by synchronize would charge them to
                // every `steps` steps (async steps overlap their neighbours, so that is most of their bubble).
                double c0 = 0, c1 = 0;
                std::vector<int64_t> jobs_before, jobs;
                std::vector<double> speeds;
                {
                    rp::Pipeline pipe(timed, devs.ptrs, po);
                    for (int s = 0; s <= warmup + steps; ++s) {
                        if (s == warmup) {
                            rec.clear();  // what ran before is outside the window (a launch that straddles it is clipped)
                            c0 = rp::clock_us();
                            jobs_before = pipe.jobs_per_device();
                        }
                        if (s == warmup + steps) {
                            c1 = rp::clock_us();
                            jobs = pipe.jobs_per_device();
                        }
                        pipe.forward_backward(mbs);
                        pipe.step({});
                    }
                    pipe.synchronize();
                    speeds = pipe.device_speeds();
                }
                rp::Trace trace = rec.snapshot();
                // The ideal: every compute launch in the window at speed 1 (its duration in the window x its
                // device's speed), spread over the summed speed.
                double work_ms = 0;
                for (const rp::TraceEvent & e : trace.events)
                    if (e.tid == static_cast<int>(rp::StreamKind::Compute))
                        work_ms += std::max(0.0, std::min(e.end_us(), c1) - std::max(e.ts_us, c0)) / 1e3 *
                                   mix.speeds[static_cast<size_t>(e.pid)];
                const double speed_sum = std::accumulate(mix.speeds.begin(), mix.speeds.end(), 0.0);
                if (mode.kind == rp::DispatchKind::RoundRobin) rr_work_ms = work_ms;
                const double step_ms = (c1 - c0) / 1e3 / steps, ideal_ms = rr_work_ms / steps / speed_sum;
                if (mode.kind == rp::DispatchKind::RoundRobin) rr_ms = step_ms;
                if (uniform_ms == 0) uniform_ms = step_ms;
                const double same_ms = uniform_ms * G / speed_sum;
                if (!trace_dir.empty()) {
                    std::string tag = std::string(async ? "async-" : "sync-") + mix.name + "-" + mode.name;
                    for (char & c : tag)
                        if (c == ' ' || c == '(' || c == ')' || c == ':') c = '_';
                    // The window's launches, from 0 (one that began before it is left out of the picture).
                    std::erase_if(trace.events, [&](const rp::TraceEvent & e) { return e.ts_us < c0; });
                    for (rp::TraceEvent & e : trace.events) e.ts_us -= c0;
                    rp::write_chrome_trace(trace_dir + "/mixed-G" + std::to_string(G) + "-" + tag + ".json", trace);
                }
                std::string per;
                for (size_t d = 0; d < jobs.size(); ++d) {
                    char b[48];
                    std::snprintf(b, sizeof b, "%s%lld", d ? "," : "", static_cast<long long>(jobs[d] - jobs_before[d]));
                    per += b;
                }
                per += ";";
                for (double v : speeds) {
                    char b[16];
                    std::snprintf(b, sizeof b, " %.2f", v);
                    per += b;
                }
                std::printf("%-5s %-3d %-15s %-19s %10.1f %10.1f %8.2fx %7.2fx %7.2fx  %s\n", async ? "async" : "sync", G, mix.name.c_str(),
                            mode.name, step_ms, ideal_ms, step_ms / ideal_ms, step_ms / same_ms, rr_ms / step_ms, per.c_str());
                std::fflush(stdout);
            }
        }
    }
    }
    return 0;
}

} // namespace

RP_BENCH_FAMILY(mixed, "RoundPipe on mixed-speed devices: round-robin vs dispatch by readiness vs the ideal (emulated compute)",
                run_mixed);
