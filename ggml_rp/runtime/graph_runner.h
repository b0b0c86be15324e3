// How a per-layer training program (roundpipe/program.h) runs its graphs on the device it was launched on,
// whatever that device is: the programs build graphs over device pointers and hand them to a GraphRunner,
// which knows where graph memory comes from and how results move between device buffers.
//
//   run(g, results)   the graph's compute tensors get memory of the device for as long as its nodes (and
//                     `results`) need it. CPU: planned into pc.device->allocate'd memory (or a host buffer
//                     without a device), computed at once, freed. CUDA: enqueued on the compute stream
//                     (cuda_runner.h), memory reused only in stream order;
//   copy_f32          a contiguous f32 node's data into a device buffer (inside run's `results` only);
//   zero              zeroes device memory, ordered before the graphs run after it;
//   upload            small host data (positions) into device memory that stays valid until the graph of
//                     the next run() has used it.
// On an accelerator every call only ENQUEUES work on the device's compute stream (runtime/device.h's launch
// contract): nothing reads device results on the host.
//
// Which runner a program uses: ProgramContext::runner when set, else the one attached to its device
// (RunnerAttachment: the CUDA devices get theirs from attach_cuda_runners), else the CPU runner, which
// serves the CPU virtual devices and plain host memory.
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
    // Runs (or enqueues) every node of g; leafs already point at memory the device reads. `results` is called
    // once the nodes are computed (or enqueued) and before their memory may be reused. Returns the bytes of
    // graph memory g needed (its plan's peak).
    virtual size_t run(Graph & g, const std::function<void()> & results = {}) = 0;
    // dst (device memory, node->nelements() floats) = node's data; node is f32 and contiguous.
    virtual void copy_f32(void * dst, const Tensor * node) = 0;
    virtual void zero(void * dst, size_t bytes) = 0;
    virtual void * upload(const void * host, size_t bytes) = 0;
};

// The CPU runner: CpuBackend with n_threads; graph memory from device's arena (plan / bind, freed right
// after the graph) or, without a device, from CpuBackend's own buffer. Lives for one program call: the
// uploads it holds are released with it.
class CpuGraphRunner final : public GraphRunner {
public:
    explicit CpuGraphRunner(Device * device = nullptr, int n_threads = 1) : device_(device), n_threads_(n_threads) {}
    size_t run(Graph & g, const std::function<void()> & results = {}) override;
    void copy_f32(void * dst, const Tensor * node) override;
    void zero(void * dst, size_t bytes) override;
    void * upload(const void * host, size_t bytes) override;

private:
    Device * device_;
    int n_threads_;
    std::vector<std::vector<char>> uploads_;
};

// Attaches a runner to a device until destroyed: programs launched on that device without a runner of their
// own use it. Attach before the first program runs there and destroy before the device.
class RunnerAttachment {
public:
    RunnerAttachment(Device & device, std::unique_ptr<GraphRunner> runner);
    ~RunnerAttachment();
    RunnerAttachment(RunnerAttachment && o) noexcept;
    RunnerAttachment & operator=(RunnerAttachment &&) = delete;
    RunnerAttachment(const RunnerAttachment &) = delete;
    RunnerAttachment & operator=(const RunnerAttachment &) = delete;
    GraphRunner & runner() const { return *runner_; }

private:
    Device * device_ = nullptr;
    std::unique_ptr<GraphRunner> runner_;
};

// The runner attached to device, or nullptr (also for a null device).
GraphRunner * attached_runner(const Device * device);

// Zeroes bytes of device memory: through the attached runner (enqueued on the compute stream), else with a
// host memset (CPU devices). Call it inside a compute-stream launch.
void zero_device_memory(Device & device, void * ptr, size_t bytes);

} // namespace rp
