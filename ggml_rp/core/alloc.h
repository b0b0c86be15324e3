// Graph allocator: assigns every compute tensor of a graph (a node that is not a view) an offset in ONE
// buffer, by liveness, like ggml-alloc:
//   - nodes are visited in execution order; a node's block is taken just before it runs;
//   - a block is freed right after the last node that reads it (directly or through a view) has run;
//     tensors flagged kFlagOutput are never freed (the caller reads them after compute);
//   - freed blocks are reused best fit (the smallest free block that fits, lowest offset on ties), merged
//     with free neighbours, and the buffer grows at its end only when no free block fits;
//   - for graphs of up to 4096 nodes the same lifetimes are also placed offline (place_lifetimes: each block at the
//     lowest offset free over its whole lifetime, in greedy orders and then a local search over the order), and
//     that placement is taken where its buffer is smaller (best fit leaves holes a later, larger block cannot use);
//   - views use their root's memory; leafs (weights, inputs, gradient buffers) are the caller's.
// So a graph's memory peak is known before anything runs; the RoundPipe planner relies on it.
#pragma once

#include "ggml_rp/core/graph.h"

#include <unordered_set>

#include <cstddef>
#include <vector>

namespace rp {

struct AllocPlan {
    size_t alignment = 64;
    size_t size = 0;                // buffer bytes needed: the peak of the live set (with alignment), and the scratch
    std::vector<size_t> offsets;    // per g.nodes[i]: byte offset (SIZE_MAX for views)
    // The kernels' scratch at the end of the buffer, [scratch_offset, scratch_offset + scratch_bytes): what one
    // node's kernel uses while it runs, for the largest (a backend's plan adds it: cpu/kernel_scratch.h); 0 here.
    size_t scratch_offset = 0;
    size_t scratch_bytes = 0;
};

// Plans g. Every block size is rounded up to `alignment` (a power of two). Nodes in `placed` get no memory
// (offset SIZE_MAX: their caller places them, before apply_plan); what they read still lives until they run.
AllocPlan plan_graph(const Graph & g, size_t alignment = 64, const std::unordered_set<const Tensor *> * placed = nullptr);

// The offline placement plan_graph also tries (graphs of up to 4096 nodes), on given lifetimes: block i of sizes[i]
// bytes (0: no block) is taken before node i runs and freed after node freed[i] has run (freed[i] >= i); each block
// goes at the lowest offset free over its whole lifetime among the blocks placed before it, the blocks taken in three
// greedy orders, then, while the buffer is above the live bound (the most bytes live at once), in the orders of a
// local search with a fixed budget (alloc.cpp). The smallest buffer found is kept: a pure function of the lifetimes.
// Returns its size; offsets[i] for every block (others unchanged). Throws rp::Error when the three vectors differ in
// length or a block is freed before it is taken. Safe to call from several threads at once (the searched sets it
// remembers are behind a lock).
size_t place_lifetimes(const std::vector<size_t> & sizes, const std::vector<size_t> & freed, std::vector<size_t> & offsets);

// Points every compute node of g at base + its offset (placed nodes keep theirs) and every view at its root's
// memory (a view of a leaf or a placed node needs its data to be set). base must hold plan.size bytes, aligned
// to plan.alignment.
void apply_plan(const Graph & g, const AllocPlan & plan, void * base);

// Refreshes the data pointers of views from their roots (after leaf data moved). Throws when a root has none.
void resolve_views(const Graph & g);

} // namespace rp
