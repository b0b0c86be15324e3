// The job orders of the three schedules the runtime runs side by side (roundpipe.md §3.3, §13):
//
//   RoundPipe  one job per stage, in plan order (F0 .. F(f-1), FB, B1 .. B(b-1)), each over all M micro-
//              batches; jobs go to devices by the global round-robin pointer (device = pointer++ mod G);
//   GPipe      the layers split evenly into G ranges bound to devices (range d on device d, its weights
//              resident for the call): device d runs its M forwards, then its M backwards;
//   1F1B       the same binding; device d runs (G-1-d) warm-up forwards, then alternates one forward and one
//              backward, then drains its backwards.
// Both baselines are plans too (bound_plan): their stage table is F0 .. F(G'-2), FB, B1 .. B(G'-1), where
// B_k covers range G'-1-k, so one job of a baseline runs tasks of two stages.
#pragma once

#include "ggml_rp/roundpipe/plan.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rp {

enum class ScheduleKind { RoundPipe, GPipe, OneFOneB };
// "roundpipe" | "gpipe" | "1f1b"; rp::Error naming the schedule otherwise.
ScheduleKind schedule_from_name(std::string_view name);
const char * schedule_name(ScheduleKind k);

// The even split of GPipe / 1F1B: G contiguous ranges of L layers (sizes differ by at most one, the larger
// ones first), as a plan whose fused tail is the last range (validated).
Plan bound_plan(int num_layers, int num_devices, RecomputeGrain grain = RecomputeGrain::Stage);

enum class Pass { Fwd, Fused, Bwd };

// One stage of a call's plan.
struct StageDesc {
    Pass pass;
    LayerRange layers;
    std::string name;  // "F2", "FB", "B3"
    std::string cat;   // trace category: "fwd/F2", "fused/FB", "bwd/B3"
};

// The stages of a plan in dispatch order: the forward stages, FB, the backward stages.
std::vector<StageDesc> plan_stages(const Plan & plan);
// Index of FB in plan_stages(plan).
inline int fused_stage(const Plan & plan) { return static_cast<int>(plan.fwd.size()); }

// One micro-batch of one stage.
struct Task {
    int stage;
    int mb;
};

// A unit of dispatch: the tasks one device runs against one upload of `layers`' weights.
struct JobSpec {
    LayerRange layers;
    std::vector<Task> tasks;
    bool has_grads = false;  // backward or fused tasks: the job holds and downloads gradients
    std::string label;       // "F2" (RoundPipe) or "dev1" (bound schedules)
    int device = -1;         // bound schedules: the device it is bound to; RoundPipe: -1 (the pointer decides)
};

// The jobs of one call of M micro-batches under `kind`, in dispatch order.
std::vector<JobSpec> schedule_jobs(ScheduleKind kind, const Plan & plan, const std::vector<StageDesc> & stages, int M);
// The same jobs for a forward-only call (Pipeline::forward): without their backward tasks (a job left with none
// is dropped) and without gradients.
std::vector<JobSpec> forward_only_jobs(std::vector<JobSpec> jobs, const std::vector<StageDesc> & stages);

} // namespace rp
