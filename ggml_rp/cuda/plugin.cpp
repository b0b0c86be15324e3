// The entry point of the CUDA plugin (runtime/device_plugin.h): the one symbol the tools look up with dlsym.
#include "ggml_rp/cuda/cuda_device.h"
#include "ggml_rp/runtime/device_plugin.h"

namespace rp {

namespace {

class CudaPlugin final : public DevicePlugin {
public:
    const char * backend() const override { return "cuda"; }
    const char * build_id() const override { return RP_DEVICE_INTERFACE_ID; }
    int device_count() override { return cuda_device_count(); }
    std::string describe() override { return describe_cuda_gpus(); }
    std::vector<std::unique_ptr<Device>> make_devices(const std::vector<size_t> & caps, OpHook hook, bool tf32_gemm) override {
        std::vector<std::unique_ptr<Device>> out;
        for (auto & d : make_cuda_devices(caps, std::move(hook), tf32_gemm)) out.push_back(std::move(d));
        return out;
    }
};

} // namespace

} // namespace rp

extern "C" __attribute__((visibility("default"))) rp::DevicePlugin * rp_device_plugin_v1() {
    static rp::CudaPlugin plugin;
    return &plugin;
}
