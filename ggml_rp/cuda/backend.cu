// The CUDA backend (backend.h): graph memory from the device's arena, one switch over Op that calls the
// launchers of ggml_rp/cuda/*.cuh (the counterpart of cpu::compute_node), and the small kernels of the ops
// that have no launcher file of their own: FILL, CPY (strided, f32/f16/bf16), REPEAT, SUM_TO, SUM and MEAN,
// and the f64 -> f32 store of the cross-entropy loss. These are plain grid-stride loops; each output element
// is computed by one thread in the CPU kernel's order of summation, so results do not depend on the launch.
#include "ggml_rp/cuda/backend.h"

#include "ggml_rp/cuda/attention.cuh"
#include "ggml_rp/cuda/backend_plan.h"
#include "ggml_rp/cuda/binary.cuh"
#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/cross_entropy.cuh"
#include "ggml_rp/cuda/cuda_device.h"
#include "ggml_rp/cuda/dropout.cuh"
#include "ggml_rp/cuda/get_rows.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/mul_mat.cuh"
#include "ggml_rp/cuda/norm.cuh"
#include "ggml_rp/cuda/rope.cuh"
#include "ggml_rp/cuda/softmax.cuh"
#include "ggml_rp/cuda/unary.cuh"
#include "ggml_rp/ops/dropout.h"
#include "ggml_rp/ops/rope.h"
#include "gguf/error.h"

#include <algorithm>
#include <cstring>

namespace rp {

namespace {

using cuda::check;
using cuda::check_launch;

// ---- kernels of the ops without a launcher file -----------------------------------------------------------

// Sizes and byte strides of a tensor, passed by value to a kernel.
struct Strided {
    int64_t ne[4];
    int64_t nb[4];
};

Strided strided(const Tensor * t) {
    Strided s;
    for (int i = 0; i < 4; ++i) {
        s.ne[i] = t->ne[i];
        s.nb[i] = static_cast<int64_t>(t->nb[i]);
    }
    return s;
}

// Element types of CPY: 0 f32, 1 f16, 2 bf16.
int float_code(DType t) { return t == DType::F16 ? 1 : t == DType::BF16 ? 2 : 0; }

__device__ inline int64_t offset_of(const Strided & s, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return i0 * s.nb[0] + i1 * s.nb[1] + i2 * s.nb[2] + i3 * s.nb[3];
}

// Linear index i (i0 fastest) of a tensor with sizes ne -> its four coordinates.
__device__ inline void coords(const Strided & s, int64_t i, int64_t c[4]) {
    c[0] = i % s.ne[0];
    i /= s.ne[0];
    c[1] = i % s.ne[1];
    i /= s.ne[1];
    c[2] = i % s.ne[2];
    c[3] = i / s.ne[2];
}

__device__ inline float load_float(const char * p, int code) {
    if (code == 1) return __half2float(*reinterpret_cast<const __half *>(p));
    if (code == 2) return __bfloat162float(*reinterpret_cast<const __nv_bfloat16 *>(p));
    return *reinterpret_cast<const float *>(p);
}

__device__ inline void store_float(char * p, int code, float v) {
    if (code == 1) *reinterpret_cast<__half *>(p) = __float2half_rn(v);
    else if (code == 2) *reinterpret_cast<__nv_bfloat16 *>(p) = __float2bfloat16_rn(v);
    else *reinterpret_cast<float *>(p) = v;
}

__global__ void fill_kernel(float * d, float v, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) d[i] = v;
}

__global__ void cpy_kernel(const char * src, Strided ss, int scode, char * dst, Strided ds, int dcode, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        int64_t c[4];
        coords(ds, i, c);
        const float v = load_float(src + offset_of(ss, c[0], c[1], c[2], c[3]), scode);
        store_float(dst + offset_of(ds, c[0], c[1], c[2], c[3]), dcode, v);
    }
}

// out[i0..i3] = x[i0 % xne0, i1 % xne1, i2 % xne2, i3 % xne3]
__global__ void repeat_kernel(const char * src, Strided xs, char * dst, Strided ds, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        int64_t c[4];
        coords(ds, i, c);
        const float v = *reinterpret_cast<const float *>(
            src + offset_of(xs, c[0] % xs.ne[0], c[1] % xs.ne[1], c[2] % xs.ne[2], c[3] % xs.ne[3]));
        *reinterpret_cast<float *>(dst + offset_of(ds, c[0], c[1], c[2], c[3])) = v;
    }
}

// Each output element sums its repeats in double, in the CPU kernel's order: (a3, a2, a1) then a0.
__global__ void sum_to_kernel(const char * src, Strided xs, char * dst, Strided ds, int64_t n) {
    const int64_t r0 = xs.ne[0] / ds.ne[0], r1 = xs.ne[1] / ds.ne[1], r2 = xs.ne[2] / ds.ne[2], r3 = xs.ne[3] / ds.ne[3];
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        int64_t c[4];
        coords(ds, i, c);
        double acc = 0.0;
        for (int64_t a3 = 0; a3 < r3; ++a3)
            for (int64_t a2 = 0; a2 < r2; ++a2)
                for (int64_t a1 = 0; a1 < r1; ++a1)
                    for (int64_t a0 = 0; a0 < r0; ++a0)
                        acc += *reinterpret_cast<const float *>(
                            src + offset_of(xs, c[0] + a0 * ds.ne[0], c[1] + a1 * ds.ne[1], c[2] + a2 * ds.ne[2],
                                            c[3] + a3 * ds.ne[3]));
        *reinterpret_cast<float *>(dst + offset_of(ds, c[0], c[1], c[2], c[3])) = static_cast<float>(acc);
    }
}

// One block of 256 threads: per-thread strided sums in double, then a fixed tree; out = sum * mul.
constexpr int kSumThreads = 256;
__global__ void sum_kernel(const char * src, Strided xs, int64_t n, double mul, float * out) {
    __shared__ double part[kSumThreads];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        int64_t c[4];
        coords(xs, i, c);
        s += *reinterpret_cast<const float *>(src + offset_of(xs, c[0], c[1], c[2], c[3]));
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = kSumThreads / 2; w > 0; w >>= 1) {
        if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = static_cast<float>(part[0] * mul);
}

__global__ void store_loss_kernel(const double * loss, float * out) { *out = static_cast<float>(*loss); }

unsigned grid_of(int64_t n) { return static_cast<unsigned>(cuda::elementwise_grid(n)); }

// ---- node glue ----------------------------------------------------------------------------------------------

struct NodeRun {
    cudaStream_t stream;
    void * scratch;           // kernel workspace
    size_t scratch_bytes;
    int * flag;               // this node's bad-index flag (nullptr when it has none)
    double * loss;            // f64 scratch of LM_HEAD_CE
    float * host_scalar;      // pinned float for a synchronous dloss read
};

template <class T> const T * in(const Tensor * t) { return static_cast<const T *>(t ? t->data : nullptr); }
template <class T> T * out(const Tensor * t) { return static_cast<T *>(t->data); }

void shape4(const Tensor * t, int64_t ne[4]) {
    for (int i = 0; i < 4; ++i) ne[i] = t->ne[i];
}

const char * wbatch(const Tensor * W, int64_t i2, int64_t i3, const Tensor * X) {
    const int64_t r2 = X->ne[2] / W->ne[2], r3 = X->ne[3] / W->ne[3];
    return static_cast<const char *>(W->data) + (i2 / r2) * W->nb[2] + (i3 / r3) * W->nb[3];
}

inline int64_t col_floats(const Tensor * t) { return static_cast<int64_t>(t->nb[1] / sizeof(float)); }

const float * col_ptr(const Tensor * t, int64_t i2, int64_t i3) {
    return reinterpret_cast<const float *>(static_cast<const char *>(t->data) + i2 * t->nb[2] + i3 * t->nb[3]);
}
float * col_ptr_mut(const Tensor * t, int64_t i2, int64_t i3) {
    return reinterpret_cast<float *>(static_cast<char *>(t->data) + i2 * t->nb[2] + i3 * t->nb[3]);
}

cuda::AttentionShape attention_shape(const Tensor * q, const Tensor * k, float scale) {
    cuda::AttentionShape s;
    s.D = q->ne[0];
    s.Hq = q->ne[1];
    s.Hkv = k->ne[1];
    s.Tq = q->ne[2];
    s.Tk = k->ne[2];
    s.B = q->ne[3];
    s.scale = scale;
    return s;
}

float * aux(const Tensor * t, size_t offset) {
    return reinterpret_cast<float *>(static_cast<char *>(t->data) + t->nbytes() + offset);
}

// dloss of LM_HEAD_CE_BACK on the host: a FILL's value, or a synchronous read of the device scalar.
float host_dloss(const Tensor * dloss, const NodeRun & r) {
    if (dloss->op == Op::FILL) return dloss->param_f32(0);
    check(cudaMemcpyAsync(r.host_scalar, dloss->data, sizeof(float), cudaMemcpyDeviceToHost, r.stream),
          "cuda lm_head_ce_back: cudaMemcpyAsync of dloss");
    check(cudaStreamSynchronize(r.stream), "cuda lm_head_ce_back: cudaStreamSynchronize for dloss");
    return *r.host_scalar;
}

void enqueue_cpy(const Tensor * src, const Tensor * dst, cudaStream_t s);

void run_node(Tensor * n, const NodeRun & r) {
    cudaStream_t s = r.stream;
    switch (n->op) {
    case Op::NONE: case Op::VIEW: return;
    case Op::FILL: {
        const int64_t ne = n->nelements();
        if (ne > 0) fill_kernel<<<grid_of(ne), cuda::kElemThreads, 0, s>>>(out<float>(n), n->param_f32(0), ne);
        check_launch("fill");
        return;
    }
    case Op::CPY: enqueue_cpy(n->src[0], n, s); return;
    case Op::REPEAT: {
        const int64_t ne = n->nelements();
        if (ne > 0) {
            repeat_kernel<<<grid_of(ne), cuda::kElemThreads, 0, s>>>(in<char>(n->src[0]), strided(n->src[0]),
                                                                      out<char>(n), strided(n), ne);
        }
        check_launch("repeat");
        return;
    }
    case Op::SUM_TO: {
        const int64_t ne = n->nelements();
        if (ne > 0) {
            sum_to_kernel<<<grid_of(ne), cuda::kElemThreads, 0, s>>>(in<char>(n->src[0]), strided(n->src[0]),
                                                                      out<char>(n), strided(n), ne);
        }
        check_launch("sum_to");
        return;
    }
    case Op::SUM: case Op::MEAN: {
        const Tensor * x = n->src[0];
        const int64_t ne = x->nelements();
        const double mul = n->op == Op::MEAN ? 1.0 / static_cast<double>(ne) : 1.0;
        sum_kernel<<<1, kSumThreads, 0, s>>>(in<char>(x), strided(x), ne, mul, out<float>(n));
        check_launch(n->op == Op::MEAN ? "mean" : "sum");
        return;
    }
    case Op::ADD: case Op::MUL: {
        int64_t ne[4], bne[4];
        shape4(n, ne);
        shape4(n->src[1], bne);
        if (n->op == Op::ADD) cuda::add(in<float>(n->src[0]), in<float>(n->src[1]), out<float>(n), ne, bne, s);
        else cuda::mul(in<float>(n->src[0]), in<float>(n->src[1]), out<float>(n), ne, bne, s);
        return;
    }
    case Op::SCALE: cuda::scale(in<float>(n->src[0]), n->param_f32(0), out<float>(n), n->nelements(), s); return;
    case Op::SILU: cuda::silu_fwd(in<float>(n->src[0]), out<float>(n), n->nelements(), s); return;
    case Op::SILU_BACK:
        cuda::silu_bwd(in<float>(n->src[0]), in<float>(n->src[1]), out<float>(n), n->nelements(), s);
        return;
    case Op::SWIGLU: cuda::swiglu_fwd(in<float>(n->src[0]), in<float>(n->src[1]), out<float>(n), n->nelements(), s); return;
    case Op::SWIGLU_BACK:
        cuda::swiglu_bwd(in<float>(n->src[0]), in<float>(n->src[1]), in<float>(n->src[2]), out<float>(n),
                         n->param_i32(0), n->nelements(), s);
        return;
    case Op::DROPOUT: {
        const DropoutParams d = dropout_params(n);
        cuda::dropout(in<float>(n->src[0]), out<float>(n), n->nelements(), d.p, d.key, d.counter_offset, s);
        return;
    }
    case Op::SOFTMAX: cuda::softmax_fwd(in<float>(n->src[0]), out<float>(n), n->ne[0], n->nrows(), s); return;
    case Op::SOFTMAX_BACK:
        cuda::softmax_bwd(in<float>(n->src[0]), in<float>(n->src[1]), out<float>(n), n->ne[0], n->nrows(), s);
        return;
    case Op::RMS_NORM:
        cuda::rms_norm_fwd(in<float>(n->src[0]), in<float>(n->src[1]), out<float>(n), n->ne[0], n->nrows(),
                           n->param_f32(0), s);
        return;
    case Op::RMS_NORM_BACK:
        cuda::rms_norm_bwd(in<float>(n->src[0]), in<float>(n->src[2]), in<float>(n->src[1]), out<float>(n), n->ne[0],
                           n->nrows(), n->param_f32(0), s);
        return;
    case Op::ROPE: case Op::ROPE_BACK: {
        cuda::RopeConfig c;
        c.n_rot = n->param_i32(0);
        c.neox = n->param_i32(1) == static_cast<int32_t>(RopeMode::Neox);
        c.freq_base = n->param_f32(2);
        c.freq_scale = n->param_f32(3);
        int64_t ne[4];
        shape4(n, ne);
        cuda::rope(in<float>(n->src[0]), in<int32_t>(n->src[1]), n->src[1]->ne[0], out<float>(n), ne, c,
                   n->op == Op::ROPE_BACK, s);
        return;
    }
    case Op::GET_ROWS: {
        const Tensor * table = n->src[0];
        const Tensor * ids = n->src[1];
        cuda::get_rows(table->data, table->type, table->nb[1], table->ne[1], table->ne[0], in<int32_t>(ids),
                       ids->nelements(), out<float>(n), r.flag, s);
        return;
    }
    case Op::GET_ROWS_BACK: {
        const Tensor * dy = n->src[0];
        const Tensor * ids = n->src[1];
        cuda::get_rows_back(in<float>(dy), in<int32_t>(ids), ids->nelements(), out<float>(n), n->ne[0], n->ne[1],
                            n->param_i32(0) != 0, r.scratch, r.scratch_bytes, r.flag, s);
        return;
    }
    case Op::MUL_MAT: {
        const Tensor * W = n->src[0];
        const Tensor * X = n->src[1];
        const int64_t K = W->ne[0], N = W->ne[1], T = X->ne[1];
        for (int64_t i3 = 0; i3 < X->ne[3]; ++i3)
            for (int64_t i2 = 0; i2 < X->ne[2]; ++i2)
                cuda::matmul_fwd(K, N, T, wbatch(W, i2, i3, X), W->type, W->nb[1], col_ptr(X, i2, i3), col_floats(X),
                                 col_ptr_mut(n, i2, i3), col_floats(n), false, r.scratch, r.scratch_bytes, s);
        return;
    }
    case Op::MUL_MAT_BACK_X: {
        const Tensor * W = n->src[0];
        const Tensor * dY = n->src[1];
        const int64_t K = W->ne[0], N = W->ne[1], T = n->ne[1];
        for (int64_t i3 = 0; i3 < n->ne[3]; ++i3)
            for (int64_t i2 = 0; i2 < n->ne[2]; ++i2)
                cuda::matmul_bwd_x(K, N, T, wbatch(W, i2, i3, n), W->type, W->nb[1], col_ptr(dY, i2, i3),
                                   col_floats(dY), col_ptr_mut(n, i2, i3), col_floats(n), false, r.scratch,
                                   r.scratch_bytes, s);
        return;
    }
    case Op::OUT_PROD: {
        const Tensor * X = n->src[0];
        const Tensor * dY = n->src[1];
        const bool accumulate = n->param_i32(0) != 0;
        const int64_t K = n->ne[0], N = n->ne[1], T = X->ne[1];
        const int64_t r2 = X->ne[2] / n->ne[2], r3 = X->ne[3] / n->ne[3];
        // Each weight batch sums the activation batches that used it, in the CPU kernel's order.
        for (int64_t w3 = 0; w3 < n->ne[3]; ++w3)
            for (int64_t w2 = 0; w2 < n->ne[2]; ++w2) {
                bool acc = accumulate;
                for (int64_t i3 = w3 * r3; i3 < (w3 + 1) * r3; ++i3)
                    for (int64_t i2 = w2 * r2; i2 < (w2 + 1) * r2; ++i2) {
                        cuda::matmul_bwd_w(K, N, T, col_ptr(X, i2, i3), col_floats(X), col_ptr(dY, i2, i3),
                                           col_floats(dY), col_ptr_mut(n, w2, w3), col_floats(n), acc, s);
                        acc = true;
                    }
            }
        return;
    }
    case Op::ATTENTION: {
        const Tensor * q = n->src[0];
        const Tensor * k = n->src[1];
        cuda::attention_fwd(attention_shape(q, k, n->param_f32(0)), q->type, q->data, k->data, n->src[2]->data,
                            out<float>(n), aux(n, 0), s);
        return;
    }
    case Op::ATTENTION_BACK: {
        const Tensor * q = n->src[0];
        const Tensor * k = n->src[1];
        cuda::attention_bwd(attention_shape(q, k, n->param_f32(0)), q->type, q->data, k->data, n->src[2]->data,
                            in<float>(n->src[3]), in<float>(n->src[4]), n->src[5]->data, out<float>(n), aux(n, 0),
                            aux(n, k->nbytes()), r.scratch, r.scratch_bytes, s);
        return;
    }
    case Op::LM_HEAD_CE: case Op::LM_HEAD_CE_BACK: {
        const Tensor * h = n->src[0];
        const Tensor * W = n->src[1];
        cuda::LmHeadCEShape sh;
        sh.C = h->ne[0];
        sh.V = W->ne[1];
        sh.T = h->ne[1];
        sh.chunk = std::max<int64_t>(1, n->param_i32(1));
        if (n->op == Op::LM_HEAD_CE) {
            cuda::lm_head_ce(sh, in<float>(h), W->data, W->type, W->nb[1], in<int32_t>(n->src[2]), n->param_f32(0),
                             r.loss, nullptr, nullptr, 0, r.scratch, r.scratch_bytes, r.flag, s);
            store_loss_kernel<<<1, 1, 0, s>>>(r.loss, out<float>(n));
            check_launch("lm_head_ce (store loss)");
            return;
        }
        const Tensor * dW = n->src[4];
        const float scale = n->param_f32(0) * host_dloss(n->src[3], r);
        cuda::lm_head_ce(sh, in<float>(h), W->data, W->type, W->nb[1], in<int32_t>(n->src[2]), scale, r.loss,
                         out<float>(n), dW ? out<float>(dW) : nullptr, dW ? col_floats(dW) : 0, r.scratch,
                         r.scratch_bytes, r.flag, s);
        return;
    }
    default: break;
    }
    throw Error(std::string("cuda compute: no CUDA kernel for op ") + op_name(n->op) + " (" + describe(n) + ")");
}

// Enqueues dst = src element by element through both tensors' strides, converting f32/f16/bf16.
void enqueue_cpy(const Tensor * src, const Tensor * dst, cudaStream_t s) {
    const int64_t ne = dst->nelements();
    if (ne > 0) {
        cpy_kernel<<<grid_of(ne), cuda::kElemThreads, 0, s>>>(in<char>(src), strided(src), float_code(src->type),
                                                               out<char>(dst), strided(dst), float_code(dst->type), ne);
    }
    check_launch("cpy");
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
        enqueue_cpy(src, &pk.src[i], s);
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
    try { dev_.free(buffer_); } catch (...) {}
    try { dev_.free(workspace_); } catch (...) {}
    try { dev_.free_pinned(host_flags_); } catch (...) {}
}

size_t CudaBackend::allocate(const Graph & g) {
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
    // Pinned host copy: one float for a dloss read, then the flags.
    const size_t host_need = sizeof(float) + flags * sizeof(int);
    if (!host_flags_ || host_need > host_flag_capacity_) {
        dev_.free_pinned(host_flags_);
        host_flags_ = nullptr;
        host_flag_capacity_ = 0;
        host_flags_ = dev_.alloc_pinned(host_need);
        host_flag_capacity_ = host_need;
    }
    std::memset(host_flags_, 0, host_flag_capacity_);
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

    NodeRun r{s, workspace_, 0, nullptr, loss, static_cast<float *>(host_flags_)};
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
            if (pk.output_packed) enqueue_cpy(&pk.output, n, s);
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
