// The RoundPipe runtime (roundpipe.md §3, §5, §8, §9, §12): the whole model lives in host memory, devices are
// stateless workers, and jobs (one stage x all micro-batches) go to the devices round-robin, or to the device
// that finishes them first when the devices' speeds differ. This is the controller; each actor owns its state
// in its own file:
//
//   controller     (pipeline.cpp) the caller's thread: forward_backward() obtains a plan, dispatches the jobs
//                  in plan order — RoundPipe to the dispatcher's device (dispatcher.h: the global round-robin
//                  pointer, which persists across stages, calls and steps, or by readiness on devices of
//                  different speeds, where a training call's stages may instead be sized by speed for the
//                  pointer's devices: planner.h split_by_speed); the baselines to their bound device — after
//                  claiming the per-layer flags the job needs; it returns once the fused parts are done and the losses are
//                  on the host, without waiting for the remaining backward stages. step() hands the update
//                  to the optimizer thread (sync: and waits; async: staleness 1, returns at once);
//   device_worker  one thread per device: enqueues a job's uploads, kernels and downloads on the device's
//                  four streams and runs ahead of them;
//   transfer       the transfer engine of each device: activations first, weights chunked and LPT-grouped
//                  behind them, prefetch depth 1;
//   layer_protocol the per-layer host flags + device events of §9.1, as named methods;
//   host_store     working copies, pinned gradient slots, hand-off and copy-back;
//   call_state     one call's micro-batches, host activations, semaphores and events;
//   schedules      the job orders of RoundPipe, GPipe and 1F1B;
//   observer       the hooks the invariant instrumentation (I4, I6, I7, I8) listens on.
//
// Gradients accumulate on the device in micro-batch order into fp32 buffers; across calls of one step the
// running sum goes back up with the weights (§5). With sync steps the result is bit-identical to the
// single-device Trainer for any G, plan and grain (tests/roundpipe/test_pipeline.cpp).
#pragma once

#include "ggml_rp/roundpipe/call_planner.h"
#include "ggml_rp/roundpipe/call_state.h"
#include "ggml_rp/roundpipe/dispatcher.h"
#include "ggml_rp/roundpipe/host_store.h"
#include "ggml_rp/roundpipe/observer.h"
#include "ggml_rp/roundpipe/plan.h"
#include "ggml_rp/roundpipe/program.h"
#include "ggml_rp/roundpipe/schedules.h"
#include "ggml_rp/runtime/device.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rp {

struct PipelineOptions {
    ScheduleKind schedule = ScheduleKind::RoundPipe;
    bool async = false;                    // staleness-1 optimizer step
    RecomputeGrain grain = RecomputeGrain::Stage;
    // Which device runs a RoundPipe job (dispatcher.h): by readiness (identical devices: the round-robin
    // pointer) or always the pointer. device_speed: each device's relative speed, fixed for the run; empty:
    // measured from the devices' launches.
    DispatchKind dispatch = DispatchKind::Ready;
    std::vector<double> device_speed;
    std::optional<Plan> plan;              // pinned plan (validated); default: the planner (RoundPipe) or an even split
    // Per-layer time estimates for the planner (§11.1: tf = forward / recompute, tb = recompute + backward);
    // empty = the cold-start byte proxy.
    std::vector<double> layer_tf, layer_tb;
    int threads_per_device = 1;            // CPU kernel threads inside each device's programs
    // Tokens per feed-forward / head graph (MicroBatchInfo::token_chunk): -1 = the call planner's choice (the
    // fastest that fits), 0 = never chunk, N = N tokens.
    int64_t token_chunk = -1;
    // Keep the embedding and LM-head matrices in host memory, the programs uploading the rows they read
    // (MicroBatchInfo::vocab_on_host): -1 = only when no plan fits without it, 0 = never, 1 = always.
    int vocab_on_host = -1;
    // Keep the frozen weights (the base of a LoRA run) on every device for the whole run when the plan fits
    // them beside it (call_planner.h): each job then uploads only its trainable tensors.
    bool resident_weights = true;
    // How the frozen weights' host bytes are pinned for their uploads (host_store.h); unset: a pinned copy
    // when the devices are accelerators, registration on CPU virtual devices (default_frozen_pinning).
    std::optional<FrozenPinning> frozen_pinning;
    // Called on the optimizer thread during each step's hand-off, in reverse layer order, with the parameters
    // whose fp32 gradients that layer completed (host_store.h): the data-parallel all-reduce hooks in here.
    // It may block (the devices keep computing the backward of earlier layers); it runs before the update.
    HostStore::GradsComplete grads_complete;
    bool instrument = false;               // an InvariantChecker observes the run (hashes every weight upload: slow;
                                           // CPU virtual devices only: a run on accelerators is refused)
    PipelineObserver * observer = nullptr; // or an observer of the caller's (outlives the pipeline)
    uint64_t fuzz_seed = 0;                // != 0: random sleeps in the device and optimizer threads
    double fuzz_max_delay_us = 0;
};

class Pipeline {
public:
    // The devices must outlive the pipeline; the program's param_infos() are updated in place by step()'s callback.
    Pipeline(TrainingProgram & program, std::vector<Device *> devices, PipelineOptions options);
    ~Pipeline();
    Pipeline(const Pipeline &) = delete;
    Pipeline & operator=(const Pipeline &) = delete;

    // One forward_backward call: returns the sum of the micro-batches' losses (pass loss_scale = 1 / the step's
    // unmasked tokens so it is the mean). Gradients accumulate across calls until step().
    // head_results (nullable): each micro-batch's head results (TrainingProgram::head_results; the loss first).
    double forward_backward(const std::vector<MicroBatch> & mbs, std::vector<std::vector<float>> * head_results = nullptr);

    // A forward-only call (evaluation, a reference pass): the micro-batches through the forward stages and the
    // head's forward (TrainingProgram::head_forward), in evaluation mode (MicroBatchInfo::training false: no
    // dropout); returns each micro-batch's head results. No gradient is
    // computed and nothing changes for the next step(); the working weights are those the next call would use.
    std::vector<std::vector<float>> forward(const std::vector<MicroBatch> & mbs);

    // The optimizer step. `update` runs on the optimizer thread once every parameter's fp32 grad is complete;
    // it updates the masters in place (clipping, AdamW, ...). Sync: returns after the update and copy-back.
    // Async: returns at once; the next call runs on the weights of the update before.
    void step(std::function<void()> update);

    // Waits for every device and the optimizer, then makes the working weights equal the masters. Call before
    // saving a result. Rethrows the first error any thread met.
    void synchronize();
    // Waits for every device and the optimizer without publishing anything: the masters hold every update,
    // the working weights stay what the next call computes at (async: the update before the last). Call
    // before evaluating on the masters or checkpointing, so that neither changes the run's trajectory.
    void drain();
    // After drain(): the working weights of every parameter (the param_infos() order), and setting them (a resumed
    // async run restores the weights its next call computes at). Sync steps upload the masters themselves: their
    // working weights are the masters, and setting them sets the masters.
    std::vector<std::vector<float>> working_weights() const;
    // Parameter p's working weights where they are (valid while the pipeline lives and is drained).
    const float * working_weight(size_t p) const;
    void set_working_weights(const std::vector<std::vector<float>> & w);

    // The plan of a call of these micro-batch shapes, and the device memory it takes: what forward_backward
    // would run (call_planner.h); MemoryError when nothing fits. Run it before a job writes any file (on the
    // largest call: when its plan cannot keep the frozen weights resident, no later call's does either).
    CallPlan plan_call(const std::vector<MicroBatchInfo> & mbs);
    const Plan & last_plan() const;
    // What pinning the frozen weights did (made when the pipeline was).
    const FrozenPinningReport & frozen_pinning() const;
    // Pinned bytes the host store holds for the trainable parameters (host_store.h): working copies and gradient
    // slots (async steps: both whole; sync steps: a tied parameter's second slot).
    size_t host_working_bytes() const;
    size_t host_slot_bytes() const;
    const DeviceMemoryPlan & last_memory() const;  // the last call's regions, as planned
    const CallPlan & last_call() const;            // all of the last call's plan (token chunk, activation sets)
    // The regions device `device` has carved (the largest plan it has run; memory_plan.h).
    DeviceMemoryPlan device_regions(int device) const;
    // The most each of them has held (after synchronize()).
    DeviceMemoryPlan device_regions_used(int device) const;
    // Bytes of weights sent to device `device` so far (the resident region once, every job's weights).
    size_t device_weight_bytes_uploaded(int device) const;
    // Calls whose measured per-layer times are in the planner's moving average (the first timed call is
    // dropped, §11.2); from the first sample on, plans come from measured times instead of the byte proxy.
    int timing_samples() const;
    // What the InvariantChecker saw (with instrument; otherwise only flag_violations is counted).
    PipelineChecks checks() const;
    // The pool of the calls' pinned host buffers (runtime/pinned_pool.h): blocks pinned, takes reused.
    PinnedPool::Stats pinned_stats() const;
    int num_devices() const;
    // One job's device: call, job label ("F2", "FB", "B1"; bound schedules "dev1"), device; in dispatch order, the
    // last 4096 jobs.
    struct Assignment {
        int64_t call;
        std::string job;
        int device;
        int layers;  // the job's stage's layers
    };
    std::vector<Assignment> assignments() const;
    // The dispatcher's current device speeds (the fastest 1; given or measured) and every device's jobs so far.
    std::vector<double> device_speeds() const;
    std::vector<int64_t> jobs_per_device() const;

    struct Impl;

private:
    void rethrow_faults();
    std::unique_ptr<Impl> impl_;
};

} // namespace rp
