// Mixture-of-experts ops on the GPU (CPU reference: ggml_rp/cpu/moe.cpp; contract: ggml_rp/ops/moe.h).
//
// Router (MOE_TOPK, MOE_WEIGHTS, MOE_WEIGHTS_BACK): one thread per token runs the shared math of
// ops/moe_math.h, the probabilities in the node's scratch: the same selection and weights as the CPU.
//
// Grouped expert matmuls (MUL_MAT_ID, MUL_MAT_ID_BACK_X, OUT_PROD_ID): one block sorts the (token, slot)
// pairs by expert (stable: token order within an expert), the per-expert starts are read back to the host
// (one synchronisation per layer and graph run, shared by the nodes that route the same ids: the GEMM sizes
// are data-dependent, as in every MoE trainer without a grouped GEMM kernel), the pairs' columns are gathered into a panel, each expert runs one cuBLAS product of
// mul_mat.cuh over its columns (any weight type), and the results are scattered back. The slot sum of
// MUL_MAT_ID_BACK_X runs in slot order and each expert's weight gradient sums its columns in token order:
// deterministic, no atomics. An id outside [0, E) is dropped (its columns stay 0) and sets the node's
// bad-index flag.
#include "ggml_rp/core/tensor.h"
#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/mul_mat.cuh"
#include "ggml_rp/cuda/node_kernel.cuh"
#include "ggml_rp/ops/moe.h"

#include <vector>

namespace rp::cuda {

namespace {

// ---- router -------------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kElemThreads) topk_kernel(const float * __restrict__ logits, int64_t E, int64_t T, int32_t k,
                                                           float * __restrict__ p, int32_t * __restrict__ ids) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= T) return;
    moe_softmax(logits + t * E, E, p + t * E);
    moe_select(p + t * E, E, k, ids + t * k);
}

__global__ void __launch_bounds__(kElemThreads) weights_kernel(const float * __restrict__ logits, const int32_t * __restrict__ ids,
                                                              int64_t E, int64_t T, MoeParams mp, float * __restrict__ p,
                                                              float * __restrict__ w, int * bad) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= T) return;
    for (int32_t s = 0; s < mp.k; ++s)
        if (ids[t * mp.k + s] < 0 || ids[t * mp.k + s] >= E) {
            for (int32_t j = 0; j < mp.k; ++j) w[t * mp.k + j] = NAN;
            if (bad) *bad = 1;
            return;
        }
    moe_softmax(logits + t * E, E, p + t * E);
    moe_weights_of(p + t * E, ids + t * mp.k, mp, w + t * mp.k);
}

// share[e] = the share of the n (token, slot) pairs routed to expert e (one thread per expert, in order).
__global__ void __launch_bounds__(kElemThreads) share_kernel(const int32_t * __restrict__ ids, int64_t n, int64_t E,
                                                            float * __restrict__ share) {
    const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= E) return;
    int64_t c = 0;
    for (int64_t i = 0; i < n; ++i) c += ids[i] == e;
    share[e] = static_cast<float>(c) / static_cast<float>(n);
}

__global__ void __launch_bounds__(kElemThreads) weights_back_kernel(const float * __restrict__ logits, const int32_t * __restrict__ ids,
                                                                   const float * __restrict__ dw, int64_t E, int64_t T, MoeParams mp,
                                                                   float * __restrict__ p, float * __restrict__ dp,
                                                                   const float * __restrict__ share, float * __restrict__ dl, int * bad) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= T) return;
    for (int32_t s = 0; s < mp.k; ++s)
        if (ids[t * mp.k + s] < 0 || ids[t * mp.k + s] >= E) {
            for (int64_t e = 0; e < E; ++e) dl[t * E + e] = NAN;
            if (bad) *bad = 1;
            return;
        }
    moe_softmax(logits + t * E, E, p + t * E);
    moe_weights_grad(p + t * E, ids + t * mp.k, dw + t * mp.k, mp, E, dp + t * E, dl + t * E, share);
}

// ---- routing of the grouped matmuls -----------------------------------------------------------------------

// One block: starts[e] = first pair of expert e in `pairs` (starts[E] = pairs placed), pairs = t * k + s
// grouped by expert, token order within each. Thread j counts and then places the pairs of experts
// j, j + blockDim, ...; an id outside [0, E) is skipped and flagged.
constexpr int kRouteThreads = 1024;
__global__ void __launch_bounds__(kRouteThreads) route_kernel(const int32_t * __restrict__ ids, int64_t n, int64_t E,
                                                    int32_t * __restrict__ starts, int32_t * __restrict__ pairs, int * bad) {
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t c = 0;
        for (int64_t i = 0; i < n; ++i) c += ids[i] == e;
        starts[e + 1] = c;
    }
    if (threadIdx.x == 0) {
        for (int64_t i = 0; i < n; ++i)
            if ((ids[i] < 0 || ids[i] >= E) && bad) *bad = 1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        starts[0] = 0;
        for (int64_t e = 0; e < E; ++e) starts[e + 1] += starts[e];
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t at = starts[e];
        for (int64_t i = 0; i < n; ++i)
            if (ids[i] == e) pairs[at++] = static_cast<int32_t>(i);
    }
}

// dst[:, j] = src[:, col(pairs[j])] for j < m (rows floats a column); col = the pair, or its token when shared.
__global__ void __launch_bounds__(kElemThreads) gather_kernel(const float * __restrict__ src, int64_t rows, const int32_t * __restrict__ pairs,
                                                             int64_t m, int64_t k, bool shared, float * __restrict__ dst) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * m;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t j = i / rows, r = i % rows, p = pairs[j];
        dst[i] = src[(shared ? p / k : p) * rows + r];
    }
}

// dst[:, pairs[j]] = src[:, j].
__global__ void __launch_bounds__(kElemThreads) scatter_kernel(const float * __restrict__ src, int64_t rows, const int32_t * __restrict__ pairs,
                                                              int64_t m, float * __restrict__ dst) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * m;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t j = i / rows, r = i % rows;
        dst[static_cast<int64_t>(pairs[j]) * rows + r] = src[i];
    }
}

// dx[:, t] = sum_s per_pair[:, s, t], s in order.
__global__ void __launch_bounds__(kElemThreads) slot_sum_kernel(const float * __restrict__ per_pair, int64_t K, int64_t k, int64_t T,
                                                               float * __restrict__ dx) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < K * T;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t t = i / K, r = i % K;
        float acc = per_pair[(t * k) * K + r];
        for (int64_t s = 1; s < k; ++s) acc += per_pair[(t * k + s) * K + r];
        dx[i] = acc;
    }
}

// The node's scratch carved as moe_matmul_scratch lays it out.
struct Carved {
    int32_t * starts;
    int32_t * pairs;
    float * panel_in;
    float * panel_out;
    float * per_pair;
    void * gemm;
    size_t gemm_bytes;
};

Carved carve(void * scratch, size_t bytes, const MoeScratch & s, const char * op) {
    require(bytes >= s.total(), op, "scratch of " + std::to_string(bytes) + " bytes is smaller than the " + std::to_string(s.total()) + " needed");
    char * p = static_cast<char *>(scratch);
    Carved c;
    c.starts = reinterpret_cast<int32_t *>(p);
    p += s.starts;
    c.pairs = reinterpret_cast<int32_t *>(p);
    p += s.pairs;
    c.panel_in = reinterpret_cast<float *>(p);
    p += s.panel_in;
    c.panel_out = reinterpret_cast<float *>(p);
    p += s.panel_out;
    c.per_pair = reinterpret_cast<float *>(p);
    p += s.per_pair;
    c.gemm = s.gemm ? p : nullptr;
    c.gemm_bytes = s.gemm;
    return c;
}

// Sorts the pairs of `ids` on the device (into this node's scratch) and returns the per-expert starts on the
// host (E + 1 entries): read back once per graph run and ids tensor (NodeRun::routes), since the sort is
// deterministic and the later nodes of the layer sort the same ids again.
std::vector<int32_t> route(const Tensor * ids, int64_t E, const Carved & c, const NodeRun & r, const char * op) {
    const int64_t n = ids->nelements();
    require(n <= 0x7fffffff && E <= 0x7fffffff, op, "too many (token, slot) pairs or experts");
    route_kernel<<<1, kRouteThreads, 0, r.stream>>>(in<int32_t>(ids), n, E, c.starts, c.pairs, r.flag);
    check_launch(op);
    if (r.routes)
        if (const std::vector<int32_t> * known = r.routes->find(ids, E)) return *known;
    std::vector<int32_t> starts(static_cast<size_t>(E) + 1);
    check(cudaMemcpyAsync(starts.data(), c.starts, starts.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, r.stream),
          (std::string("cuda ") + op + ": reading the expert counts").c_str());
    check(cudaStreamSynchronize(r.stream), (std::string("cuda ") + op + ": waiting for the expert counts").c_str());
    if (r.routes) r.routes->entries.push_back({ids, ids->data, E, starts});
    return starts;
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(elementwise_grid(n)); }

// ---- node entries -------------------------------------------------------------------------------------------

void run_topk(Tensor * n, const NodeRun & r) {
    const Tensor * logits = n->src[0];
    const int64_t E = logits->ne[0], T = logits->ne[1];
    require(r.scratch_bytes >= moe_router_scratch(E, T, false), "moe_topk", "scratch too small");
    if (T == 0) return;
    topk_kernel<<<static_cast<unsigned>(ceil_div(T, kElemThreads)), kElemThreads, 0, r.stream>>>(
        in<float>(logits), E, T, static_cast<int32_t>(n->ne[0]), static_cast<float *>(r.scratch), out<int32_t>(n));
    check_launch("moe_topk");
}


void run_weights(Tensor * n, const NodeRun & r) {
    const Tensor * logits = n->src[0];
    const int64_t E = logits->ne[0], T = logits->ne[1];
    require(r.scratch_bytes >= moe_router_scratch(E, T, false), "moe_weights", "scratch too small");
    if (T == 0) return;
    weights_kernel<<<static_cast<unsigned>(ceil_div(T, kElemThreads)), kElemThreads, 0, r.stream>>>(
        in<float>(logits), in<int32_t>(n->src[1]), E, T, moe_params(n), static_cast<float *>(r.scratch), out<float>(n), r.flag);
    check_launch("moe_weights");
}

void run_weights_back(Tensor * n, const NodeRun & r) {
    const Tensor * logits = n->src[0];
    const int64_t E = logits->ne[0], T = logits->ne[1];
    require(r.scratch_bytes >= moe_router_scratch(E, T, true), "moe_weights_back", "scratch too small");
    if (T == 0) return;
    float * p = static_cast<float *>(r.scratch);
    float * share = p + 2 * E * T;
    const MoeParams mp = moe_params(n);
    if (mp.aux != 0.0f) {
        share_kernel<<<static_cast<unsigned>(ceil_div(E, kElemThreads)), kElemThreads, 0, r.stream>>>(in<int32_t>(n->src[1]), T * mp.k, E, share);
        check_launch("moe_weights_back (expert shares)");
    }
    weights_back_kernel<<<static_cast<unsigned>(ceil_div(T, kElemThreads)), kElemThreads, 0, r.stream>>>(
        in<float>(logits), in<int32_t>(n->src[1]), in<float>(n->src[2]), E, T, mp, p, p + E * T, mp.aux != 0.0f ? share : nullptr,
        out<float>(n), r.flag);
    check_launch("moe_weights_back");
}

void run_mul_mat_id(Tensor * n, const NodeRun & r) {
    const Tensor * W = n->src[0];
    const Tensor * X = n->src[1];
    const Tensor * ids = n->src[2];
    const int64_t K = W->ne[0], N = W->ne[1], E = W->ne[2], k = ids->ne[0], np = ids->nelements();
    const Carved c = carve(r.scratch, r.scratch_bytes, moe_matmul_scratch(K, N, E, np, W->type), "mul_mat_id");
    check(cudaMemsetAsync(n->data, 0, n->nbytes(), r.stream), "cuda mul_mat_id: zeroing the output");
    if (np == 0) return;
    const std::vector<int32_t> st = route(ids, E, c, r, "mul_mat_id");
    const int64_t m_all = st[static_cast<size_t>(E)];
    if (m_all == 0) return;
    gather_kernel<<<grid_for(K * m_all), kElemThreads, 0, r.stream>>>(in<float>(X), K, c.pairs, m_all, k, X->ne[1] == 1, c.panel_in);
    check_launch("mul_mat_id (gather)");
    for (int64_t e = 0; e < E; ++e) {
        const int64_t b = st[static_cast<size_t>(e)], m = st[static_cast<size_t>(e) + 1] - b;
        if (m == 0) continue;
        matmul_fwd(K, N, m, static_cast<const char *>(W->data) + static_cast<size_t>(e) * W->nb[2], W->type, W->nb[1],
                   c.panel_in + b * K, K, c.panel_out + b * N, N, false, c.gemm, c.gemm_bytes, r.stream);
    }
    scatter_kernel<<<grid_for(N * m_all), kElemThreads, 0, r.stream>>>(c.panel_out, N, c.pairs, m_all, out<float>(n));
    check_launch("mul_mat_id (scatter)");
}

void run_mul_mat_id_back_x(Tensor * n, const NodeRun & r) {
    const Tensor * W = n->src[0];
    const Tensor * dY = n->src[1];
    const Tensor * ids = n->src[2];
    const int64_t K = W->ne[0], N = W->ne[1], E = W->ne[2], k = ids->ne[0], T = ids->ne[1], np = ids->nelements();
    const bool shared = n->ne[1] == 1;
    const Carved c = carve(r.scratch, r.scratch_bytes, moe_matmul_scratch(K, N, E, np, W->type), "mul_mat_id_back_x");
    float * per_pair = shared ? c.per_pair : out<float>(n);
    check(cudaMemsetAsync(per_pair, 0, static_cast<size_t>(K * np) * sizeof(float), r.stream), "cuda mul_mat_id_back_x: zeroing");
    if (np > 0) {
        const std::vector<int32_t> st = route(ids, E, c, r, "mul_mat_id_back_x");
        const int64_t m_all = st[static_cast<size_t>(E)];
        if (m_all > 0) {
            gather_kernel<<<grid_for(N * m_all), kElemThreads, 0, r.stream>>>(in<float>(dY), N, c.pairs, m_all, k, false, c.panel_in);
            check_launch("mul_mat_id_back_x (gather)");
            for (int64_t e = 0; e < E; ++e) {
                const int64_t b = st[static_cast<size_t>(e)], m = st[static_cast<size_t>(e) + 1] - b;
                if (m == 0) continue;
                matmul_bwd_x(K, N, m, static_cast<const char *>(W->data) + static_cast<size_t>(e) * W->nb[2], W->type, W->nb[1],
                             c.panel_in + b * N, N, c.panel_out + b * K, K, false, c.gemm, c.gemm_bytes, r.stream);
            }
            scatter_kernel<<<grid_for(K * m_all), kElemThreads, 0, r.stream>>>(c.panel_out, K, c.pairs, m_all, per_pair);
            check_launch("mul_mat_id_back_x (scatter)");
        }
    }
    if (shared && T > 0) {
        slot_sum_kernel<<<grid_for(K * T), kElemThreads, 0, r.stream>>>(per_pair, K, k, T, out<float>(n));
        check_launch("mul_mat_id_back_x (slot sum)");
    }
}

void run_out_prod_id(Tensor * n, const NodeRun & r) {
    const Tensor * X = n->src[0];
    const Tensor * dY = n->src[1];
    const Tensor * ids = n->src[2];
    const bool accumulate = n->param_i32(0) != 0;
    const int64_t K = n->ne[0], N = n->ne[1], E = n->ne[2], k = ids->ne[0], np = ids->nelements();
    const Carved c = carve(r.scratch, r.scratch_bytes, moe_matmul_scratch(K, N, E, np, gguf::TensorType::F32), "out_prod_id");
    if (!accumulate) check(cudaMemsetAsync(n->data, 0, n->nbytes(), r.stream), "cuda out_prod_id: zeroing");
    if (np == 0) return;
    const std::vector<int32_t> st = route(ids, E, c, r, "out_prod_id");
    const int64_t m_all = st[static_cast<size_t>(E)];
    if (m_all == 0) return;
    gather_kernel<<<grid_for(K * m_all), kElemThreads, 0, r.stream>>>(in<float>(X), K, c.pairs, m_all, k, X->ne[1] == 1, c.panel_in);
    gather_kernel<<<grid_for(N * m_all), kElemThreads, 0, r.stream>>>(in<float>(dY), N, c.pairs, m_all, k, false, c.panel_out);
    check_launch("out_prod_id (gather)");
    for (int64_t e = 0; e < E; ++e) {
        const int64_t b = st[static_cast<size_t>(e)], m = st[static_cast<size_t>(e) + 1] - b;
        if (m == 0) continue;
        matmul_bwd_w(K, N, m, c.panel_in + b * K, K, c.panel_out + b * N, N, out<float>(n) + e * K * N, K, true, r.stream);
    }
}

const RegisterNodeKernels kRegister{{Op::MOE_TOPK, run_topk},
                                    {Op::MOE_WEIGHTS, run_weights},
                                    {Op::MOE_WEIGHTS_BACK, run_weights_back},
                                    {Op::MUL_MAT_ID, run_mul_mat_id},
                                    {Op::MUL_MAT_ID_BACK_X, run_mul_mat_id_back_x},
                                    {Op::OUT_PROD_ID, run_out_prod_id}};

} // namespace

} // namespace rp::cuda
