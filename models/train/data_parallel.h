// Data-parallel training between processes (architecture.md §8), the model side: which micro-batches a rank
// computes, the all-reduce of the trainable tensors' gradients (in buckets, as the hand-off completes them)
// and the replica check. The collectives themselves are ggml_rp/dist/communicator.h.
//
// The split: rank r of R computes micro-batches r, r + R, r + 2R, ... of every step (micro_batch_shapes), and
// accumulates their gradients in that order; the ranks' sums are then added in rank order. A single process
// told to accumulate in R groups (SessionOptions::accumulate_groups) sums in exactly that grouping, so a
// data-parallel run equals it bit for bit; against the plain single-process run (every micro-batch into one
// sum) it differs only by the reassociation of those sums.
#pragma once

#include "ggml_rp/dist/communicator.h"
#include "models/train/trainer.h"
#include "ggml_rp/optim/optimizer.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rp {

// Whether micro-batch `index` of a step belongs to group `group` of `groups` (rank r of R: group r).
inline bool in_group(size_t index, int64_t group, int64_t groups) {
    return static_cast<int64_t>(index % static_cast<size_t>(groups)) == group;
}

// Sums the trainer's gradients over the ranks. add() the parameters as their gradients complete (the
// pipeline's hand-off, layer by layer from the last): a bucket is reduced as soon as it holds bucket_bytes, and
// the last one when every parameter has been added, so the communication of late layers runs while the
// devices compute the backward of early ones. The result does not depend on the bucketing (each element is
// summed in rank order).
class GradientReducer {
public:
    GradientReducer(Communicator & comm, const Trainer & trainer, size_t bucket_bytes = size_t(8) << 20);
    void add(int param);
    void reduce_all();  // every parameter (the host path, after its last micro-batch)
    // Bytes all-reduced in the last step.
    size_t step_bytes() const { return step_bytes_; }

private:
    void flush();

    Communicator & comm_;
    const Trainer & trainer_;
    size_t bucket_bytes_;
    std::vector<int> pending_;
    size_t pending_bytes_ = 0, added_ = 0, step_bytes_ = 0, running_bytes_ = 0;
    int64_t bucket_ = 0;
    std::vector<float> staging_;
};

// 64-bit FNV-1a over 8-byte words, then the tail bytes (replica checks, configuration fingerprints).
uint64_t fnv1a64(const void * data, size_t bytes, uint64_t h = 0xcbf29ce484222325ull);

// The hash of every trainable tensor's master and of every optimizer state array, with their names.
struct ReplicaHashes {
    std::vector<uint64_t> hashes;
    std::vector<std::string> names;
};
ReplicaHashes replica_hashes(const Trainer & trainer, const Optimizer & optimizer);

} // namespace rp
