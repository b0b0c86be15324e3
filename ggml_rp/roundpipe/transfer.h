// The transfer engine's pure parts (roundpipe.md §8): chunking weight copies to at most 256 MB, and grouping the
// chunks behind the activation uploads still pending on a device with greedy LPT number partitioning, so that a
// large weight transfer never delays a small activation transfer on the critical path.
#pragma once

#include <cstddef>
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

} // namespace rp
