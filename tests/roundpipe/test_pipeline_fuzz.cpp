// Race fuzzing of the RoundPipe runtime (roundpipe.md §16): every stream of every CPU virtual device sleeps a
// random time before each operation, and the device and optimizer threads sleep between their steps; each
// seed must still end bit-identical to the single-device reference, with no protocol violation; every third seed
// runs a forward-only call (Pipeline::forward) before each training call, whose loss must be the training call's;
// every sixth runs a mixed machine (every other device at half speed, jobs dispatched by readiness). CI also runs
// this program under ThreadSanitizer (RP_OPENMP=OFF). RP_FUZZ_SEEDS overrides the number of seeds (>= 200).
#include "tests/roundpipe/pipeline_util.h"

#include <gtest/gtest.h>

#include <cstdlib>

using namespace rp_pipe_test;

namespace {

// A 4-layer llama: small enough for hundreds of seeds.
const rp::Model & small_model() {
    static rp_test::TempDir dir;
    static std::unique_ptr<rp::Model> model = [] {
        rp::SynthSpec s;
        s.vocab_from = rp_test::shared_dir() + "/models/stories260K.gguf";
        s.n_embd = 32;
        s.n_head = 2;
        s.n_head_kv = 1;
        s.head_dim = 16;
        s.n_ff = 48;
        s.n_layer = 4;
        s.seed = 3;
        rp::write_synth_model(s, dir.file("llama4.gguf"));
        return rp::Model::load(dir.file("llama4.gguf"));
    }();
    return *model;
}

int seeds() {
    const char * e = std::getenv("RP_FUZZ_SEEDS");
    const int n = e ? std::atoi(e) : 200;
    return n < 200 ? 200 : n;
}

} // namespace

TEST(PipelineFuzz, RandomDelaysNeverChangeTheBits) {
    const rp::Model & model = small_model();
    Workload w;
    w.steps = 2;
    w.calls = 2;
    w.M = 3;
    w.T = 8;
    rp::FinetuneConfig lora;
    lora.lora_rank = 2;
    lora.lora_dropout = 0.25f;  // recompute on another device must regenerate the same masks
    rp::FinetuneConfig full;
    full.full = true;
    const auto ref_lora = reference(model, lora, w);
    const auto ref_full = reference(model, full, w);
    const auto ref_async = async_reference(model, lora, w);
    const int n = seeds();
    int failures = 0, resident_runs = 0, streamed_runs = 0;  // LoRA runs whose frozen weights stayed / streamed
    for (int seed = 1; seed <= n && failures < 3; ++seed) {
        rp::PipelineOptions o;
        o.fuzz_seed = static_cast<uint64_t>(seed);
        o.fuzz_max_delay_us = 40;
        o.instrument = seed % 4 == 0;
        o.async = seed % 5 == 0;
        o.grain = seed % 3 == 0 ? rp::RecomputeGrain::Layer : rp::RecomputeGrain::Stage;
        o.schedule = seed % 7 == 0 ? rp::ScheduleKind::OneFOneB : (seed % 11 == 0 ? rp::ScheduleKind::GPipe : rp::ScheduleKind::RoundPipe);
        if (o.async) o.schedule = rp::ScheduleKind::RoundPipe;
        const bool use_full = !o.async && seed % 2 == 0;
        o.resident_weights = (seed / 2) % 2 == 0;  // LoRA runs alternate: frozen weights resident, streamed
        DeviceSetup ds;
        ds.G = 1 + seed % 4;
        // The bound schedules keep a device's whole range resident (two weight slots of it): more memory.
        ds.memory = size_t(o.schedule == rp::ScheduleKind::RoundPipe ? 1 : 2) << 20;
        ds.delay_seed = static_cast<uint64_t>(seed) * 1000;
        ds.max_delay_us = 40;
        if (seed % 6 == 5 && ds.G > 1) {  // a mixed machine: every other device at half speed, dispatch by readiness
            for (int d = 0; d < ds.G; ++d) ds.speeds.push_back(d % 2 ? 0.5 : 1.0);
            o.device_speed = ds.speeds;
        }
        Workload wf = w;
        wf.forward_first = seed % 3 == 1;  // forward-only calls (a reference pass, an evaluation) between the training calls
        const RunResult r = pipelined(model, use_full ? full : lora, wf, ds, o);
        const auto & ref = o.async ? ref_async : (use_full ? ref_full : ref_lora);
        const int diff = first_difference(r.masters, ref);
        EXPECT_EQ(diff, -1) << "seed " << seed << " G=" << ds.G << " " << rp::schedule_name(o.schedule)
                            << (o.async ? " async" : " sync") << (use_full ? " full" : " lora") << " plan " << r.plan.describe();
        EXPECT_EQ(r.checks.flag_violations, 0) << "seed " << seed;
        EXPECT_EQ(r.forward_mismatches, 0) << "seed " << seed << ": a forward-only call's loss differs from its training call's";
        if (o.instrument) {
            EXPECT_EQ(r.checks.weight_version_mismatches, 0) << "seed " << seed;
            EXPECT_EQ(r.checks.grad_slot_errors, 0) << "seed " << seed;
            EXPECT_EQ(r.checks.priority_violations, 0) << "seed " << seed;
        }
        failures += diff != -1;
        if (!use_full) (r.memory.resident > 0 ? resident_runs : streamed_runs) += 1;
    }
    EXPECT_GE(resident_runs, n / 10);
    EXPECT_GE(streamed_runs, n / 10);
}
