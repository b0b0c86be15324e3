// rp-bench dp: data-parallel scaling on the real runtime, under mpirun (mpirun -np R rp-bench dp ...): each
// rank runs RoundPipe on --gpus CPU virtual devices with emulated compute (bench/timed_program.h: the layers'
// measured times, so R ranks x G devices on a 2-core machine do not compete for cores), the host links of its
// devices modelled like PCIe 4.0 on an RTX 4090 (as rp-bench roundpipe), and its gradients all-reduced over
// MPI for real, bucket by bucket as the hand-off completes each layer, on an emulated inter-node link
// (--link, e.g. 25Gbit/s,10us). Weak scaling: every rank trains its own --micro-batches per step, so the
// ideal is the R = 1 step time; efficiency = step time at R = 1 / step time at R (bench/mpi/scaling.sh runs
// R = 1, 2, 4 and prints the table).
//
// Printed by rank 0 (one line, for the script): R, step time, tokens/s per rank, all-reduce bytes per step,
// and the exposed all-reduce time per step (from each rank's trace: all-reduce time during which none of the
// rank's devices computed).
#include "bench/bench.h"
#include "bench/timed_program.h"

#include "ggml_rp/dist/mpi_world.h"
#include "ggml_rp/roundpipe/pipeline.h"
#include "ggml_rp/roundpipe/trace.h"
#include "ggml_rp/runtime/clock.h"
#include "ggml_rp/runtime/cpu_device.h"
#include "models/train/data_parallel.h"
#include "models/train/trainer.h"
#include "models/arch/model.h"
#include "models/train/trainer.h"

#include <cstdio>
#include <cstring>
#include <memory>

namespace {

using rp::bench::now_s;

int run_dp(int argc, char ** argv) {
    std::string link_text = "25Gbit/s,10us";
    bool full = false;
    rp::bench::EmulatedWorkload w;
    int G = 2, M = 4, steps = 4;
    rp::cli::Options opt("rp-bench dp",
                         "usage: mpirun -np R rp-bench dp --model FILE.gguf [options]\n"
                         "  data-parallel scaling: step time, tokens/s per rank, exposed all-reduce (emulated compute)");
    w.declare(opt);
    opt.flag("--full", full, "full finetune (default: LoRA)");
    opt.integer("--gpus", G, 1, 4096, "devices per rank");
    opt.integer("--micro-batches", M, 1, 1 << 20, "micro-batches per step");
    opt.integer("--steps", steps, 1, 1 << 20, "steps timed");
    opt.text("--link", link_text, "the emulated inter-node link", "L");
    if (!opt.parse(argc, argv)) return 0;
    w.require_model("dp");
    const int64_t T = w.T, B = w.B;
    const double gpu_tokens = w.gpu_tokens;

    rp::CommOptions co;
    co.timeout_s = 600;  // rank 0 measures the layers while the others wait
    auto world = rp::MpiWorld::init(nullptr, nullptr, co);
    const int R = world->size(), me = world->rank();

    auto model = rp::Model::load(w.path);
    rp::FinetuneConfig cfg;
    cfg.full = full;
    cfg.lora_rank = w.rank;
    rp::Trainer tr(*model, cfg);
    rp::TrainingProgram & real = tr;
    const rp::MicroBatchInfo mb = rp::bench::micro_batch(T, B);

    // Rank 0 measures (alone: the others wait), every rank emulates those times.
    const int L = real.num_layers();
    std::vector<uint64_t> times(static_cast<size_t>(2 * L + 1), 0);
    if (me == 0) {
        const rp::bench::Measured ms = rp::bench::measure(real, mb, model->hparams().n_vocab);
        for (int l = 0; l < L; ++l) {
            std::memcpy(&times[static_cast<size_t>(l)], &ms.fwd[static_cast<size_t>(l)], 8);
            std::memcpy(&times[static_cast<size_t>(L + l)], &ms.bwd[static_cast<size_t>(l)], 8);
        }
        std::memcpy(&times.back(), &ms.head, 8);
    }
    const std::vector<uint64_t> all = world->allgather(times, "layer times");
    rp::bench::Measured ms;
    ms.fwd.resize(static_cast<size_t>(L));
    ms.bwd.resize(static_cast<size_t>(L));
    for (int l = 0; l < L; ++l) {
        std::memcpy(&ms.fwd[static_cast<size_t>(l)], &all[static_cast<size_t>(l)], 8);
        std::memcpy(&ms.bwd[static_cast<size_t>(l)], &all[static_cast<size_t>(L + l)], 8);
    }
    std::memcpy(&ms.head, &all[static_cast<size_t>(2 * L)], 8);

    const auto [wbytes, tfwd] = rp::bench::block_totals(real, ms);
    size_t gbytes = 0;
    for (const auto & p : tr.params()) gbytes += static_cast<size_t>(p.t->nelements()) * sizeof(float);
    const rp::LinkModel pcie = rp::bench::pcie_4090_link(wbytes, tfwd, gpu_tokens);  // as rp-bench roundpipe

    rp::TraceRecorder rec(true);
    co.link = rp::LinkModel::parse(link_text);
    if (R == 1) co.link.reset();
    co.trace = rec.hook();
    co.trace_device = G;
    co.timeout_s = 120;
    world->set_options(co);
    auto grad_comm = world->duplicate();
    rp::GradientReducer reducer(*grad_comm, tr);

    rp::bench::TimedProgram timed(real, ms.fwd, ms.bwd, ms.head);
    const rp::bench::BenchDevices devs = rp::bench::make_devices(G, pcie, rec.hook());
    rp::PipelineOptions po;
    po.layer_tf = ms.fwd;
    po.layer_tb = ms.bwd;
    if (R > 1)
        po.grads_complete = [&reducer](int, const std::vector<int> & params) {
            for (int p : params) reducer.add(p);
        };
    const std::vector<int32_t> ids(static_cast<size_t>(T * B), 1);
    const std::vector<rp::MicroBatch> mbs = rp::bench::same_micro_batches(M, ids, mb);
    double t0 = 0, t1 = 0, trace_from = 0;
    {
        rp::Pipeline pipe(timed, devs.ptrs, po);
        for (int s = 0; s <= steps; ++s) {  // step 0 warms up (the planner's first timing sample)
            if (s == 1) {
                pipe.synchronize();
                const uint64_t z = 0;
                world->allgather(std::span<const uint64_t>(&z, 1), "start");
                t0 = now_s();
                trace_from = rp::clock_us();
            }
            pipe.forward_backward(mbs);
            pipe.step({});
        }
        pipe.synchronize();
        t1 = now_s();
    }
    rp::Trace trace = rec.snapshot();
    std::erase_if(trace.events, [&](const rp::TraceEvent & e) { return e.ts_us < trace_from; });
    const rp::TraceStats st = rp::analyse_trace(trace);
    // Every rank's numbers to rank 0: step time and exposed all-reduce, the slowest rank's.
    double mine[2] = {(t1 - t0) / steps, st.exposed_allreduce_us * 1e-6 / steps};
    uint64_t bits[2];
    std::memcpy(bits, mine, sizeof bits);
    const std::vector<uint64_t> got = world->allgather(bits, "results");
    double step_s = 0, exposed_s = 0;
    for (int r = 0; r < R; ++r) {
        double v[2];
        std::memcpy(v, &got[static_cast<size_t>(2 * r)], sizeof v);
        step_s = std::max(step_s, v[0]);
        exposed_s = std::max(exposed_s, v[1]);
    }
    if (me == 0) {
        const double tokens = static_cast<double>(M) * static_cast<double>(T * B);
        std::printf("dp R=%d %s G=%d M=%d link=%s grads=%.2fMiB step=%.2fms tokens/s/rank=%.0f exposed_allreduce=%.2fms\n", R,
                    full ? "full" : "lora", G, M, R > 1 ? co.link->to_string().c_str() : "none", static_cast<double>(gbytes) / 1048576.0,
                    1e3 * step_s, tokens / step_s, 1e3 * exposed_s);
    }
    grad_comm.reset();
    world.reset();
    rp::MpiWorld::finalize();
    return 0;
}

} // namespace

RP_BENCH_FAMILY(dp, "data-parallel scaling under mpirun (emulated compute, emulated inter-node link)", run_dp);
