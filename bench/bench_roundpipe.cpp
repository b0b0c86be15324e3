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

#include "ggml_rp/roundpipe/pipeline.h"
#include "ggml_rp/roundpipe/trace.h"
#include "ggml_rp/runtime/cpu_device.h"
#include "models/finetune.h"
#include "models/model.h"
#include "models/training_program.h"

#include <cstdio>
#include <memory>
#include <random>
#include <thread>

namespace {

using rp::bench::now_s;

// A program with the tensors of `real` whose compute sleeps for measured per-layer times.
class TimedProgram final : public rp::TrainingProgram {
public:
    TimedProgram(rp::TrainingProgram & real, std::vector<double> fwd_s, std::vector<double> bwd_s, double head_s)
        : real_(real), fwd_(std::move(fwd_s)), bwd_(std::move(bwd_s)), head_(head_s) {}
    int num_layers() const override { return real_.num_layers(); }
    const std::vector<TensorInfo> & layer_tensors(int l) const override { return real_.layer_tensors(l); }
    const std::vector<ParamInfo> & params() const override { return real_.params(); }
    std::string layer_name(int l) const override { return real_.layer_name(l); }
    size_t hidden_bytes(const rp::MicroBatchInfo & mb) const override { return real_.hidden_bytes(mb); }
    void forward(int l, const rp::LayerMemory &, const void *, void *, const rp::MicroBatchInfo &, rp::ProgramContext &) override {
        sleep(fwd_[static_cast<size_t>(l)]);
    }
    void head(const rp::LayerMemory &, const void *, const int32_t *, float * loss, void *, const rp::MicroBatchInfo &,
              rp::ProgramContext &) override {
        *loss = 0;
        sleep(head_);
    }
    void backward(int l, const rp::LayerMemory &, const void *, const void *, void *, const rp::MicroBatchInfo &,
                  rp::ProgramContext &) override {
        sleep(bwd_[static_cast<size_t>(l)]);
    }

    size_t program_footprint(rp::ProgramKind, int, const rp::MicroBatchInfo &, const rp::GraphRunner &) override {
        return 0;  // its programs sleep: no graph memory
    }

private:
    static void sleep(double s) {  // sleep_for overshoots by ~50-100 us; spin the last 200 us
        const double end = now_s() + s;
        if (s > 300e-6) std::this_thread::sleep_for(std::chrono::duration<double>(s - 200e-6));
        while (now_s() < end) {}
    }
    rp::TrainingProgram & real_;
    std::vector<double> fwd_, bwd_;
    double head_;
};

struct Measured {
    std::vector<double> fwd, bwd;  // per layer (bwd = recompute + backward)
    double head = 0;
};

// Median of 3 runs of every layer's programs on host memory, one thread.
Measured measure(rp::TrainingProgram & p, const rp::MicroBatchInfo & mb, uint32_t vocab) {
    const int L = p.num_layers();
    std::mt19937 rng(1);
    std::vector<int32_t> ids(static_cast<size_t>(mb.tokens())), labels(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<int32_t>(rng() % vocab);
        labels[i] = static_cast<int32_t>(rng() % vocab);
    }
    const size_t H = p.hidden_bytes(mb) / sizeof(float);
    std::vector<float> x(H, 0.1f), y(H), d(H, 1e-3f), din(H);
    std::vector<std::vector<float>> grads;
    auto memory = [&](int l) {
        rp::LayerMemory m;
        for (const auto & ti : p.layer_tensors(l)) {
            if (ti.param >= 0) {
                m.data.push_back(p.params()[static_cast<size_t>(ti.param)].master);
                grads.emplace_back(ti.bytes / sizeof(float));
                m.grad.push_back(grads.back().data());
            } else {
                m.data.push_back(const_cast<void *>(ti.host));
                m.grad.push_back(nullptr);
            }
        }
        return m;
    };
    rp::ProgramContext pc;
    Measured r;
    for (int l = 0; l < L; ++l) {
        const rp::LayerMemory m = memory(l);
        const void * in = l == 0 ? static_cast<const void *>(ids.data()) : x.data();
        if (l == L - 1) {
            float loss = 0;
            r.head = rp::bench::time_it([&] { p.head(m, in, labels.data(), &loss, din.data(), mb, pc); }, 3).median_s;
            r.fwd.push_back(r.head / 3);
            r.bwd.push_back(r.head);
        } else {
            r.fwd.push_back(rp::bench::time_it([&] { p.forward(l, m, in, y.data(), mb, pc); }, 3).median_s);
            r.bwd.push_back(rp::bench::time_it([&] { p.backward(l, m, in, d.data(), l == 0 ? nullptr : din.data(), mb, pc); }, 3).median_s);
        }
    }
    return r;
}

int run_roundpipe(int argc, char ** argv) {
    rp::bench::Options opt(argc, argv);
    if (opt.help()) {
        std::printf("rp-bench roundpipe --model FILE.gguf [--seq-len 64] [--seqs 2] [--steps 3] [--rank 8] [--gpu-tokens 8192]\n"
                    "                   [--trace-dir DIR]\n"
                    "  bubble ratio / exposed communication / throughput of roundpipe vs gpipe vs 1f1b (LoRA)\n");
        return 0;
    }
    const std::string path = opt.get_string("--model", "");
    const int64_t T = opt.get_int("--seq-len", 64), B = opt.get_int("--seqs", 2);
    const double gpu_tokens = opt.get_double("--gpu-tokens", 8192);
    const int steps = static_cast<int>(opt.get_int("--steps", 3));
    const int64_t rank = opt.get_int("--rank", 8);
    const std::string trace_dir = opt.get_string("--trace-dir", "");
    opt.finish();
    if (path.empty()) throw rp::Error("roundpipe: --model FILE.gguf is required");

    auto model = rp::Model::load(path);
    rp::FinetuneConfig cfg;
    cfg.lora_rank = rank;
    rp::Trainer tr(*model, cfg);
    rp::ModelProgram real(tr);
    rp::MicroBatchInfo mb;
    mb.seq_len = T;
    mb.n_seq = B;
    mb.loss_scale = 1.0f / static_cast<float>(T * B);
    const Measured ms = measure(real, mb, model->hparams().n_vocab);

    size_t wbytes = 0;
    double tfwd = 0;
    for (int l = 1; l + 1 < real.num_layers(); ++l) {
        for (const auto & ti : real.layer_tensors(l)) wbytes += ti.bytes;
        tfwd += ms.fwd[static_cast<size_t>(l)];
    }
    const double ratio = 165e12 / (32e9 * gpu_tokens);  // upload / forward on a 4090 over PCIe 4.0
    rp::LinkModel link;
    link.bytes_per_s = static_cast<double>(wbytes) / (tfwd * ratio);
    link.latency_s = 10e-6;
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
            std::vector<std::unique_ptr<rp::CpuDevice>> devs;
            std::vector<rp::Device *> ptrs;
            for (int i = 0; i < G; ++i) {
                rp::CpuDeviceOptions o;
                o.memory_bytes = size_t(1) << 30;
                o.link = link;
                o.hook = rec.hook();
                devs.push_back(std::make_unique<rp::CpuDevice>(i, o));
                ptrs.push_back(devs.back().get());
            }
            rp::PipelineOptions po;
            po.schedule = c.kind;
            po.async = c.async;
            po.layer_tf = ms.fwd;
            po.layer_tb = ms.bwd;
            std::vector<int32_t> ids(static_cast<size_t>(T * B), 1);
            std::vector<rp::MicroBatch> mbs(static_cast<size_t>(M));
            for (int i = 0; i < M; ++i) {
                mbs[static_cast<size_t>(i)].ids = ids.data();
                mbs[static_cast<size_t>(i)].labels = ids.data();
                mbs[static_cast<size_t>(i)].info = mb;
            }
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
