// The RoundPipe runtime on CPU virtual devices against the single-device Trainer (roundpipe.md §15):
//   I1-I3  sync mode is bit-identical to single-device training for G = 1..4, M in {G, G+1, 2G+1}, planner
//          plans and hand-made ones, stage and layer grain, LoRA and full, tied and untied heads, two steps of
//          two accumulated calls each; the GPipe and 1F1B baselines give the same bits too;
//   I5     async mode equals the explicit delayed-gradient reference theta_k = theta_{k-1} - U(g(theta_{k-2}));
//   I4 I6 I7 I8  by instrumentation: forward and recompute hash the same weight bytes, every gradient slot is
//          downloaded once per call and handed off once per step, no host flag is set twice, every device's
//          arena high-water mark stays within its carved regions (which cover every job and program), and every weight chunk group
//          ran after the activation uploads it was queued behind.
// The race fuzz (random delays in every stream, the device threads and the optimizer thread) is in
// test_pipeline_fuzz.cpp.
#include "tests/roundpipe/pipeline_util.h"

#include "base/error.h"
#include "ggml_rp/roundpipe/memory_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <string>

using namespace rp_pipe_test;

namespace {

rp::FinetuneConfig lora_cfg() {
    rp::FinetuneConfig c;
    c.lora_rank = 4;
    return c;
}

rp::FinetuneConfig full_cfg() {
    rp::FinetuneConfig c;
    c.full = true;
    return c;
}

// Deterministic planner input (every layer costs the same; forward 1, backward stage 3) for the tests that
// assert a stage count: measured times vary with the machine's load (PlansFromMeasuredTimesKeepTheBits covers
// the measured path).
size_t sum(const std::vector<size_t> & v) { return std::accumulate(v.begin(), v.end(), size_t(0)); }

void uniform_times(rp::PipelineOptions & o, int L) {
    o.layer_tf.assign(static_cast<size_t>(L), 1.0);
    o.layer_tb.assign(static_cast<size_t>(L), 3.0);
}

void expect_checks_clean(const RunResult & r, const std::string & what) {
    EXPECT_EQ(r.checks.weight_version_mismatches, 0) << what;
    EXPECT_EQ(r.checks.grad_slot_errors, 0) << what;
    EXPECT_EQ(r.checks.priority_violations, 0) << what;
    EXPECT_EQ(r.checks.flag_violations, 0) << what;
    EXPECT_GT(r.checks.grads_handed_off, 0) << what;
    // I7: a device's arena holds its one block of regions and nothing else, and no job or program used more
    // of a region than was carved (the regions are the largest of the calls' plans: timings move the plan).
    for (size_t d = 0; d < r.high_water.size(); ++d) {
        EXPECT_LE(r.high_water[d], r.carved[d].peak()) << what << " device " << d;
        EXPECT_TRUE(r.carved[d].covers(r.used[d])) << what << " device " << d << ": used " << r.used[d].describe()
                                                   << ", carved " << r.carved[d].describe();
    }
}

// A hand-made plan's options (instrumented) on 3 CPU devices of 16 MiB, and the run's label.
rp::PipelineOptions hand_made(const std::vector<int> & fwd, const std::vector<int> & bwd, rp::RecomputeGrain grain) {
    rp::PipelineOptions o;
    o.plan = rp::plan_from_sizes(fwd, bwd, grain);
    o.grain = grain;
    o.instrument = true;
    return o;
}
DeviceSetup three_devices() {
    DeviceSetup ds;
    ds.G = 3;
    ds.memory = size_t(16) << 20;
    return ds;
}
std::string hand_made_label(bool full, const rp::PipelineOptions & o) {
    return std::string(full ? "full " : "lora ") + o.plan->describe() + (o.grain == rp::RecomputeGrain::Layer ? " layer grain" : " stage grain");
}

} // namespace

TEST(Pipeline, SyncEqualsSingleDeviceForEveryGAndM) {
    const Models & m = Models::get();
    for (int G = 1; G <= 4; ++G)
        for (int M : {G, G + 1, 2 * G + 1}) {
            Workload w;
            w.M = M;
            const auto ref = reference(*m.llama, lora_cfg(), w);
            if (G == 1) {  // the reference trains: its masters moved away from the initial ones
                rp::Trainer fresh(*m.llama, lora_cfg());
                ASSERT_NE(first_difference(masters_of(fresh), ref), -1);
            }
            rp::PipelineOptions o;
            o.instrument = true;
            uniform_times(o, 18);
            DeviceSetup ds;
            ds.G = G;
            ds.memory = size_t(3) << 20;
            const RunResult r = pipelined(*m.llama, lora_cfg(), w, ds, o);
            const std::string what = "G=" + std::to_string(G) + " M=" + std::to_string(M) + " plan " + r.plan.describe();
            EXPECT_GE(r.plan.num_stages(), 6) << what;
            EXPECT_EQ(first_difference(r.masters, ref), -1) << what;
            expect_checks_clean(r, what);
        }
}

TEST(Pipeline, SyncEqualsSingleDeviceForHandMadePlansAndBothGrains) {
    const Models & m = Models::get();
    Workload w;
    w.M = 4;
    const int L = 18;  // 16 blocks + embedding + head
    const std::vector<std::pair<std::vector<int>, std::vector<int>>> plans = {
        {{5, 6, 6}, {1, 2, 2, 3, 3, 3, 4}},  // FB = head only
        {{3, 4, 4}, {7, 5, 6}},              // FB with decoder layers
        {{}, {L}},                           // one fused stage: the whole model
        {{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
    };
    for (const bool full : {false, true}) {
        const rp::FinetuneConfig cfg = full ? full_cfg() : lora_cfg();
        const auto ref = reference(*m.llama, cfg, w);
        for (const auto & [f, b] : plans)
            for (const auto grain : {rp::RecomputeGrain::Stage, rp::RecomputeGrain::Layer}) {
                const rp::PipelineOptions o = hand_made(f, b, grain);
                const RunResult r = pipelined(*m.llama, cfg, w, three_devices(), o);
                const std::string what = hand_made_label(full, o);
                EXPECT_EQ(first_difference(r.masters, ref), -1) << what;
                expect_checks_clean(r, what);
            }
    }
}

// Bf16 boundaries (FinetuneConfig::boundary_type): every program writes its layer's output rounded to bf16, so
// the devices keep the host's bits whatever the plan (fused stages, one-layer stages, stage and layer grain, a token
// chunk), and a call's host checkpoints take half the bytes (its gradients, tokens and losses the same); its pinned
// buffers fewer.
TEST(Pipeline, Bf16BoundariesKeepTheHostsBitsWithHalfTheCheckpoints) {
    const Models & m = Models::get();
    Workload w;
    w.M = 3;
    w.steps = 1;
    w.calls = 1;
    const std::vector<std::pair<std::vector<int>, std::vector<int>>> plans = {
        {{3, 4, 4}, {7, 5, 6}},  // FB with decoder layers
        {std::vector<int>(17, 1), std::vector<int>(18, 1)},  // every layer its own stage
    };
    for (const bool full : {false, true}) {
        rp::FinetuneConfig f32 = full ? full_cfg() : lora_cfg(), bf16 = f32;
        bf16.boundary_type = rp::DType::BF16;
        const auto ref = reference(*m.llama, bf16, w);
        ASSERT_NE(first_difference(ref, reference(*m.llama, f32, w)), -1) << "the rounding changed nothing";
        rp::Trainer t16(*m.llama, bf16), t32(*m.llama, f32);
        for (const auto & [f, b] : plans)
            for (const auto grain : {rp::RecomputeGrain::Stage, rp::RecomputeGrain::Layer}) {
                const rp::PipelineOptions o = hand_made(f, b, grain);
                const RunResult r16 = pipelined(*m.llama, bf16, w, three_devices(), o), r32 = pipelined(*m.llama, f32, w, three_devices(), o);
                const std::string what = hand_made_label(full, o);
                EXPECT_EQ(first_difference(r16.masters, ref), -1) << what;
                expect_checks_clean(r16, what);
                const rp::HostCallBytes h16 = rp::host_call_bytes(t16, *o.plan, shapes_of(w)), h32 = rp::host_call_bytes(t32, *o.plan, shapes_of(w));
                EXPECT_GT(h16.checkpoints, 0u) << what;
                EXPECT_EQ(2 * h16.checkpoints, h32.checkpoints) << what;
                EXPECT_EQ(h16.gradients, h32.gradients) << what;
                EXPECT_EQ(h16.tokens, h32.tokens) << what;
                EXPECT_LT(r16.pinned_in_use_peak.at(0), r32.pinned_in_use_peak.at(0)) << what;
            }
        // A token chunk: the host Trainer with the same chunk.
        rp::FinetuneConfig chunked = bf16;
        chunked.token_chunk = 5;
        rp::PipelineOptions o;
        o.token_chunk = 5;
        o.instrument = true;
        uniform_times(o, 18);
        DeviceSetup ds;
        ds.G = 2;
        ds.memory = size_t(16) << 20;
        const RunResult r = pipelined(*m.llama, bf16, w, ds, o);
        EXPECT_EQ(r.token_chunk, 5);
        EXPECT_EQ(first_difference(r.masters, reference(*m.llama, chunked, w)), -1) << (full ? "full" : "lora") << " token chunk 5";
        expect_checks_clean(r, "token chunk 5");
    }
}

TEST(Pipeline, SyncEqualsSingleDeviceWithTiedHeadFullFinetune) {
    const Models & m = Models::get();
    for (int G : {1, 2, 4}) {
        Workload w;
        w.M = G + 1;
        const auto ref = reference(*m.qwen3, full_cfg(), w);
        rp::PipelineOptions o;
        o.instrument = true;
        uniform_times(o, 18);
        DeviceSetup ds;
        ds.G = G;
        ds.memory = size_t(2) << 20;
        const RunResult r = pipelined(*m.qwen3, full_cfg(), w, ds, o);
        const std::string what = "qwen3 tied full G=" + std::to_string(G) + " plan " + r.plan.describe();
        EXPECT_GE(r.plan.num_stages(), 6) << what;
        EXPECT_EQ(first_difference(r.masters, ref), -1) << what;
        expect_checks_clean(r, what);
    }
}

// Sync steps keep no copy of the trainable state (host_store.h): the devices upload the masters and sum each
// gradient in place in its highest layer's slot, so of the pinned store only the tied embedding's second slot is
// left; async steps keep the working copies and every slot. Both give their reference's bits (sync: the host's;
// async: the delayed-gradient reference, test I5), so here only the bytes are counted, with the masters and
// gradients registered in place, and the memory plan's count of them (host_store_bytes) is checked against them.
TEST(Pipeline, SyncStepsShareTheMastersAndGradientsAsyncStepsCopyThem) {
    const Models & m = Models::get();
    rp::Trainer tr(*m.qwen3, full_cfg());
    size_t masters = 0, slots = 0, embd = 0;
    for (const auto & p : tr.param_infos()) masters += p.n * sizeof(float);
    for (int l = 0; l < tr.num_layers(); ++l)
        for (const auto & ti : tr.layer_tensors(l))
            if (ti.param >= 0) slots += ti.bytes;
    for (const auto & ti : tr.layer_tensors(0))
        if (ti.param >= 0) embd += ti.bytes;
    ASSERT_GT(embd, 0u);
    ASSERT_GT(slots, masters) << "the tied embedding has two slots";
    Workload w;
    const auto ref = reference(*m.qwen3, full_cfg(), w);
    for (const bool async : {false, true}) {
        rp::PipelineOptions o;
        o.async = async;
        uniform_times(o, 18);
        DeviceSetup ds;
        ds.G = 2;
        ds.memory = size_t(2) << 20;
        const RunResult r = pipelined(*m.qwen3, full_cfg(), w, ds, o);
        // What the memory plan counts (run_plan.cpp) is what the store holds.
        const rp::HostStoreBytes planned = rp::host_store_bytes(tr, !async);
        EXPECT_EQ(r.host_working, planned.working);
        EXPECT_EQ(r.host_slots, planned.slots);
        if (async) {
            EXPECT_EQ(r.host_working, masters);
            EXPECT_EQ(r.host_slots, slots);
            EXPECT_EQ(r.pinning.masters_registered, 0u);
        } else {
            EXPECT_EQ(first_difference(r.masters, ref), -1);
            EXPECT_EQ(r.host_working, 0u);
            EXPECT_EQ(r.host_slots, embd) << "the tied embedding's second slot";
            EXPECT_GE(r.pinning.masters_registered, masters) << "masters and gradients registered in place";
            EXPECT_EQ(r.pinning.masters_pageable, 0u);
        }
    }
}

// qwen3moe, gpt-oss and qwen35moe: the routing is recomputed on whichever device runs the backward; sync mode still
// gives the single-device bits for G = 1..4, LoRA (attention, experts, router) and full (router and experts
// trainable; gpt-oss's sinks and biases too; qwen35moe's shared expert and its gate).
TEST(Pipeline, SyncEqualsSingleDeviceForMixtureOfExperts) {
    const Models & m = Models::get();
    rp::FinetuneConfig lora = lora_cfg();
    lora.lora_targets.push_back("ffn_gate_inp");
    for (const rp::Model * model : {m.moe.get(), m.gpt_oss.get(), m.qwen35moe.get()})
    for (const bool full : {false, true})
        for (int G = 1; G <= 4; ++G) {
            const rp::FinetuneConfig cfg = full ? full_cfg() : lora;
            Workload w;
            w.M = G + 1;
            const auto ref = reference(*model, cfg, w);
            rp::PipelineOptions o;
            o.instrument = true;
            uniform_times(o, 8);
            DeviceSetup ds;
            ds.G = G;
            ds.memory = size_t(4) << 20;
            const RunResult r = pipelined(*model, cfg, w, ds, o);
            const std::string what = std::string(model->hparams().arch->name) + (full ? " full" : " lora") + " G=" + std::to_string(G) +
                                     " plan " + r.plan.describe();
            EXPECT_GE(r.plan.num_stages(), 2) << what;
            EXPECT_EQ(first_difference(r.masters, ref), -1) << what;
            expect_checks_clean(r, what);
        }
}

namespace {

// LoRA and full on 1..4 devices give the single-device bits, with at least 3 stages and the runtime's checks clean.
void expect_sync_equals_single_device(const rp::Model & model) {
    for (const bool full : {false, true})
        for (int G = 1; G <= 4; ++G) {
            const rp::FinetuneConfig cfg = full ? full_cfg() : lora_cfg();
            Workload w;
            w.M = G + 1;
            const auto ref = reference(model, cfg, w);
            rp::PipelineOptions o;
            o.instrument = true;
            uniform_times(o, static_cast<int>(model.hparams().n_layer) + 2);
            DeviceSetup ds;
            ds.G = G;
            ds.memory = size_t(2) << 20;
            const RunResult r = pipelined(model, cfg, w, ds, o);
            const std::string what = std::string(model.hparams().arch->name) + (full ? " full" : " lora") + " G=" + std::to_string(G) +
                                     " plan " + r.plan.describe();
            EXPECT_GE(r.plan.num_stages(), 3) << what;
            EXPECT_EQ(first_difference(r.masters, ref), -1) << what;
            expect_checks_clean(r, what);
        }
}

} // namespace

// gemma3: windowed and global layers with their own RoPE, post norms, GeGLU, a scaled tied embedding.
TEST(Pipeline, SyncEqualsSingleDeviceForGemma3) { expect_sync_equals_single_device(*Models::get().gemma3); }

// qwen35: Gated DeltaNet layers (whose backward recomputes the chunks' states) between gated attention layers.
TEST(Pipeline, SyncEqualsSingleDeviceForQwen35) { expect_sync_equals_single_device(*Models::get().qwen35); }

TEST(Pipeline, BaselineSchedulesGiveTheSameBits) {
    const Models & m = Models::get();
    Workload w;
    w.M = 5;
    const auto ref = reference(*m.llama, lora_cfg(), w);
    for (const auto kind : {rp::ScheduleKind::GPipe, rp::ScheduleKind::OneFOneB})
        for (int G : {1, 2, 4}) {
            rp::PipelineOptions o;
            o.schedule = kind;
            o.instrument = true;
            DeviceSetup ds;
            ds.G = G;
            ds.memory = size_t(16) << 20;
            const RunResult r = pipelined(*m.llama, lora_cfg(), w, ds, o);
            const std::string what = std::string(rp::schedule_name(kind)) + " G=" + std::to_string(G);
            EXPECT_EQ(r.plan.num_stages(), 2 * G - 1) << what;
            EXPECT_EQ(first_difference(r.masters, ref), -1) << what;
            expect_checks_clean(r, what);
        }
}

// Pipeline::forward (evaluation, a reference pass: the forward stages and the heads' forward alone): its loss is
// the training call's on the same micro-batches bit for bit, on every schedule, and forward calls before each
// training call change no bit of the training (the single device's masters) and trip no instrumentation check.
TEST(Pipeline, ForwardOnlyCallsGiveTheTrainingLossAndChangeNothing) {
    const Models & m = Models::get();
    Workload w;
    w.M = 3;
    const auto ref = reference(*m.llama, lora_cfg(), w);
    for (const auto kind : {rp::ScheduleKind::RoundPipe, rp::ScheduleKind::GPipe, rp::ScheduleKind::OneFOneB}) {
        const std::string what = rp::schedule_name(kind);
        rp::Trainer tr(*m.llama, lora_cfg());
        Updater up(tr);
        DeviceSetup ds;
        ds.G = 2;
        ds.memory = size_t(16) << 20;
        DeviceSet set = cpu_devices(ds);
        std::vector<rp::Device *> ptrs;
        for (const auto & d : set.devices) ptrs.push_back(d.get());
        rp::PipelineOptions o;
        o.schedule = kind;
        o.instrument = true;
        uniform_times(o, 18);
        rp::PipelineChecks checks;
        {
            rp::Pipeline pipe(tr, ptrs, o);
            for (int s = 0; s < w.steps; ++s) {
                for (int c = 0; c < w.calls; ++c) {
                    std::vector<MbData> data;
                    for (int mb = 0; mb < w.M; ++mb) data.push_back(w.data(s, c, mb));
                    const std::vector<rp::MicroBatch> mbs = micro_batches(data, s, w.loss_scale(s));
                    const std::vector<std::vector<float>> fwd = pipe.forward(mbs);
                    ASSERT_EQ(fwd.size(), mbs.size()) << what;
                    double forward_loss = 0;
                    for (const auto & r : fwd) {
                        ASSERT_EQ(r.size(), 1u) << what;
                        forward_loss += r[0];
                    }
                    EXPECT_EQ(forward_loss, pipe.forward_backward(mbs)) << what << " step " << s << " call " << c;
                }
                pipe.step([&] { up.update(tr); });
            }
            pipe.synchronize();
            checks = pipe.checks();
        }
        EXPECT_EQ(first_difference(masters_of(tr), ref), -1) << what;
        EXPECT_EQ(checks.weight_version_mismatches, 0) << what;
        EXPECT_EQ(checks.grad_slot_errors, 0) << what;
        EXPECT_EQ(checks.flag_violations, 0) << what;
    }
}

TEST(Pipeline, AsyncEqualsDelayedGradientReference) {
    const Models & m = Models::get();
    Workload w;
    w.steps = 4;
    w.calls = 1;
    w.M = 4;
    for (const bool full : {false, true}) {
        const rp::FinetuneConfig cfg = full ? full_cfg() : lora_cfg();
        const auto ref = async_reference(*m.llama, cfg, w);
        const auto sync_ref = reference(*m.llama, cfg, w);
        rp::PipelineOptions o;
        o.async = true;
        o.instrument = true;
        DeviceSetup ds;
        ds.G = 3;
        ds.memory = size_t(3) << 20;
        const RunResult r = pipelined(*m.llama, cfg, w, ds, o);
        EXPECT_EQ(first_difference(r.masters, ref), -1) << (full ? "full" : "lora");
        EXPECT_NE(first_difference(r.masters, sync_ref), -1) << "async must differ from sync (the test would be vacuous)";
        expect_checks_clean(r, full ? "async full" : "async lora");
    }
}

TEST(Pipeline, PlansFromMeasuredTimesKeepTheBits) {
    // Six calls: the first timed call is dropped, then the moving average replans every call (I3 across
    // changing plans within a step: the accumulation order never depends on the plan).
    const Models & m = Models::get();
    Workload w;
    w.steps = 3;
    w.calls = 2;
    w.M = 3;
    const auto ref = reference(*m.llama, lora_cfg(), w);
    DeviceSetup ds;
    ds.G = 2;
    const RunResult r = pipelined(*m.llama, lora_cfg(), w, ds, {});
    EXPECT_GE(r.timing_samples, 3);
    EXPECT_EQ(first_difference(r.masters, ref), -1) << r.plan.describe();
}

TEST(Pipeline, LossesEqualTheTrainersLosses) {
    const Models & m = Models::get();
    Workload w;
    w.steps = 1;
    w.calls = 1;
    w.M = 3;
    rp::Trainer tr(*m.llama, lora_cfg());
    double expect = 0;
    for (int mb = 0; mb < w.M; ++mb) {
        const MbData d = w.data(0, 0, mb);
        expect += tr.accumulate(d.ids.data(), d.labels.data(), d.T, d.B, w.loss_scale(0), 1, 0, d.offset);
    }
    DeviceSetup ds;
    ds.G = 2;
    const RunResult r = pipelined(*m.llama, lora_cfg(), w, ds, {});
    ASSERT_EQ(r.losses.size(), 1u);
    EXPECT_EQ(r.losses[0], expect);
    EXPECT_GT(expect, 1.0);
}

// Issue #37: devices of different speeds (CPU devices that really compute at 1, 1, 0.5, 0.5 of the host's speed, with
// random stalls in every stream) give the single-device bits for LoRA and full, dense and MoE, while dispatch by
// readiness moves work off the slow devices: jobs (the assignment is not the pointer's) or layers (stages sized by
// speed on the pointer's devices, when the dispatcher's model finishes the call sooner so: the dense model's case).
// Round-robin on the same machine, and readiness on identical devices, keep the pointer's assignment and the
// planner's stages exactly.
TEST(Pipeline, MixedSpeedsGiveTheSameBitsWithWorkMovedOffTheSlowDevices) {
    const Models & m = Models::get();
    const std::vector<double> speeds = {1, 1, 0.5, 0.5};
    auto pointer_order = [](const RunResult & r, int G) {
        for (size_t k = 0; k < r.assignments.size(); ++k)
            if (r.assignments[k].device != static_cast<int>(k % static_cast<size_t>(G))) return false;
        return !r.assignments.empty();
    };
    auto sized = [](const RunResult & r) {
        for (const std::string & n : r.plan.notes)
            if (n == "stages sized by device speed") return true;
        return false;
    };
    rp::FinetuneConfig moe_lora = lora_cfg();
    moe_lora.lora_targets.push_back("ffn_gate_inp");
    struct Case {
        const rp::Model * model;
        rp::FinetuneConfig cfg;
        std::string what;
    };
    int sized_runs = 0, moved_runs = 0;
    for (const Case & c : {Case{m.llama.get(), lora_cfg(), "llama lora"}, Case{m.llama.get(), full_cfg(), "llama full"},
                           Case{m.moe.get(), moe_lora, "qwen3moe lora"}, Case{m.moe.get(), full_cfg(), "qwen3moe full"}}) {
        Workload w;
        w.M = 5;
        w.steps = 3;
        const auto ref = reference(*c.model, c.cfg, w);
        rp::PipelineOptions o;
        o.instrument = true;
        uniform_times(o, static_cast<int>(c.model->hparams().n_layer) + 2);
        o.device_speed = speeds;
        DeviceSetup ds;
        ds.G = 4;
        ds.memory = size_t(4) << 20;
        ds.speeds = speeds;
        ds.delay_seed = 37;
        ds.max_delay_us = 30;
        const RunResult r = pipelined(*c.model, c.cfg, w, ds, o);
        EXPECT_EQ(first_difference(r.masters, ref), -1) << c.what << " plan " << r.plan.describe();
        expect_checks_clean(r, c.what);
        EXPECT_EQ(r.device_speeds, speeds);
        int64_t fast = 0, slow = 0;  // layer-jobs run
        for (const auto & a : r.assignments) (a.device < 2 ? fast : slow) += a.layers;
        EXPECT_LT(slow, fast) << c.what << " plan " << r.plan.describe();
        // (each call chooses: the last one's plan says whether it was sized)
        EXPECT_TRUE(sized(r) || !pointer_order(r, 4)) << c.what << ": round-robin's assignment of the planner's stages";
        ++(sized(r) ? sized_runs : moved_runs);
        if (c.what == "llama lora") {
            EXPECT_TRUE(sized(r)) << r.plan.describe();
            // (its planner keeps most layers' inputs: the sized plan runs at layer grain, a grain the planner did
            // not choose; the bits above are the host's all the same)
            EXPECT_EQ(r.plan.grain, rp::RecomputeGrain::Layer) << r.plan.describe();
        }

        o.dispatch = rp::DispatchKind::RoundRobin;  // the pointer and the planner's stages, whatever the speeds
        const RunResult rr = pipelined(*c.model, c.cfg, w, ds, o);
        EXPECT_EQ(first_difference(rr.masters, ref), -1) << c.what << " round-robin";
        EXPECT_TRUE(pointer_order(rr, 4)) << c.what << " round-robin";
        EXPECT_FALSE(sized(rr)) << c.what << " round-robin";
        if (c.what != "llama lora") continue;
        o.dispatch = rp::DispatchKind::Ready;  // identical devices: the pointer
        o.device_speed = {1, 1, 1, 1};
        ds.speeds.clear();
        const RunResult same = pipelined(*c.model, c.cfg, w, ds, o);
        EXPECT_EQ(first_difference(same.masters, ref), -1) << c.what << " identical devices";
        EXPECT_TRUE(pointer_order(same, 4)) << c.what << " identical devices";
        EXPECT_FALSE(sized(same)) << c.what << " identical devices";
    }
    std::printf("[ dispatch ] mixed speeds: %d runs with stages sized by speed, %d with jobs moved\n", sized_runs, moved_runs);
}

// A device that slows down mid-run (a straggler at a quarter of the speed from step 2 on) shows in its measured
// speed and gets fewer jobs from then on; the bits stay the host's.
TEST(Pipeline, AStragglerIsMeasuredAndGetsFewerJobs) {
    const Models & m = Models::get();
    Workload w;
    w.M = 4;
    w.steps = 6;
    const auto ref = reference(*m.llama, lora_cfg(), w);
    rp::PipelineOptions o;
    uniform_times(o, 18);  // the plan fixed; the dispatcher measures the devices itself
    DeviceSetup ds;
    ds.G = 4;
    ds.memory = size_t(3) << 20;
    ds.straggler = 3;
    ds.straggle_from = 2;
    ds.straggler_speed = 0.25;
    ds.measure_speeds = true;
    const RunResult r = pipelined(*m.llama, lora_cfg(), w, ds, o);
    EXPECT_EQ(first_difference(r.masters, ref), -1) << r.plan.describe();
    ASSERT_EQ(r.device_speeds.size(), 4u);
    // (the others' speeds are only near 1: four CPU devices share the machine's cores, and the noise of a loaded
    // machine can exceed the band that counts as equal)
    EXPECT_LT(r.device_speeds[3], 0.6) << "measured straggler speed";
    const std::vector<int64_t> & last = r.jobs_per_step.back();
    const int64_t total = last[0] + last[1] + last[2] + last[3];
    EXPECT_LT(last[3] * 4, total) << "the straggler kept its round-robin share: " << last[0] << "," << last[1] << ","
                                  << last[2] << "," << last[3];
}

TEST(Pipeline, DeviceTooSmallForALayerNamesIt) {
    const Models & m = Models::get();
    Workload w;
    w.steps = 1;
    w.calls = 1;
    DeviceSetup ds;
    ds.G = 2;
    ds.memory = size_t(64) << 10;  // 64 KiB: less than one decoder layer
    try {
        pipelined(*m.llama, lora_cfg(), w, ds, {});
        FAIL() << "expected an error";
    } catch (const rp::Error & e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("blk."), std::string::npos) << msg;
        EXPECT_NE(msg.find("bytes"), std::string::npos) << msg;
    }
}

TEST(Pipeline, BoundPlanSplitsEvenly) {
    const rp::Plan p = rp::bound_plan(18, 4);
    ASSERT_EQ(p.fwd.size(), 3u);
    ASSERT_EQ(p.bwd.size(), 4u);
    EXPECT_EQ(p.fwd[0], (rp::LayerRange{0, 5}));
    EXPECT_EQ(p.fwd[1], (rp::LayerRange{5, 10}));
    EXPECT_EQ(p.fwd[2], (rp::LayerRange{10, 14}));
    EXPECT_EQ(p.bwd[0], (rp::LayerRange{14, 18}));
    EXPECT_EQ(p.bwd[1], (rp::LayerRange{10, 14}));
    EXPECT_EQ(p.bwd[3], (rp::LayerRange{0, 5}));
    EXPECT_THROW(rp::schedule_from_name("zigzag"), rp::Error);
    EXPECT_EQ(rp::schedule_from_name("1f1b"), rp::ScheduleKind::OneFOneB);
}

// The calls in flight, as the host plan counts them (run_plan.h): with one call per step, a sync step returns the
// finished call's pinned buffers to the pool before the next call takes its own, and so does a forward-only call
// (evaluation) in a sync run: the pool never hands out more than one call's bytes at once. Async steps overlap the
// next step's forward with this one's backward: two calls' bytes. The bits are the host's either way.
TEST(Pipeline, SyncStepsHoldOneCallsPinnedBuffersAsyncTwo) {
    const Models & m = Models::get();
    Workload w;
    w.calls = 1;
    w.steps = 4;
    w.forward_first = true;
    const auto ref = reference(*m.llama, lora_cfg(), w);
    DeviceSetup ds;
    ds.G = 2;
    rp::PipelineOptions o;
    uniform_times(o, 18);
    Workload single = w;  // one call alone: its bytes
    single.steps = 1;
    single.forward_first = false;
    const size_t one = pipelined(*m.llama, lora_cfg(), single, ds, o).pinned_in_use_peak.front();
    EXPECT_GT(one, 0u);
    for (const bool async : {false, true}) {
        o.async = async;
        const RunResult r = pipelined(*m.llama, lora_cfg(), w, ds, o);
        if (!async) {
            EXPECT_EQ(first_difference(r.masters, ref), -1);
        }
        EXPECT_EQ(r.forward_mismatches, 0);
        ASSERT_EQ(r.pinned_in_use_peak.size(), 4u);
        if (async) {
            EXPECT_GE(r.pinned_in_use_peak.back(), 2 * one) << "async steps: two calls in flight";
        } else {
            EXPECT_EQ(r.pinned_in_use_peak.back(), one) << "sync steps: one call's buffers at a time";
        }
    }
}

// A micro-batch's backward stages take its two input-gradient buffers in turn (memory_plan.h BoundaryBuffers), so
// a call holds the same pinned bytes with 2 backward stages as with 17: with one-layer forward stages every layer's
// input is a checkpoint either way, and only the count of backward boundaries differs. The bits are the host's, and
// the fuzz (test_pipeline_fuzz.cpp) runs such plans with random delays in every stream.
TEST(Pipeline, ACallsInputGradientsTakeTwoBuffersPerMicroBatchWhateverItsBackwardStages) {
    const Models & m = Models::get();
    Workload w;
    w.calls = 1;
    w.steps = 1;
    w.M = 3;
    const auto ref = reference(*m.llama, lora_cfg(), w);
    const std::vector<int> fwd(17, 1);  // 16 blocks + the embedding; FB is the head
    size_t peak[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
        rp::PipelineOptions o;
        o.plan = k == 0 ? rp::plan_from_sizes(fwd, {1, 9, 8}, rp::RecomputeGrain::Stage)
                        : rp::plan_from_sizes(fwd, std::vector<int>(18, 1), rp::RecomputeGrain::Stage);
        o.instrument = true;
        DeviceSetup ds;
        ds.G = 3;
        ds.memory = size_t(16) << 20;
        const RunResult r = pipelined(*m.llama, lora_cfg(), w, ds, o);
        EXPECT_EQ(first_difference(r.masters, ref), -1) << o.plan->describe();
        expect_checks_clean(r, o.plan->describe());
        ASSERT_EQ(r.pinned_in_use_peak.size(), 1u);
        peak[k] = r.pinned_in_use_peak[0];
        const rp::BoundaryBuffers bb = rp::boundary_buffers(*o.plan, 18);
        EXPECT_EQ(bb.dact_buffers, 2);
        EXPECT_EQ(std::count(bb.dact.begin(), bb.dact.end(), 1), k == 0 ? 2 : 17);
    }
    EXPECT_GT(peak[0], 0u);
    EXPECT_EQ(peak[1], peak[0]) << "17 backward boundaries hold what 2 do";
}

// The calls' pinned buffers (tokens, boundary activations, losses) come from the run's pool: a block is pinned
// when no earlier call's block is free, and otherwise reused -- no cudaHostAlloc / cudaFreeHost per call, whose
// free synchronises the whole GPU -- with the bits of the single-device run. A call keeps its buffers while its
// jobs and the planner's timing harvest (at most 4 calls) hold it, so a few calls' worth get pinned; of 16
// calls' worth, at most half.
TEST(Pipeline, CallsReuseEarlierCallsPinnedBuffers) {
    const Models & m = Models::get();
    Workload w;
    w.M = 3;
    w.steps = 8;
    w.calls = 2;
    const auto ref = reference(*m.llama, lora_cfg(), w);
    DeviceSetup ds;
    ds.G = 2;
    const RunResult r = pipelined(*m.llama, lora_cfg(), w, ds, rp::PipelineOptions{});
    EXPECT_EQ(first_difference(r.masters, ref), -1);
    ASSERT_EQ(r.pinned_allocations.size(), 16u);
    const uint64_t per_call = r.pinned_allocations.front();
    EXPECT_GT(per_call, 0u);
    EXPECT_LE(r.pinned_allocations.back(), 8 * per_call);
    EXPECT_GT(r.pinned_reuses, 0u);
}

// Resident frozen weights (PipelineOptions::resident_weights, memory_plan.h): when the plan fits them, every
// device keeps the LoRA run's base weights from the first job on, and each job uploads only its trainable
// tensors. The bits are the single-device run's either way; the weight bytes each device was sent equal the
// link model's (the resident region once per device + the jobs' trainable tensors), a fraction of streaming's.
// With too little memory for them beside any plan the run streams, saying so in the plan's notes. The speeds are
// given (identical devices keep the round-robin pointer): measured ones would let a loaded machine's timings
// decide which device runs what.
TEST(Pipeline, ResidentFrozenWeightsGoUpOncePerDeviceWithTheSameBits) {
    const Models & m = Models::get();
    Workload w;
    w.M = 3;
    const auto ref = reference(*m.llama, lora_cfg(), w);
    DeviceSetup ds;
    ds.G = 2;
    ds.memory = size_t(16) << 20;
    rp::PipelineOptions o;
    o.instrument = true;
    o.device_speed = {1.0, 1.0};
    uniform_times(o, 18);
    const RunResult res = pipelined(*m.llama, lora_cfg(), w, ds, o);
    o.resident_weights = false;
    const RunResult str = pipelined(*m.llama, lora_cfg(), w, ds, o);
    for (const RunResult * r : {&res, &str}) {
        EXPECT_EQ(first_difference(r->masters, ref), -1) << r->plan.describe();
        expect_checks_clean(*r, r->plan.describe());
    }
    ASSERT_GT(res.memory.resident, 0u) << res.memory.describe();
    EXPECT_EQ(str.memory.resident, 0u) << str.memory.describe();
    EXPECT_GE(res.planned_resident_once, size_t(2) << 20);  // the 16 blocks' frozen f32 weights and the embeddings
    EXPECT_EQ(str.planned_resident_once, 0u);
    bool noted = false;
    for (const std::string & n : res.plan.notes) noted = noted || n.find("stay on every device") != std::string::npos;
    EXPECT_TRUE(noted) << res.plan.describe();
    for (size_t d = 0; d < res.used.size(); ++d) {
        EXPECT_EQ(res.used[d].resident, res.memory.resident) << "device " << d;
        EXPECT_GT(res.weights_uploaded[d], res.planned_resident_once) << "device " << d << " ran no job";
    }
    EXPECT_EQ(sum(res.weights_uploaded), res.planned_weights_up + 2 * res.planned_resident_once);
    EXPECT_EQ(sum(str.weights_uploaded), str.planned_weights_up);
    // 2 steps x 2 calls x (forward + backward): streaming sends the frozen weights 8 times, residency twice.
    EXPECT_LT(sum(res.weights_uploaded) * 3, sum(str.weights_uploaded));

    // 2.25 MiB: the plans that fit leave no room for the 2.1 MiB of resident weights.
    ds.memory = size_t(9) << 18;
    o.resident_weights = true;
    const RunResult tight = pipelined(*m.llama, lora_cfg(), w, ds, o);
    EXPECT_EQ(first_difference(tight.masters, ref), -1);
    EXPECT_EQ(tight.memory.resident, 0u);
    EXPECT_EQ(sum(tight.weights_uploaded), tight.planned_weights_up);
    noted = false;
    for (const std::string & n : tight.plan.notes) noted = noted || n.find("every job uploads its weights") != std::string::npos;
    EXPECT_TRUE(noted) << tight.plan.describe();
}

// The resident region outlives the carves: a later call that needs larger regions (longer micro-batches; stages
// sized for devices of different speeds, whose largest stage holds more layers) carves the working regions again
// and keeps the frozen weights where they are, so they still go up once per device.
TEST(Pipeline, ResidentFrozenWeightsStayThroughACarveForALargerCall) {
    const Models & m = Models::get();
    Workload w;
    w.M = 3;
    w.steps = 3;
    w.longer_T = 30;
    w.longer_from = 2;
    const auto ref = reference(*m.llama, lora_cfg(), w);
    for (const std::vector<double> & speeds : {std::vector<double>{1.0, 1.0}, std::vector<double>{1.0, 0.5}}) {
        const std::string what = "speeds " + std::to_string(speeds[0]) + ", " + std::to_string(speeds[1]);
        DeviceSetup ds;
        ds.G = 2;
        ds.memory = size_t(16) << 20;
        ds.speeds = speeds;
        rp::PipelineOptions o;
        o.instrument = true;
        o.device_speed = speeds;
        uniform_times(o, 18);
        const RunResult r = pipelined(*m.llama, lora_cfg(), w, ds, o);
        EXPECT_EQ(first_difference(r.masters, ref), -1) << what;
        expect_checks_clean(r, what);
        ASSERT_EQ(r.call_memory.size(), 6u) << what;
        // The longer calls need more activation memory than any earlier call's regions hold: a second carve.
        EXPECT_GT(r.call_memory.back().activations, r.call_memory.front().activations) << what;
        ASSERT_GT(r.call_memory.back().resident, 0u) << what;
        EXPECT_EQ(r.call_memory.back().resident, r.call_memory.front().resident) << what;
        for (size_t d = 0; d < r.carved.size(); ++d) {
            EXPECT_GE(r.carved[d].activations, r.call_memory.back().activations) << what << " device " << d;
            EXPECT_GT(r.weights_uploaded[d], r.planned_resident_once) << what << " device " << d << " ran no job";
        }
        EXPECT_EQ(sum(r.weights_uploaded), r.planned_weights_up + 2 * r.planned_resident_once) << what;
    }
}

// Mixed memory (issue #37): two devices of 64 MiB and two too small for any plan (7/8 of the least memory a call
// takes: one layer per stage, the smallest chunk). The planner plans for the large devices and keeps the stages
// the small ones cannot hold (here the three-layer forward stages and most backward ones) on the large ones; the
// small ones run the others, each carving only what its stages need. The bits are the host's, by the pointer and by readiness on mixed speeds; no job
// ran on a device that may not hold its stage; every device stayed within its own memory. Devices of which
// none holds a plan are refused up front, the message naming each with its bytes.
TEST(Pipeline, MixedMemoryKeepsTheLargeStagesOnTheLargeDevices) {
    const Models & m = Models::get();
    Workload w;
    w.M = 3;
    rp::FinetuneConfig cfg = lora_cfg();
    rp::Trainer tr(*m.qwen3, cfg);
    rp::TrainingProgram & prog = tr;
    const auto rules = rp::footprint_rules("cpu");
    rp::CallPlanner planner(prog, *rules);
    rp::PipelineOptions o;
    uniform_times(o, 18);
    o.resident_weights = false;  // (a resident region is every device's: a small one then holds no stage)
    rp::CallPlanRequest req;
    req.devices = 4;
    req.tf = o.layer_tf;
    req.tb = o.layer_tb;
    req.resident = false;
    const size_t least = planner.least_memory(req, shapes_of(w)).peak();
    const size_t big = size_t(64) << 20, small = least - least / 8 - (least - least / 8) % rp::kBufferAlign;
    req.device_memories = {big, small, big, small};
    req.device_names = {"cpu:0", "cpu:1", "cpu:2", "cpu:3"};
    req.device_memory = small;
    const rp::CallPlan cp = planner.plan(req, shapes_of(w));
    ASSERT_FALSE(cp.stage_devices.empty()) << "the small devices hold every stage: " << cp.plan.describe();
    const std::vector<rp::StageDesc> stages = rp::plan_stages(cp.plan);
    int small_stages = 0;
    for (size_t s = 0; s < stages.size(); ++s) {
        EXPECT_TRUE(cp.stage_devices[s][0] && cp.stage_devices[s][2]) << stages[s].name << ": the large devices hold every stage";
        EXPECT_EQ(cp.stage_devices[s][1], cp.stage_devices[s][3]) << stages[s].name;
        small_stages += cp.stage_devices[s][1];
    }
    ASSERT_GT(small_stages, 0) << "the small devices hold no stage: " << cp.plan.describe();
    EXPECT_LT(small_stages, static_cast<int>(stages.size()));
    EXPECT_EQ(cp.regions_of(0).peak(), cp.memory.peak());
    EXPECT_LE(cp.regions_of(1).peak(), small);
    EXPECT_LT(cp.regions_of(1).peak(), cp.memory.peak());
    bool noted = false;
    for (const std::string & n : cp.plan.notes) noted = noted || n.find("cpu:1, " + rp::format_bytes(small) + ", runs ") != std::string::npos;
    EXPECT_TRUE(noted) << cp.plan.describe();

    const auto ref = reference(*m.qwen3, cfg, w);
    for (const std::vector<double> & speeds : {std::vector<double>{1, 1, 1, 1}, std::vector<double>{1, 0.5, 0.5, 1}}) {
        const std::string what = speeds[1] == 1 ? "identical speeds" : "speeds 1,0.5,0.5,1";
        DeviceSetup ds;
        ds.G = 4;
        ds.memories = req.device_memories;
        ds.speeds = speeds;
        o.instrument = true;
        // On mixed speeds each training call is preceded by a forward-only one (evaluation): its jobs too go only
        // to the devices that hold their stages, and its loss is the training call's.
        Workload wf = w;
        wf.forward_first = speeds[1] != 1;
        const RunResult r = pipelined(*m.qwen3, cfg, wf, ds, o);
        EXPECT_EQ(first_difference(r.masters, ref), -1) << what << " plan " << r.plan.describe();
        EXPECT_EQ(r.forward_mismatches, 0) << what;
        expect_checks_clean(r, what);
        const std::vector<rp::StageDesc> ran = rp::plan_stages(r.plan);
        std::vector<int> jobs(4, 0);
        for (const rp::Pipeline::Assignment & a : r.assignments) {
            ++jobs[static_cast<size_t>(a.device)];
            for (size_t s = 0; s < ran.size(); ++s)
                if (ran[s].name == a.job) {
                    EXPECT_TRUE(cp.stage_devices[s][static_cast<size_t>(a.device)]) << what << ": " << a.job << " ran on cpu:" << a.device;
                }
        }
        EXPECT_GT(jobs[1] + jobs[3], 0) << what << ": the small devices ran no job";
        for (size_t d = 0; d < 4; ++d) {
            EXPECT_LE(r.high_water[d], ds.memories[d]) << what << " device " << d;
            EXPECT_TRUE(r.carved[d].covers(r.used[d])) << what << " device " << d;
            EXPECT_LE(r.carved[d].peak(), ds.memories[d]) << what << " device " << d;
        }
    }

    // The frozen weights resident where they fit: the small devices, too small for the region, stream the weights
    // of the stages they run (their regions have no resident region); the same bits.
    {
        rp::CallPlanRequest rreq = req;
        rreq.resident = true;
        const rp::CallPlan rcp = planner.plan(rreq, shapes_of(w));
        ASSERT_TRUE(rcp.shape.resident) << rcp.plan.describe();
        ASSERT_FALSE(rcp.stage_devices.empty()) << rcp.plan.describe();
        EXPECT_GT(rcp.regions_of(0).resident, small) << "the case needs a resident region larger than the small devices";
        EXPECT_EQ(rcp.regions_of(1).resident, 0u);
        EXPECT_FALSE(rcp.shape_on(1).resident);
        EXPECT_TRUE(rcp.shape_on(0).resident);
        EXPECT_GT(rcp.regions_of(1).peak(), 0u) << "the small devices run no stage";
        rp::PipelineOptions ro = o;
        ro.resident_weights = true;
        DeviceSetup ds;
        ds.G = 4;
        ds.memories = req.device_memories;
        const RunResult r = pipelined(*m.qwen3, cfg, w, ds, ro);
        EXPECT_EQ(first_difference(r.masters, ref), -1) << "resident plan " << r.plan.describe();
        expect_checks_clean(r, "resident");
        EXPECT_GT(r.memory.resident, 0u);
        EXPECT_EQ(r.used[1].resident + r.used[3].resident, 0u);
        EXPECT_GT(r.weights_uploaded[1] + r.weights_uploaded[3], 0u) << "the small devices ran no job";
        for (size_t d = 0; d < 4; ++d) EXPECT_LE(r.high_water[d], ds.memories[d]) << "resident, device " << d;
    }

    // No device holds a plan: refused before anything runs, every device named.
    DeviceSetup tiny;
    tiny.G = 2;
    tiny.memories = {least / 2 - (least / 2) % rp::kBufferAlign, least / 3 - (least / 3) % rp::kBufferAlign};
    DeviceSet set = cpu_devices(tiny);
    std::vector<rp::Device *> ptrs;
    for (const auto & d : set.devices) ptrs.push_back(d.get());
    rp::Pipeline pipe(prog, ptrs, o);
    try {
        pipe.plan_call(shapes_of(w));
        ADD_FAILURE() << "devices below the least memory were accepted";
    } catch (const rp::MemoryError & e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("cpu:0 " + rp::format_bytes(tiny.memories[0])), std::string::npos) << msg;
        EXPECT_NE(msg.find("cpu:1 " + rp::format_bytes(tiny.memories[1])), std::string::npos) << msg;
        EXPECT_EQ(e.available(), tiny.memories[0]) << msg;
    }
    for (const auto & d : set.devices) EXPECT_EQ(d->high_water(), 0u);
}

// The three ways of pinning the frozen weights upload the same bytes: the same bits, resident or streamed,
// with a tied head (one tensor in two layers) and its single copy.
TEST(Pipeline, EveryFrozenPinningGivesTheSameBits) {
    const Models & m = Models::get();
    Workload w;
    w.M = 3;
    const auto ref = reference(*m.qwen3, lora_cfg(), w);
    DeviceSetup ds;
    ds.G = 2;
    ds.memory = size_t(16) << 20;
    for (const rp::FrozenPinning mode : {rp::FrozenPinning::Copy, rp::FrozenPinning::Register, rp::FrozenPinning::Pageable})
        for (const bool resident : {true, false}) {
            rp::PipelineOptions o;
            o.instrument = true;
            uniform_times(o, 18);
            o.frozen_pinning = mode;
            o.resident_weights = resident;
            const RunResult r = pipelined(*m.qwen3, lora_cfg(), w, ds, o);
            const std::string what = std::string(rp::frozen_pinning_name(mode)) + (resident ? " resident" : " streamed");
            EXPECT_EQ(r.pinning.mode, mode) << what;
            EXPECT_EQ(first_difference(r.masters, ref), -1) << what;
            expect_checks_clean(r, what);
        }
    // Unset: CPU virtual devices register (an accelerator would copy).
    rp::PipelineOptions o;
    uniform_times(o, 18);
    EXPECT_EQ(pipelined(*m.qwen3, lora_cfg(), w, ds, o).pinning.mode, rp::FrozenPinning::Register);
    EXPECT_EQ(rp::default_frozen_pinning(true), rp::FrozenPinning::Copy);
    for (const rp::FrozenPinning p : {rp::FrozenPinning::Copy, rp::FrozenPinning::Register, rp::FrozenPinning::Pageable})
        EXPECT_EQ(rp::parse_frozen_pinning(rp::frozen_pinning_name(p)), p);
    EXPECT_FALSE(rp::parse_frozen_pinning("pinned").has_value());
}

// Once a call's plan cannot keep the frozen weights resident, no later call's does (Pipeline's rule): calls of
// alternating shapes would otherwise re-carve the devices and upload the whole model again at each switch.
TEST(Pipeline, ACallThatStreamsTheWeightsMakesTheLaterCallsStreamToo) {
    const Models & m = Models::get();
    rp::Trainer tr(*m.llama, lora_cfg());
    rp::TrainingProgram & prog = tr;
    auto shapes = [](int64_t T) {
        rp::MicroBatchInfo i;
        i.seq_len = T;
        i.n_seq = 1;
        return std::vector<rp::MicroBatchInfo>(3, i);
    };
    rp::PipelineOptions o;
    uniform_times(o, 18);
    o.token_chunk = 0;
    // Capacity: what the short call takes with the weights resident; the long call's activations need more.
    const auto rules = rp::footprint_rules("cpu");
    rp::CallPlanner planner(prog, *rules);
    rp::CallPlanRequest req;
    req.devices = 2;
    req.token_chunk = 0;
    req.tf = o.layer_tf;
    req.tb = o.layer_tb;
    const rp::CallPlan short_free = planner.plan(req, shapes(12));
    ASSERT_TRUE(short_free.shape.resident);
    DeviceSetup ds;
    ds.G = 2;
    ds.memory = short_free.memory.peak();
    req.device_memory = ds.memory;
    // The long call: the shortest of these lengths that still trains there, but only streamed.
    int64_t longer = 0;
    for (int64_t T : {32, 64, 128, 192, 256, 320}) {
        try {
            if (!planner.plan(req, shapes(T)).shape.resident) {
                longer = T;
                break;
            }
        } catch (const rp::MemoryError &) {
            break;
        }
    }
    ASSERT_GT(longer, 0) << "the case needs a call that trains only with the weights streamed";
    DeviceSet set = cpu_devices(ds);
    std::vector<rp::Device *> ptrs;
    for (const auto & d : set.devices) ptrs.push_back(d.get());
    rp::Pipeline pipe(prog, ptrs, o);
    EXPECT_TRUE(pipe.plan_call(shapes(12)).shape.resident);
    EXPECT_FALSE(pipe.plan_call(shapes(longer)).shape.resident);
    const rp::CallPlan again = pipe.plan_call(shapes(12));
    EXPECT_FALSE(again.shape.resident);
    bool noted = false;
    for (const std::string & n : again.plan.notes) noted = noted || n.find("did not fit beside an earlier call's plan") != std::string::npos;
    EXPECT_TRUE(noted) << again.plan.describe();
    o.resident_weights = false;  // asked not to: never
    rp::Pipeline off(prog, ptrs, o);
    EXPECT_FALSE(off.plan_call(shapes(12)).shape.resident);
}

// The vocabulary matrices on the host (PipelineOptions::vocab_on_host, call_planner.h): a tied qwen3 whose
// 16384 x 32 embedding (2 MiB, also its head) outweighs everything else. No plan with the matrix in a weight slot
// fits less than it; with the matrix on the host (layer 0 gathers its tokens' rows, the head folds 100-row ranges
// into state held across its graphs) the least plan's weight slot is far below it, and a device of that least
// plan's size trains: the planner leaves the vocabulary on the host itself, says so, and the masters are the
// single-device Trainer's bits. The jobs' weight uploads are the link model's (the rows go up with the programs:
// vocab_rows_up); every device stays within its carved regions.
TEST(Pipeline, VocabularyOnTheHostTrainsBelowTheHeadsSizeWithTheSameBits) {
    rp_test::TempDir dir;
    rp::SynthSpec s;
    s.arch = "qwen3";
    s.tied = true;
    s.n_vocab = 16384;
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 8, s.n_ff = 48, s.n_layer = 4, s.seed = 21;
    rp::write_synth_model(s, dir.file("qwen3-wide-vocab.gguf"));
    const std::unique_ptr<rp::Model> model = rp::Model::load(dir.file("qwen3-wide-vocab.gguf"));
    rp::FinetuneConfig cfg = lora_cfg();
    cfg.ce_chunk = 100;
    Workload w;
    w.M = 3;
    w.calls = 1;
    rp::Trainer tr(*model, cfg);
    rp::TrainingProgram & prog = tr;
    size_t head = 0;
    for (const auto & ti : prog.layer_tensors(prog.num_layers() - 1))
        if (ti.vocab_rows > 0) head = ti.bytes;
    ASSERT_EQ(head, size_t(16384) * 32 * 4);
    const auto rules = rp::footprint_rules("cpu");
    rp::CallPlanner planner(prog, *rules);
    rp::CallPlanRequest req;
    req.devices = 2;
    req.vocab_on_host = 0;
    const rp::DeviceMemoryPlan on_device = planner.least_memory(req, shapes_of(w));
    req.vocab_on_host = -1;
    const rp::DeviceMemoryPlan on_host = planner.least_memory(req, shapes_of(w));
    std::printf("  least device memory: %s with the vocabulary on the devices, %s on the host\n", on_device.describe().c_str(),
                on_host.describe().c_str());
    EXPECT_GE(on_device.weight_slot, head);
    EXPECT_LT(on_host.weight_slot * 8, head);
    EXPECT_LT(on_host.peak(), head);
    // A device that holds the least plan with the matrix on it keeps it there (one activation set rather than the
    // head over the link for every micro-batch).
    req.device_memory = rp::align_buffer(on_device.peak());
    const rp::CallPlan kept = planner.plan(req, shapes_of(w));
    EXPECT_FALSE(kept.shape.vocab_on_host) << kept.plan.describe();
    req.device_memory = 0;

    const auto ref = reference(*model, cfg, w);
    rp::PipelineOptions o;
    o.instrument = true;
    o.device_speed = {1.0, 1.0};
    uniform_times(o, prog.num_layers());
    DeviceSetup ds;
    ds.G = 2;
    ds.memory = rp::align_buffer(on_host.peak());
    const RunResult r = pipelined(*model, cfg, w, ds, o);
    EXPECT_EQ(first_difference(r.masters, ref), -1) << r.plan.describe();
    expect_checks_clean(r, r.plan.describe());
    bool noted = false;
    for (const std::string & n : r.plan.notes) noted = noted || n.find("stay in host memory") != std::string::npos;
    EXPECT_TRUE(noted) << r.plan.describe();
    EXPECT_LT(r.memory.weight_slot * 8, head) << r.memory.describe();
    EXPECT_EQ(sum(r.weights_uploaded), r.planned_weights_up);
    EXPECT_LT(r.planned_weights_up, head);  // the vocabulary never goes up with a job
    EXPECT_GE(r.planned_vocab_rows_up, head * 3 * 2) << "the head once per micro-batch (3 a call, 2 steps)";

    // Asked for, on a device that holds the matrix: the same bits; asked not to, on the small device: refused.
    o.vocab_on_host = 1;
    ds.memory = size_t(16) << 20;
    const RunResult asked = pipelined(*model, cfg, w, ds, o);
    EXPECT_EQ(first_difference(asked.masters, ref), -1) << asked.plan.describe();
    expect_checks_clean(asked, asked.plan.describe());
    // Token ranges of 5 (3 or 5 a micro-batch): the planner folds each row range into every token range's state
    // (MicroBatchInfo::vocab_pass_once), so the head crosses once per micro-batch, not once per token range; the
    // bits of the host Trainer with the same token chunk.
    rp::FinetuneConfig chunked = cfg;
    chunked.token_chunk = 5;
    o.token_chunk = 5;
    const RunResult ranges = pipelined(*model, cfg, w, ds, o);
    EXPECT_EQ(first_difference(ranges.masters, reference(*model, chunked, w)), -1) << ranges.plan.describe();
    expect_checks_clean(ranges, ranges.plan.describe());
    EXPECT_GE(ranges.planned_vocab_rows_up, head * 3 * 2);
    EXPECT_LT(ranges.planned_vocab_rows_up, head * 3 * 2 + head) << "the head once per micro-batch, and the embedding's rows";
    o.vocab_on_host = 0;
    ds.memory = rp::align_buffer(on_host.peak());
    EXPECT_THROW(pipelined(*model, cfg, w, ds, o), rp::MemoryError);
}

// A job's activation region is the next job's once its last micro-batch's downloads are done: the next job's first
// uploads do not wait for the gradients' downloads (they read the weight slot), which would put one job's gradient
// D2H between every two jobs of a device. The test holds device 0's download stream inside the first gradient
// download until an upload of the device's next job has completed. With the old wait (the next job's uploads behind
// every download of the job before) nothing releases it: the bounded wait runs out and the test fails. Passing
// never depends on time: the upload does not wait on the held stream.
TEST(Pipeline, ANextJobsUploadsDoNotWaitForTheGradientDownloads) {
    const Models & m = Models::get();
    Workload w;
    w.steps = 1;
    w.calls = 1;
    w.M = 4;
    struct Gate {
        std::mutex mu;
        std::condition_variable cv;
        std::string last_first_upload;  // the stage of device 0's latest micro-batch-0 activation upload
        std::string held;               // the job whose gradient download is held ("" before)
        bool released = false, timed_out = false;
    } gate;
    const std::string G_DOWN = "G down ", A = "A ";
    rp::OpHook hook = [&](const rp::OpRecord & rec) {
        if (rec.device != 0) return;
        std::unique_lock<std::mutex> lk(gate.mu);
        if (rec.stream == static_cast<int>(rp::StreamKind::ActivationUpload) && rec.name.rfind(A, 0) == 0 &&
            rec.name.size() > 4 && rec.name.compare(rec.name.size() - 4, 4, " mb0") == 0) {
            gate.last_first_upload = rec.name.substr(A.size(), rec.name.size() - A.size() - 4);
            if (!gate.held.empty() && gate.last_first_upload != gate.held) {
                gate.released = true;
                gate.cv.notify_all();
            }
        } else if (rec.stream == static_cast<int>(rp::StreamKind::Download) && rec.name.rfind(G_DOWN, 0) == 0 && gate.held.empty()) {
            gate.held = rec.name.substr(G_DOWN.size());
            gate.released = gate.last_first_upload != gate.held;  // the next job's upload already went up
            if (!gate.cv.wait_for(lk, std::chrono::seconds(120), [&] { return gate.released; })) gate.timed_out = true;
        }
    };
    DeviceSetup ds;
    ds.G = 2;
    ds.hook = hook;
    rp::PipelineOptions o;
    uniform_times(o, 18);  // one plan for the whole call: the regions are carved once, before the held download
    const RunResult r = pipelined(*m.llama, lora_cfg(), w, ds, o);
    EXPECT_GT(r.plan.bwd.size(), 2u) << "device 0 must run a job after one with gradients";
    EXPECT_FALSE(gate.held.empty()) << "no gradient download on device 0";
    EXPECT_FALSE(gate.timed_out) << "the job after " << gate.held << " on device 0 uploaded nothing while its gradients downloaded";
    EXPECT_TRUE(gate.released);
    EXPECT_EQ(first_difference(r.masters, reference(*m.llama, lora_cfg(), w)), -1);
}
