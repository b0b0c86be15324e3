// Device backends loaded at run time. The CUDA backend (devices, kernels, cuBLAS) is a plugin library,
// libggml_rp_cuda.so, that a tool opens with dlopen only when asked for CUDA devices (as llama.cpp's
// GGML_BACKEND_DL does): one build runs on machines without the CUDA libraries, and a CPU run does not pay
// for loading cuBLAS. The plugin exports one C function returning a DevicePlugin; the core checks that the
// plugin was built from the same device interface (build_id) before using it.
#pragma once

#include "ggml_rp/runtime/device.h"

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace rp {

class DevicePlugin {
public:
    virtual ~DevicePlugin() = default;
    virtual const char * backend() const = 0;   // "cuda"
    virtual const char * build_id() const = 0;  // the interface fingerprint it was compiled against
    // Visible accelerators; 0 without a driver or a device. Never throws.
    virtual int device_count() = 0;
    // One line per accelerator, e.g. "GPU 0: NVIDIA H200, sm_90, 139.8 GiB".
    virtual std::string describe() = 0;
    // One logical device per cap (bytes; 0: its share of its accelerator's free memory) over the visible
    // accelerators (logical i on accelerator i % count), named "<backend>:<i>", every stream operation reported
    // to hook when it is set; tf32_gemm: f32 GEMMs on TF32 tensor cores (DeviceSetOptions).
    virtual std::vector<std::unique_ptr<Device>> make_devices(const std::vector<size_t> & caps, OpHook hook, bool tf32_gemm) = 0;
};

// The interface fingerprint of this build (a hash of the device and runner headers, set at configure time).
const char * device_interface_id();

// Loads the CUDA plugin once per process and returns it. Looks at $RP_CUDA_PLUGIN (a file), then next to the
// running program (…/libggml_rp_cuda.so, …/../lib/libggml_rp_cuda.so). Throws rp::Error saying why it is not
// available: not built (configure with -DRP_CUDA=ON), not found (the places looked at), not loadable (the
// dynamic loader's message, e.g. a missing libcudart), or built from another interface.
DevicePlugin & cuda_plugin();

// The exported entry point of a plugin library.
extern "C" {
using DevicePluginEntry = DevicePlugin * (*)();
}
inline constexpr const char * kDevicePluginEntry = "rp_device_plugin_v1";

} // namespace rp
