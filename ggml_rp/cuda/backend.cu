// The CUDA backend (backend.h): graph memory from the device's arena, every node run through the entry its op
// family registered (node_kernel.cuh) — the counterpart of cpu::compute_node — after packing strided operands
// the kernels read packed (the op table's CUDA traits, backend_plan.h).
#include "ggml_rp/cuda/backend.h"

#include "base/error.h"
#include "ggml_rp/cuda/backend_plan.h"
#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/copy.cuh"
#include "ggml_rp/cuda/cuda_device.h"
#include "ggml_rp/cuda/node_kernel.cuh"
#include "ggml_rp/ops/op_registry.h"
#include "ggml_rp/ops/op_table.h"
#include "ggml_rp/runtime/arena.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace rp {

namespace cuda {

NodeKernel node_kernel(Op op) { return OpRegistry<NodeKernel>::get().find(op); }

RegisterNodeKernels::RegisterNodeKernels(std::initializer_list<std::pair<Op, NodeKernel>> entries) {
    OpRegistry<NodeKernel>::get().add(entries, "CUDA");
}

} // namespace cuda

namespace {

using cuda::NodeRun;

void run_node(Tensor * n, const NodeRun & r) {
    if (n->op == Op::NONE || n->op == Op::VIEW) return;
    const cuda::NodeKernel k = cuda::node_kernel(n->op);
    if (!k) throw Error(std::string("cuda compute: no CUDA kernel for op ") + op_name(n->op) + " (" + describe(n) + ")");
    k(n, r);
}

// The tensors standing in for a node whose strided operands (or output) are packed into scratch.
struct Packed {
    Tensor node;
    Tensor src[kMaxSrc];
    Tensor output;
    bool output_packed = false;
};

Tensor packed_like(const Tensor * t, char * at) {
    Tensor p = *t;
    set_contiguous_strides(&p);
    p.view_src = nullptr;
    p.view_offs = 0;
    p.data = at;
    return p;
}

// Returns the node to run: n itself when nothing needs packing, else pk.node, whose strided sources have been
// copied (enqueued) into packed scratch at `area` and whose output, when strided, goes to scratch too.
Tensor * pack_node(Tensor * n, Packed & pk, char * area, cudaStream_t s) {
    if (cuda::node_pack_bytes(n) == 0) return n;
    pk.node = *n;
    for (int i = 0; i < kMaxSrc; ++i) {
        const Tensor * src = n->src[i];
        if (!src || !cuda::packs_operand(n->op, i) || src->is_contiguous()) continue;
        pk.src[i] = packed_like(src, area);
        area += cuda::align256(cuda::packed_bytes(src));
        cuda::enqueue_cpy(src, &pk.src[i], s);
        pk.node.src[i] = &pk.src[i];
    }
    if (cuda::packs_output(n->op) && !n->is_contiguous()) {
        pk.output = packed_like(n, area);
        for (int i = 0; i < kMaxDims; ++i) pk.node.nb[i] = pk.output.nb[i];
        pk.node.data = pk.output.data;
        pk.output_packed = true;
    }
    return &pk.node;
}

} // namespace

CudaBackend::CudaBackend(CudaDevice & dev) : dev_(dev) {}

CudaBackend::~CudaBackend() {
    // The caller has synchronized (backend.h). Each release on its own: a destructor must not throw.
    if (owned_) {
        try { dev_.free(buffer_); } catch (...) {}
        try { dev_.free(workspace_); } catch (...) {}
    }
    try { dev_.free_pinned(host_flags_); } catch (...) {}
}

namespace {
void ensure_host_flags(CudaDevice & dev, void *& host, size_t & capacity, size_t flags) {
    const size_t need = sizeof(float) + flags * sizeof(int);  // one float for a dloss read, then the flags
    if (!host || need > capacity) {
        dev.free_pinned(host);
        host = nullptr;
        capacity = 0;
        host = dev.alloc_pinned(need);
        capacity = need;
    }
    std::memset(host, 0, capacity);
}
} // namespace

size_t CudaBackend::bind(const Graph & g, void * mem, size_t bytes) {
    const cuda::CudaGraphBytes need = cuda::cuda_graph_bytes(g);
    if (need.total() > bytes) {
        throw Error(dev_.name() + ": a graph of " + format_bytes(need.total()) + " (buffer " + format_bytes(need.buffer) +
                    ", workspace " + format_bytes(need.workspace()) + ") does not fit the graph region of " + format_bytes(bytes) +
                    " the memory plan reserved");
    }
    if (owned_) {
        dev_.free(buffer_);
        dev_.free(workspace_);
    }
    owned_ = false;
    plan_ = plan_graph(g, 256);
    buffer_ = mem;
    buffer_bytes_ = plan_.size;
    apply_plan(g, plan_, buffer_);
    workspace_ = static_cast<char *>(mem) + cuda::align256(need.buffer);
    workspace_bytes_ = need.workspace();
    scratch_bytes_ = need.scratch;
    max_flags_ = need.flags;
    ensure_host_flags(dev_, host_flags_, host_flag_capacity_, need.flags);
    flag_nodes_.clear();
    return plan_.size;
}

size_t CudaBackend::allocate(const Graph & g) {
    if (!owned_) {  // the memory was a caller's: start over in the arena
        buffer_ = workspace_ = nullptr;
        buffer_bytes_ = workspace_bytes_ = 0;
        owned_ = true;
    }
    // Plan and the device buffer: the arena's 256-byte alignment serves every kernel (cuBLAS, wmma tiles).
    AllocPlan plan = plan_graph(g, 256);
    if (!buffer_ || plan.size > buffer_bytes_) {
        dev_.free(buffer_);
        buffer_ = nullptr;
        buffer_bytes_ = 0;
        buffer_ = dev_.allocate(plan.size, "graph buffer");
        buffer_bytes_ = plan.size;
    }
    plan_ = std::move(plan);
    apply_plan(g, plan_, buffer_);

    // Kernel scratch (the largest node's), one flag per reporting node, the f64 loss.
    size_t scratch = 0, flags = 0;
    for (const Tensor * n : g.nodes) {
        scratch = std::max(scratch, cuda::node_scratch_bytes(n));
        if (cuda::reports_bad_index(n->op)) ++flags;
    }
    const size_t need = scratch + cuda::align256(flags * sizeof(int)) + cuda::align256(sizeof(double));
    if (!workspace_ || need > workspace_bytes_ || flags > max_flags_) {
        dev_.free(workspace_);
        workspace_ = nullptr;
        workspace_bytes_ = 0;
        workspace_ = dev_.allocate(need, "graph workspace");
        workspace_bytes_ = need;
    }
    // Kernel scratch first; flags and the loss at the end, so a larger scratch fits when the workspace is reused.
    scratch_bytes_ = workspace_bytes_ - cuda::align256(flags * sizeof(int)) - cuda::align256(sizeof(double));
    max_flags_ = flags;
    ensure_host_flags(dev_, host_flags_, host_flag_capacity_, flags);
    flag_nodes_.clear();
    return plan_.size;
}

void CudaBackend::compute(const Graph & g, Stream & stream) {
    if (stream.device_index() != dev_.index() || !stream.native_handle()) {
        throw Error("cuda compute: the stream is not a stream of " + dev_.name());
    }
    const auto s = static_cast<cudaStream_t>(stream.native_handle());
    cuda::check(cudaSetDevice(dev_.ordinal()), (dev_.name() + ": cudaSetDevice").c_str());

    // Every check before anything is enqueued.
    for (const Tensor * t : g.leafs) {
        if (!t->data) throw Error("cuda compute: leaf " + describe(t) + " has no data");
        cudaPointerAttributes attr{};
        cuda::check(cudaPointerGetAttributes(&attr, t->data), "cuda compute: cudaPointerGetAttributes");
        if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
            throw Error("cuda compute: leaf " + describe(t) + " holds a host pointer; upload it to " + dev_.name() +
                        " first");
        }
        if (attr.type == cudaMemoryTypeDevice && attr.device != dev_.ordinal()) {
            throw Error("cuda compute: leaf " + describe(t) + " lives on GPU " + std::to_string(attr.device) + ", not on " +
                        dev_.name() + "'s GPU " + std::to_string(dev_.ordinal()));
        }
    }
    size_t flags = 0;
    for (const Tensor * t : g.nodes) {
        if (!t->is_view() && !t->data) {
            throw Error("cuda compute: node " + describe(t) + " has no memory (call allocate first)");
        }
        cuda::check_cuda_node(t);
        if (cuda::node_scratch_bytes(t) > scratch_bytes_) {
            throw Error("cuda compute: node " + describe(t) + " needs more workspace than allocate() planned " +
                        "(call allocate with this graph)");
        }
        if (cuda::reports_bad_index(t->op)) ++flags;
    }
    if (flags > max_flags_) throw Error("cuda compute: the graph was not allocated (call allocate first)");
    resolve_views(g);

    char * ws = static_cast<char *>(workspace_);
    int * dflags = reinterpret_cast<int *>(ws + scratch_bytes_);
    auto * loss = reinterpret_cast<double *>(ws + scratch_bytes_ + cuda::align256(max_flags_ * sizeof(int)));
    if (flags > 0) cuda::check(cudaMemsetAsync(dflags, 0, flags * sizeof(int), s), "cuda compute: cudaMemsetAsync of the flags");

    cuda::ExpertRoutes routes;  // this run's expert counts (cuda/moe.cu): read once per ids tensor
    NodeRun r{s, workspace_, 0, nullptr, loss, static_cast<float *>(host_flags_), &routes};
    flag_nodes_.clear();
    Packed pk;
    for (Tensor * n : g.nodes) {
        r.flag = nullptr;
        if (cuda::reports_bad_index(n->op)) {
            r.flag = dflags + flag_nodes_.size();
            flag_nodes_.push_back(describe(n));
        }
        // [kernel workspace | packed operands and output]
        r.scratch_bytes = cuda::align256(cuda::node_workspace_bytes(n));
        try {
            pk.output_packed = false;
            Tensor * run = pack_node(n, pk, ws + r.scratch_bytes, s);
            run_node(run, r);
            if (pk.output_packed) cuda::enqueue_cpy(&pk.output, n, s);
        } catch (const Error & e) {
            throw Error(std::string("cuda compute: node ").append(describe(n)).append(": ").append(e.what()));
        }
    }
    if (flags > 0) {
        cuda::check(cudaMemcpyAsync(static_cast<char *>(host_flags_) + sizeof(float), dflags, flags * sizeof(int),
                              cudaMemcpyDeviceToHost, s),
              "cuda compute: cudaMemcpyAsync of the flags");
    }
}

void CudaBackend::check() {
    const auto * flags = reinterpret_cast<const int *>(static_cast<const char *>(host_flags_) + sizeof(float));
    for (size_t i = 0; i < flag_nodes_.size(); ++i) {
        if (flags[i] != 0) {
            const std::string node = flag_nodes_[i];
            std::memset(host_flags_, 0, host_flag_capacity_);
            throw Error("cuda compute: node " + node + " read an id or label outside its range (ids must lie in " +
                        "[0, rows), labels in [0, V) or be -1)");
        }
    }
}

} // namespace rp
