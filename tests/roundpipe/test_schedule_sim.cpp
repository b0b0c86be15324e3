// The RoundPipe timing model (schedule_sim.h): the worked example of roundpipe.md §3.4 slot by slot, the
// round-robin pointer across iterations, "M >= G gives no steady-state bubble" (and M = G + 1 absorbing a
// hand-off latency up to t / G, roundpipe.md §3.4, §16), sync mode as back-to-back isolated iterations,
// prefetch depth 1 for weight uploads (§8.4), and the trace agreeing with the model's own bubble figure.
#include "ggml_rp/roundpipe/schedule_sim.h"
#include "ggml_rp/roundpipe/sim_presets.h"
#include "base/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

using rp::Plan;
using rp::SimConfig;
using rp::SimModel;

namespace {

std::map<std::string, rp::TraceEvent> by_name(const rp::Trace & t) {
    std::map<std::string, rp::TraceEvent> m;
    for (const rp::TraceEvent & e : t.events) m[e.name] = e;
    return m;
}

// Layers of equal cost t: forward stages of two layers (tf = t/2 each), backward stages of one (recompute
// t/2 + backward t/2), the fused tail one layer (forward t/2 + backward t/2): every job takes t per
// micro-batch. 6 layers before FB: 3 forward stages, FB, 6 backward stages.
struct Uniform {
    Plan plan = rp::plan_from_sizes({2, 2, 2}, {1, 1, 1, 1, 1, 1, 1});
    SimModel model;
    explicit Uniform(double t) {
        model.tf_ms.assign(7, t / 2);
        model.tb_ms.assign(7, t);
    }
};

} // namespace

// roundpipe.md §3.4: G = 3, M = 4, F0, F1 | FB, B1, B2, B3, every stage t per micro-batch.
//   g0: F0m0..m3 at 0..3, B1m0..m3 at 4..7, next iteration's F0m0 at 8
//   g1: F1 at 1..4, B2 at 5..8;   g2: FB at 2..5, B3 at 6..9          (in units of t)
TEST(ScheduleSim, WorkedExampleOfTheSpec) {
    const double t = 10;
    const Plan plan = rp::plan_from_sizes({1, 2}, {1, 1, 1, 1});  // layers 0 | 1,2 | FB 3 | B 2, 1, 0
    SimModel m;
    m.tf_ms = {t, t / 2, t / 2, t / 2};
    m.tb_ms = {t, t, t, t};
    SimConfig c;
    c.devices = 3;
    c.micro_batches = 4;
    c.iterations = 2;
    const rp::SimResult r = rp::simulate_roundpipe(plan, m, c);
    const auto ops = by_name(r.trace);

    struct Want {
        std::string stage;
        int device, first_slot;
    };
    for (const Want & w : {Want{"F0", 0, 0}, Want{"F1", 1, 1}, Want{"FB", 2, 2}, Want{"B1", 0, 4}, Want{"B2", 1, 5},
                           Want{"B3", 2, 6}}) {
        for (int i = 0; i < 4; ++i) {
            const bool bwd = w.stage[0] == 'B';
            const std::string name = w.stage + (bwd ? " recompute" : "") + " mb" + std::to_string(i) + " it0";
            ASSERT_TRUE(ops.count(name)) << name;
            EXPECT_EQ(ops.at(name).pid, w.device) << name;
            EXPECT_NEAR(ops.at(name).ts_us, (w.first_slot + i) * t * 1000, 1e-6) << name;
        }
    }
    // the pointer persists: 6 jobs per iteration on 3 devices, so the next F0 is on g0 again, at slot 8
    ASSERT_TRUE(ops.count("F0 mb0 it1"));
    EXPECT_EQ(ops.at("F0 mb0 it1").pid, 0);
    EXPECT_NEAR(ops.at("F0 mb0 it1").ts_us, 8 * t * 1000, 1e-6);
    EXPECT_EQ(ops.at("F1 mb0 it1").pid, 1);
    EXPECT_NEAR(r.iteration_end_ms[0], 10 * t, 1e-9);  // B3m3 ends at slot 10
}

TEST(ScheduleSim, PointerRotatesWhenJobsAreNotAMultipleOfG) {
    Uniform u(10);
    SimConfig c;
    c.devices = 4;  // 10 jobs per iteration: F0 of iteration k runs on device (10 k) mod 4
    c.micro_batches = 5;
    c.iterations = 3;
    const auto ops = by_name(rp::simulate_roundpipe(u.plan, u.model, c).trace);
    EXPECT_EQ(ops.at("F0 mb0 it0").pid, 0);
    EXPECT_EQ(ops.at("F0 mb0 it1").pid, 2);
    EXPECT_EQ(ops.at("F0 mb0 it2").pid, 0);
    EXPECT_EQ(ops.at("FB mb0 it1").pid, (10 + 3) % 4);
    EXPECT_EQ(rp::steady_window(10, 4), 2);
    EXPECT_EQ(rp::steady_window(15, 8), 8);
    EXPECT_EQ(rp::steady_window(16, 8), 1);
}

TEST(ScheduleSim, NoSteadyStateBubbleWhenMicroBatchesAtLeastDevices) {
    Uniform u(10);
    for (int G : {2, 3, 4}) {
        for (int M : {G, G + 1, 2 * G}) {
            SimConfig c;
            c.devices = G;
            c.micro_batches = M;
            c.iterations = 2 + 8 * rp::steady_window(u.plan.num_stages(), G);
            const rp::SimResult r = rp::simulate_roundpipe(u.plan, u.model, c);
            EXPECT_NEAR(r.steady_bubble_ratio, 0, 1e-9) << "G " << G << " M " << M;
            EXPECT_NEAR(r.work_per_iteration_ms, 10.0 * M * u.plan.num_stages(), 1e-9);
        }
        SimConfig c;
        c.devices = G;
        c.micro_batches = G - 1;
        c.iterations = 2 + 8 * rp::steady_window(u.plan.num_stages(), G);
        EXPECT_GT(rp::simulate_roundpipe(u.plan, u.model, c).steady_bubble_ratio, 0.05) << "G " << G << " M " << G - 1;
    }
}

// Each hand-off costs h (D2H h/2 + H2D h/2). A forward chain then advances t + h per job, a device t per
// micro-batch: with M = G the chain is the bottleneck (a bubble of 1 - t / (t + h) on forward-bound
// stretches), with M = G + 1 and h <= t / G the devices are (M t / G >= t + h).
TEST(ScheduleSim, OneExtraMicroBatchAbsorbsTheHandOffLatency) {
    Uniform u(10);
    const int G = 4;
    SimConfig c;
    c.devices = G;
    c.hop_ms = 2.0;  // <= t / G = 2.5
    c.iterations = 2 + 8 * rp::steady_window(u.plan.num_stages(), G);
    c.micro_batches = G;
    const rp::SimResult tight = rp::simulate_roundpipe(u.plan, u.model, c);
    EXPECT_GT(tight.steady_bubble_ratio, 0.01);
    c.micro_batches = G + 1;
    const rp::SimResult loose = rp::simulate_roundpipe(u.plan, u.model, c);
    EXPECT_NEAR(loose.steady_bubble_ratio, 0, 1e-9);
    EXPECT_GT(loose.exposed_comm_fraction, 0);  // the very first hand-offs are exposed
}

TEST(ScheduleSim, SyncModeRunsIsolatedIterationsBackToBack) {
    Uniform u(10);
    SimConfig c;
    c.devices = 4;
    c.micro_batches = 5;
    c.hop_ms = 1;
    c.iterations = 1;
    const rp::SimResult alone = rp::simulate_roundpipe(u.plan, u.model, c);
    c.iterations = 5;
    c.async_optimizer = false;
    const rp::SimResult sync = rp::simulate_roundpipe(u.plan, u.model, c);
    EXPECT_NEAR(sync.steady_iteration_ms, alone.makespan_ms, 1e-9);
    EXPECT_NEAR(sync.steady_bubble_ratio, alone.bubble_ratio, 1e-12);
    c.async_optimizer = true;
    const rp::SimResult async = rp::simulate_roundpipe(u.plan, u.model, c);
    EXPECT_LT(async.steady_iteration_ms, sync.steady_iteration_ms);
    // with a slow optimizer the async step still overlaps, the sync one adds it to every iteration
    c.optimizer_ms = 30;
    c.async_optimizer = false;
    EXPECT_NEAR(rp::simulate_roundpipe(u.plan, u.model, c).steady_iteration_ms, alone.makespan_ms + 30, 1e-9);
}

TEST(ScheduleSim, WeightUploadsPrefetchOneJobAheadAndTheTraceAgrees) {
    Uniform u(10);
    u.model.weight_bytes.assign(7, 40e6);  // 40 MB per layer over 32 GB/s: 1.25 ms, 2.5 ms per stage
    u.model.grad_bytes.assign(7, 1e6);
    SimConfig c;
    c.devices = 3;
    c.micro_batches = 4;
    c.hop_ms = 0.5;
    c.link = rp::LinkModel::parse("32GB/s,10us");
    c.iterations = 1;
    const rp::SimResult r = rp::simulate_roundpipe(u.plan, u.model, c);
    const auto ops = by_name(r.trace);

    // jobs in dispatch order and their devices: job j on device j mod 3
    const std::vector<std::string> stages = {"F0", "F1", "F2", "FB", "B1", "B2", "B3", "B4", "B5", "B6"};
    for (size_t j = 0; j < stages.size(); ++j) {
        const std::string w = stages[j] + " weights it0";
        ASSERT_TRUE(ops.count(w)) << w;
        EXPECT_EQ(ops.at(w).pid, static_cast<int>(j % 3));
        const double layers = stages[j][0] == 'F' && stages[j] != "FB" ? 2 : 1;
        EXPECT_NEAR(ops.at(w).dur_us, (layers * 40e6 / 32e9 + 10e-6) * 1e6, 1e-6);
        if (j >= 6) {  // the job two before on the same device must have finished computing
            const rp::TraceEvent & last = ops.at(stages[j - 6] + " mb3 it0");
            EXPECT_GE(ops.at(w).ts_us, last.end_us() - 1e-9) << w;
        }
        // and every compute op of the job starts after its weights arrived
        EXPECT_GE(ops.at(stages[j] + " mb0 it0").ts_us, ops.at(w).end_us() - 1e-9);
    }
    EXPECT_TRUE(ops.count("B3 weight grads it0"));
    const rp::TraceStats st = rp::analyse_trace(r.trace);
    EXPECT_NEAR(st.bubble_ratio, r.bubble_ratio, 1e-9);
    EXPECT_NEAR(st.span_us(), r.makespan_ms * 1000, 1e-6);
    EXPECT_NEAR(st.exposed_comm_fraction, r.exposed_comm_fraction, 1e-12);
}

TEST(ScheduleSim, RejectsAModelThatDoesNotMatchThePlan) {
    Uniform u(10);
    SimConfig c;
    SimModel bad = u.model;
    bad.tb_ms.pop_back();
    EXPECT_THROW(rp::simulate_roundpipe(u.plan, bad, c), rp::Error);
    bad = u.model;
    bad.tf_ms.push_back(1);
    bad.tb_ms.push_back(1);
    EXPECT_THROW(rp::simulate_roundpipe(u.plan, bad, c), rp::Error);  // the plan covers 7 layers
    c.devices = 0;
    EXPECT_THROW(rp::simulate_roundpipe(u.plan, u.model, c), rp::Error);
}

// Data parallel (SimConfig::nodes): one all-reduce per bucket on the inter-node link, two rounds of
// (R - 1) / R of its bytes each, starting once its layers are handed off; the update waits for the last.
TEST(ScheduleSim, DataParallelAllReduceOverlapsAndThenDelaysTheUpdate) {
    Uniform u(10);
    u.model.grad_bytes.assign(7, 1e6);  // 1 MB of gradients per layer
    SimConfig c;
    c.devices = 4;
    c.micro_batches = 5;
    c.iterations = 6;
    c.async_optimizer = false;
    const rp::SimResult one = rp::simulate_roundpipe(u.plan, u.model, c);
    c.nodes = 1;  // nodes = 1 is the single-server model exactly
    EXPECT_EQ(rp::simulate_roundpipe(u.plan, u.model, c).steady_iteration_ms, one.steady_iteration_ms);

    c.nodes = 2;
    c.bucket_bytes = 1;  // a bucket per layer
    c.node_link.bytes_per_s = 1e9;  // 1 GB/s: each layer 2 x 0.5 MB / 1 GB/s = 1 ms
    const rp::SimResult fast = rp::simulate_roundpipe(u.plan, u.model, c);
    EXPECT_NEAR(fast.allreduce_ms_per_iteration, 7.0, 1e-9);
    size_t buckets = 0;
    for (const rp::TraceEvent & e : fast.trace.events) buckets += e.tid == rp::kAllReduceStream;
    EXPECT_EQ(buckets, 7u * 6);
    // the deep layers' all-reduces hide behind the backward of the shallow ones: only the last is exposed
    EXPECT_LT(fast.steady_iteration_ms, one.steady_iteration_ms + 7.0);
    EXPECT_GE(fast.steady_iteration_ms, one.steady_iteration_ms + 1.0 - 1e-9);
    EXPECT_NEAR(fast.exposed_allreduce_ms_per_iteration, fast.steady_iteration_ms - one.steady_iteration_ms, 1e-6);
    // a link so slow that the all-reduce dominates: the iteration is its length plus what cannot overlap
    c.node_link.bytes_per_s = 1e6;  // 1 s per layer
    const rp::SimResult slow = rp::simulate_roundpipe(u.plan, u.model, c);
    EXPECT_GT(slow.steady_iteration_ms, 7000.0);
    // 4 nodes send 3/4 of the bytes per round instead of 1/2
    c.nodes = 4;
    EXPECT_NEAR(rp::simulate_roundpipe(u.plan, u.model, c).allreduce_ms_per_iteration, 1.5 * slow.allreduce_ms_per_iteration, 1e-6);
    // nodes without gradient sizes are refused
    u.model.grad_bytes.clear();
    EXPECT_THROW(rp::simulate_roundpipe(u.plan, u.model, c), rp::Error);
}

// Dispatch by readiness (issue #37, in the timing model): on identical devices and jobs of one length it is the
// round-robin assignment; with a straggler (one device at speed 0.25) it gives that device fewer jobs and the
// iteration comes much closer to the ideal (the work over the devices' summed speed) than the fixed pointer, which
// waits for the straggler on every round.
TEST(ScheduleSim, DispatchByReadinessAroundAStraggler) {
    Uniform u(10);
    SimConfig c;
    c.devices = 4;
    c.micro_batches = 8;
    c.iterations = 2 + 8 * rp::steady_window(u.plan.num_stages(), 4);
    const rp::SimResult rr = rp::simulate_roundpipe(u.plan, u.model, c);
    c.dispatch = rp::SimDispatch::Ready;
    const rp::SimResult ready = rp::simulate_roundpipe(u.plan, u.model, c);
    EXPECT_EQ(ready.jobs_per_device, rr.jobs_per_device);
    EXPECT_NEAR(ready.steady_iteration_ms, rr.steady_iteration_ms, 1e-9);
    ASSERT_EQ(ready.trace.events.size(), rr.trace.events.size());
    for (size_t i = 0; i < rr.trace.events.size(); ++i) EXPECT_EQ(ready.trace.events[i].pid, rr.trace.events[i].pid) << rr.trace.events[i].name;
    EXPECT_NEAR(rr.ideal_iteration_ms, rr.work_per_iteration_ms / 4, 1e-9);

    c.device_speed = {1, 1, 1, 0.25};
    const rp::SimResult straggled = rp::simulate_roundpipe(u.plan, u.model, c);
    c.dispatch = rp::SimDispatch::RoundRobin;
    const rp::SimResult fixed = rp::simulate_roundpipe(u.plan, u.model, c);
    EXPECT_NEAR(straggled.work_per_iteration_ms, rr.work_per_iteration_ms, 1e-9);  // (work counts at speed 1)
    EXPECT_NEAR(straggled.ideal_iteration_ms, rr.work_per_iteration_ms / 3.25, 1e-9);
    const std::vector<int> & jobs = straggled.jobs_per_device;
    EXPECT_LT(jobs[3], (jobs[0] + jobs[1] + jobs[2] + jobs[3]) / 4) << "the straggler kept its round-robin share";
    EXPECT_EQ(fixed.jobs_per_device, rr.jobs_per_device);
    std::printf("[ sim ] straggler at 0.25 of 4 devices: round-robin %.1f ms, by readiness %.1f ms, ideal %.1f ms; jobs %d,%d,%d,%d\n",
                fixed.steady_iteration_ms, straggled.steady_iteration_ms, straggled.ideal_iteration_ms, jobs[0], jobs[1], jobs[2], jobs[3]);
    EXPECT_LT(straggled.steady_iteration_ms, 0.75 * fixed.steady_iteration_ms);
    EXPECT_GE(straggled.steady_iteration_ms, straggled.ideal_iteration_ms);

    // One device at half speed alone: every compute takes twice as long.
    SimConfig one;
    one.devices = 1;
    one.micro_batches = 2;
    one.iterations = 1;
    const double t1 = rp::simulate_roundpipe(u.plan, u.model, one).makespan_ms;
    one.device_speed = {0.5};
    EXPECT_NEAR(rp::simulate_roundpipe(u.plan, u.model, one).makespan_ms, 2 * t1, 1e-9);
    one.device_speed = {0.5, 1};
    EXPECT_THROW(rp::simulate_roundpipe(u.plan, u.model, one), rp::Error);
    one.device_speed = {0};
    EXPECT_THROW(rp::simulate_roundpipe(u.plan, u.model, one), rp::Error);
}

// SimConfig::size_by_speed: on half-speed devices each iteration runs the stages the runtime would size by speed
// (speed_plans.h), bound to their devices, and the steady state comes near the ideal where dispatch by readiness
// of the planner's stages and round-robin stay far from it; on identical devices nothing changes; a pinned plan
// (size_by_speed false) is run as given.
TEST(ScheduleSim, StagesSizedBySpeedAsTheRuntimeSizesThem) {
    SimModel model;  // 20 blocks between an embedding and a head, backward twice the forward
    model.tf_ms.assign(22, 1.0);
    model.tb_ms.assign(22, 3.0);
    model.tf_ms.front() = model.tb_ms.front() = 0;
    std::vector<int> fwd(10, 2), bwd(22, 1);
    fwd.front() = 3;
    const Plan plan = rp::plan_from_sizes(fwd, bwd);
    SimConfig c;
    c.devices = 4;
    c.micro_batches = 8;
    c.dispatch = rp::SimDispatch::Ready;
    c.iterations = 2 + 8 * rp::steady_window(plan.num_stages(), 4);
    const rp::SimResult same = rp::simulate_roundpipe(plan, model, c);
    c.size_by_speed = true;
    const rp::SimResult same_sized = rp::simulate_roundpipe(plan, model, c);
    EXPECT_EQ(same_sized.sized_iterations, 0);  // identical devices: the pointer and the planner's stages
    EXPECT_EQ(same_sized.steady_iteration_ms, same.steady_iteration_ms);
    EXPECT_EQ(same_sized.jobs_per_device, same.jobs_per_device);

    c.device_speed = {1, 1, 0.5, 0.5};
    const rp::SimResult sized = rp::simulate_roundpipe(plan, model, c);
    c.size_by_speed = false;
    const rp::SimResult ready = rp::simulate_roundpipe(plan, model, c);
    c.dispatch = rp::SimDispatch::RoundRobin;
    const rp::SimResult rr = rp::simulate_roundpipe(plan, model, c);
    EXPECT_EQ(sized.sized_iterations, c.iterations);
    EXPECT_EQ(ready.sized_iterations, 0);
    EXPECT_EQ(rr.sized_iterations, 0);
    std::printf("[ sim ] 4 devices at 1, 1, 0.5, 0.5, steady / ideal: round-robin %.2f, by readiness %.2f, stages sized by speed %.2f; "
                "identical devices %.2f\n",
                rr.steady_iteration_ms / rr.ideal_iteration_ms, ready.steady_iteration_ms / ready.ideal_iteration_ms,
                sized.steady_iteration_ms / sized.ideal_iteration_ms, same.steady_iteration_ms / same.ideal_iteration_ms);
    EXPECT_GT(rr.steady_iteration_ms, 1.3 * rr.ideal_iteration_ms);
    EXPECT_GT(ready.steady_iteration_ms, 1.2 * ready.ideal_iteration_ms);
    EXPECT_LT(sized.steady_iteration_ms, 1.1 * sized.ideal_iteration_ms);
    EXPECT_LT(sized.jobs_per_device[2] + sized.jobs_per_device[3], sized.jobs_per_device[0] + sized.jobs_per_device[1] + 8)
        << "sized stages: the slow devices take no more jobs than the fast ones";
}

// rp-simulate --devices: a mixed machine as named GPUs with counts (or speeds), one speed per device in order,
// relative to the RTX 4090 the presets' times are an RTX 4090's. The A800's is the paper's measured RoundPipe
// throughput ratio over the dense models (roundpipe.md 13.3 / 13.2): 84692/65417, 28427/24275, 6301/5516.
TEST(ScheduleSim, NamedGpuMixesGiveOneSpeedPerDevice) {
    const double a800 = (84692.0 / 65417 + 28427.0 / 24275 + 6301.0 / 5516) / 3;
    EXPECT_NEAR(a800, 1.20, 0.005);
    EXPECT_EQ(rp::parse_device_mix("4090x2,a800"), (std::vector<double>{1.0, 1.0, a800}));
    EXPECT_EQ(rp::parse_device_mix("1x2,0.5x3"), (std::vector<double>{1, 1, 0.5, 0.5, 0.5}));
    const std::vector<double> mixed = rp::parse_device_mix("4090x4,3090x4");
    ASSERT_EQ(mixed.size(), 8u);
    EXPECT_EQ(mixed[3], 1.0);
    EXPECT_DOUBLE_EQ(mixed[4], 71.0 / 165.2);
    for (const rp::GpuSpeed & g : rp::gpu_speeds()) {
        EXPECT_GT(g.speed, 0) << g.key;
        EXPECT_FALSE(g.source.empty()) << g.key;
    }
    for (const std::string bad : {"4090x0", "4090x", "x4", "5090x2", "0x3", "4090x2,", "-1", "4090x2.5"}) {
        try {
            rp::parse_device_mix(bad);
            ADD_FAILURE() << bad << " was accepted";
        } catch (const rp::Error & e) {
            EXPECT_NE(std::string(e.what()).find("device mix '" + bad + "'"), std::string::npos) << e.what();
        }
    }
}
