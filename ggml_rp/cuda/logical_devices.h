// Host-only rules of the CUDA device (ggml_rp/cuda/cuda_device.h), kept free of CUDA headers so that the CPU
// tests (tests/cuda) check them on any machine:
//   - how logical devices spread over the physical GPUs (logical i -> ordinal i % count), so that several
//     logical devices, each with its own memory cap and streams, can share one GPU;
//   - the argument checks of make_cuda_devices (counts, and that the caps of the logical devices placed on one
//     GPU fit in its free memory), with messages naming the GPU, the count and the bytes;
//   - the process-wide bookkeeping of registered host ranges: cudaHostRegister pins a range for the whole
//     process, once, while the Device interface registers per device; so the first device to register a
//     range pins it, later devices only hold a reference, and the last one to unregister unpins it.
// Header-only on purpose: the library builds ggml_rp/cuda/*.cu only (ggml_rp/CMakeLists.txt).
#pragma once

#include "ggml_rp/runtime/arena.h"
#include "base/error.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace rp::cuda {

// The name of logical device i: "cuda:<i>" (the trace and every error message use it).
inline std::string logical_device_name(int logical) { return "cuda:" + std::to_string(logical); }

// The physical GPU of logical device `logical` when n_physical GPUs are visible: round robin.
inline int physical_ordinal(int logical, int n_physical) {
    if (n_physical <= 0) throw Error("CUDA: no GPU is visible (cudaGetDeviceCount reports none)");
    if (logical < 0) throw Error("CUDA: negative logical device index " + std::to_string(logical));
    return logical % n_physical;
}

// The ordinal of every logical device 0 .. n_logical - 1.
inline std::vector<int> logical_device_ordinals(int n_logical, int n_physical) {
    if (n_logical < 1) {
        throw Error("CUDA: " + std::to_string(n_logical) + " logical devices requested, at least 1 is needed");
    }
    std::vector<int> ord(static_cast<size_t>(n_logical));
    for (int i = 0; i < n_logical; ++i) ord[static_cast<size_t>(i)] = physical_ordinal(i, n_physical);
    return ord;
}

// What make_cuda_devices knows of one GPU before it reserves memory on it.
struct GpuInfo {
    std::string name;           // e.g. "NVIDIA H200"
    size_t free_bytes = 0;      // cudaMemGetInfo
    size_t overhead_bytes = 0;  // what each logical device takes besides its cap (its cuBLAS workspace, blas.cuh)
};

// Throws rp::Error when mem_each is 0 or when the logical devices placed on one GPU (ordinals from
// logical_device_ordinals) together ask for more than its free memory (each its cap plus the GPU's per-device
// overhead); the message names the GPU, how many logical devices and the bytes. gpus[o] describes ordinal o.
inline void check_logical_memory(const std::vector<int> & ordinals, size_t mem_each, const std::vector<GpuInfo> & gpus) {
    if (mem_each == 0) throw Error("CUDA: a logical device needs a memory cap above 0 bytes");
    std::map<int, size_t> count;
    for (int o : ordinals) {
        if (o < 0 || static_cast<size_t>(o) >= gpus.size()) {
            throw Error("CUDA: logical device placed on GPU " + std::to_string(o) + ", but only " +
                        std::to_string(gpus.size()) + " GPUs are visible");
        }
        ++count[o];
    }
    for (const auto & [o, k] : count) {
        const GpuInfo & g = gpus[static_cast<size_t>(o)];
        const size_t each = mem_each + g.overhead_bytes;
        if (each < mem_each || each > g.free_bytes / k) {  // k * each > free, without overflow
            std::string msg = std::string("CUDA GPU ").append(std::to_string(o)).append(" (").append(g.name)
                                  .append("): ").append(std::to_string(k)).append(" logical devices of ")
                                  .append(format_bytes(mem_each));
            if (g.overhead_bytes) msg.append(" (+ ").append(format_bytes(g.overhead_bytes)).append(" cuBLAS workspace)");
            throw Error(msg.append(" each do not fit in its ").append(format_bytes(g.free_bytes)).append(" of free memory"));
        }
    }
}

// Registered host ranges of the process: which devices hold each range (see the header comment).
class HostRegistry {
public:
    // Device `device` (named `who` in errors) registers [ptr, ptr + bytes). The first holder of a range calls
    // pin() (cudaHostRegister) under the registry's lock; when pin() throws nothing is recorded. Throws
    // rp::Error when this device already registered ptr, or when ptr is registered with another size.
    void add(int device, const void * ptr, size_t bytes, const std::string & who, const std::function<void()> & pin) {
        std::lock_guard<std::mutex> lk(m_);
        auto it = ranges_.find(ptr);
        if (it == ranges_.end()) {
            pin();
            ranges_.emplace(ptr, Range{bytes, {device}});
            return;
        }
        if (it->second.holders.count(device)) throw Error(who + ": host range registered twice");
        if (it->second.bytes != bytes) {
            throw Error(who + ": host range registered with " + std::to_string(bytes) + " bytes, but another device " +
                        "registered it with " + std::to_string(it->second.bytes) + " bytes");
        }
        it->second.holders.insert(device);
    }

    // Device `device` releases ptr; the last holder calls unpin() (cudaHostUnregister) under the lock. The
    // device's hold is released even when unpin() throws. Throws rp::Error when the device does not hold ptr.
    void remove(int device, const void * ptr, const std::string & who, const std::function<void()> & unpin) {
        std::lock_guard<std::mutex> lk(m_);
        auto it = ranges_.find(ptr);
        if (it == ranges_.end() || it->second.holders.erase(device) == 0) {
            throw Error(who + ": unregister of a host range that was not registered");
        }
        if (it->second.holders.empty()) {
            ranges_.erase(it);
            unpin();
        }
    }

    size_t holders(const void * ptr) const {
        std::lock_guard<std::mutex> lk(m_);
        auto it = ranges_.find(ptr);
        return it == ranges_.end() ? 0 : it->second.holders.size();
    }

private:
    struct Range {
        size_t bytes;
        std::set<int> holders;
    };
    mutable std::mutex m_;
    std::map<const void *, Range> ranges_;
};

// The registry of this process (one for every CUDA device).
inline HostRegistry & process_host_registry() {
    static HostRegistry r;
    return r;
}

} // namespace rp::cuda
