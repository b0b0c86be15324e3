// The CPU backend: allocates a graph's compute tensors in one host buffer (through the graph allocator) and
// runs its nodes in order. Each kernel is parallel inside (OpenMP) with a fixed partition of the work, and
// every output element is reduced by one thread in a fixed order: results are the same bits for any number
// of threads.
#pragma once

#include "ggml_rp/core/alloc.h"
#include "ggml_rp/core/graph.h"

#include <cstddef>
#include <cstdint>
#include <memory>

namespace rp {

class CpuBackend {
public:
    CpuBackend() = default;
    CpuBackend(const CpuBackend &) = delete;
    CpuBackend & operator=(const CpuBackend &) = delete;

    // Plans g (plan_cpu_graph: its tensors and its kernels' scratch), grows the buffer when needed and points
    // every node of g at its memory. Leafs keep the data their owner gave them. Call again after changing g;
    // the buffer serves one graph at a time (allocating another graph may move it). Returns the buffer bytes
    // the plan needs (the graph's memory peak).
    size_t allocate(const Graph & g);

    // Binds g by a plan made for it earlier (a graph built once and replayed: no planning), growing the
    // buffer when needed; views are pointed at their roots again (leafs may point elsewhere since). The
    // plan's scratch serves the kernels of every compute() until the next allocate or reserve.
    void allocate(const Graph & g, const AllocPlan & plan);

    // The buffer, grown to at least `bytes` (its contents kept only while it does not grow; the old buffer is
    // freed before the new one is taken): for a caller that places tensors in it itself.
    void * reserve(size_t bytes);

    // Runs every node of g in order with n_threads OpenMP threads (0: OpenMP's default), the kernels' scratch
    // in the block the last allocate planned. Leaf data must be set; throws rp::Error (naming the tensor) on a
    // missing buffer or bad runtime data (an id out of range).
    void compute(const Graph & g, int n_threads = 0);
    // The same with the kernels' scratch in [scratch, scratch + scratch_bytes) (a graph that apply_plan placed
    // in the caller's memory: its plan's scratch_offset there).
    void compute(const Graph & g, int n_threads, void * scratch, size_t scratch_bytes);

    size_t buffer_size() const { return capacity_; }
    // Frees the buffer (graphs allocated in it must not run again before the next allocate()).
    void release() {
        buffer_.reset();
        capacity_ = 0;
        scratch_offset_ = scratch_bytes_ = 0;
    }

private:
    struct FreeAligned { void operator()(void * p) const; };
    std::unique_ptr<void, FreeAligned> buffer_;
    size_t capacity_ = 0;
    size_t scratch_offset_ = 0, scratch_bytes_ = 0;  // the last allocate's plan's, in buffer_
};

namespace cpu {

// Runs one node whose data and sources' data are set (the building block of CpuBackend::compute).
void compute_node(Tensor * node);

// Kernels touching fewer elements run on one thread (default 16384). Results never depend on it (every
// element is computed by the same code either way); tests set 0 to run every kernel's parallel partition.
void set_min_parallel_elements(int64_t n);

} // namespace cpu

} // namespace rp
