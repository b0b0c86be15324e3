// The CUDA backend: CpuBackend's counterpart on a CudaDevice. allocate() plans a graph with the same graph
// allocator (core/alloc.h) into memory taken from the device's arena (so used() / high_water() count it);
// compute() enqueues every node's kernel, in graph order, on one stream of that device.
//
// - leafs must already hold device pointers (weights and inputs uploaded by the caller); compute() checks it;
// - compute() only enqueues: results are ready after the stream (or an event recorded after it) completes.
//   It may run inside Stream::launch's work (the RoundPipe executor) or on its own;
// - every node is checked before anything is enqueued (backend_plan.h): an op without a CUDA path or a layout
//   the kernels do not take throws rp::Error naming the op and the tensor;
// - ids and labels live on the device, so an id out of range cannot throw at once as on the CPU: the kernels
//   skip it and raise a flag per node; check() (after the stream has synchronized) throws rp::Error naming the
//   node. One exception to "only enqueues": LM_HEAD_CE_BACK of the sum needs its dloss scalar on the host (the
//   per-token form reads its dloss vector on the device); when dloss is
//   not a FILL node (the usual seed of build_backward), compute() reads it with a stream synchronization.
// - the buffers serve one graph at a time and allocate() may move them: call it only when no earlier
//   compute() is still running (synchronize the stream first), as the destructor also requires.
#pragma once

#include "ggml_rp/core/alloc.h"
#include "ggml_rp/core/graph.h"

#include <cstddef>
#include <string>
#include <vector>

namespace rp {

class CudaDevice;
class Stream;

class CudaBackend {
public:
    explicit CudaBackend(CudaDevice & dev);
    ~CudaBackend();
    CudaBackend(const CudaBackend &) = delete;
    CudaBackend & operator=(const CudaBackend &) = delete;

    // Plans g, grows the device buffers when needed and points every node of g at its memory. Returns the
    // buffer bytes the plan needs (the graph's memory peak, as CpuBackend::allocate).
    size_t allocate(const Graph & g);
    // The same into memory the caller owns: [mem, mem + bytes) holds the buffer then the workspace
    // (cuda_graph_bytes of backend_plan.h); throws rp::Error when it does not fit.
    size_t bind(const Graph & g, void * mem, size_t bytes);

    // Enqueues every node of g, in order, on `stream` (a stream of this backend's device); makes the device's
    // GPU current on the calling thread.
    void compute(const Graph & g, Stream & stream);

    // After the stream of the last compute() has completed: throws rp::Error naming the first node that saw
    // an id or label out of range, and clears the flags.
    void check();

    const AllocPlan & plan() const { return plan_; }
    size_t buffer_size() const { return buffer_bytes_; }        // device bytes of the graph buffer
    size_t workspace_size() const { return workspace_bytes_; }  // device bytes of kernel scratch + flags

private:
    CudaDevice & dev_;
    AllocPlan plan_;
    bool owned_ = true;             // buffer_ and workspace_ are this backend's (allocate), not a caller's (bind)
    void * buffer_ = nullptr;
    size_t buffer_bytes_ = 0;
    void * workspace_ = nullptr;    // [kernel scratch | flag per reporting node | loss (double)]
    size_t workspace_bytes_ = 0;
    size_t scratch_bytes_ = 0;      // the kernel scratch part
    size_t max_flags_ = 0;          // flags the workspace holds
    void * host_flags_ = nullptr;   // pinned copy of the flags
    size_t host_flag_capacity_ = 0;
    std::vector<std::string> flag_nodes_;  // the node each flag of the last compute() belongs to
};

} // namespace rp
