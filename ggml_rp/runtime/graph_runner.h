// How a per-layer training program (roundpipe/program.h) runs its graphs on the device it was launched on,
// whatever that device is: the programs build graphs over device pointers and hand them to a GraphRunner,
// which knows where graph memory comes from and how results move between device buffers.
//
//   run(g, n, results)  the graph's compute tensors get memory of the device for as long as its nodes (and
//                       `results`) need it. CPU: planned into the device's arena (or a host buffer without a
//                       device), computed at once with n threads, freed. CUDA: enqueued on the compute stream
//                       (cuda_runner.h), memory reused only in stream order;
//   copy_f32            a contiguous f32 node's data into a device buffer (inside run's `results` only);
//   zero                zeroes device memory, ordered before the graphs run after it;
//   upload              small host data (positions) into device memory that stays valid until the graph of
//                       the next run() has used it.
// On an accelerator every call only ENQUEUES work on the device's compute stream (runtime/device.h's launch
// contract): nothing reads device results on the host.
//
// Every Device owns its runner (Device::runner()); a program launched on a device uses that one. Host-memory
// training (no device) uses a CpuGraphRunner of its own. A runner is used by one thread at a time: the
// device's compute stream (its launches) or the caller that owns it.
#pragma once

#include "ggml_rp/core/graph.h"
#include "ggml_rp/core/tensor.h"
#include "ggml_rp/runtime/device.h"

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace rp {

class GraphRunner {
public:
    virtual ~GraphRunner() = default;
    // Runs (or enqueues) every node of g with n_threads CPU threads (0: all; accelerators ignore it); leafs
    // already point at memory the device reads. `results` is called once the nodes are computed (or
    // enqueued) and before their memory may be reused. Returns the bytes of graph memory g needed (its
    // plan's peak).
    virtual size_t run(Graph & g, int n_threads, const std::function<void()> & results = {}) = 0;
    // dst (device memory, node->nelements() floats) = node's data; node is f32 and contiguous.
    virtual void copy_f32(void * dst, const Tensor * node) = 0;
    virtual void zero(void * dst, size_t bytes) = 0;
    virtual void * upload(const void * host, size_t bytes) = 0;
};

// The CPU runner: CpuBackend; graph memory from the device's arena (plan / bind, freed right after the
// graph) or, without a device, from the backend's own buffer. Uploads are host copies, released after the
// next run() has used them.
class CpuGraphRunner final : public GraphRunner {
public:
    explicit CpuGraphRunner(Device * device = nullptr) : device_(device) {}
    size_t run(Graph & g, int n_threads, const std::function<void()> & results = {}) override;
    void copy_f32(void * dst, const Tensor * node) override;
    void zero(void * dst, size_t bytes) override;
    void * upload(const void * host, size_t bytes) override;

private:
    Device * device_;
    std::vector<std::vector<char>> uploads_;
};

} // namespace rp
