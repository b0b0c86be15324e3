// Shared setup of the RoundPipe runtime tests: a generated llama / qwen3 model, deterministic training data,
// the single-device reference (the Trainer, as rp-finetune runs it) and the pipelined run on CPU virtual
// devices (or any devices a DeviceFactory makes: tests/cuda runs the same workloads on CUDA devices), both
// ending in the bytes of every trainable master.
#pragma once

#include "ggml_rp/optim/clip.h"
#include "ggml_rp/optim/optimizer.h"
#include "ggml_rp/roundpipe/pipeline.h"
#include "ggml_rp/runtime/cpu_device.h"
#include "models/train/trainer.h"
#include "models/arch/model.h"
#include "models/train/trainer.h"
#include "tests/common/shared_paths.h"
#include "tests/common/temp_dir.h"
#include "models/convert/synth_model.h"

#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace rp_pipe_test {

// A 16-layer llama (untied), a 16-layer qwen3 with a tied head, 6-layer qwen3moe and gpt-oss, a 7-layer gemma3 and
// 6-layer qwen35 and qwen35moe, written once per process.
struct Models {
    rp_test::TempDir dir;
    std::unique_ptr<rp::Model> llama, qwen3, moe, gpt_oss, gemma3, qwen35, qwen35moe;
    Models() {
        rp::SynthSpec s;
        s.vocab_from = rp_test::shared_dir() + "/models/stories260K.gguf";
        s.n_embd = 64;
        s.n_head = 4;
        s.n_head_kv = 2;
        s.head_dim = 16;
        s.n_ff = 96;
        s.n_layer = 16;
        s.seed = 7;
        rp::write_synth_model(s, dir.file("llama16.gguf"));
        llama = rp::Model::load(dir.file("llama16.gguf"));
        s.arch = "qwen3";
        s.vocab_from = rp_test::shared_dir() + "/models/synthetic/tiny-random-qwen2.gguf";
        s.tied = true;
        s.n_embd = 32;
        s.head_dim = 8;
        s.n_ff = 48;
        s.seed = 9;
        rp::write_synth_model(s, dir.file("qwen3-16-tied.gguf"));
        qwen3 = rp::Model::load(dir.file("qwen3-16-tied.gguf"));
        // A 6-layer qwen3moe: 8 experts, top 2 (every MoE layer one layer of the plan, its experts with it).
        s.arch = "qwen3moe";
        s.tied = false;
        s.n_layer = 6;
        s.head_dim = 12;
        s.n_expert = 8, s.n_expert_used = 2, s.n_ff_exp = 24;
        s.seed = 13;
        rp::write_synth_model(s, dir.file("qwen3moe-6.gguf"));
        moe = rp::Model::load(dir.file("qwen3moe-6.gguf"));
        // A 6-layer gpt-oss: the same experts, sinks, biases and a window of 5 on the even layers (12 tokens).
        s.arch = "gpt-oss";
        s.n_swa = 5;
        s.seed = 17;
        rp::write_synth_model(s, dir.file("gpt-oss-6.gguf"));
        gpt_oss = rp::Model::load(dir.file("gpt-oss-6.gguf"));
        // A 7-layer gemma3, tied: five windowed layers (5 of 12 tokens), a global one with linear RoPE scaling, and
        // a windowed one again; embedding scale, q/k and post norms, GeGLU.
        rp::SynthSpec g;
        g.arch = "gemma3";
        g.vocab_from = s.vocab_from;
        g.n_embd = 32, g.n_head = 4, g.n_head_kv = 2, g.head_dim = 12, g.n_ff = 48, g.n_layer = 7;
        g.n_swa = 5, g.rope_linear = 4.0f, g.tied = true, g.seed = 19;
        rp::write_synth_model(g, dir.file("gemma3-7.gguf"));
        gemma3 = rp::Model::load(dir.file("gemma3-7.gguf"));
        // A 6-layer qwen35: Gated DeltaNet layers (2 key heads, 4 value heads of 8) with a gated full attention layer
        // every third.
        rp::SynthSpec h;
        h.arch = "qwen35";
        h.vocab_from = s.vocab_from;
        h.n_embd = 32, h.n_head = 4, h.n_head_kv = 2, h.head_dim = 12, h.n_rot = 8, h.n_ff = 48, h.n_layer = 6;
        h.ssm_k_heads = 2, h.ssm_v_heads = 4, h.ssm_head_dim = 8, h.full_attn_interval = 3, h.seed = 23;
        rp::write_synth_model(h, dir.file("qwen35-6.gguf"));
        qwen35 = rp::Model::load(dir.file("qwen35-6.gguf"));
        // And its mixture of experts: 8 experts, top 2, with the shared expert.
        h.arch = "qwen35moe";
        h.n_expert = 8, h.n_expert_used = 2, h.n_ff_exp = 24, h.seed = 29;
        rp::write_synth_model(h, dir.file("qwen35moe-6.gguf"));
        qwen35moe = rp::Model::load(dir.file("qwen35moe-6.gguf"));
    }
    static Models & get() {
        static Models m;
        return m;
    }
};

// The token ids and labels of one micro-batch of one call of one step (deterministic, some labels masked).
struct MbData {
    std::vector<int32_t> ids, labels;
    int64_t T, B, offset;
};

struct Workload {
    int steps = 2;
    int calls = 2;  // forward_backward calls accumulated per step
    int M = 3;      // micro-batches per call
    // pipelined(): each call preceded by a forward-only call of the same micro-batches (Pipeline::forward), whose
    // loss must be the training call's without LoRA dropout (RunResult::forward_mismatches); the references ignore it.
    bool forward_first = false;
    int64_t T = 12;
    // From step longer_from on, micro-batches of longer_T tokens (0: T throughout): a call whose memory plan
    // needs larger regions than the earlier calls', so the devices carve again.
    int64_t longer_T = 0;
    int longer_from = 0;
    uint32_t vocab = 256;

    // Micro-batch mb of call c of step s; n_seq alternates 1 and 2 so micro-batches differ in size.
    MbData data(int s, int c, int mb) const {
        MbData d;
        d.T = longer_T > 0 && s >= longer_from ? longer_T : T;
        d.B = 1 + (mb % 2);
        d.offset = 0;
        for (int k = 0; k < mb; ++k) d.offset += 1 + (k % 2);
        d.offset += static_cast<int64_t>(c) * 100;
        for (int64_t i = 0; i < d.T * d.B; ++i) {
            const uint32_t h = static_cast<uint32_t>((s * 7919 + c * 104729 + mb * 1299709 + i * 15485863) ^ 0x5bd1e995u);
            d.ids.push_back(static_cast<int32_t>((h >> 3) % vocab));
            d.labels.push_back((h & 7u) == 0 ? -1 : static_cast<int32_t>((h >> 11) % vocab));
        }
        return d;
    }
    float loss_scale(int s) const {
        size_t n = 0;
        for (int c = 0; c < calls; ++c)
            for (int mb = 0; mb < M; ++mb)
                for (int32_t l : data(s, c, mb).labels) n += l >= 0;
        return 1.0f / static_cast<float>(n);
    }
};

// The micro-batch shapes of a workload's first call (what a planner plans for).
inline std::vector<rp::MicroBatchInfo> shapes_of(const Workload & w) {
    std::vector<rp::MicroBatchInfo> out;
    for (int mb = 0; mb < w.M; ++mb) {
        const MbData d = w.data(0, 0, mb);
        rp::MicroBatchInfo i;
        i.seq_len = d.T;
        i.n_seq = d.B;
        out.push_back(i);
    }
    return out;
}

// One optimizer step on the Trainer's params: global-norm clipping then AdamW (what rp-finetune does).
struct Updater {
    rp::Optimizer opt;
    std::vector<size_t> slot;
    explicit Updater(const rp::Trainer & tr) : opt(rp::OptimizerConfig{}) {
        for (const auto & p : tr.params()) slot.push_back(opt.add_param(p.name, static_cast<size_t>(p.t->nelements())));
    }
    // masters[i] may differ from the params' own data (the async reference keeps its own).
    void update(const rp::Trainer & tr, const std::vector<float *> & masters, double lr = 1e-2) {
        std::vector<std::span<float>> g;
        for (const auto & p : tr.params()) g.emplace_back(p.t->grad->data_as<float>(), static_cast<size_t>(p.t->nelements()));
        rp::clip_grad_norm(g, 1.0);
        for (size_t i = 0; i < tr.params().size(); ++i)
            opt.update(slot[i], std::span<float>(masters[i], g[i].size()), g[i], lr);
        opt.end_step();
    }
    void update(const rp::Trainer & tr) {
        std::vector<float *> m;
        for (const auto & p : tr.params()) m.push_back(p.t->data_as<float>());
        update(tr, m);
    }
};

inline std::vector<std::vector<float>> masters_of(const rp::Trainer & tr) {
    std::vector<std::vector<float>> out;
    for (const auto & p : tr.params()) {
        const float * d = p.t->data_as<float>();
        out.emplace_back(d, d + p.t->nelements());
    }
    return out;
}

// Step s's gradient on one device: Trainer::accumulate per micro-batch of every call, in order.
inline void step_gradient(rp::Trainer & tr, const Workload & w, int s) {
    tr.zero_grads();
    const float ls = w.loss_scale(s);
    for (int c = 0; c < w.calls; ++c)
        for (int mb = 0; mb < w.M; ++mb) {
            const MbData d = w.data(s, c, mb);
            tr.accumulate(d.ids.data(), d.labels.data(), d.T, d.B, ls, 1, s, d.offset);
        }
    tr.collect_grads();
}

// The single-device reference: each step's gradient, then one update.
inline std::vector<std::vector<float>> reference(const rp::Model & model, const rp::FinetuneConfig & cfg, const Workload & w) {
    rp::Trainer tr(model, cfg);
    Updater up(tr);
    for (int s = 0; s < w.steps; ++s) {
        step_gradient(tr, w, s);
        up.update(tr);
    }
    return masters_of(tr);
}

// The async reference (roundpipe.md §12.3): iteration k computes its gradient at the weights published by the
// copy-back of step k-1, which are the masters before update k-1: theta_k = theta_{k-1} - U(g(theta_{k-2})).
inline std::vector<std::vector<float>> async_reference(const rp::Model & model, const rp::FinetuneConfig & cfg,
                                                       const Workload & w) {
    rp::Trainer tr(model, cfg);
    Updater up(tr);
    std::vector<std::vector<float>> theta = masters_of(tr), published = theta;
    for (int s = 0; s < w.steps; ++s) {
        for (size_t i = 0; i < tr.params().size(); ++i)
            std::memcpy(tr.params()[i].t->data, published[i].data(), published[i].size() * sizeof(float));
        step_gradient(tr, w, s);
        published = theta;  // step s's copy-back publishes the masters before this update
        std::vector<float *> m;
        for (auto & t : theta) m.push_back(t.data());
        up.update(tr, m);
    }
    return theta;
}

// The pipeline's view of a call's micro-batches (pointers into `data`, which must outlive the result).
inline std::vector<rp::MicroBatch> micro_batches(const std::vector<MbData> & data, int64_t step, float loss_scale) {
    std::vector<rp::MicroBatch> mbs;
    for (const MbData & d : data) {
        rp::MicroBatch m;
        m.ids = d.ids.data();
        m.labels = d.labels.data();
        m.info.seq_len = d.T;
        m.info.n_seq = d.B;
        m.info.seq_offset = d.offset;
        m.info.step = step;
        m.info.loss_scale = loss_scale;
        mbs.push_back(m);
    }
    return mbs;
}

struct RunResult {
    std::vector<std::vector<float>> masters;
    rp::PipelineChecks checks;
    std::vector<size_t> high_water;
    size_t peak_graph = 0;
    rp::Plan plan;
    rp::DeviceMemoryPlan memory;             // the last call's planned regions
    std::vector<rp::DeviceMemoryPlan> call_memory;  // every training call's planned regions, in call order
    int64_t token_chunk = 0;                 // and the token chunk its programs ran with
    std::vector<rp::DeviceMemoryPlan> used;  // per device: the most each region held
    std::vector<rp::DeviceMemoryPlan> carved;  // per device: the regions as carved (the largest of the calls' plans)
    std::vector<double> losses;
    int forward_mismatches = 0;                // Workload::forward_first: forward-only losses that differed
    int timing_samples = 0;
    std::vector<uint64_t> pinned_allocations;  // the pool's count after each call (blocks pinned so far)
    std::vector<size_t> pinned_in_use_peak;    // the pool's most bytes handed out at once, after each call
    uint64_t pinned_reuses = 0;                // takes the pool served from blocks of earlier calls
    std::vector<size_t> weights_uploaded;      // per device: weight bytes sent (measured by the workers)
    size_t planned_weights_up = 0;             // link_bytes over the calls: the jobs' weights
    size_t planned_vocab_rows_up = 0;          // and the vocabulary rows the programs upload (vocab_on_host)
    size_t planned_resident_once = 0;          // and the resident region's, once per device (0: streamed)
    rp::FrozenPinningReport pinning;           // what pinning the frozen weights did
    size_t host_working = 0, host_slots = 0;   // the host store's pinned working copies and gradient slots
    std::vector<rp::Pipeline::Assignment> assignments;  // every job's device, in dispatch order
    std::vector<std::vector<int64_t>> jobs_per_step;    // [step][device]: jobs dispatched in the step
    std::vector<double> device_speeds;                  // the dispatcher's speeds at the end
};

struct DeviceSetup {
    int G = 2;
    size_t memory = size_t(4) << 20;
    std::vector<size_t> memories;  // mixed memory: each CPU device's bytes (empty: `memory` each)
    uint64_t delay_seed = 0;
    double max_delay_us = 0;
    std::vector<double> speeds;  // CPU devices' compute speeds (cpu_device.h); empty: all 1
    // A straggler: from step straggle_from on, CPU device `straggler` runs at straggler_speed.
    int straggler = -1;
    int straggle_from = 0;
    double straggler_speed = 1;
    // The dispatcher measures the devices' speeds. Otherwise pipelined() gives them (PipelineOptions::device_speed
    // unset: `speeds`, else identical), so that a loaded machine's timings never decide which device runs a job or
    // where the stages end, and what a test counts per device is fixed.
    bool measure_speeds = false;
    rp::OpHook hook;  // every CPU device's operation hook (cpu_device.h; empty: none)
};

// The devices of one pipelined run (each owns its graph runner).
struct DeviceSet {
    std::vector<std::unique_ptr<rp::Device>> devices;
};
using DeviceFactory = std::function<DeviceSet(const DeviceSetup &)>;

// ds.G CPU virtual devices of ds.memory bytes, with ds's delay injection.
inline DeviceSet cpu_devices(const DeviceSetup & ds) {
    DeviceSet set;
    for (int i = 0; i < ds.G; ++i) {
        rp::CpuDeviceOptions o;
        o.memory_bytes = ds.memories.empty() ? ds.memory : ds.memories.at(static_cast<size_t>(i));
        o.delay_seed = ds.delay_seed ? ds.delay_seed + static_cast<uint64_t>(i) : 0;
        o.max_delay_us = ds.max_delay_us;
        if (!ds.speeds.empty()) o.speed = ds.speeds[static_cast<size_t>(i)];
        o.hook = ds.hook;
        set.devices.push_back(std::make_unique<rp::CpuDevice>(i, o));
    }
    return set;
}

inline RunResult pipelined(const rp::Model & model, const rp::FinetuneConfig & cfg, const Workload & w, const DeviceSetup & ds,
                           rp::PipelineOptions opt, const DeviceFactory & make_devices = cpu_devices) {
    rp::Trainer tr(model, cfg);
    Updater up(tr);
    rp::TrainingProgram & prog = tr;
    if (!ds.measure_speeds && opt.device_speed.empty())
        opt.device_speed = ds.speeds.empty() ? std::vector<double>(static_cast<size_t>(ds.G), 1.0) : ds.speeds;
    DeviceSet set = make_devices(ds);
    std::vector<rp::Device *> ptrs;
    for (const auto & d : set.devices) ptrs.push_back(d.get());
    RunResult r;
    {
        rp::Pipeline pipe(prog, ptrs, opt);
        for (int s = 0; s < w.steps; ++s) {
            if (ds.straggler >= 0 && s == ds.straggle_from)
                dynamic_cast<rp::CpuDevice &>(*ptrs.at(static_cast<size_t>(ds.straggler))).set_speed(ds.straggler_speed);
            const std::vector<int64_t> jobs_before = pipe.jobs_per_device();
            const float ls = w.loss_scale(s);
            for (int c = 0; c < w.calls; ++c) {
                std::vector<MbData> data;
                for (int mb = 0; mb < w.M; ++mb) data.push_back(w.data(s, c, mb));
                const std::vector<rp::MicroBatch> mbs = micro_batches(data, s, ls);
                double forward_loss = 0;
                if (w.forward_first)
                    for (const std::vector<float> & res : pipe.forward(mbs)) forward_loss += res[0];
                r.losses.push_back(pipe.forward_backward(mbs));
                // (with LoRA dropout the forward-only call, in evaluation mode, drops nothing: another loss)
                if (w.forward_first && cfg.lora_dropout == 0.0f && forward_loss != r.losses.back()) ++r.forward_mismatches;
                r.pinned_allocations.push_back(pipe.pinned_stats().allocations);
                r.pinned_in_use_peak.push_back(pipe.pinned_stats().in_use_peak);
                const rp::CallPlan & lc = pipe.last_call();
                std::vector<rp::MicroBatchInfo> info;  // as the call ran them
                for (const rp::MicroBatch & mb : mbs) {
                    info.push_back(mb.info);
                    lc.apply(info.back());
                }
                const rp::LinkBytes link = rp::link_bytes(prog, lc.plan, opt.schedule, info, lc.shape.resident);
                r.planned_weights_up += link.weights_up;
                r.planned_vocab_rows_up += link.vocab_rows_up;
                r.planned_resident_once = link.resident_once;
                r.call_memory.push_back(pipe.last_memory());
            }
            pipe.step([&] { up.update(tr); });
            std::vector<int64_t> jobs = pipe.jobs_per_device();
            for (size_t d = 0; d < jobs.size(); ++d) jobs[d] -= jobs_before[d];
            r.jobs_per_step.push_back(jobs);
        }
        pipe.synchronize();
        r.checks = pipe.checks();
        r.plan = pipe.last_plan();
        r.memory = pipe.last_memory();
        r.token_chunk = pipe.last_call().token_chunk;
        for (int d = 0; d < pipe.num_devices(); ++d) {
            r.used.push_back(pipe.device_regions_used(d));
            r.carved.push_back(pipe.device_regions(d));
            r.weights_uploaded.push_back(pipe.device_weight_bytes_uploaded(d));
        }
        r.timing_samples = pipe.timing_samples();
        r.pinned_reuses = pipe.pinned_stats().reuses;
        r.pinning = pipe.frozen_pinning();
        r.host_working = pipe.host_working_bytes();
        r.host_slots = pipe.host_slot_bytes();
        r.assignments = pipe.assignments();
        r.device_speeds = pipe.device_speeds();
    }
    for (auto & d : set.devices) r.high_water.push_back(d->high_water());
    r.peak_graph = tr.peak_graph_bytes();
    r.masters = masters_of(tr);
    return r;
}

// Index of the first parameter whose bytes differ, or -1.
inline int first_difference(const std::vector<std::vector<float>> & a, const std::vector<std::vector<float>> & b) {
    if (a.size() != b.size()) return 0;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
            return static_cast<int>(i);
    return -1;
}

} // namespace rp_pipe_test
