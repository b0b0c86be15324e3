// The CPU graph runner (graph_runner.h).
#include "ggml_rp/runtime/graph_runner.h"

#include "ggml_rp/ops/flops.h"

#include "base/error.h"
#include "ggml_rp/core/alloc.h"
#include "ggml_rp/cpu/backend.h"
#include "ggml_rp/cpu/kernel_scratch.h"
#include "ggml_rp/runtime/arena.h"

#include <cstdint>
#include <algorithm>
#include <cstring>

namespace rp {

size_t CpuGraphRunner::run(Graph & g, int n_threads, const std::function<void()> & results) {
    AllocPlan plan;
    return run_planned(g, plan, n_threads, results);
}

size_t CpuGraphRunner::run_planned(Graph & g, AllocPlan & plan, int n_threads, const std::function<void()> & results) {
    // The uploads made for this graph are released once it has run (also when it fails).
    struct ReleaseUploads {
        std::vector<std::vector<char>> & u;
        ~ReleaseUploads() { u.clear(); }
    } release{uploads_};
    if (plan.offsets.size() != g.nodes.size()) plan = cpu::plan_cpu_graph(g);
    CpuBackend be;
    if (region_) {  // [held | the graph]
        const size_t at = held_bytes_, bytes = plan.size;
        if (at + bytes > region_bytes_)
            throw Error((device_ ? device_->name() : std::string("host")) + ": a graph of " + format_bytes(bytes) +
                        (at ? " beside " + format_bytes(at) + " held" : std::string()) + " does not fit the graph region of " +
                        format_bytes(region_bytes_) + " the memory plan reserved");
        char * base = static_cast<char *>(region_) + at;
        apply_plan(g, plan, base);
        region_peak_ = std::max(region_peak_, at + bytes);
        be.compute(g, n_threads, base + plan.scratch_offset, plan.scratch_bytes);
        if (results) results();
        return bytes;
    }
    if (!device_) {
        CpuBackend & host = host_ ? *host_ : be;
        host.allocate(g, plan);
        host.compute(g, n_threads);
        if (results) results();
        return plan.size;
    }
    const size_t bytes = plan.size;
    void * buf = device_->allocate(bytes, "graph buffer");
    try {
        apply_plan(g, plan, buf);
        be.compute(g, n_threads, static_cast<char *>(buf) + plan.scratch_offset, plan.scratch_bytes);
        if (results) results();
    } catch (...) {
        device_->free(buf);
        throw;
    }
    device_->free(buf);
    return bytes;
}

size_t CpuGraphRunner::graph_bytes(const Graph & g) const { return cpu::plan_cpu_graph(g).size; }

void CpuGraphRunner::set_region(void * base, size_t bytes) {
    if (held_) throw Error("graph runner: set_region while a program holds memory");
    region_ = base;
    region_bytes_ = base ? bytes : 0;
    region_peak_ = 0;
}

size_t FootprintRunner::run(Graph & g, int, const std::function<void()> & results) {
    peak_ = std::max(peak_, held_ + rules_.graph_bytes(g) + pending_uploads_);
    pending_uploads_ = 0;
    if (results) results();  // copies into device buffers: no-ops here
    return 0;
}

namespace {

// Where a runner that only measures puts an upload: a leaf's data that nothing reads.
void * unread_upload() {
    alignas(64) static char dummy[64];
    return dummy;
}

} // namespace

void * FootprintRunner::upload(const void *, size_t bytes) {
    pending_uploads_ += rules_.upload_bytes(bytes);
    return unread_upload();
}

void * FootprintRunner::hold(size_t bytes) {
    if (held_) throw Error("graph runner: hold() twice without release_held()");
    // In the rules' unit: an accelerator's uploads' (CUDA: 256 bytes, as its runner holds), else the CPU runner's 64.
    held_ = rules_.upload_bytes(bytes) > 0 ? rules_.upload_bytes(bytes) : (bytes + 63) / 64 * 64;
    return unread_upload();
}

size_t FlopRunner::run(Graph & g, int, const std::function<void()> & results) {
    for (const Tensor * n : g.nodes) {
        const bool backward = is_backward_op(n->op);
        if (count == Count::All || backward == (count == Count::Backward)) flops_ += node_model_flops(n);
    }
    if (results) results();
    return 0;
}

void * FlopRunner::upload(const void *, size_t) { return unread_upload(); }

void CpuGraphRunner::copy_out(void * dst, const Tensor * node) {
    if (!dtype_is_float(node->type) || !node->is_contiguous())
        throw Error("graph runner: copy_out of " + describe(node) + ": the node is not contiguous f32, f16 or bf16");
    std::memcpy(dst, node->data, node->nbytes());
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

void * CpuGraphRunner::hold(size_t bytes) {
    if (held_) throw Error("graph runner: hold() twice without release_held()");
    const size_t b = (bytes + 63) / 64 * 64;
    if (region_) {
        if (b > region_bytes_)
            throw Error((device_ ? device_->name() : std::string("host")) + ": " + format_bytes(b) + " held by a program do not fit the graph region of " +
                        format_bytes(region_bytes_) + " the memory plan reserved");
        held_ = region_;
    } else if (device_) {
        held_block_ = device_->allocate(b, "program state");
        held_ = held_block_;
    } else {
        held_host_.assign(b + 64, 0);
        held_ = held_host_.data() + (64 - reinterpret_cast<uintptr_t>(held_host_.data()) % 64) % 64;
    }
    held_bytes_ = region_ ? b : 0;
    return held_;
}

void CpuGraphRunner::release_held() {
    if (held_block_) device_->free(held_block_);
    held_block_ = nullptr;
    held_ = nullptr;
    held_bytes_ = 0;
    std::vector<char>().swap(held_host_);
}

} // namespace rp
