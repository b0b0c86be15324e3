// The transfer engine of one device (roundpipe.md §8): how host <-> device copies are queued so that the
// critical path never waits behind bulk weight traffic.
//
//   activations   H2D on the activation-upload stream, each gated by its producer's D2H event; after a task's
//                 uploads, an upload mark is recorded, which the compute stream waits for;
//   weights       H2D on the weight-upload stream, split into chunks of at most 256 MB, grouped by greedy LPT
//                 number partitioning into as many groups as there are activation marks still pending, each
//                 group queued behind one pending mark, lightest group first ("activations first, weights
//                 fill the gaps"); the compute stream waits for the whole upload;
//   prefetch      after a job's upload the weight stream waits for the compute stream's tail, so the next
//                 job's upload may overlap this job's compute, never the previous one's (depth 1);
//   downloads     every D2H on the download stream, after the compute stream's work so far.
// One engine per device, used by that device's thread only. The pure parts (chunking, LPT) are functions.
#pragma once

#include "ggml_rp/roundpipe/observer.h"
#include "ggml_rp/runtime/device.h"

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

namespace rp {

inline constexpr size_t kMaxWeightChunk = size_t(256) << 20;

// One flat copy: `bytes` bytes at byte `offset` of tensor `tensor` (an index the caller defines).
struct CopyChunk {
    int tensor = 0;
    size_t offset = 0;
    size_t bytes = 0;
};

// Splits every tensor (sizes[i] bytes) into chunks of at most max_chunk bytes, in tensor order.
std::vector<CopyChunk> split_chunks(const std::vector<size_t> & sizes, size_t max_chunk = kMaxWeightChunk);

// Greedy LPT: chunks sorted by size (descending, stable), each placed into the currently lightest of n groups
// (lowest index on ties). Returns the groups (each in placement order), ordered lightest group first, which is
// the order in which they are issued behind the pending activation marks. n < 1 is treated as 1; empty groups
// are dropped. The heaviest group is at most the optimum + the largest chunk.
std::vector<std::vector<CopyChunk>> lpt_groups(const std::vector<CopyChunk> & chunks, int n);

// A weight (or any parameter-class) H2D copy of one tensor.
struct WeightCopy {
    void * dst;
    const void * src;
    size_t bytes;
};

class TransferEngine {
public:
    TransferEngine(Device & device, PipelineObserver & observer) : dev_(device), obs_(observer) {}

    // ---- activations ----
    // H2D of an activation-class buffer, after `ready` (the producer's D2H; nullptr = nothing to wait for).
    void upload_activation(void * dst, const void * src, size_t bytes, Event * ready, const OpLabel & label);
    // After a task's activation uploads: records the upload mark and makes the compute stream wait for it.
    void activations_uploaded();

    // ---- weights ----
    // Queues the copies behind the pending marks (chunked, LPT-grouped), then `also(weight stream, compute
    // stream)` (a job's gradient re-uploads and zeroing), then records the upload's end, which the compute
    // stream waits for. Returns that event.
    std::shared_ptr<Event> upload_weights(const std::vector<WeightCopy> & copies, const OpLabel & label,
                                          const std::function<void(Stream & weights, Stream & compute)> & also);
    // Prefetch depth 1: the next weight upload waits for the compute stream's work so far.
    void limit_prefetch();

    // ---- downloads ----
    // D2H after the compute stream's work so far; returns the event recorded after the copy.
    std::shared_ptr<Event> download(void * dst, const void * src, size_t bytes, const OpLabel & label);
    // The download stream waits for the compute stream's work so far (what a later record on it covers).
    void downloads_after_compute();
    // A D2H on the download stream in its order (after downloads_after_compute), without a record.
    void copy_down(void * dst, const void * src, size_t bytes, const OpLabel & label);

    // An event recorded on stream s now.
    std::shared_ptr<Event> record(StreamKind s);

private:
    Device & dev_;
    PipelineObserver & obs_;
    std::deque<std::shared_ptr<Event>> marks_;  // activation-upload marks, oldest first
};

} // namespace rp
