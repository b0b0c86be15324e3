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

#include <algorithm>
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

// Throws rp::Error when a cap is 0 or when the logical devices placed on one GPU (ordinals from
// logical_device_ordinals) together ask for more than its free memory (each its cap plus the GPU's per-device
// overhead); the message names the GPU, how many logical devices and the bytes. gpus[o] describes ordinal o;
// caps[i] is logical device i's.
inline void check_logical_memory(const std::vector<int> & ordinals, const std::vector<size_t> & caps, const std::vector<GpuInfo> & gpus) {
    if (caps.size() != ordinals.size())
        throw Error("CUDA: " + std::to_string(caps.size()) + " memory caps for " + std::to_string(ordinals.size()) + " logical devices");
    std::map<int, size_t> count, asked;
    for (size_t i = 0; i < ordinals.size(); ++i) {
        const int o = ordinals[i];
        if (caps[i] == 0) throw Error("CUDA: a logical device needs a memory cap above 0 bytes");
        if (o < 0 || static_cast<size_t>(o) >= gpus.size()) {
            throw Error("CUDA: logical device placed on GPU " + std::to_string(o) + ", but only " +
                        std::to_string(gpus.size()) + " GPUs are visible");
        }
        const size_t each = caps[i] + gpus[static_cast<size_t>(o)].overhead_bytes;
        const size_t before = asked[o];
        ++count[o];
        asked[o] = each < caps[i] || before + each < before ? SIZE_MAX : before + each;  // saturating: never wraps
    }
    for (const auto & [o, k] : count) {
        const GpuInfo & g = gpus[static_cast<size_t>(o)];
        if (asked[o] <= g.free_bytes) continue;
        std::string caps_of;
        size_t first = SIZE_MAX;
        bool same = true;
        for (size_t i = 0; i < ordinals.size(); ++i)
            if (ordinals[i] == o) {
                if (first == SIZE_MAX) first = caps[i];
                same = same && caps[i] == first;
                caps_of += (caps_of.empty() ? "" : ", ") + format_bytes(caps[i]);
            }
        std::string msg = std::string("CUDA GPU ").append(std::to_string(o)).append(" (").append(g.name).append("): ")
                              .append(std::to_string(k)).append(" logical devices of ")
                              .append(same ? format_bytes(first) : caps_of);
        if (g.overhead_bytes) msg.append(" (+ ").append(format_bytes(g.overhead_bytes)).append(" cuBLAS workspace)");
        throw Error(msg.append(same ? " each" : "").append(" do not fit in its ").append(format_bytes(g.free_bytes)).append(" of free memory"));
    }
}
inline void check_logical_memory(const std::vector<int> & ordinals, size_t mem_each, const std::vector<GpuInfo> & gpus) {
    check_logical_memory(ordinals, std::vector<size_t>(ordinals.size(), mem_each), gpus);
}

// Held back on each GPU whose free memory the caps take ("auto"): what the CUDA context, the streams and the
// driver allocate after the arenas (at least 256 MiB, or 2% of the free memory).
inline size_t auto_reserve(size_t free_bytes) { return std::max<size_t>(size_t(256) << 20, free_bytes / 50); }

// Each logical device's cap: caps[i], or where it is 0 ("auto") an equal share of what its GPU's free memory
// leaves after the given caps, every device's overhead and auto_reserve, rounded down to whole MiB. Throws
// rp::Error naming the GPU when nothing is left for an auto device; the result still goes through
// check_logical_memory.
inline std::vector<size_t> resolve_logical_memory(const std::vector<int> & ordinals, const std::vector<size_t> & caps,
                                                  const std::vector<GpuInfo> & gpus) {
    if (caps.size() != ordinals.size())
        throw Error("CUDA: " + std::to_string(caps.size()) + " memory caps for " + std::to_string(ordinals.size()) + " logical devices");
    std::vector<size_t> out = caps;
    std::map<int, std::pair<size_t, size_t>> autos;  // ordinal -> (auto devices, bytes the others and overheads take)
    for (size_t i = 0; i < ordinals.size(); ++i) {
        const int o = ordinals[i];
        if (o < 0 || static_cast<size_t>(o) >= gpus.size()) continue;  // (check_logical_memory names it)
        auto & a = autos[o];
        a.second += gpus[static_cast<size_t>(o)].overhead_bytes + caps[i];
        if (caps[i] == 0) ++a.first;
    }
    for (size_t i = 0; i < ordinals.size(); ++i) {
        if (caps[i] != 0) continue;
        const int o = ordinals[i];
        if (o < 0 || static_cast<size_t>(o) >= gpus.size()) continue;
        const GpuInfo & g = gpus[static_cast<size_t>(o)];
        const auto & [n, taken] = autos[o];
        const size_t held = taken + auto_reserve(g.free_bytes);
        const size_t share = g.free_bytes > held ? (g.free_bytes - held) / n / (size_t(1) << 20) * (size_t(1) << 20) : 0;
        if (share == 0)
            throw Error("CUDA GPU " + std::to_string(o) + " (" + g.name + "): " + format_bytes(g.free_bytes) + " free leaves nothing for " +
                        std::to_string(n) + " logical device" + (n == 1 ? "" : "s") + " of its free memory (\"auto\") beside " +
                        format_bytes(held) + " of other caps, cuBLAS workspaces and the reserve");
        out[i] = share;
    }
    return out;
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
