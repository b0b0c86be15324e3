// A timing model of the RoundPipe library schedule (roundpipe.md §3, §8, §9) with modelled times: predicts
// iteration time, throughput and bubble ratio for hardware that is not here. It follows the library form
// (§3.5 lists how the paper's own simulator differs):
//
// - jobs = (stage, all M micro-batches) in plan order F0..F(f-1), FB, B1..; device = a global round-robin
//   pointer that persists across iterations (or, SimDispatch::Ready, the runtime's dispatch by readiness, and
//   with SimConfig::size_by_speed each iteration's stages sized by the devices' speeds as the runtime's calls);
//   the controller hands a job to a device only after that device's thread has finished enqueuing its previous
//   job (idle semaphore); a device of speed s computes in 1/s of the modelled time (SimConfig::device_speed);
// - per device four in-order streams: weight upload, activation upload, compute, download;
// - prefetch depth 1: a job's weight upload waits for the compute of the job before the previous one on the
//   device; an activation upload waits for the compute two micro-batches back (§8.4);
// - hand-offs go device -> host -> device: a D2H on the producer's download stream, then an H2D on the
//   consumer's activation stream (hop_ms/2 each, or act_bytes over the link);
// - checkpoints (stage grain: the input of each backward stage's first layer; layer grain: every layer's
//   input) are downloaded by the forward job that computes them, unless they are that job's own input
//   (already on the host); layer 0's input (the batch itself) is not modelled as a transfer;
// - FB runs forward + backward per micro-batch (its loss is on the host after the forward part); a backward
//   stage runs the recompute as soon as its checkpoint is uploaded and the backward once the output-grad of
//   the previous backward stage is uploaded (layer grain is modelled as stage grain with more checkpoints);
// - host flags (§9.1): forward_backward returns when the losses are on the host; step() then, in async mode,
//   waits for the previous update and queues copy-back (after every weight upload of the iteration has
//   completed), grad hand-off (after each layer's grad download) and the update on the optimizer thread;
//   the next iteration's jobs wait for their layers' copy-back (and backward jobs for their hand-off). In
//   sync mode step() does hand-off, update and copy-back on the controller after every grad download.
// Not modelled: host-side enqueue work and the loss download (instantaneous); two copy streams of one device
// sharing a link direction (each stream is its own queue); the host memory bandwidth all devices share.
#pragma once

#include "ggml_rp/roundpipe/dispatcher.h"
#include "ggml_rp/roundpipe/plan.h"
#include "ggml_rp/roundpipe/trace.h"
#include "ggml_rp/runtime/link_model.h"

#include <vector>

namespace rp {

struct SimModel {
    std::vector<double> tf_ms;         // per layer forward (= recompute) time per micro-batch
    std::vector<double> tb_ms;         // per layer backward-stage time per micro-batch (recompute + backward;
                                       // for the fused tail's layers: forward + backward)
    std::vector<double> weight_bytes;  // per layer bytes uploaded by every job holding it (empty = none)
    std::vector<double> grad_bytes;    // per layer trainable grad bytes downloaded by its backward job
};

// How a job picks its device: the paper's round-robin pointer, or by readiness: the runtime's own rule
// (dispatcher.h: the device on which the job would finish first by the devices' speeds, ties in the pointer's
// order; identical devices keep the pointer), so rp-simulate predicts the assignment the runtime makes.
enum class SimDispatch { RoundRobin, Ready };

struct SimConfig {
    int devices = 8;
    // Each device's speed: its compute takes the modelled time divided by it (a 3090 beside a 4090, a throttled
    // GPU); empty: all 1. Copies are not scaled (the link is the host's).
    std::vector<double> device_speed;
    SimDispatch dispatch = SimDispatch::RoundRobin;
    // With SimDispatch::Ready on devices of different speeds: each iteration's stages sized by speed as the
    // runtime sizes each call's (speed_plans.h: the plan its model finishes soonest, when sooner than the given
    // plan by readiness, bound to the pointer's devices); false: the given plan every iteration (a pinned plan).
    bool size_by_speed = false;
    int micro_batches = 9;
    int iterations = 6;         // for a settled period use 2 + 8 * steady_window (see there)
    bool async_optimizer = true;
    double hop_ms = 0;          // activation hand-off time device -> host -> device (half each way)
    double act_bytes = 0;       // when > 0, hand-offs take act_bytes over `link` each way instead of hop_ms/2
    LinkModel link;             // per device H2D and D2H links for weights, grads (and activations)
    double optimizer_ms = 0;    // CPU update per step
    double copy_back_ms = 0;    // fp32 master -> working copy, whole model, spread over layers by weight bytes
    // Data parallel over `nodes` servers (architecture.md §8): as each layer's gradients are handed off (deep
    // layers first), they join a bucket; a bucket of bucket_bytes (or the last) is all-reduced on the one
    // inter-node link, buckets one after another, in two rounds (reduce-scatter, all-gather) of
    // node_link.seconds((nodes - 1) / nodes x its bytes) each; the update waits for the last. Needs grad_bytes.
    int nodes = 1;
    LinkModel node_link;
    double bucket_bytes = 8.0 * 1024 * 1024;
};

struct SimResult {
    Trace trace;                          // every modelled stream operation (ts, dur in us)
    std::vector<double> iteration_end_ms; // end of each iteration's last compute operation
    double work_per_iteration_ms = 0;     // compute time of one iteration summed over devices (at speed 1)
    double makespan_ms = 0;               // first compute start to last compute end, whole run
    double bubble_ratio = 0;              // whole run: 1 - busy / (devices * makespan), busy = compute time on the
                                          // devices at their speeds (= work with every speed 1)
    double steady_iteration_ms = 0;       // mean period between iteration ends over the second half of the
                                          // run in whole mapping cycles (all but the first iteration when
                                          // the run is shorter than a cycle + 2)
    double steady_bubble_ratio = 0;       // 1 - busy per iteration / (devices * period)
    std::vector<int> jobs_per_device;     // jobs each device ran, whole run
    int sized_iterations = 0;             // iterations run with stages sized by speed (SimConfig::size_by_speed)
    double ideal_iteration_ms = 0;        // work per iteration / the devices' summed speed: no bubble at all
    double exposed_comm_fraction = 0;     // from the trace (analyse_trace), whole run
    double allreduce_ms_per_iteration = 0;      // nodes > 1: link busy time per iteration
    double exposed_allreduce_ms_per_iteration = 0;  // of it, while no device computed (analyse_trace)
};

// Iterations after which the stage -> device mapping repeats: devices / gcd(jobs per iteration, devices).
int steady_window(int jobs_per_iteration, int devices);

// Throws rp::Error when the model does not match the plan or a setting is out of range.
SimResult simulate_roundpipe(const Plan & plan, const SimModel & model, const SimConfig & config);

} // namespace rp
