// Stage boundaries by device speed (issue #37): the dispatcher's model of a RoundPipe call, and the plans the
// runtime weighs against the planner's own when dispatch by readiness runs on devices of different speeds.
//
// With equal stages, a half-speed device's job holds every micro-batch of the chain behind it up. So the stages
// are sized for the devices the round-robin pointer gives them (planner.h split_by_speed: each takes about the
// same time there), for several stage counts and every rotation of the devices, and each such plan is run on
// a copy of the dispatcher's model (dispatcher.h): the caller takes the one that finishes soonest when it beats
// the planner's plan dispatched by readiness and its memory plan fits. Pure functions of the speeds, the
// per-layer estimates and the micro-batches: reproducible and testable without devices.
#pragma once

#include "ggml_rp/roundpipe/dispatcher.h"
#include "ggml_rp/roundpipe/plan.h"
#include "ggml_rp/roundpipe/program.h"
#include "ggml_rp/roundpipe/schedules.h"

#include <utility>
#include <vector>

namespace rp {

// What the model of a call needs: the call's micro-batches and the per-layer estimates at speed 1 (seconds per
// micro-batch of the mean size; tf forward, tb backward without its recompute, as CallPlanRequest).
struct CallModelInputs {
    const std::vector<MicroBatchInfo> * info = nullptr;
    const std::vector<double> * tf = nullptr;
    const std::vector<double> * tb = nullptr;
};

// A job's micro-batch times at speed 1: the per-layer estimates summed over its stage (forward: tf; fused: tb;
// backward: tb, and at stage grain the forwards that recompute the inputs of all but the first layer, which the
// per-layer tb leaves out; forward-only calls: tf), scaled by the micro-batch's tokens relative to the call's mean.
std::vector<double> job_task_times(const std::vector<StageDesc> & stages, RecomputeGrain grain, const CallModelInputs & in,
                                   bool forward_only, const JobSpec & spec);

// The device of a job by dispatcher `d`, whose model it advances: `bound` (>= 0), or d's choice among `allowed`.
int model_job(Dispatcher & d, const std::vector<StageDesc> & stages, RecomputeGrain grain, const CallModelInputs & in,
              bool forward_only, const JobSpec & spec, int bound, const std::vector<char> * allowed = nullptr);

// When the model's last job of a RoundPipe training call of `plan` ends, run on a copy of `d` (devices_idle as
// Dispatcher::begin_call): each job on bound[k], or by readiness where bound is null.
double predicted_call_end(const Dispatcher & d, bool devices_idle, const Plan & plan, const CallModelInputs & in,
                          const std::vector<int> * bound = nullptr);

struct SpeedPlan {
    double end = 0;               // the model's end of the call (predicted_call_end's clock)
    Plan plan;                    // stages sized by speed ("stages sized by device speed" in its notes)
    std::vector<int> devices;     // each stage's device (plan_stages order): the pointer's from `rotation` on
    int rotation = 0;             // stage k on device (d.pointer() + rotation + k) mod G
    std::pair<int, int> counts;   // its (forward, backward) stage counts, the fused tail not counted (grain: plan.grain)
};

// The plans sized by speed for the planner's `planned` (its fused tail kept), sorted by the model's end, soonest
// first. Stage counts: the planner's, finer (3/2 and 2 times: a slow device then takes fewer layers than a fast
// one where stages hold one or two) and coarser (1/2, 1/3, 1/4: a one-layer stage cannot shrink for a slow
// device, a coarser one can), forward and backward apart; then, from the best of those, every forward count with
// its backward count and every backward count with the best forward count, until neither moves (at most
// kCountRounds rounds). Whether one round of the devices' stages, each sized by its device's speed, divides the
// layers evenly decides how long the slow devices hold the chain up, and that is not monotone in the count: on
// 4 devices at speeds 1, 1, 0.5, 0.5 and 20 equal layers the best backward has 13 stages (2, 2, 1, 1 layers a
// round), a count none of the ratios gives. Each count on every rotation of the devices: the rotation decides
// where the fused tail, whose size is fixed, lands and which device the count leaves with the extra job.
// At the planner's grain, and at layer grain too where the planner's plan keeps at least kLayerGrainKept of the
// host activations layer grain keeps (every layer's input): a fast device's backward stage of several layers
// then recomputes nothing, where at stage grain the forwards that recompute the inputs of its upper layers add
// about a quarter to its work (the plan's grain says which was chosen).
constexpr int kCountRounds = 2;
constexpr double kLayerGrainKept = 0.75;
std::vector<SpeedPlan> speed_plans(const Dispatcher & d, bool devices_idle, const Plan & planned, const CallModelInputs & in);

} // namespace rp
