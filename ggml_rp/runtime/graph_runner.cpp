// The CPU graph runner (graph_runner.h).
#include "ggml_rp/runtime/graph_runner.h"

#include "ggml_rp/ops/flops.h"

#include "base/error.h"
#include "ggml_rp/core/alloc.h"
#include "ggml_rp/cpu/backend.h"
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
    if (plan.offsets.size() != g.nodes.size()) plan = plan_graph(g, 64);
    CpuBackend be;
    if (region_) {
        const size_t bytes = plan.size;
        if (bytes > region_bytes_)
            throw Error((device_ ? device_->name() : std::string("host")) + ": a graph of " + format_bytes(bytes) +
                        " does not fit the graph region of " + format_bytes(region_bytes_) + " the memory plan reserved");
        apply_plan(g, plan, region_);
        region_peak_ = std::max(region_peak_, bytes);
        be.compute(g, n_threads);
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
        be.compute(g, n_threads);
        if (results) results();
    } catch (...) {
        device_->free(buf);
        throw;
    }
    device_->free(buf);
    return bytes;
}

size_t CpuGraphRunner::graph_bytes(const Graph & g) const { return plan_graph(g, 64).size; }

void CpuGraphRunner::set_region(void * base, size_t bytes) {
    region_ = base;
    region_bytes_ = base ? bytes : 0;
    region_peak_ = 0;
}

size_t FootprintRunner::run(Graph & g, int, const std::function<void()> & results) {
    peak_ = std::max(peak_, rules_.graph_bytes(g) + pending_uploads_);
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

} // namespace rp
