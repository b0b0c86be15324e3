// rp-bench roundpipe: bubble ratio, exposed communication and throughput of RoundPipe (async and sync) against
// the GPipe and 1F1B baselines, for G = 2, 4, 8 devices, on the real runtime (dispatcher, transfer engine,
// events, optimizer thread), side by side in one run.
//
// Why compute is emulated: eight virtual devices on a 2-core machine would compete for the cores and stretch
// every kernel, so the bubble of the schedule could not be told from CPU contention. The benchmark therefore
// measures each layer's real forward, recompute+backward and head programs once (one thread), then runs the
// pipeline with a TimedProgram whose programs sleep for exactly those times (the data are not computed; the
// tests check the numbers). The host<->device link is modelled so that uploading a layer's weights costs,
// relative to its forward, what it costs on an RTX 4090 over PCIe 4.0 x16 (32 GB/s, 165 TFLOP/s fp16) for a
// micro-batch of --gpu-tokens tokens (default 8192, the paper's 4 x 2048): upload / forward = 165e12 /
// (32e9 x tokens) = 0.63 (roundpipe.md §8, §13.1).
#include "bench/bench.h"
#include "bench/timed_program.h"

#include "ggml_rp/roundpipe/pipeline.h"
#include "ggml_rp/roundpipe/trace.h"
#include "ggml_rp/runtime/cpu_device.h"
#include "models/train/trainer.h"
#include "models/arch/model.h"
#include "models/train/trainer.h"

#include <cstdio>
#include <memory>
#include <random>
#include <thread>

namespace {

using rp::bench::now_s;
using rp::bench::Measured;
using rp::bench::TimedProgram;

int run_roundpipe(int argc, char ** argv) {
    std::string trace_dir;
    rp::bench::EmulatedWorkload w;
    int steps = 3;
    rp::cli::Options opt("rp-bench roundpipe",
                         "usage: rp-bench roundpipe --model FILE.gguf [options]\n"
                         "  bubble ratio / exposed communication / throughput of roundpipe vs gpipe vs 1f1b (LoRA)");
    w.declare(opt);
    opt.integer("--steps", steps, 1, 1 << 20, "steps timed");
    opt.text("--trace-dir", trace_dir, "write each schedule's trace here", "DIR");
    if (!opt.parse(argc, argv)) return 0;
    w.require_model("roundpipe");
    const std::string & path = w.path;
    const int64_t T = w.T, B = w.B;
    const double gpu_tokens = w.gpu_tokens;

    rp::bench::MeasuredLora lora = rp::bench::measured_lora(path, w.rank, T, B);
    rp::TrainingProgram & real = lora.program();
    const rp::MicroBatchInfo & mb = lora.mb;
    const Measured & ms = lora.ms;
    const auto [wbytes, tfwd] = rp::bench::block_totals(real, ms);
    const double ratio = rp::bench::pcie_4090_ratio(gpu_tokens);
    const rp::LinkModel link = rp::bench::pcie_4090_link(wbytes, tfwd, gpu_tokens);
    std::printf("model %s: %d layers, %.1f MiB of block weights; micro-batch %lld x %lld tokens\n", path.c_str(),
                real.num_layers(), static_cast<double>(wbytes) / 1048576.0, static_cast<long long>(B), static_cast<long long>(T));
    std::printf("measured per micro-batch: block forward %.2f ms, recompute+backward %.2f ms (mean); head fwd+bwd %.2f ms\n",
                1e3 * tfwd / (real.num_layers() - 2), 1e3 * [&] {
                    double s = 0;
                    for (int l = 1; l + 1 < real.num_layers(); ++l) s += ms.bwd[static_cast<size_t>(l)];
                    return s / (real.num_layers() - 2);
                }(), 1e3 * ms.head);
    std::printf("link modelled at %s (upload/forward of a layer = %.2f, as a 4090 on PCIe 4.0 with %.0f-token micro-batches)\n\n",
                link.to_string().c_str(), ratio, gpu_tokens);

    TimedProgram timed(real, ms.fwd, ms.bwd, ms.head);
    std::printf("%-3s %-16s %4s %7s %9s %12s %10s %12s\n", "G", "schedule", "M", "stages", "bubble %", "exposed comm %",
                "tokens/s", "vs gpipe");
    for (int G : {2, 4, 8}) {
        const int M = 2 * G;
        double gpipe_tps = 0;
        struct Cfg {
            const char * name;
            rp::ScheduleKind kind;
            bool async;
        };
        for (const Cfg & c : {Cfg{"gpipe", rp::ScheduleKind::GPipe, false}, Cfg{"1f1b", rp::ScheduleKind::OneFOneB, false},
                              Cfg{"roundpipe-sync", rp::ScheduleKind::RoundPipe, false},
                              Cfg{"roundpipe-async", rp::ScheduleKind::RoundPipe, true}}) {
            rp::TraceRecorder rec;
            const rp::bench::BenchDevices devs = rp::bench::make_devices(G, link, rec.hook());
            const std::vector<rp::Device *> & ptrs = devs.ptrs;
            rp::PipelineOptions po;
            po.schedule = c.kind;
            po.async = c.async;
            po.layer_tf = ms.fwd;
            po.layer_tb = ms.bwd;
            const std::vector<int32_t> ids(static_cast<size_t>(T * B), 1);
            const std::vector<rp::MicroBatch> mbs = rp::bench::same_micro_batches(M, ids, mb);
            rp::Plan plan;
            double t0 = 0, t1 = 0;
            {
                rp::Pipeline pipe(timed, ptrs, po);
                t0 = now_s();
                for (int s = 0; s < steps; ++s) {
                    pipe.forward_backward(mbs);
                    pipe.step({});
                }
                pipe.synchronize();
                t1 = now_s();
                plan = pipe.last_plan();
            }
            const rp::Trace trace = rec.snapshot();
            if (!trace_dir.empty())
                rp::write_chrome_trace(trace_dir + "/" + c.name + "-G" + std::to_string(G) + ".json", trace);
            const rp::TraceStats st = rp::analyse_trace(trace);
            const double tps = static_cast<double>(steps * M * T * B) / (t1 - t0);
            if (c.kind == rp::ScheduleKind::GPipe) gpipe_tps = tps;
            std::printf("%-3d %-16s %4d %7d %9.1f %12.1f %10.0f %11.2fx\n", G, c.name, M, plan.num_stages(), 100 * st.bubble_ratio,
                        100 * st.exposed_comm_fraction, tps, gpipe_tps > 0 ? tps / gpipe_tps : 0.0);
        }
    }
    return 0;
}

} // namespace

RP_BENCH_FAMILY(roundpipe, "RoundPipe vs GPipe vs 1F1B on the real runtime (emulated compute): bubble ratio, throughput",
                run_roundpipe);
