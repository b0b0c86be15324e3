#include "ggml_rp/runtime/device_plugin.h"

#include "base/error.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#ifndef RP_DEVICE_INTERFACE_ID
#error "RP_DEVICE_INTERFACE_ID is set by ggml_rp/CMakeLists.txt"
#endif

namespace rp {

const char * device_interface_id() { return RP_DEVICE_INTERFACE_ID; }

namespace {

std::string program_dir() {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return {};
    buf[n] = '\0';
    return std::filesystem::path(buf).parent_path().string();
}

DevicePlugin * open_cuda_plugin() {
    const char * name = "libggml_rp_cuda.so";
    std::vector<std::string> candidates;
    if (const char * env = std::getenv("RP_CUDA_PLUGIN"); env && *env) {
        candidates.push_back(env);
    } else {
        const std::string dir = program_dir();
        candidates.push_back(dir + "/" + name);
        candidates.push_back(dir + "/../lib/" + name);
    }
    std::string looked;
    for (const std::string & path : candidates) {
        std::error_code ec;
        if (!std::filesystem::exists(path, ec)) {
            looked += (looked.empty() ? "" : ", ") + path;
            continue;
        }
        void * h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!h) throw Error("CUDA plugin " + path + " cannot be loaded: " + dlerror());
        auto entry = reinterpret_cast<DevicePluginEntry>(dlsym(h, kDevicePluginEntry));
        if (!entry) throw Error("CUDA plugin " + path + " has no entry point " + kDevicePluginEntry);
        DevicePlugin * p = entry();
        if (!p || std::strcmp(p->build_id(), device_interface_id()) != 0)
            throw Error("CUDA plugin " + path + " was built from another version of ggml-rp (interface " +
                        (p ? p->build_id() : "?") + ", this program " + device_interface_id() + "); rebuild both");
        return p;  // never unloaded: devices and their code live until the process ends
    }
#if defined(RP_BUILT_WITH_CUDA)
    throw Error("the CUDA plugin " + std::string(name) + " is not installed next to this program (looked at " + looked +
                "; set RP_CUDA_PLUGIN to its path)");
#else
    throw Error("this build of ggml-rp has no CUDA backend (configure with -DRP_CUDA=ON; looked for " + looked + ")");
#endif
}

} // namespace

DevicePlugin & cuda_plugin() {
    static std::once_flag once;
    static DevicePlugin * plugin = nullptr;
    static std::string error;
    std::call_once(once, [] {
        try {
            plugin = open_cuda_plugin();
        } catch (const Error & e) {
            error = e.what();
        }
    });
    if (!plugin) throw Error(error);
    return *plugin;
}

} // namespace rp
