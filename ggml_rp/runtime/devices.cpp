#include "ggml_rp/runtime/devices.h"

#include "base/error.h"
#include "ggml_rp/runtime/cpu_device.h"
#include "ggml_rp/runtime/device_plugin.h"

namespace rp {

std::vector<std::unique_ptr<Device>> make_devices(const DeviceSetOptions & o) {
    if (o.count < 1) throw Error("devices: count " + std::to_string(o.count) + " must be at least 1");
    std::vector<std::unique_ptr<Device>> out;
    if (!o.speeds.empty() && static_cast<int>(o.speeds.size()) != o.count)
        throw Error("devices: " + std::to_string(o.speeds.size()) + " speeds for " + std::to_string(o.count) + " devices");
    if (!o.memories.empty() && static_cast<int>(o.memories.size()) != o.count)
        throw Error("devices: " + std::to_string(o.memories.size()) + " memory sizes for " + std::to_string(o.count) + " devices");
    const std::vector<size_t> memory = o.memories.empty() ? std::vector<size_t>(static_cast<size_t>(o.count), o.memory_each) : o.memories;
    if (o.backend == "cpu") {
        for (int i = 0; i < o.count; ++i) {
            if (memory[static_cast<size_t>(i)] == 0)
                throw Error("devices: CPU device " + std::to_string(i) + " needs its memory size (the free memory, \"auto\", applies to CUDA devices)");
            CpuDeviceOptions c;
            c.memory_bytes = memory[static_cast<size_t>(i)];
            c.link = o.link;
            c.hook = o.hook;
            c.delay_seed = o.delay_seed ? o.delay_seed + static_cast<uint64_t>(i) : 0;
            c.max_delay_us = o.max_delay_us;
            if (i == 0) c.faults = o.faults;
            if (!o.speeds.empty()) c.speed = o.speeds[static_cast<size_t>(i)];
            out.push_back(std::make_unique<CpuDevice>(i, c));
        }
        return out;
    }
    if (o.backend == "cuda") {
        if (o.link) throw Error("devices: a link model applies to CPU virtual devices, not to CUDA devices");
        if (!o.speeds.empty()) throw Error("devices: emulated device speeds apply to CPU virtual devices, not to CUDA devices");
        if (o.delay_seed || o.faults.any()) throw Error("devices: delay and fault injection apply to CPU virtual devices, not to CUDA devices");
        DevicePlugin & p = cuda_plugin();
        if (p.device_count() == 0) throw Error("devices: backend cuda: " + p.describe());
        return p.make_devices(memory, o.hook, o.tf32_gemm);
    }
    throw Error("devices: unknown backend '" + o.backend + "' (cpu or cuda)");
}

} // namespace rp
