// The plan of a call, chosen so that it fits the devices (roundpipe.md §11, architecture.md §7).
//
// The partitioner (planner.h) trades stage time against stage memory with a per-stage cap; the memory model
// (memory_plan.h) gives the exact bytes a plan takes on a device. The call planner joins them:
//   1. cap = the device's memory, the partitioner's plan, its exact memory;
//   2. while the plan does not fit: a smaller cap (scaled by how far it missed, at least 10% less), again;
//   3. when the partitioner cannot go smaller, the minimum-memory plan: one layer per stage, FB = the head;
//   4. when even that does not fit: rp::Error (MemoryError) naming the device, the bytes it has, what the
//      smallest plan needs region by region (the job, the program), and the largest seq_len that would fit.
// With `resident` (and frozen tensors in the program), steps 1-2 first run with every frozen weight kept on
// the device (memory_plan.h: the resident region; the partitioner gets what is left beside it): a plan that
// fits so uploads only the trainable tensors with each job. Only when none does, the streamed plans above.
// A pinned plan and the bound schedules' plans are checked the same way (step 1 only).
// Mixed memory (devices of different sizes, RoundPipe): every device runs every job when a plan fits the
// smallest; else the plan of the next larger size that has one, each smaller device restricted to the stages
// whose jobs fit it beside each other (the smallest stages first) and carving only what they need, so a large
// stage (the fused tail with the LM head) runs only on the devices that hold it; a device too small for the
// resident region beside its stages streams their weights when it so runs more of them. When even the largest device
// holds no plan: MemoryError naming every device and its bytes. (A bound schedule's devices run fixed jobs:
// the smallest device decides its plan.)
// Program footprints are measured once per set of micro-batch shapes (cached): planning costs graph builds,
// never a kernel.
#pragma once

#include "base/error.h"
#include "ggml_rp/roundpipe/memory_plan.h"
#include "ggml_rp/roundpipe/plan.h"
#include "ggml_rp/roundpipe/program.h"
#include "ggml_rp/roundpipe/schedules.h"
#include "ggml_rp/runtime/graph_runner.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rp {

struct CallPlanRequest {
    ScheduleKind schedule = ScheduleKind::RoundPipe;
    RecomputeGrain grain = RecomputeGrain::Stage;
    std::optional<Plan> plan;    // pinned (RoundPipe only)
    int devices = 1;             // G: the partitioner's minimum stage count
    size_t device_memory = 0;    // bytes of the smallest device; 0 = unlimited (nothing is checked)
    std::string device_name;     // for messages: "cpu:0", "cuda:1"
    // Mixed memory: every device's bytes (> 0) and name, in device order, when they differ (device_memory is then
    // the smallest); empty: every device has device_memory.
    std::vector<size_t> device_memories;
    std::vector<std::string> device_names;
    std::vector<double> tf, tb;  // per-layer times for the partitioner; empty = the cold-start byte proxy
    // MicroBatchInfo::token_chunk: -1 = the planner's choice (every token in one graph when that fits, else
    // the largest of 8192, 4096, ..., 256 tokens that does), 0 = never chunk, N = chunks of N tokens.
    int64_t token_chunk = -1;
    bool resident = true;  // try keeping the frozen weights on the devices first (CallShape::resident)
    // MicroBatchInfo::vocab_on_host (the embedding and head matrices on the host): -1 = only when no plan fits
    // without it (and for the least memory), 0 = never, 1 = always (when the program has such frozen matrices).
    int vocab_on_host = -1;
};

struct CallPlan {
    Plan plan;
    CallShape shape;
    DeviceMemoryPlan memory;  // what every device carves (the max over the call's jobs)
    int64_t token_chunk = 0;  // what the call's micro-batches run with (MicroBatchInfo::token_chunk)
    // Mixed memory, when no plan fits the smallest device: [device] the regions it carves (the max over the jobs
    // it may run; nothing when it runs none; no resident region when it streams the weights of a resident call,
    // shape_on) and [stage][device] whether it may run the stage (plan_stages order). Empty: every device carves
    // `memory` and may run every stage.
    std::vector<DeviceMemoryPlan> device_regions;
    std::vector<std::vector<char>> stage_devices;

    const DeviceMemoryPlan & regions_of(int device) const {
        return device_regions.empty() ? memory : device_regions.at(static_cast<size_t>(device));
    }
    // The shape of the jobs on `device`: a resident call's device without a resident region streams the weights.
    CallShape shape_on(int device) const {
        CallShape s = shape;
        s.resident = s.resident && regions_of(device).resident > 0;
        return s;
    }
    // What the call's micro-batches run with: its token chunk, and whether the vocabulary stays on the host.
    void apply(MicroBatchInfo & mb) const {
        mb.token_chunk = token_chunk;
        mb.vocab_on_host = shape.vocab_on_host;
        mb.vocab_pass_once = shape.vocab_pass_once;
    }
    // Null when every device may run the stage.
    const std::vector<char> * devices_of_stage(int stage) const {
        return stage_devices.empty() ? nullptr : &stage_devices.at(static_cast<size_t>(stage));
    }
};

// Thrown when no plan fits; what() says why, the fields say by how much.
class MemoryError : public Error {
public:
    MemoryError(const std::string & what, size_t needed, size_t available, int64_t max_seq_len)
        : Error(what), needed_(needed), available_(available), max_seq_len_(max_seq_len) {}
    size_t needed() const { return needed_; }
    size_t available() const { return available_; }
    int64_t max_seq_len() const { return max_seq_len_; }  // at the call's n_seq and M; 0 = not even 1 token

private:
    size_t needed_, available_;
    int64_t max_seq_len_;
};

class CallPlanner {
public:
    // `rules`: the runner whose memory rules the devices follow (a device's runner, or footprint_rules()).
    CallPlanner(TrainingProgram & program, const GraphRunner & rules);

    CallPlan plan(const CallPlanRequest & req, const std::vector<MicroBatchInfo> & mbs);
    // The memory of one given plan for these micro-batches (with their token_chunk).
    DeviceMemoryPlan memory_of(const Plan & plan, ScheduleKind schedule, const std::vector<MicroBatchInfo> & mbs, int sets = 2,
                               bool resident = false);
    // The one-layer-per-stage plan (the least device memory any plan takes).
    Plan min_memory_plan(RecomputeGrain grain) const;
    // The least memory any call of these micro-batches can take under req: the one-layer-per-stage plan, the
    // smallest token chunk, one activation set per stage (a bound schedule: its plan, the same way).
    DeviceMemoryPlan least_memory(const CallPlanRequest & req, const std::vector<MicroBatchInfo> & mbs);
    // The largest seq_len (M micro-batches of n_seq sequences) whose minimum-memory plan fits `device_memory`;
    // 0 when not even seq_len 1 fits. Searches up to `limit`.
    int64_t max_seq_len(const CallPlanRequest & req, int64_t n_seq, int M, int64_t limit);

    const ProgramFootprints & footprints(const std::vector<MicroBatchInfo> & mbs);
    size_t resident_bytes() const { return resident_bytes_; }  // the resident region a plan may keep (0: none)
    CallShape shape_of(const std::vector<MicroBatchInfo> & mbs, RecomputeGrain grain) const;

    // The token chunks plan() tries, in order (the last one takes the least memory).
    static std::vector<int64_t> chunk_candidates(const CallPlanRequest & req, const std::vector<MicroBatchInfo> & mbs);

private:
    // The plan for devices of req.device_memory each (the body of plan() for identical devices).
    CallPlan plan_uniform(const CallPlanRequest & req, const std::vector<MicroBatchInfo> & mbs);
    // Mixed memory: which stages each device of req.device_memories may run, and its regions (CallPlan).
    void restrict_to_devices(CallPlan & cp, const CallPlanRequest & req, const std::vector<MicroBatchInfo> & mbs);
    // (seq_len, n_seq, token_chunk, vocab_on_host, vocab_pass_once), sorted, unique
    using ShapeKey = std::vector<std::array<int64_t, 5>>;
    static ShapeKey shape_key(const std::vector<MicroBatchInfo> & mbs);
    // The plan with the micro-batches' own token_chunk; nullopt when it does not fit, unless `last` (then
    // MemoryError).
    std::optional<CallPlan> plan_fixed(const CallPlanRequest & req, const std::vector<MicroBatchInfo> & mbs, int sets, bool last,
                                       bool resident);

    // Whether plans leave the vocabulary matrices on the host, in the order tried (the last takes the least memory).
    std::vector<bool> vocab_candidates(const CallPlanRequest & req) const;
    // The micro-batches as the least-memory plan runs them: the smallest token chunk, the vocabulary on the host
    // when it may be.
    std::vector<MicroBatchInfo> least_mbs(const CallPlanRequest & req, const std::vector<MicroBatchInfo> & mbs) const;

    TrainingProgram & prog_;
    const GraphRunner & rules_;
    bool vocab_movable_ = false;  // a frozen tensor of the program may stay on the host (TensorInfo::vocab_rows)
    std::vector<size_t> layer_bytes_, layer_train_bytes_;
    std::vector<size_t> layer_vocab_bytes_;  // of layer_bytes_: the frozen vocabulary matrices (TensorInfo::vocab_rows)
    size_t resident_bytes_ = 0;  // the resident region (layout_resident): 0 when nothing is frozen
    std::map<ShapeKey, ProgramFootprints> cache_;
};

} // namespace rp
