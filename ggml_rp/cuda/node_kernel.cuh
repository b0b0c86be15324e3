// How the CUDA backend runs one node: each op family's file (cuda/<family>.cu) defines, next to its
// launchers, the node entry of every op it implements and registers it here by op; the backend (backend.cu)
// looks the entry up. So the backend has no switch over ops, and adding an op means its own files plus its row
// in the op list (core/ops.def), whose CUDA traits say that the kernel exists (tests/cuda checks that the
// registrations and the table agree).
//
// Registrations are static objects of the family files; the plugin and the CUDA tests link the family files
// as object files (ggml_rp/CMakeLists.txt), so none is dropped by the linker.
#pragma once

#include "ggml_rp/core/tensor.h"
#include "ggml_rp/cuda/launch.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <initializer_list>
#include <utility>
#include <vector>

namespace rp::cuda {

// The per-expert starts of the grouped expert matmuls (cuda/moe.cu) that one graph run has read back to the
// host, by ids tensor: the layer's MUL_MAT_ID / MUL_MAT_ID_BACK_X / OUT_PROD_ID nodes share one ids tensor, so
// the host waits for the counts once per layer instead of once per node. A tensor's contents are fixed for
// the run (each node is computed once), so the key is the tensor and its memory; cleared when a run starts.
struct ExpertRoutes {
    struct Entry {
        const Tensor * ids;
        const void * data;
        int64_t experts;
        std::vector<int32_t> starts;  // E + 1
    };
    std::vector<Entry> entries;
    const std::vector<int32_t> * find(const Tensor * ids, int64_t experts) const {
        for (const Entry & e : entries)
            if (e.ids == ids && e.data == ids->data && e.experts == experts) return &e.starts;
        return nullptr;
    }
};

// What a node entry gets besides the node: the stream, its slice of the graph's workspace, its bad-index flag.
struct NodeRun {
    cudaStream_t stream;
    void * scratch;           // kernel workspace (node_workspace_bytes of backend_plan.h)
    size_t scratch_bytes;
    int * flag;               // this node's bad-index flag (nullptr when it has none)
    double * loss;            // f64 scratch of LM_HEAD_CE
    float * host_scalar;      // pinned float for a synchronous dloss read
    ExpertRoutes * routes = nullptr;  // this run's expert counts read so far (nullptr: read every time)
};

using NodeKernel = void (*)(Tensor * node, const NodeRun & r);

// The entry registered for op, or nullptr.
NodeKernel node_kernel(Op op);

// At namespace scope of a family file: `const RegisterNodeKernels kRegister{{Op::ADD, run_add}, ...};`
struct RegisterNodeKernels {
    RegisterNodeKernels(std::initializer_list<std::pair<Op, NodeKernel>> entries);
};

// Operand access for the node entries (device pointers in data).
template <class T> const T * in(const Tensor * t) { return static_cast<const T *>(t ? t->data : nullptr); }
template <class T> T * out(const Tensor * t) { return static_cast<T *>(t->data); }
inline void shape4(const Tensor * t, int64_t ne[4]) {
    for (int i = 0; i < 4; ++i) ne[i] = t->ne[i];
}
inline unsigned grid_of(int64_t n) { return static_cast<unsigned>(elementwise_grid(n)); }

} // namespace rp::cuda
