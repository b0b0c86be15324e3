// One forward_backward call of the RoundPipe runtime (roundpipe.md §3.3, §9.2, §9.3): everything its jobs
// share — the micro-batches (pinned copies of the caller's tokens), the plan and its stages, the host
// activations between stages (every forward stage's output and the checkpoints the backward stages start
// from) with their readiness events, the per-stage counting semaphores, the losses, and the event pairs
// around every program launch that feed the planner's timings.
//
// Ownership: the controller creates a call; the jobs hold it (shared) until their device has retired their
// memory, because device threads may still enqueue the last backward stages after the call returned.
// An event slot is written by the one producer task before it releases its stage's semaphore and read by
// consumers after they acquired it (§9.2 orders them); the timing list has its own lock.
#pragma once

#include "ggml_rp/roundpipe/plan.h"
#include "ggml_rp/roundpipe/program.h"
#include "ggml_rp/roundpipe/schedules.h"
#include "ggml_rp/roundpipe/sync.h"
#include "ggml_rp/runtime/device.h"
#include "ggml_rp/runtime/pinned_pool.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace rp {

// One micro-batch: its token ids and labels in host memory ([n_seq][seq_len], label -1 = masked).
struct MicroBatch {
    const int32_t * ids = nullptr;
    const int32_t * labels = nullptr;
    MicroBatchInfo info;
};

struct Call {
    // Copies the micro-batches into pinned memory from `host` (the run's pool: the blocks of earlier calls) and
    // lays out the host activations of `plan`.
    Call(int64_t id, const TrainingProgram & prog, PinnedPool & host, const std::vector<MicroBatch> & mbs, Plan plan);

    int64_t id = 0;
    int M = 0;
    std::vector<MicroBatchInfo> info;
    bool forward_only = false;               // Pipeline::forward: the head's forward alone, no backward stage
    std::vector<PinnedBuffer> ids, labels;  // pinned copies of the caller's tokens
    std::vector<PinnedBuffer> positions;    // and of packed micro-batches' positions (info[i].positions points here)
    std::vector<PinnedBuffer> sequence_values;  // and of their sequence values (info[i].sequence_values points here)
    size_t max_hidden = 0, max_tokens = 0;
    Plan plan;
    std::vector<StageDesc> stages;
    int fb = 0;                              // index of FB in stages
    std::vector<std::unique_ptr<Semaphore>> sem;  // per stage, released once per micro-batch
    Semaphore fused_done;                    // the controller's count of finished fused parts
    std::vector<char> need_act;              // per layer: its input is kept on the host
    std::vector<std::vector<PinnedBuffer>> act;        // [layer][mb]: input of the layer
    std::vector<std::vector<PinnedBuffer>> dact_bufs;  // [mb][0 or 1]: the input gradients (memory_plan.h BoundaryBuffers)
    std::vector<int> dact_buffer;                      // [layer]: which of its micro-batch's gradient buffers (-1: none)
    // The input gradient of layer l for micro-batch mi: one of the micro-batch's two buffers, taken in turn.
    void * dact(int l, int mi) const {
        return dact_bufs[static_cast<size_t>(mi)][static_cast<size_t>(dact_buffer[static_cast<size_t>(l)])].data();
    }
    std::vector<std::vector<std::shared_ptr<Event>>> act_ready, dact_ready;  // recorded after the D2H
    PinnedBuffer loss;                       // each micro-batch's head results (its loss first) from loss_at[i]
    std::vector<size_t> loss_at;             // floats
    std::vector<std::shared_ptr<Event>> loss_ready;

    // Event pairs around every program launch, harvested for the planner once they have all completed (§11.2).
    enum class Launch { Forward, RecomputeBackward, Head };
    struct Timed {
        int layer;
        Launch kind;
        int device;  // the pipeline's index of the device that ran it
        std::shared_ptr<Event> start, end;
    };
    void add_timed(Timed t);
    // The timed launches when all have completed (else false, nothing copied).
    bool completed_timings(std::vector<Timed> & out);

private:
    std::mutex timed_m_;
    std::vector<Timed> timed_;
};

} // namespace rp
