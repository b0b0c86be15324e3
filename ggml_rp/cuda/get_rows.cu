// GET_ROWS (one block per id, any dequantizable table type through quant_block.h's per-element math) and
// GET_ROWS_BACK and SEGMENT_SUM (sort-free deterministic scatter-add: per token, the owner flag and the link to the next token
// with the same id; each owner sums its chain in token order).
#include "ggml_rp/cuda/get_rows.cuh"

#include "ggml_rp/core/quant.h"
#include "ggml_rp/core/quant_block.h"
#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/node_kernel.cuh"

namespace rp::cuda {

namespace {

__device__ inline float elem_f32(const float & x, int) { return x; }
__device__ inline float elem_f16(const uint16_t & h, int) { return fp16_to_fp32(h); }
__device__ inline float elem_bf16(const uint16_t & h, int) { return bf16_to_fp32(h); }

template <class Block, float (*Elem)(const Block &, int), int QK>
__global__ void __launch_bounds__(kElemThreads) get_rows_kernel(const char * __restrict__ table, size_t row_bytes, int64_t n_rows, int64_t C,
                                const int32_t * __restrict__ ids, float * __restrict__ out, int * bad_id) {
    const int64_t k = blockIdx.x;
    const int32_t id = ids[k];
    float * o = out + k * C;
    if (id < 0 || id >= n_rows) {
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = NAN;
        if (threadIdx.x == 0 && bad_id) *bad_id = 1;
        return;
    }
    const Block * row = reinterpret_cast<const Block *>(table + static_cast<size_t>(id) * row_bytes);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = Elem(row[c / QK], static_cast<int>(c % QK));
}

template <class Block, float (*Elem)(const Block &, int), int QK>
void launch(const void * table, size_t row_bytes, int64_t n_rows, int64_t C, const int32_t * ids, int64_t n_ids,
            float * out, int * bad_id, cudaStream_t stream) {
    get_rows_kernel<Block, Elem, QK><<<static_cast<unsigned>(n_ids), row_threads(C < kElemThreads ? C : kElemThreads), 0, stream>>>(
        static_cast<const char *>(table), row_bytes, n_rows, C, ids, out, bad_id);
    check_launch("get_rows");
}

// owner[k] = no earlier token has ids[k]; next[k] = the next token with ids[k], or -1.
__global__ void __launch_bounds__(kElemThreads) link_kernel(const int32_t * __restrict__ ids, int64_t n, int32_t * __restrict__ next,
                            int32_t * __restrict__ owner) {
    const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (k >= n) return;
    const int32_t id = ids[k];
    int32_t nx = -1;
    for (int64_t j = k + 1; j < n; ++j)
        if (ids[j] == id) { nx = static_cast<int32_t>(j); break; }
    int32_t own = 1;
    for (int64_t j = k - 1; j >= 0; --j)
        if (ids[j] == id) { own = 0; break; }
    next[k] = nx;
    owner[k] = own;
}

// One block per token (x) and column chunk (y): owners add their chain's rows in token order.
__global__ void __launch_bounds__(kElemThreads) scatter_kernel(const float * __restrict__ dy, const int32_t * __restrict__ ids,
                               const int32_t * __restrict__ next, const int32_t * __restrict__ owner, float * dtable,
                               int64_t C, int64_t n_rows, int * bad_id) {
    const int64_t k = blockIdx.x;
    if (!owner[k]) return;
    const int32_t id = ids[k];
    if (id < 0 || id >= n_rows) {
        if (threadIdx.x == 0 && bad_id) *bad_id = 1;
        return;
    }
    const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = dtable[static_cast<int64_t>(id) * C + c];
    for (int64_t j = k; j >= 0; j = next[j]) acc += dy[j * C + c];
    dtable[static_cast<int64_t>(id) * C + c] = acc;
}

} // namespace

void get_rows(const void * table, gguf::TensorType type, size_t row_bytes, int64_t n_rows, int64_t C,
              const int32_t * ids, int64_t n_ids, float * out, int * bad_id, cudaStream_t stream) {
    using T = gguf::TensorType;
    const gguf::TypeTraits * tt = gguf::type_traits(static_cast<uint32_t>(type));
    require(tt && can_dequantize(type), "get_rows", std::string("unsupported table type ") +
                                                     gguf::type_name(static_cast<uint32_t>(type)));
    require(C >= 1 && C % tt->block_size == 0, "get_rows",
            "row length " + std::to_string(C) + " is not a multiple of the block size of " + tt->name);
    require(n_ids >= 0 && n_ids <= 0x7fffffff, "get_rows", "bad id count " + std::to_string(n_ids));
    if (n_ids == 0) return;
    switch (type) {
    case T::F32: return launch<float, elem_f32, 1>(table, row_bytes, n_rows, C, ids, n_ids, out, bad_id, stream);
    case T::F16: return launch<uint16_t, elem_f16, 1>(table, row_bytes, n_rows, C, ids, n_ids, out, bad_id, stream);
    case T::BF16: return launch<uint16_t, elem_bf16, 1>(table, row_bytes, n_rows, C, ids, n_ids, out, bad_id, stream);
    case T::Q4_0: return launch<block_q4_0, dequant_elem_q4_0, QK4_0>(table, row_bytes, n_rows, C, ids, n_ids, out, bad_id, stream);
    case T::Q4_1: return launch<block_q4_1, dequant_elem_q4_1, QK4_1>(table, row_bytes, n_rows, C, ids, n_ids, out, bad_id, stream);
    case T::Q5_0: return launch<block_q5_0, dequant_elem_q5_0, QK5_0>(table, row_bytes, n_rows, C, ids, n_ids, out, bad_id, stream);
    case T::Q5_1: return launch<block_q5_1, dequant_elem_q5_1, QK5_1>(table, row_bytes, n_rows, C, ids, n_ids, out, bad_id, stream);
    case T::Q8_0: return launch<block_q8_0, dequant_elem_q8_0, QK8_0>(table, row_bytes, n_rows, C, ids, n_ids, out, bad_id, stream);
    case T::Q2_K: return launch<block_q2_K, dequant_elem_q2_K, QK_K>(table, row_bytes, n_rows, C, ids, n_ids, out, bad_id, stream);
    case T::Q3_K: return launch<block_q3_K, dequant_elem_q3_K, QK_K>(table, row_bytes, n_rows, C, ids, n_ids, out, bad_id, stream);
    case T::Q4_K: return launch<block_q4_K, dequant_elem_q4_K, QK_K>(table, row_bytes, n_rows, C, ids, n_ids, out, bad_id, stream);
    case T::Q5_K: return launch<block_q5_K, dequant_elem_q5_K, QK_K>(table, row_bytes, n_rows, C, ids, n_ids, out, bad_id, stream);
    case T::Q6_K: return launch<block_q6_K, dequant_elem_q6_K, QK_K>(table, row_bytes, n_rows, C, ids, n_ids, out, bad_id, stream);
    default:
        require(false, "get_rows", std::string("unsupported table type ") + tt->name);
    }
}

void get_rows_back(const float * dy, const int32_t * ids, int64_t n_ids, float * dtable, int64_t C, int64_t n_rows,
                   bool accumulate, void * workspace, size_t workspace_bytes, int * bad_id, cudaStream_t stream) {
    require(C >= 1 && n_rows >= 1, "get_rows_back", "bad table shape [" + std::to_string(C) + ", " +
                                                        std::to_string(n_rows) + "]");
    require(n_ids >= 0 && n_ids <= 0x7fffffff, "get_rows_back", "bad id count " + std::to_string(n_ids));
    require(workspace_bytes >= get_rows_back_workspace_bytes(n_ids), "get_rows_back",
            "workspace of " + std::to_string(workspace_bytes) + " bytes is smaller than the " +
                std::to_string(get_rows_back_workspace_bytes(n_ids)) + " needed");
    if (!accumulate)
        check(cudaMemsetAsync(dtable, 0, static_cast<size_t>(C * n_rows) * sizeof(float), stream),
              "cuda get_rows_back: zeroing the table gradient");
    if (n_ids == 0) return;
    int32_t * next = static_cast<int32_t *>(workspace);
    int32_t * owner = next + round_up(n_ids, 64);
    link_kernel<<<static_cast<unsigned>(ceil_div(n_ids, kElemThreads)), kElemThreads, 0, stream>>>(ids, n_ids, next, owner);
    check_launch("get_rows_back (links)");
    const int threads = row_threads(C < kElemThreads ? C : kElemThreads);
    const dim3 grid(static_cast<unsigned>(n_ids), static_cast<unsigned>(ceil_div(C, threads)));
    scatter_kernel<<<grid, threads, 0, stream>>>(dy, ids, next, owner, dtable, C, n_rows, bad_id);
    check_launch("get_rows_back (scatter)");
}

// ---- node entries ----
namespace {
void run_get_rows(Tensor * n, const NodeRun & r) {
    const Tensor * table = n->src[0];
    const Tensor * ids = n->src[1];
    get_rows(table->data, table->type, table->nb[1], table->ne[1], table->ne[0], in<int32_t>(ids), ids->nelements(),
             out<float>(n), r.flag, r.stream);
}
void run_get_rows_back(Tensor * n, const NodeRun & r) {
    const Tensor * ids = n->src[1];
    get_rows_back(in<float>(n->src[0]), in<int32_t>(ids), ids->nelements(), out<float>(n), n->ne[0], n->ne[1],
                  n->param_i32(0) != 0, r.scratch, r.scratch_bytes, r.flag, r.stream);
}
// SEGMENT_SUM: the scatter-add of one column into n_segments rows (x contiguous: backend_plan.h)
void run_segment_sum(Tensor * n, const NodeRun & r) {
    const Tensor * ids = n->src[1];
    get_rows_back(in<float>(n->src[0]), in<int32_t>(ids), ids->nelements(), out<float>(n), 1, n->ne[0], false, r.scratch, r.scratch_bytes,
                  r.flag, r.stream);
}
const RegisterNodeKernels kRegister{{Op::GET_ROWS, run_get_rows}, {Op::GET_ROWS_BACK, run_get_rows_back}, {Op::SEGMENT_SUM, run_segment_sum}};
} // namespace

} // namespace rp::cuda
