// The CPU graph runner and the device -> runner attachments (graph_runner.h).
#include "ggml_rp/runtime/graph_runner.h"

#include "ggml_rp/core/ggml_rp.h"
#include "gguf/error.h"

#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace rp {

size_t CpuGraphRunner::run(Graph & g, const std::function<void()> & results) {
    CpuBackend be;
    if (!device_) {
        const size_t bytes = be.allocate(g);
        be.compute(g, n_threads_);
        if (results) results();
        return bytes;
    }
    const size_t bytes = be.plan(g);
    void * buf = device_->allocate(bytes, "graph buffer");
    try {
        be.bind(g, buf);
        be.compute(g, n_threads_);
        if (results) results();
    } catch (...) {
        device_->free(buf);
        throw;
    }
    device_->free(buf);
    return bytes;
}

void CpuGraphRunner::copy_f32(void * dst, const Tensor * node) {
    // tensor_get_f32 reads any layout; for the f32 contiguous nodes the programs copy it is a plain copy.
    const std::vector<float> v = tensor_get_f32(node);
    std::memcpy(dst, v.data(), v.size() * sizeof(float));
}

void CpuGraphRunner::zero(void * dst, size_t bytes) { std::memset(dst, 0, bytes); }

void * CpuGraphRunner::upload(const void * host, size_t bytes) {
    // Host memory is device memory here; a copy keeps the contract (valid after the caller's data is gone).
    // Over-aligned like Context::alloc_data's buffers, for the kernels' vector loads.
    std::vector<char> & buf = uploads_.emplace_back(bytes + 64);
    char * p = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
    std::memcpy(p, host, bytes);
    return p;
}

namespace {

std::mutex & attachments_mutex() {
    static std::mutex m;
    return m;
}
std::unordered_map<const Device *, GraphRunner *> & attachments() {
    static std::unordered_map<const Device *, GraphRunner *> map;
    return map;
}

} // namespace

RunnerAttachment::RunnerAttachment(Device & device, std::unique_ptr<GraphRunner> runner)
    : device_(&device), runner_(std::move(runner)) {
    std::lock_guard<std::mutex> lk(attachments_mutex());
    if (!attachments().emplace(device_, runner_.get()).second)
        throw Error("graph runner: " + device.name() + " already has a runner attached");
}

RunnerAttachment::RunnerAttachment(RunnerAttachment && o) noexcept : device_(o.device_), runner_(std::move(o.runner_)) {
    o.device_ = nullptr;
}

RunnerAttachment::~RunnerAttachment() {
    if (!device_) return;
    std::lock_guard<std::mutex> lk(attachments_mutex());
    attachments().erase(device_);
}

GraphRunner * attached_runner(const Device * device) {
    if (!device) return nullptr;
    std::lock_guard<std::mutex> lk(attachments_mutex());
    const auto it = attachments().find(device);
    return it == attachments().end() ? nullptr : it->second;
}

void zero_device_memory(Device & device, void * ptr, size_t bytes) {
    if (GraphRunner * r = attached_runner(&device)) r->zero(ptr, bytes);
    else std::memset(ptr, 0, bytes);
}

} // namespace rp
