// Stage boundaries by device speed (ggml_rp/roundpipe/speed_plans.h, issue #37) on the dispatcher's model alone:
// a job's times, the model's end of a call (the runtime's jobs' end, without building them), and the plans sized
// by speed — valid plans on the pointer's devices, sorted by the model's end, and on a machine of half-speed devices
// close to the bound no schedule beats (the call's work over the summed speed), where the stage counts of the fixed
// ratios alone stay far from it.
#include "ggml_rp/roundpipe/speed_plans.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace {

using rp::CallModelInputs;
using rp::Dispatcher;
using rp::DispatchKind;
using rp::MicroBatchInfo;
using rp::Plan;

std::vector<MicroBatchInfo> micro_batches(int M, int64_t tokens = 64) {
    std::vector<MicroBatchInfo> mbs(static_cast<size_t>(M));
    for (MicroBatchInfo & m : mbs) {
        m.seq_len = tokens;
        m.n_seq = 1;
    }
    return mbs;
}

// The layers of a 20-block model as the runtime plans it: the embedding, 20 equal blocks, the head (tf forward,
// tb backward without its recompute, in seconds per micro-batch), and the planner's plan for it: forward stages of
// two layers, backward stages of one, the head as the fused tail.
struct Model20 {
    std::vector<double> tf, tb;
    Plan planned;
    Model20() {
        tf.assign(22, 0.002);
        tb.assign(22, 0.004);
        tf.front() = tb.front() = 1e-5;
        tf.back() = 0.0002;
        tb.back() = 0.0006;
        planned = rp::plan_from_sizes({3, 2, 2, 2, 2, 2, 2, 2, 2, 2}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2});
    }
    // The call's work at speed 1 on plan p: every micro-batch through every job.
    double work(const Plan & p, const CallModelInputs & in) const {
        const std::vector<rp::StageDesc> stages = rp::plan_stages(p);
        double w = 0;
        for (const rp::JobSpec & j : rp::schedule_jobs(rp::ScheduleKind::RoundPipe, p, stages, static_cast<int>(in.info->size())))
            for (double t : rp::job_task_times(stages, p.grain, in, false, j)) w += t;
        return w;
    }
};

TEST(SpeedPlans, JobTimesSumTheStageRecomputeAndScaleByTokens) {
    const std::vector<double> tf = {1, 2, 3, 4}, tb = {10, 20, 30, 40};
    std::vector<MicroBatchInfo> info = micro_batches(2);
    info[1].seq_len = 192;  // three times the first: the mean is 128
    const CallModelInputs in{&info, &tf, &tb};
    const Plan p = rp::plan_from_sizes({3}, {1, 3});
    const std::vector<rp::StageDesc> stages = rp::plan_stages(p);
    const std::vector<rp::JobSpec> jobs = rp::schedule_jobs(rp::ScheduleKind::RoundPipe, p, stages, 2);
    ASSERT_EQ(jobs.size(), 3u);
    // F [0,3): tf; FB [3,4): tb; B [0,3): tb plus the forwards recomputing the inputs of layers 1 and 2.
    EXPECT_EQ(rp::job_task_times(stages, p.grain, in, false, jobs[0]), (std::vector<double>{6 * 0.5, 6 * 1.5}));
    EXPECT_EQ(rp::job_task_times(stages, p.grain, in, false, jobs[1]), (std::vector<double>{40 * 0.5, 40 * 1.5}));
    EXPECT_EQ(rp::job_task_times(stages, p.grain, in, false, jobs[2]), (std::vector<double>{(60 + 3) * 0.5, (60 + 3) * 1.5}));
    // Layer grain recomputes each layer's input from its checkpoint: no forwards added. Forward-only: tf.
    EXPECT_EQ(rp::job_task_times(stages, rp::RecomputeGrain::Layer, in, false, jobs[2]), (std::vector<double>{60 * 0.5, 60 * 1.5}));
    EXPECT_EQ(rp::job_task_times(stages, p.grain, in, true, jobs[2]), (std::vector<double>{6 * 0.5, 6 * 1.5}));
}

TEST(SpeedPlans, ThePredictedEndIsTheDispatchersAndLeavesItUntouched) {
    const Model20 m;
    const std::vector<MicroBatchInfo> info = micro_batches(8);
    const CallModelInputs in{&info, &m.tf, &m.tb};
    const Dispatcher d(4, DispatchKind::Ready, {1, 1, 1, 1});
    // Identical devices on the pointer: the chain of 31 jobs, 8 micro-batches each, 4 at a time, ends after the
    // call's work over 4 devices and within one job's fill and drain of it.
    const double end = rp::predicted_call_end(d, true, m.planned, in);
    const double w = m.work(m.planned, in);
    EXPECT_GT(end, w / 4);
    EXPECT_LT(end, w / 4 * 1.25) << end << " work " << w;
    EXPECT_EQ(d.predicted_end(), 0);  // a copy ran the call
    EXPECT_EQ(d.pointer(), 0);
    std::vector<int> bound(static_cast<size_t>(m.planned.num_stages()));
    for (size_t k = 0; k < bound.size(); ++k) bound[k] = static_cast<int>(k % 4);
    EXPECT_EQ(rp::predicted_call_end(d, true, m.planned, in, &bound), end);  // the pointer's devices, bound
}

// predicted_call_end runs the RoundPipe jobs without building them: it equals the runtime's way, the jobs of
// schedule_jobs each through model_job on a copy of the dispatcher, for micro-batches of different sizes, at stage
// and layer grain, bound to devices and by readiness, sync and async.
TEST(SpeedPlans, ThePredictedEndIsTheJobsEnd) {
    const Model20 m;
    std::vector<MicroBatchInfo> info = micro_batches(6);
    info[1].seq_len = 17, info[4].seq_len = 200;
    const CallModelInputs in{&info, &m.tf, &m.tb};
    Dispatcher d(4, DispatchKind::Ready, {1, 1, 0.5, 0.25});
    d.begin_call(true);
    d.pick({1, 2, 3}, false);  // a model that is not at rest
    for (rp::RecomputeGrain grain : {rp::RecomputeGrain::Stage, rp::RecomputeGrain::Layer}) {
        Plan p = m.planned;
        p.grain = grain;
        const std::vector<rp::StageDesc> stages = rp::plan_stages(p);
        const std::vector<rp::JobSpec> jobs = rp::schedule_jobs(rp::ScheduleKind::RoundPipe, p, stages, static_cast<int>(info.size()));
        std::vector<int> bound(jobs.size());
        for (size_t k = 0; k < bound.size(); ++k) bound[k] = static_cast<int>((k * 3) % 4);
        for (const bool idle : {true, false})
            for (const bool bind : {true, false}) {
                Dispatcher trial = d;
                trial.begin_call(idle);
                for (size_t k = 0; k < jobs.size(); ++k) rp::model_job(trial, stages, p.grain, in, false, jobs[k], bind ? bound[k] : -1);
                EXPECT_EQ(rp::predicted_call_end(d, idle, p, in, bind ? &bound : nullptr), trial.predicted_end())
                    << p.describe() << (idle ? " idle" : "") << (bind ? " bound" : " by readiness");
            }
    }
}

TEST(SpeedPlans, HalfSpeedDevicesGetStagesThatKeepTheChainNearTheBound) {
    const Model20 m;
    const std::vector<MicroBatchInfo> info = micro_batches(8);
    const CallModelInputs in{&info, &m.tf, &m.tb};
    const std::vector<double> speeds = {1, 1, 0.5, 0.5};
    const Dispatcher d(4, DispatchKind::Ready, speeds);
    const std::vector<rp::SpeedPlan> plans = rp::speed_plans(d, true, m.planned, in);
    ASSERT_FALSE(plans.empty());
    std::set<std::tuple<rp::RecomputeGrain, int, int>> counts;
    for (size_t i = 0; i < plans.size(); ++i) {
        const rp::SpeedPlan & s = plans[i];
        SCOPED_TRACE(s.plan.describe());
        EXPECT_NO_THROW(rp::validate_plan(s.plan, 22));
        EXPECT_EQ(s.plan.bwd.front(), m.planned.bwd.front());  // the fused tail as planned
        EXPECT_EQ(static_cast<int>(s.plan.fwd.size()), s.counts.first);
        EXPECT_EQ(static_cast<int>(s.plan.bwd.size()) - 1, s.counts.second);
        ASSERT_EQ(static_cast<int>(s.devices.size()), s.plan.num_stages());
        for (size_t k = 0; k < s.devices.size(); ++k) EXPECT_EQ(s.devices[k], static_cast<int>((static_cast<size_t>(s.rotation) + k) % 4));
        EXPECT_EQ(s.end, rp::predicted_call_end(d, true, s.plan, in, &s.devices));
        if (i > 0) {
            EXPECT_LE(plans[i - 1].end, s.end);
        }
        EXPECT_NE(std::find(s.plan.notes.begin(), s.plan.notes.end(), "stages sized by device speed"), s.plan.notes.end());
        counts.insert({s.plan.grain, s.counts.first, s.counts.second});
    }
    // The fixed ratios' counts and the sweeps over every count, at both grains (the planner's plan keeps the
    // inputs of all but one layer), each on the 4 rotations.
    EXPECT_EQ(plans.size(), counts.size() * 4);
    for (rp::RecomputeGrain g : {rp::RecomputeGrain::Stage, rp::RecomputeGrain::Layer})
        EXPECT_TRUE(counts.count({g, 10, 20}) && counts.count({g, 3, 5}) && counts.count({g, 15, 21})) << counts.size() << " counts";

    // The bound: the planner's plan's work over the summed speed (no schedule finishes sooner), and what 4
    // identical devices of speed 3/4 take (the same fill and drain). Against the latter: dispatch by readiness of
    // the planner's stages; the best of the fixed ratios' counts and the best of every count, at stage grain (a
    // fast device's two-block backward stage recomputes a forward: about a quarter more work) and at layer grain.
    const double bound = m.work(m.planned, in) / 3;
    const double same = rp::predicted_call_end(Dispatcher(4, DispatchKind::Ready, {1, 1, 1, 1}), true, m.planned, in) * 4 / 3;
    const double by_readiness = rp::predicted_call_end(d, true, m.planned, in);
    // (the planner's 10 forward and 20 backward stages by 1, 3/2, 2, 1/2, 1/3, 1/4, at most the 21 layers before the tail)
    std::set<std::pair<int, int>> ratio_counts;
    for (int fc : {10, 15, 20, 5, 3})
        for (int bc : {20, 21, 10, 7, 5}) ratio_counts.insert({fc, bc});
    double ratios_best[2] = {1e30, 1e30}, every_best[2] = {1e30, 1e30};
    for (const rp::SpeedPlan & s : plans) {
        const int g = s.plan.grain == rp::RecomputeGrain::Layer;
        every_best[g] = std::min(every_best[g], s.end);
        if (ratio_counts.count(s.counts)) ratios_best[g] = std::min(ratios_best[g], s.end);
    }
    std::printf("[ speed plans ] 4 devices at 1, 1, 0.5, 0.5, against identical devices of the same summed speed (the bound x %.2f): the "
                "planner's stages by readiness %.2fx; the fixed ratios' counts %.2fx at stage grain, %.2fx at layer grain; every count "
                "%.2fx, %.2fx; chosen %s\n",
                same / bound, by_readiness / same, ratios_best[0] / same, ratios_best[1] / same, every_best[0] / same, every_best[1] / same,
                plans.front().plan.describe().c_str());
    EXPECT_GT(same, bound);
    // Measured: 1.38, 1.26, 1.10, 1.12, 1.03.
    EXPECT_GT(by_readiness, 1.3 * same);
    EXPECT_GT(ratios_best[0], 1.2 * same);
    EXPECT_GT(ratios_best[1], 1.07 * same);
    EXPECT_LT(every_best[0], 1.15 * same);
    EXPECT_LT(every_best[1], 1.05 * same);
    EXPECT_EQ(plans.front().plan.grain, rp::RecomputeGrain::Layer);
    // The backward stages of the best plan (two thirds of the work) take about as long on their devices as each
    // other: above the embedding, a fast device's hold two blocks where a slow device's hold one.
    const std::vector<rp::StageDesc> stages = rp::plan_stages(plans.front().plan);
    for (size_t k = 0; k + 1 < stages.size(); ++k) {
        if (stages[k].pass != rp::Pass::Bwd) continue;
        EXPECT_EQ(stages[k].layers.size(), speeds[static_cast<size_t>(plans.front().devices[k])] == 1 ? 2 : 1) << stages[k].name;
    }
}

// Where the planner's plan keeps few layers' inputs (backward stages of four layers), layer grain would keep
// every one: not tried.
TEST(SpeedPlans, LayerGrainOnlyWhereThePlannersPlanKeepsMostInputs) {
    Model20 m;
    m.planned = rp::plan_from_sizes({5, 4, 4, 4, 4}, {1, 4, 4, 4, 4, 5});
    const std::vector<MicroBatchInfo> info = micro_batches(8);
    const CallModelInputs in{&info, &m.tf, &m.tb};
    const Dispatcher d(4, DispatchKind::Ready, {1, 1, 0.5, 0.5});
    const std::vector<rp::SpeedPlan> plans = rp::speed_plans(d, true, m.planned, in);
    ASSERT_FALSE(plans.empty());
    for (const rp::SpeedPlan & s : plans) EXPECT_EQ(s.plan.grain, rp::RecomputeGrain::Stage) << s.plan.describe();
    // A plan already at layer grain stays there.
    m.planned.grain = rp::RecomputeGrain::Layer;
    for (const rp::SpeedPlan & s : rp::speed_plans(d, true, m.planned, in)) EXPECT_EQ(s.plan.grain, rp::RecomputeGrain::Layer);
}

} // namespace
