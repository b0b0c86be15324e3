// The RoundPipe runtime (roundpipe.md §3, §5, §8, §9, §12): the whole model lives in host memory, devices are
// stateless workers, and jobs (one stage x all micro-batches) go to the devices round-robin.
//
// Actors
//   controller   the caller's thread: forward_backward() obtains a plan, dispatches the jobs in plan order to
//                device (pointer++ mod G) — one global pointer that persists across stages, calls and steps —
//                after waiting the per-layer host flags the job needs and the device's idle semaphore (at most
//                one queued job per device); it returns once the fused parts are done and the losses are on
//                the host, without waiting for the remaining backward stages.
//   device       one thread per device: enqueues a job's uploads, kernels and downloads on the device's four
//                streams and runs ahead of them. Per micro-batch it acquires the predecessor stage's counting
//                semaphore (host enqueue order, §9.2), waits the producer's device event (data readiness, §9.3)
//                on its activation-upload stream, and releases its own semaphore after recording its output.
//   optimizer    one thread with a FIFO: copy-back (masters -> working weights), grad hand-off (pinned staging ->
//                fp32 grads, layers in reverse order, tied slots summed), the update, the done flag. step() in
//                sync mode runs hand-off, update, copy-back and waits; in async mode (staleness 1) it enqueues
//                copy-back (of the previous update), hand-off, update and returns at once.
//
// Transfer engine: weight chunks <= 256 MB, LPT-grouped behind the device's pending activation-upload marks
// (activations first, §8.2); the weight stream waits on the compute stream's tail (prefetch depth 1), and a
// device never holds the memory of more than two jobs (the previous job is retired — its download-stream
// event synchronised and its memory freed — before the next-but-one allocates).
//
// Gradients accumulate on the device in micro-batch order into fp32 buffers; across calls of one step the
// running sum goes back up with the weights (§5). With sync steps the result is bit-identical to the
// single-device Trainer for any G, plan and grain (tests/roundpipe/test_pipeline.cpp).
//
// Baselines on the same machinery: GPipe and 1F1B bind an even split of the layers to the devices (stage s on
// device s, its weights resident for the whole call), same micro-batches, same programs.
#pragma once

#include "ggml_rp/roundpipe/plan.h"
#include "ggml_rp/roundpipe/program.h"
#include "ggml_rp/runtime/device.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rp {

enum class ScheduleKind { RoundPipe, GPipe, OneFOneB };
ScheduleKind schedule_from_name(std::string_view name);  // "roundpipe" | "gpipe" | "1f1b"; rp::Error otherwise
const char * schedule_name(ScheduleKind k);

struct PipelineOptions {
    ScheduleKind schedule = ScheduleKind::RoundPipe;
    bool async = false;                    // staleness-1 optimizer step
    RecomputeGrain grain = RecomputeGrain::Stage;
    std::optional<Plan> plan;              // pinned plan (validated); default: the planner (RoundPipe) or an even split
    double memory_fraction = 0.6;          // planner memory limit = fraction x the smallest device capacity
    // Per-layer time estimates for the planner (§11.1: tf = forward / recompute, tb = recompute + backward);
    // empty = the cold-start byte proxy.
    std::vector<double> layer_tf, layer_tb;
    int threads_per_device = 1;            // CPU kernel threads inside each device's programs
    bool instrument = false;               // I4 / I6 / I8 bookkeeping (hashes every weight upload: slow)
    uint64_t fuzz_seed = 0;                // != 0: random sleeps in the device and optimizer threads
    double fuzz_max_delay_us = 0;
};

// One micro-batch: its token ids and labels in host memory ([n_seq][seq_len], label -1 = masked).
struct MicroBatch {
    const int32_t * ids = nullptr;
    const int32_t * labels = nullptr;
    MicroBatchInfo info;
};

// What instrumentation saw (all zero = every invariant held).
struct PipelineChecks {
    int64_t weight_version_mismatches = 0;  // I4: forward and recompute read different bytes of a layer
    int64_t weight_uploads_hashed = 0;
    int64_t grad_slot_errors = 0;           // I6: a slot downloaded != once per call, or handed off != once per step
    int64_t grads_handed_off = 0;
    int64_t priority_violations = 0;        // I8: a weight chunk ran before an activation upload it was queued behind
    int64_t weight_groups_checked = 0;
    int64_t flag_violations = 0;            // a host flag set twice without a clear in between
    size_t max_job_bytes = 0;               // largest weights + grads + activation slots of one job
};

class Pipeline {
public:
    // The devices must outlive the pipeline; the program's params() are updated in place by step()'s callback.
    Pipeline(TrainingProgram & program, std::vector<Device *> devices, PipelineOptions options);
    ~Pipeline();
    Pipeline(const Pipeline &) = delete;
    Pipeline & operator=(const Pipeline &) = delete;

    // One forward_backward call: returns the sum of the micro-batches' losses (pass loss_scale = 1 / the step's
    // unmasked tokens so it is the mean). Gradients accumulate across calls until step().
    double forward_backward(const std::vector<MicroBatch> & mbs);

    // The optimizer step. `update` runs on the optimizer thread once every parameter's fp32 grad is complete;
    // it updates the masters in place (clipping, AdamW, ...). Sync: returns after the update and copy-back.
    // Async: returns at once; the next call runs on the weights of the update before.
    void step(std::function<void()> update);

    // Waits for every device and the optimizer, then makes the working weights equal the masters. Call before
    // evaluating or saving. Rethrows the first error any thread met.
    void synchronize();

    const Plan & last_plan() const;
    // Calls whose measured per-layer times are in the planner's moving average (the first timed call is
    // dropped, §11.2); from the first sample on, plans come from measured times instead of the byte proxy.
    int timing_samples() const;
    PipelineChecks checks() const;
    int num_devices() const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// The even split of GPipe / 1F1B: G contiguous ranges of L layers (sizes differ by at most one, the larger
// ones first), as a plan whose fused tail is the last range (validated).
Plan bound_plan(int num_layers, int num_devices, RecomputeGrain grain = RecomputeGrain::Stage);

} // namespace rp
