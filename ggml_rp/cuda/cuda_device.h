// The CUDA device: one LOGICAL device on a physical GPU, mapping the Device interface (runtime/device.h) onto
// the CUDA runtime. Several logical devices may share one GPU (make_cuda_devices), each with its own memory
// cap and streams, so a single GPU can stand in for a multi-GPU RoundPipe run.
//
// - memory: ONE cudaMalloc of the cap at construction, handed out by an rp::Arena, so used() / high_water()
//   are exact and an oversized request throws rp::Error naming the device, what it was for and the bytes;
// - streams: cudaStreamNonBlocking, one per StreamKind role (plus extras); events: cudaEvent with timing.
//   CUDA's event semantics are the ones device.h documents; waits across devices use cudaStreamWaitEvent;
// - launch(label, work): calls work on the calling thread with this device's GPU current and the stream
//   available through native_handle(); work only enqueues. A work that throws (a launcher's argument check)
//   poisons its stream like a failed job of the CPU device: later launches and copies of that stream are
//   skipped, records still happen, synchronize() rethrows. Asynchronous CUDA errors surface as rp::Error at
//   the next synchronize;
// - hook (optional): when set, each launch and copy is bracketed by two cudaLaunchHostFunc callbacks that
//   stamp rp::clock_us() when the stream reaches them; the second one calls the hook. Chosen over event
//   pairs because the records are then on the same clock as every other device and the trace without any
//   calibration, they arrive in stream order as the work completes (as the CPU device's do) and no poller
//   thread is needed; the cost, a few microseconds per bracket, is paid per stage-sized launch and only when
//   tracing. The hook runs on a CUDA callback thread and must not call CUDA;
// - its graph runner (cuda_runner.h) enqueues graphs on its compute stream; the device owns it;
// - every failing CUDA call throws rp::Error "<device>: <call>: <cudaGetErrorString>".
// No CUDA header here: plain C++ (the scheduler, the tools) includes it.
#pragma once

#include "ggml_rp/runtime/arena_device.h"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace rp {

struct CudaDeviceOptions {
    int ordinal = 0;                     // physical GPU
    size_t memory_bytes = size_t(64) << 20;
    int num_streams = kNumStreamKinds;   // at least kNumStreamKinds
    OpHook hook;                         // may be empty (no tracing, no callbacks)
    std::string name;                    // default "cuda:<index>"
    bool tf32_gemm = false;              // f32 GEMMs on TF32 tensor cores (cuda/blas.cuh), else plain fp32
};

class CudaDevice final : public ArenaDevice {
public:
    CudaDevice(int index, CudaDeviceOptions options);
    ~CudaDevice() override;  // waits for every stream, then releases the runner, streams and memory
    CudaDevice(const CudaDevice &) = delete;
    CudaDevice & operator=(const CudaDevice &) = delete;

    int ordinal() const { return ordinal_; }

    std::unique_ptr<Event> create_event() override;

    void * alloc_pinned(size_t bytes) override;
    void free_pinned(void * ptr) override;
    void register_host(void * ptr, size_t bytes, bool read_only = false) override;
    void unregister_host(void * ptr) override;

    struct Impl;

private:
    int ordinal_;
    std::unique_ptr<Impl> impl_;
};

// One logical device per cap (caps[i] bytes; 0: its share of its GPU's free memory, resolve_logical_memory),
// logical i on GPU i % cuda_device_count() (logical_devices.h), names "cuda:<i>", all with the same hook. Throws
// rp::Error when no GPU is visible or the caps placed on one GPU exceed its free memory.
std::vector<std::unique_ptr<CudaDevice>> make_cuda_devices(const std::vector<size_t> & caps, OpHook hook = {}, bool tf32_gemm = false);
// n_logical devices of mem_each bytes.
inline std::vector<std::unique_ptr<CudaDevice>> make_cuda_devices(int n_logical, size_t mem_each, OpHook hook = {}, bool tf32_gemm = false) {
    return make_cuda_devices(std::vector<size_t>(static_cast<size_t>(std::max(n_logical, 0)), mem_each), std::move(hook), tf32_gemm);
}

// Visible GPUs; 0 without a driver or a GPU. Never throws.
int cuda_device_count();

// One line per visible GPU: "GPU 0: NVIDIA H200, sm_90, 139.8 GiB" (or why none is visible). Never throws.
std::string describe_cuda_gpus();

} // namespace rp
