// Making the devices of a run from a description (what rp-finetune's --devices/--backend/--device-mem/--link
// say): CPU virtual devices (cpu_device.h), or logical CUDA devices through the CUDA plugin (device_plugin.h).
#pragma once

#include "ggml_rp/runtime/cpu_device.h"
#include "ggml_rp/runtime/device.h"
#include "ggml_rp/runtime/link_model.h"

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rp {

struct DeviceSetOptions {
    std::string backend = "cpu";     // "cpu" | "cuda"
    int count = 1;
    size_t memory_each = size_t(256) << 20;
    // Mixed memory: each device's bytes, overriding memory_each (one per device; 0 on CUDA: the device's share
    // of its GPU's free memory). Empty: memory_each each.
    std::vector<size_t> memories;
    std::optional<LinkModel> link;   // CPU devices only: the modelled host <-> device link
    OpHook hook;                     // every stream operation (tracing); may be empty
    // CUDA devices only: f32 GEMMs (LoRA products, weight gradients, dequantized block-type weights) on TF32
    // tensor cores (relative error ~1e-3 per product, about 8x the fp32 rate) rather than in plain fp32.
    bool tf32_gemm = true;
    // CPU devices only (tests and soaks): random delays in every stream (seed 0: none), and device 0's
    // injected faults (cpu_device.h FaultPlan).
    uint64_t delay_seed = 0;
    double max_delay_us = 0;
    FaultPlan faults;
    // CPU devices only: each device's compute speed in (0, 1] (cpu_device.h: a mixed machine emulated); empty: 1.
    std::vector<double> speeds;
};

// Throws rp::Error naming the backend and why (an unknown backend, no CUDA plugin, no GPU, a link model for
// CUDA devices, a count below 1).
std::vector<std::unique_ptr<Device>> make_devices(const DeviceSetOptions & options);

} // namespace rp
