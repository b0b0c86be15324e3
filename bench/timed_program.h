// Emulated compute for the runtime benchmarks (rp-bench roundpipe, rp-bench dp): each layer's real programs
// are timed once, then a TimedProgram with the same tensors sleeps for exactly those times, so that many
// virtual devices (or ranks) on a 2-core machine do not compete for the cores and the schedule, not CPU
// contention, decides the numbers.
#pragma once

#include "bench/bench.h"
#include "ggml_rp/roundpipe/call_state.h"
#include "ggml_rp/roundpipe/program.h"
#include "ggml_rp/runtime/cpu_device.h"
#include "ggml_rp/runtime/link_model.h"
#include "models/arch/model.h"
#include "models/train/trainer.h"
#include "tools/options.h"

#include <memory>

#include <chrono>
#include <random>
#include <thread>
#include <vector>

namespace rp::bench {

// A program with the tensors of `real` whose compute sleeps for measured per-layer times.
class TimedProgram final : public rp::TrainingProgram {
public:
    TimedProgram(rp::TrainingProgram & real, std::vector<double> fwd_s, std::vector<double> bwd_s, double head_s)
        : real_(real), fwd_(std::move(fwd_s)), bwd_(std::move(bwd_s)), head_(head_s) {}
    int num_layers() const override { return real_.num_layers(); }
    const std::vector<TensorInfo> & layer_tensors(int l) const override { return real_.layer_tensors(l); }
    const std::vector<ParamInfo> & param_infos() const override { return real_.param_infos(); }
    std::string layer_name(int l) const override { return real_.layer_name(l); }
    size_t hidden_bytes(const rp::MicroBatchInfo & mb) const override { return real_.hidden_bytes(mb); }
    size_t boundary_bytes(const rp::MicroBatchInfo & mb) const override { return real_.boundary_bytes(mb); }
    void forward(int l, const rp::LayerMemory &, const void *, void *, const rp::MicroBatchInfo &, rp::ProgramContext &) override {
        sleep(fwd_[static_cast<size_t>(l)]);
    }
    void head(const rp::LayerMemory &, const void *, const int32_t *, float * loss, void *, const rp::MicroBatchInfo &,
              rp::ProgramContext &) override {
        *loss = 0;
        sleep(head_);
    }
    void head_forward(const rp::LayerMemory &, const void *, const int32_t *, float * results, const rp::MicroBatchInfo &,
                      rp::ProgramContext &) override {
        *results = 0;
        sleep(head_ / 3);
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
inline Measured measure(rp::TrainingProgram & p, const rp::MicroBatchInfo & mb, uint32_t vocab) {
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
                m.data.push_back(p.param_infos()[static_cast<size_t>(ti.param)].master);
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
            r.head = time_it([&] { p.head(m, in, labels.data(), &loss, din.data(), mb, pc); }, 3).median_s;
            r.fwd.push_back(r.head / 3);
            r.bwd.push_back(r.head);
        } else {
            r.fwd.push_back(time_it([&] { p.forward(l, m, in, y.data(), mb, pc); }, 3).median_s);
            r.bwd.push_back(time_it([&] { p.backward(l, m, in, d.data(), l == 0 ? nullptr : din.data(), mb, pc); }, 3).median_s);
        }
    }
    return r;
}


// G CPU virtual devices of 1 GiB each on `link`, recorded by `hook`.
struct BenchDevices {
    std::vector<std::unique_ptr<rp::CpuDevice>> owned;
    std::vector<rp::Device *> ptrs;
};
// speeds: each device's compute speed (cpu_device.h); empty: all 1.
inline BenchDevices make_devices(int G, const rp::LinkModel & link, const rp::OpHook & hook, const std::vector<double> & speeds = {}) {
    BenchDevices d;
    for (int i = 0; i < G; ++i) {
        rp::CpuDeviceOptions o;
        o.memory_bytes = size_t(1) << 30;
        o.link = link;
        o.hook = hook;
        if (!speeds.empty()) o.speed = speeds.at(static_cast<size_t>(i));
        d.owned.push_back(std::make_unique<rp::CpuDevice>(i, o));
        d.ptrs.push_back(d.owned.back().get());
    }
    return d;
}

// The host link of an RTX 4090 on PCIe 4.0 x16 (32 GB/s, 165 TFLOP/s fp16) relative to the measured compute:
// uploading the block weights (wbytes) costs, against their forward (block_fwd_s), what it costs there for a
// micro-batch of gpu_tokens tokens: upload / forward = 165e12 / (32e9 x gpu_tokens) (roundpipe.md §8, §13.1).
inline double pcie_4090_ratio(double gpu_tokens) { return 165e12 / (32e9 * gpu_tokens); }
inline rp::LinkModel pcie_4090_link(size_t wbytes, double block_fwd_s, double gpu_tokens) {
    rp::LinkModel link;
    link.bytes_per_s = static_cast<double>(wbytes) / (block_fwd_s * pcie_4090_ratio(gpu_tokens));
    link.latency_s = 10e-6;
    return link;
}

// One micro-batch of B sequences of T tokens, its loss the mean over them.
inline rp::MicroBatchInfo micro_batch(int64_t T, int64_t B) {
    rp::MicroBatchInfo mb;
    mb.seq_len = T;
    mb.n_seq = B;
    mb.loss_scale = 1.0f / static_cast<float>(T * B);
    return mb;
}

// The block layers (every layer but the first and the last): their weight bytes and measured forward time,
// what pcie_4090_link scales the link by.
struct BlockTotals {
    size_t weight_bytes = 0;
    double forward_s = 0;
};
inline BlockTotals block_totals(const rp::TrainingProgram & p, const Measured & ms) {
    BlockTotals t;
    for (int l = 1; l + 1 < p.num_layers(); ++l) {
        for (const auto & ti : p.layer_tensors(l)) t.weight_bytes += ti.bytes;
        t.forward_s += ms.fwd[static_cast<size_t>(l)];
    }
    return t;
}

// What the emulated-compute benches (rp-bench roundpipe, mixed, dp) train: the model, the micro-batch shape, the
// LoRA rank and the emulated GPU's speed, their flags declared once.
struct EmulatedWorkload {
    std::string path;
    int64_t T = 64, B = 2, rank = 8;
    double gpu_tokens = 8192;
    void declare(rp::cli::Options & opt) {
        opt.text("--model", path, "the model (required)");
        opt.integer("--seq-len", T, 1, 1 << 24, "tokens per sequence");
        opt.integer("--seqs", B, 1, 1 << 20, "sequences per micro-batch");
        opt.integer("--rank", rank, 1, 1 << 20, "LoRA rank");
        opt.number("--gpu-tokens", gpu_tokens, 1, 1e12, "tokens/s of the emulated GPU (scales the measured compute and the link)", "X");
    }
    // rp::Error naming the bench family when no --model was given.
    void require_model(const std::string & family) const {
        if (path.empty()) throw rp::Error(family + ": --model FILE.gguf is required");
    }
};

// A LoRA trainer of rank `rank` on the model at `path`, its layers' programs measured on micro-batches of
// B sequences of T tokens (what rp-bench roundpipe and mixed emulate).
struct MeasuredLora {
    std::unique_ptr<rp::Model> model;
    std::unique_ptr<rp::Trainer> trainer;
    rp::MicroBatchInfo mb;
    Measured ms;
    rp::TrainingProgram & program() { return *trainer; }
};
inline MeasuredLora measured_lora(const std::string & path, int64_t rank, int64_t T, int64_t B) {
    MeasuredLora m;
    m.model = rp::Model::load(path);
    rp::FinetuneConfig cfg;
    cfg.lora_rank = rank;
    m.trainer = std::make_unique<rp::Trainer>(*m.model, cfg);
    m.mb = micro_batch(T, B);
    m.ms = measure(*m.trainer, m.mb, m.model->hparams().n_vocab);
    return m;
}

// M micro-batches of the same token ids (the emulated programs never read them).
inline std::vector<rp::MicroBatch> same_micro_batches(int M, const std::vector<int32_t> & ids, const rp::MicroBatchInfo & mb) {
    std::vector<rp::MicroBatch> mbs(static_cast<size_t>(M));
    for (rp::MicroBatch & m : mbs) {
        m.ids = ids.data();
        m.labels = ids.data();
        m.info = mb;
    }
    return mbs;
}

} // namespace rp::bench
