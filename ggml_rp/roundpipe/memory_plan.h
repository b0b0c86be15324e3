// The device memory of the RoundPipe runtime, planned to the byte before anything runs (architecture.md §7).
//
// A device's memory is carved into regions, each sized from the model, the plan and the micro-batch shapes:
//   resident           when the plan fits them (CallShape::resident): every layer's frozen weights (the base
//                      weights of a LoRA run) in a block of their own, uploaded once when it is allocated and
//                      read by every job after it, kept when the other regions are carved again; the weight
//                      slots then hold only the trainable tensors and their gradients;
//   weight slots (2)   a job's weights (in the dtype the device holds them) and its trainable gradients (f32):
//                      the job computing and the one prefetched behind it (prefetch depth 1) hold one each;
//   activations        the computing job's activation sets — stage inputs, the hidden buffers between its
//                      layers, the gradients it passes on, labels, the loss: a prefetched job holds weights
//                      only, so one region serves the jobs of a device one after the other;
//   graph              the programs' graphs and uploads (CPU: plan_cpu_graph's peak and its kernels' scratch;
//                      CUDA: the plan with 256-byte alignment plus the kernels' scratch): the programs run one
//                      after the other on the compute stream, so one region serves them all.
// Every buffer has a fixed offset in its region (layout_job, the one function the device worker lays its
// buffers out with), so a plan that fits is a run that fits, whatever the timing; peak = resident +
// 2 x weight slot + activations + graph. Nothing else is taken from a device's memory while the runtime trains.
#pragma once

#include "ggml_rp/roundpipe/plan.h"
#include "ggml_rp/roundpipe/program.h"
#include "ggml_rp/roundpipe/schedules.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rp {

inline constexpr size_t kBufferAlign = 256;  // every buffer (and region) is a multiple: the arenas' unit
inline constexpr size_t kNoBuffer = SIZE_MAX;
inline constexpr size_t align_buffer(size_t b) { return (b + kBufferAlign - 1) / kBufferAlign * kBufferAlign; }

// One activation set (offsets into the activation region; kNoBuffer where the stage has none).
struct ActSetLayout {
    std::vector<size_t> in;    // fwd / fused / bwd stage grain: [0] the stage input; bwd layer grain: 1 or 2 checkpoints
    std::vector<size_t> work;  // fwd: 1 or 2 layer outputs (ping-pong); fused / bwd stage grain: inputs of layers a+1 ..
    size_t labels = kNoBuffer;
    size_t dout = kNoBuffer;
    size_t d[2] = {kNoBuffer, kNoBuffer};  // input gradients (ping-pong)
    size_t loss = kNoBuffer;
};

// Where the frozen weights live in the resident region: [layer][tensor] offsets (kNoBuffer for a trainable
// tensor), and the region's bytes. A tensor several layers read (a tied embedding and head) is there once: the
// layers' entries share its offset.
struct ResidentLayout {
    std::vector<std::vector<size_t>> data;
    size_t bytes = 0;
};
ResidentLayout layout_resident(const TrainingProgram & prog);

// Where one job's buffers live.
struct JobLayout {
    // [layer - first][tensor]: offsets in the weight slot (kNoBuffer: a gradient the job has not, or a frozen
    // tensor that lives in the resident region)
    std::vector<std::vector<size_t>> data, grad;
    size_t weight_bytes = 0;                      // weights + gradient buffers (the slot)
    std::map<int, std::vector<ActSetLayout>> sets;  // stage -> its sets (1, or 2 when it runs 2+ micro-batches)
    size_t activation_bytes = 0;
};

// What memory depends on, of one call.
struct CallShape {
    size_t hidden = 0;   // bytes of a hidden state of the largest micro-batch
    size_t tokens = 0;   // bytes of its token ids (and of its labels)
    RecomputeGrain grain = RecomputeGrain::Stage;
    // Activation sets per stage when it runs 2+ micro-batches: 2 lets the next micro-batch's uploads overlap
    // this one's compute; 1 (when memory is tight) makes them wait for it.
    int sets = 2;
    // The frozen weights stay on the device for the whole run (the resident region) instead of going up with
    // every job. Only when the program has frozen tensors.
    bool resident = false;
    size_t head_results = 1;  // floats the head writes for the largest micro-batch (TrainingProgram::head_results)
    // Bytes of a buffer that holds a layer's input or output (a stage input, a forward output, a recomputed
    // input): the boundary bytes (TrainingProgram::boundary_bytes) when no program chunks its tokens, else hidden
    // (a token-chunked forward writes its attention half into its output in f32). 0: hidden. Gradients: hidden.
    size_t state = 0;
    size_t state_bytes() const { return state ? state : hidden; }
    // The streamable tensors stay on the host (MicroBatchInfo::vocab_on_host): no slot holds them; the programs'
    // uploads of their pieces are in the graph region (ProgramFootprints).
    bool vocab_on_host = false;
    bool vocab_pass_once = false;  // (MicroBatchInfo::vocab_pass_once)
};

JobLayout layout_job(const TrainingProgram & prog, const std::vector<StageDesc> & stages, const CallShape & shape,
                     const JobSpec & spec);

// Graph-region bytes of every program, the largest over a call's micro-batch shapes.
struct ProgramFootprints {
    std::vector<size_t> forward, backward;  // per layer (L-1: the head's fused program is `head`)
    size_t head = 0;
};
ProgramFootprints program_footprints(TrainingProgram & prog, const std::vector<MicroBatchInfo> & mbs,
                                     const GraphRunner & rules);

struct DeviceMemoryPlan {
    size_t resident = 0;  // the resident region (0: every job uploads all its weights)
    size_t weight_slot = 0;
    size_t activations = 0;
    size_t graph = 0;
    // What sets each region's size: "job F2 (layers 3..7)", "program backward of blk.4"...
    std::string weight_by, activations_by, graph_by;

    size_t peak() const { return resident + 2 * weight_slot + activations + graph; }
    bool covers(const DeviceMemoryPlan & o) const {
        return resident >= o.resident && weight_slot >= o.weight_slot && activations >= o.activations && graph >= o.graph;
    }
    DeviceMemoryPlan max(const DeviceMemoryPlan & o) const;
    std::string describe() const;  // ["40 MiB resident frozen weights + "] "2 x 1.2 MiB weight slot (job B3) + ..."
};

// The memory every device needs for these jobs of a call: each job's layout, each program's footprint.
DeviceMemoryPlan plan_device_memory(const TrainingProgram & prog, const std::vector<StageDesc> & stages,
                                    const std::vector<JobSpec> & jobs, const CallShape & shape,
                                    const ProgramFootprints & fp);

// The host activations of a call (call_state.h), per layer: its input is kept (a forward stage's output, or a
// checkpoint a backward stage starts from: stage inputs, every layer's input at layer grain), its input
// gradient is kept (a backward stage's incoming gradient). Layer 0 has neither (its input is token ids).
// A micro-batch's backward stages run one after another, each reading the gradient the one above wrote, so the
// input gradients of a micro-batch take two buffers in turn (dact_buffer: 0 and 1 down the layers): the stage that
// overwrites a buffer runs after the stage that uploaded it, through their data dependence (device_worker.cpp).
struct BoundaryBuffers {
    std::vector<char> act, dact;
    std::vector<int> dact_buffer;  // per layer with dact: which of the micro-batch's gradient buffers (else -1)
    int dact_buffers = 0;          // per micro-batch: 0, 1 (one backward boundary) or 2
};
BoundaryBuffers boundary_buffers(const Plan & plan, int num_layers);

// Pinned host bytes of one call: token ids + labels, kept inputs, kept input gradients, losses.
struct HostCallBytes {
    size_t tokens = 0, checkpoints = 0, gradients = 0, losses = 0;
    size_t total() const { return tokens + checkpoints + gradients + losses; }
};
HostCallBytes host_call_bytes(const TrainingProgram & prog, const Plan & plan, const std::vector<MicroBatchInfo> & mbs);

// Bytes over the host-device link in one call (one step of one call: gradients start at zero on the device).
// With resident frozen weights (shape.resident) only the trainable ones go up with each job; the frozen ones
// went up once, when the region was carved (resident_once, per device). Streamed tensors (the micro-batches'
// vocab_on_host) go up with the programs that read them: the embedding's rows of each micro-batch's tokens, the
// whole head once per token range of each micro-batch (vocab_rows_up, not in the jobs' weights_up).
struct LinkBytes {
    size_t resident_once = 0;
    size_t weights_up = 0, grads_down = 0, activations_up = 0, activations_down = 0;
    size_t vocab_rows_up = 0;
    size_t total() const { return weights_up + vocab_rows_up + grads_down + activations_up + activations_down; }
};
LinkBytes link_bytes(const TrainingProgram & prog, const Plan & plan, ScheduleKind schedule,
                     const std::vector<MicroBatchInfo> & mbs, bool resident = false);

} // namespace rp
