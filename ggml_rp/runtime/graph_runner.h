// How a per-layer training program (roundpipe/program.h) runs its graphs on the device it was launched on,
// whatever that device is: the programs build graphs over device pointers and hand them to a GraphRunner,
// which knows where graph memory comes from and how results move between device buffers.
//
//   run(g, n, results)  the graph's compute tensors get memory of the device for as long as its nodes (and
//                       `results`) need it. CPU: planned into the device's arena (or a host buffer without a
//                       device), computed at once with n threads, freed. CUDA: enqueued on the compute stream
//                       (cuda_runner.h), memory reused only in stream order;
//   copy_out            a contiguous node's bytes (f32, f16 or bf16, as they are) into a device buffer (inside
//                       run's `results` only);
//   zero                zeroes device memory, ordered before the graphs run after it;
//   upload              host data (positions, a streamed weight's rows) into device memory that stays valid
//                       until the graph of the next run() has used it;
//   hold                device memory that stays valid across the graphs of one program until release_held (a
//                       streamed LM head's carried state): graph_bytes and upload_bytes come on top of it;
//   graph_bytes         the device bytes run(g) takes (its plan and kernel scratch), and upload_bytes those
//                       an upload takes: the memory model (roundpipe/memory_plan.h) asks before anything runs;
//   set_region          from then on graphs and uploads take their memory from one region the caller reserved
//                       (the RoundPipe runtime's graph region: programs run one after the other on the compute
//                       stream, so one region serves them all and the device's arena never fragments).
// On an accelerator every call only ENQUEUES work on the device's compute stream (runtime/device.h's launch
// contract): nothing reads device results on the host.
//
// Every Device owns its runner (Device::runner()); a program launched on a device uses that one. Host-memory
// training (no device) uses a CpuGraphRunner of its own. A runner is used by one thread at a time: the
// device's compute stream (its launches) or the caller that owns it.
#pragma once

#include "ggml_rp/core/alloc.h"
#include "ggml_rp/core/graph.h"
#include "ggml_rp/core/tensor.h"
#include "ggml_rp/runtime/device.h"

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace rp {

class CpuBackend;

class GraphRunner {
public:
    virtual ~GraphRunner() = default;
    // Runs (or enqueues) every node of g with n_threads CPU threads (0: all; accelerators ignore it); leafs
    // already point at memory the device reads. `results` is called once the nodes are computed (or
    // enqueued) and before their memory may be reused. Returns the bytes of graph memory g needed (its
    // plan's peak).
    virtual size_t run(Graph & g, int n_threads, const std::function<void()> & results = {}) = 0;
    // run() for a graph built once and replayed: `plan` is the plan of an earlier run of g under this runner's
    // rules, kept by the caller (empty the first time: made and stored here). A runner whose plans are its own
    // (the CUDA runner's) plans as run() does.
    virtual size_t run_planned(Graph & g, AllocPlan & plan, int n_threads, const std::function<void()> & results = {}) {
        (void) plan;
        return run(g, n_threads, results);
    }
    // dst (device memory, node->nbytes() bytes) = node's data; node is contiguous f32, f16 or bf16.
    virtual void copy_out(void * dst, const Tensor * node) = 0;
    virtual void zero(void * dst, size_t bytes) = 0;
    virtual void * upload(const void * host, size_t bytes) = 0;
    // One block of device memory at a time that the graphs run after it may read and write, until release_held()
    // (after which nothing run before it may still use it). With a region, it is the region's start: a graph and
    // its uploads then fit beside it (a measuring runner counts it in every graph's peak).
    virtual void * hold(size_t bytes) = 0;
    virtual void release_held() = 0;

    // ---- memory ----
    virtual size_t graph_bytes(const Graph & g) const = 0;
    virtual size_t upload_bytes(size_t bytes) const = 0;
    // [base, base + bytes): the region every later run and upload uses (nullptr: the device's arena again).
    // Throws rp::Error from run() when a graph does not fit it.
    virtual void set_region(void * base, size_t bytes) = 0;
    // The most of the region one graph and its uploads have used since set_region (0 without a region).
    virtual size_t region_high_water() const = 0;
    // False for a runner that only measures (FootprintRunner): a program may then build one graph of each
    // shape it would repeat (e.g. one token range of many equal ones), the footprint being the same.
    virtual bool computes() const { return true; }
};

// The CPU runner: CpuBackend; graph memory from the device's arena (plan / bind, freed right after the
// graph) or, without a device, from the backend's own buffer. Uploads are host copies, released after the
// next run() has used them.
class CpuGraphRunner final : public GraphRunner {
public:
    // Without a device, graphs take their memory from `host` when given (a CpuBackend whose buffer only
    // grows, kept by the caller across graphs and steps: a fresh buffer per graph is fresh pages to fault in
    // and zero, bench/design-measurements.md), else from a buffer of their own.
    explicit CpuGraphRunner(Device * device = nullptr, CpuBackend * host = nullptr) : device_(device), host_(host) {}
    size_t run(Graph & g, int n_threads, const std::function<void()> & results = {}) override;
    size_t run_planned(Graph & g, AllocPlan & plan, int n_threads, const std::function<void()> & results = {}) override;
    void copy_out(void * dst, const Tensor * node) override;
    void zero(void * dst, size_t bytes) override;
    void * upload(const void * host, size_t bytes) override;
    void * hold(size_t bytes) override;
    void release_held() override;
    size_t graph_bytes(const Graph & g) const override;   // plan_cpu_graph's size: the peak and the kernels' scratch
    size_t upload_bytes(size_t) const override { return 0; }  // uploads are host copies
    void set_region(void * base, size_t bytes) override;
    size_t region_high_water() const override { return region_peak_; }

private:
    Device * device_;
    CpuBackend * host_;
    void * region_ = nullptr;
    size_t region_bytes_ = 0;
    size_t region_peak_ = 0;
    std::vector<std::vector<char>> uploads_;
    // hold(): the region's first held_bytes_ (a region), a block of the device (held_block_), or host memory
    void * held_ = nullptr;
    size_t held_bytes_ = 0;
    void * held_block_ = nullptr;
    std::vector<char> held_host_;
};

// A runner that runs nothing: it measures the device memory a program's graphs and uploads would take under
// another runner's rules (`rules`: a device's runner, or roundpipe/footprint_rules.h's), so the memory model gets the
// exact bytes of every program by running the program's own code (roundpipe/memory_plan.h). run() returns 0
// (nothing ran); peak() is the largest graph + uploads of one run. Uploads return a dummy non-null pointer.
class FootprintRunner final : public GraphRunner {
public:
    explicit FootprintRunner(const GraphRunner & rules) : rules_(rules) {}
    size_t run(Graph & g, int n_threads, const std::function<void()> & results = {}) override;
    void copy_out(void *, const Tensor *) override {}
    void zero(void *, size_t) override {}
    void * upload(const void * host, size_t bytes) override;
    void * hold(size_t bytes) override;
    void release_held() override { held_ = 0; }
    size_t graph_bytes(const Graph & g) const override { return rules_.graph_bytes(g); }
    size_t upload_bytes(size_t bytes) const override { return rules_.upload_bytes(bytes); }
    void set_region(void *, size_t) override {}
    size_t region_high_water() const override { return peak_; }
    bool computes() const override { return false; }
    size_t peak() const { return peak_; }

private:
    const GraphRunner & rules_;
    size_t pending_uploads_ = 0;
    size_t held_ = 0;
    size_t peak_ = 0;
};

// A runner that runs nothing and sums the model FLOPs (ops/flops.h) of the nodes of the graphs given to it:
// the forward's, the backward's (ops a backward rule emits) or all. Like FootprintRunner it only measures.
class FlopRunner final : public GraphRunner {
public:
    enum class Count { Forward, Backward, All };
    Count count = Count::All;
    size_t run(Graph & g, int n_threads, const std::function<void()> & results = {}) override;
    void copy_out(void *, const Tensor *) override {}
    void zero(void *, size_t) override {}
    void * upload(const void * host, size_t bytes) override;
    void * hold(size_t bytes) override { return upload(nullptr, bytes); }
    void release_held() override {}
    size_t graph_bytes(const Graph &) const override { return 0; }
    size_t upload_bytes(size_t) const override { return 0; }
    void set_region(void *, size_t) override {}
    size_t region_high_water() const override { return 0; }
    bool computes() const override { return false; }
    double flops() const { return flops_; }

private:
    double flops_ = 0.0;
};

} // namespace rp
