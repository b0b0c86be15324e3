// LM_HEAD_CE and LM_HEAD_CE_BACK: chunked logits through cuBLAS, online logsumexp per token (one block per
// token per chunk), gradient tile in place, then the two backward GEMMs per chunk; or the gradient formed in
// the forward (one GEMM more per chunk there, none in the backward). See cross_entropy.cuh.
#include "ggml_rp/cuda/cross_entropy.cuh"

#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/get_rows.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/mul_mat.cuh"
#include "ggml_rp/cuda/unary.cuh"
#include "ggml_rp/cuda/node_kernel.cuh"
#include "ggml_rp/ops/cross_entropy.h"
#include "ggml_rp/ops/node_args.h"

namespace rp::cuda {

namespace {

// The running state's start; the label derivative 1 (no cap, or no label yet).
__global__ void __launch_bounds__(kElemThreads) ce_init_kernel(float * m, double * sum, double * other, float * label_logit, float * label_d,
                                                              int64_t T) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= T) return;
    m[t] = -INFINITY;
    sum[t] = 0.0;
    other[t] = 0.0;
    label_logit[t] = 0.0f;
    label_d[t] = 1.0f;
}

// One block per token: fold the chunk's logits (column t at L + t*nv) into the running max, the sum and the sum
// without the label (`other`: 1 - p_label = other / sum, the gradient's exact label entry). With `grad` (the
// gradient formed in the forward) the column then becomes the gradient tile exp(l - m) * d (d = 1 - tanh^2 of
// the capped logit, 1 without a cap; the label's entry 0; all 0 for a masked token), the factor that brings the
// token's running gradient to the new maximum goes into rescale, and the label logit's d into label_d. The max and
// the sums are the same floats either way.
__global__ void __launch_bounds__(kRowMaxThreads) ce_pass1_kernel(float * __restrict__ L, int64_t nv, int64_t v0, int64_t V,
                                const int32_t * __restrict__ labels, float * m, double * sum, float * label_logit,
                                bool grad, float softcap, double * other, float * rescale, float * label_d) {
    __shared__ float red[32];
    const int64_t t = blockIdx.x;
    float * col = L + t * nv;
    const float mold = m[t];
    float mx = mold;
    for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) mx = fmaxf(mx, col[j]);
    mx = block_max(mx, red);
    const int32_t y = labels[t];
    const bool has_label = y >= v0 && y < v0 + nv;
    const bool masked = y < 0 || y >= V;
    float cs = 0.0f, co = 0.0f;
    for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) {
        const float e = expf(col[j] - mx);
        cs += e;
        if (v0 + j != y) co += e;
    }
    cs = block_sum(cs, red);
    co = block_sum(co, red);
    const float ly = has_label ? col[y - v0] : 0.0f;   // read by every thread before the tile is written
    const double r = mold == mx ? 1.0 : exp(static_cast<double>(mold) - static_cast<double>(mx));
    if (grad) {
        __syncthreads();
        for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) {
            const float e = expf(col[j] - mx);
            const float tc = softcap > 0.0f ? col[j] / softcap : 0.0f;
            col[j] = masked || v0 + j == y ? 0.0f : e * (1.0f - tc * tc);
        }
        if (threadIdx.x == 0 && !masked) {
            rescale[t] = static_cast<float>(r);
            if (has_label && softcap > 0.0f) label_d[t] = 1.0f - (ly / softcap) * (ly / softcap);
        }
    }
    if (threadIdx.x == 0) {
        if (has_label) label_logit[t] = ly;
        sum[t] = (mold == mx ? sum[t] : sum[t] * exp(static_cast<double>(mold) - static_cast<double>(mx))) + cs;
        other[t] = other[t] * r + co;
        m[t] = mx;
    }
}

// No rescale (a masked token's stays so: pass 1 sets only the others').
__global__ void __launch_bounds__(kElemThreads) ce_rescale_init_kernel(float * rescale, int64_t T) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t < T) rescale[t] = 1.0f;
}

// A streamed head's label rows: each token's row index inside the chunk [v0, v0 + nv) (0 when its label is not
// there), and after the gather (tile: the chunk's rows by those ids, [C, T]) the rows of the tokens whose label is
// there kept in the state.
__global__ void __launch_bounds__(kElemThreads) ce_local_ids_kernel(const int32_t * labels, int64_t v0, int64_t nv, int64_t T, int32_t * ids) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const int32_t y = labels[t];
    ids[t] = y >= v0 && y < v0 + nv ? static_cast<int32_t>(y - v0) : 0;
}
__global__ void __launch_bounds__(kElemThreads) ce_keep_label_rows_kernel(const float * __restrict__ tile, const int32_t * __restrict__ labels,
                                                                         int64_t v0, int64_t nv, int64_t C, int64_t T, float * rows) {
    const int64_t n = C * T;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int32_t y = labels[e / C];
        if (y >= v0 && y < v0 + nv) rows[e] = tile[e];
    }
}

// Column t of u ([C, T]) times rescale[t]: the running gradients brought to the chunk's new maxima.
__global__ void __launch_bounds__(kElemThreads) ce_rescale_kernel(float * u, const float * __restrict__ rescale, int64_t C, int64_t T) {
    const int64_t n = C * T;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) u[e] *= rescale[e / C];
}

// Per token: the ids to gather (the label, 0 for a masked token: its row is not used; ids may be null), 1 / sum
// into inv and (1 - p_label) * d_label into coef.
__global__ void __launch_bounds__(kElemThreads) ce_grad_coef_kernel(const int32_t * labels, int64_t V, int64_t T, const double * sum,
                                    const float * rest, const float * label_d, int32_t * ids, float * inv, float * coef) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const int32_t y = labels[t];
    const bool masked = y < 0 || y >= V;
    if (ids) ids[t] = masked ? 0 : y;
    inv[t] = masked ? 0.0f : static_cast<float>(1.0 / sum[t]);
    coef[t] = masked ? 0.0f : rest[t] * label_d[t];
}

// u = acc / sum - coef * (the label's row); 0 for masked tokens (inv = coef = 0). u may be acc.
__global__ void __launch_bounds__(kElemThreads) ce_grad_finish_kernel(float * u, const float * acc, const float * __restrict__ wy,
                                      const float * __restrict__ inv, const float * __restrict__ coef, int64_t C, int64_t T) {
    const int64_t n = C * T;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t t = e / C;
        u[e] = inv[t] == 0.0f ? 0.0f : acc[e] * inv[t] - coef[t] * wy[e];
    }
}

// dh = unit * loss_scale (* token_scale[t]).
__global__ void __launch_bounds__(kElemThreads) ce_scale_unit_kernel(float * dh, const float * __restrict__ unit, int64_t C, int64_t T,
                                     float loss_scale, const float * __restrict__ token_scale) {
    const int64_t n = C * T;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride)
        dh[e] = unit[e] * (token_scale ? loss_scale * token_scale[e / C] : loss_scale);
}

__global__ void __launch_bounds__(kElemThreads) ce_finish_kernel(const float * m, const double * sum, const double * other,
                                 const float * label_logit, const int32_t * labels, int64_t V, int64_t T, float loss_scale,
                                 float * lse, float * rest, double * tokloss, int * bad_label) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const double l = static_cast<double>(m[t]) + log(sum[t]);
    lse[t] = static_cast<float>(l);
    const int32_t y = labels[t];
    if (y < -1 || y >= V) {
        if (bad_label) *bad_label = 1;
    }
    const bool valid = y >= 0 && y < V;
    rest[t] = valid ? static_cast<float>(other[t] / sum[t]) : 0.0f;
    tokloss[t] = valid ? static_cast<double>(loss_scale) * (l - static_cast<double>(label_logit[t])) : 0.0;
}

// One block of 256 threads: loss = sum of tokloss, strided per thread then a fixed tree.
__global__ void __launch_bounds__(kElemThreads) ce_sum_kernel(const double * tokloss, int64_t T, double * loss) {
    __shared__ double part[kElemThreads];
    double s = 0.0;
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x) s += tokloss[t];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *loss = part[0];
}

// The per-token losses as floats (the per-token form's output).
__global__ void __launch_bounds__(kElemThreads) ce_token_loss_kernel(const double * tokloss, int64_t T, float * out_) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t < T) out_[t] = static_cast<float>(tokloss[t]);
}

// In place: logits -> (softmax - onehot) * loss_scale (* token_scale[t]) for valid labels, 0 for ignored tokens;
// the label's p - 1 is -rest[t] (the other probabilities summed apart: exact where p is near 1).
__global__ void __launch_bounds__(kElemThreads) ce_grad_kernel(float * L, int64_t nv, int64_t v0, int64_t T, const int32_t * __restrict__ labels,
                               const float * __restrict__ lse, const float * __restrict__ rest, int64_t V, float loss_scale,
                               float softcap, const float * __restrict__ token_scale) {
    const int64_t n = nv * T;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t t = e / nv, j = e % nv;
        const int32_t y = labels[t];
        if (y < 0 || y >= V) { L[e] = 0.0f; continue; }
        const float g = v0 + j == y ? -rest[t] : expf(L[e] - lse[t]);
        const float tc = softcap > 0.0f ? L[e] / softcap : 0.0f;  // the capped logit's tanh: its derivative 1 - t^2
        const float sc = token_scale ? loss_scale * token_scale[t] : loss_scale;
        L[e] = g * sc * (1.0f - tc * tc);
    }
}

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>(ceil_div(n, threads)); }

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// The start of a workspace as lm_head_ce_workspace_bytes and lm_head_ce_range_workspace_bytes lay it out: the
// chunk's tile (at least C x T: label rows are gathered through it), then one chunk's GEMM scratch; `rest` after.
struct ChunkScratch {
    float * tile;
    void * gemm;
    size_t gemm_bytes;
    char * rest;
};
ChunkScratch carve_chunk_scratch(void * workspace, int64_t C, int64_t chunk, int64_t T, gguf::TensorType wtype) {
    char * p = static_cast<char *>(workspace);
    ChunkScratch c;
    c.tile = reinterpret_cast<float *>(p);
    p += align256(size_t((chunk > C ? chunk : C) * T) * 4);
    c.gemm = p;
    c.gemm_bytes = matmul_workspace_bytes(C, chunk, T, wtype);
    c.rest = p + c.gemm_bytes;
    return c;
}

void start_state(const LmHeadCEState & st, int64_t T, cudaStream_t stream) {
    ce_init_kernel<<<blocks_for(T, kElemThreads), kElemThreads, 0, stream>>>(st.max, st.sum, st.other, st.label_logit, st.label_d, T);
    check_launch("lm_head_ce (init)");
}

// Pass 1, one chunk [v0, v0 + nv) of the vocabulary (wchunk: its rows) folded into st: the chunk's logits into
// the tile L, the online logsumexp, and with st.unit the gradient tile through one GEMM into the running unit
// gradients (brought to each token's new maximum first). With st.label_rows the chunk's label rows are kept
// (gathered through L, ids: T ints of scratch). rescale: T floats, 1 where pass 1 does not set them.
void fold_chunk(const LmHeadCEShape & s, int64_t v0, int64_t nv, const float * h, const char * wchunk, gguf::TensorType wtype,
                size_t w_row_bytes, const int32_t * labels, const LmHeadCEState & st, float * L, void * gemm_ws, size_t gemm_bytes,
                float * rescale, int32_t * ids, cudaStream_t stream) {
    const int64_t C = s.C, T = s.T;
    if (st.label_rows) {
        ce_local_ids_kernel<<<blocks_for(T, kElemThreads), kElemThreads, 0, stream>>>(labels, v0, nv, T, ids);
        check_launch("lm_head_ce_range (label ids)");
        get_rows(wchunk, wtype, w_row_bytes, nv, C, ids, T, L, nullptr, stream);
        ce_keep_label_rows_kernel<<<static_cast<unsigned>(elementwise_grid(C * T)), kElemThreads, 0, stream>>>(L, labels, v0, nv, C, T,
                                                                                                             st.label_rows);
        check_launch("lm_head_ce_range (label rows)");
    }
    matmul_fwd(C, nv, T, wchunk, wtype, w_row_bytes, h, C, L, nv, false, gemm_ws, gemm_bytes, stream);
    if (s.softcap > 0.0f) scale(L, 1.0f, L, nv * T, stream, s.softcap);   // Gemma 2: cap tanh(L / cap), in place
    ce_pass1_kernel<<<static_cast<unsigned>(T), row_threads(nv), 0, stream>>>(
        L, nv, v0, s.V, labels, st.max, st.sum, st.label_logit, st.unit != nullptr, s.softcap, st.other, rescale, st.label_d);
    check_launch("lm_head_ce (logsumexp)");
    if (!st.unit) return;
    if (v0 > 0) {
        ce_rescale_kernel<<<static_cast<unsigned>(elementwise_grid(C * T)), kElemThreads, 0, stream>>>(st.unit, rescale, C, T);
        check_launch("lm_head_ce (gradient rescale)");
    }
    matmul_bwd_x(C, nv, T, wchunk, wtype, w_row_bytes, L, nv, st.unit, C, v0 > 0, gemm_ws, gemm_bytes, stream);
}

// Pass 1's end: logsumexps into lse, 1 - p_label into rest, each token's loss (tokloss) and their sum into *loss,
// the token losses and lse / rest into aux's outputs when they are elsewhere; with aux.unit_dh_out the unit
// gradients from st.unit, the label rows from st.label_rows or else gathered from W through the tile (ids).
// inv, coef: T floats of scratch.
void finish_state(const LmHeadCEShape & s, const int32_t * labels, float loss_scale, const LmHeadCEState & st, float * lse, float * rest,
                  double * tokloss, float * inv, float * coef, int32_t * ids, float * tile, const void * W, gguf::TensorType wtype,
                  size_t w_row_bytes, double * loss, int * bad_label, cudaStream_t stream, const LmHeadCEAux & aux) {
    const int64_t C = s.C, V = s.V, T = s.T;
    const unsigned tok_blocks = blocks_for(T, kElemThreads);
    ce_finish_kernel<<<tok_blocks, kElemThreads, 0, stream>>>(st.max, st.sum, st.other, st.label_logit, labels, V, T, loss_scale, lse, rest,
                                                             tokloss, bad_label);
    check_launch("lm_head_ce (finish)");
    ce_sum_kernel<<<1, kElemThreads, 0, stream>>>(tokloss, T, loss);
    check_launch("lm_head_ce (sum)");
    if (aux.token_loss) {
        ce_token_loss_kernel<<<tok_blocks, kElemThreads, 0, stream>>>(tokloss, T, aux.token_loss);
        check_launch("lm_head_ce (token losses)");
    }
    if (aux.lse_out && aux.lse_out != lse)
        check(cudaMemcpyAsync(aux.lse_out, lse, size_t(T) * 4, cudaMemcpyDeviceToDevice, stream), "cuda lm_head_ce: lse");
    if (aux.rest_out && aux.rest_out != rest)
        check(cudaMemcpyAsync(aux.rest_out, rest, size_t(T) * 4, cudaMemcpyDeviceToDevice, stream), "cuda lm_head_ce: 1 - p");
    if (!aux.unit_dh_out) return;
    // divide by the sum, less (1 - p_label) d_label times the label's row
    ce_grad_coef_kernel<<<tok_blocks, kElemThreads, 0, stream>>>(labels, V, T, st.sum, rest, st.label_d, st.label_rows ? nullptr : ids,
                                                                inv, coef);
    check_launch("lm_head_ce (gradient coefficients)");
    const float * wy = st.label_rows;
    if (!wy) {
        get_rows(W, wtype, w_row_bytes, V, C, ids, T, tile, nullptr, stream);
        wy = tile;
    }
    ce_grad_finish_kernel<<<static_cast<unsigned>(elementwise_grid(C * T)), kElemThreads, 0, stream>>>(aux.unit_dh_out, st.unit, wy, inv,
                                                                                                      coef, C, T);
    check_launch("lm_head_ce (gradient finish)");
}

} // namespace

void lm_head_ce(const LmHeadCEShape & s, const float * h, const void * W, gguf::TensorType wtype, size_t w_row_bytes,
                const int32_t * labels, float loss_scale, double * loss, float * dh, float * dW, int64_t dw_row,
                void * workspace, size_t workspace_bytes, int * bad_label, cudaStream_t stream, const LmHeadCEAux & aux) {
    const char * op = "lm_head_ce";
    require(s.C >= 1 && s.V >= 1 && s.T >= 0 && s.T <= 0x7fffffff && s.chunk >= 1, op,
            "bad shape C=" + std::to_string(s.C) + " V=" + std::to_string(s.V) + " T=" + std::to_string(s.T) +
                " chunk=" + std::to_string(s.chunk));
    require(!dW || dw_row >= s.C, op, "dW row stride " + std::to_string(dw_row) + " is smaller than C=" + std::to_string(s.C));
    if (dh && aux.lse_in && aux.unit_dh_in && !dW) {  // the forward formed dh: scale it (no pass, no workspace)
        if (s.T == 0) return;
        ce_scale_unit_kernel<<<static_cast<unsigned>(elementwise_grid(s.C * s.T)), kElemThreads, 0, stream>>>(dh, aux.unit_dh_in, s.C, s.T,
                                                                                                            loss_scale, aux.token_scale);
        check_launch("lm_head_ce_back (scale the forward's gradient)");
        return;
    }
    const size_t need = lm_head_ce_workspace_bytes(s.C, s.V, s.T, s.chunk, wtype);
    require(workspace_bytes >= need, op, "workspace of " + std::to_string(workspace_bytes) +
                                             " bytes is smaller than the " + std::to_string(need) + " needed");
    require(!aux.lse_in == !aux.rest_in, op, "lse_in and rest_in come together (both a forward call's)");
    const int64_t C = s.C, V = s.V, T = s.T, chunk = s.chunk < V ? s.chunk : V;
    if (T == 0) {
        check(cudaMemsetAsync(loss, 0, sizeof(double), stream), "cuda lm_head_ce");
        return;
    }
    // Carve the workspace in lm_head_ce_workspace_bytes' order.
    const ChunkScratch cs = carve_chunk_scratch(workspace, C, chunk, T, wtype);
    float * L = cs.tile;
    void * gemm_ws = cs.gemm;
    const size_t gemm_bytes = cs.gemm_bytes;
    char * p = cs.rest;
    auto floats = [&] { float * f = reinterpret_cast<float *>(p); p += align256(size_t(T) * 4); return f; };
    auto doubles = [&] { double * d = reinterpret_cast<double *>(p); p += align256(size_t(T) * 8); return d; };
    LmHeadCEState st;
    st.max = floats();
    st.label_logit = floats();
    float * lse = floats();
    float * rest = floats();
    float * rescale = floats();
    st.label_d = floats();
    int32_t * ids = reinterpret_cast<int32_t *>(floats());
    float * coef = floats();
    st.sum = doubles();
    double * tokloss = doubles();
    st.other = doubles();
    if (aux.lse_in) {  // read-only
        lse = const_cast<float *>(aux.lse_in);
        rest = const_cast<float *>(aux.rest_in);
    }

    const char * wbytes = static_cast<const char *>(W);
    const unsigned unit_blocks = static_cast<unsigned>(elementwise_grid(C * T));
    if (!aux.lse_in) {
        st.unit = aux.unit_dh_out;  // accumulated in place, finished there
        start_state(st, T, stream);
        ce_rescale_init_kernel<<<blocks_for(T, kElemThreads), kElemThreads, 0, stream>>>(rescale, T);
        check_launch("lm_head_ce (rescale init)");
        for (int64_t v0 = 0; v0 < V; v0 += chunk)
            fold_chunk(s, v0, chunk < V - v0 ? chunk : V - v0, h, wbytes + v0 * w_row_bytes, wtype, w_row_bytes, labels, st, L, gemm_ws,
                       gemm_bytes, rescale, ids, stream);
        finish_state(s, labels, loss_scale, st, lse, rest, tokloss, rescale, coef, ids, L, W, wtype, w_row_bytes, loss, bad_label,
                     stream, aux);
    }
    if (dh && aux.unit_dh_in) {  // the forward formed dh: scale it; pass 2 only for dW
        ce_scale_unit_kernel<<<unit_blocks, kElemThreads, 0, stream>>>(dh, aux.unit_dh_in, C, T, loss_scale, aux.token_scale);
        check_launch("lm_head_ce_back (scale the forward's gradient)");
        dh = nullptr;
    }
    if (!dh && !dW) return;

    for (int64_t v0 = 0; v0 < V; v0 += chunk) {
        const int64_t nv = chunk < V - v0 ? chunk : V - v0;
        const char * wchunk = wbytes + v0 * w_row_bytes;
        matmul_fwd(C, nv, T, wchunk, wtype, w_row_bytes, h, C, L, nv, false, gemm_ws, gemm_bytes, stream);
        if (s.softcap > 0.0f) scale(L, 1.0f, L, nv * T, stream, s.softcap);
        ce_grad_kernel<<<static_cast<unsigned>(elementwise_grid(nv * T)), kElemThreads, 0, stream>>>(
            L, nv, v0, T, labels, lse, rest, V, loss_scale, s.softcap, aux.token_scale);
        check_launch("lm_head_ce_back (gradient tile)");
        if (dh) matmul_bwd_x(C, nv, T, wchunk, wtype, w_row_bytes, L, nv, dh, C, v0 > 0, gemm_ws, gemm_bytes, stream);
        if (dW) matmul_bwd_w(C, nv, T, h, C, L, nv, dW + v0 * dw_row, dw_row, true, stream);
    }
}

void lm_head_ce_range(const LmHeadCEShape & s, int64_t v0, int64_t nv, const float * h, const void * W_range, gguf::TensorType wtype,
                      size_t w_row_bytes, const int32_t * labels, const LmHeadCEState & st, void * workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
    const char * op = "lm_head_ce_range";
    require(s.C >= 1 && s.V >= 1 && s.T >= 0 && s.T <= 0x7fffffff && s.chunk >= 1 && v0 >= 0 && nv >= 1 && v0 + nv <= s.V &&
                v0 % s.chunk == 0,
            op, "bad range [" + std::to_string(v0) + ", " + std::to_string(v0 + nv) + ") of V=" + std::to_string(s.V) + " (chunk " +
                    std::to_string(s.chunk) + ")");
    require(!st.unit == !st.label_rows, op, "the unit gradients and the label rows come together");
    const size_t need = lm_head_ce_range_workspace_bytes(s.C, nv, s.T, s.chunk, wtype);
    require(workspace_bytes >= need, op, "workspace of " + std::to_string(workspace_bytes) + " bytes is smaller than the " +
                                             std::to_string(need) + " needed");
    const int64_t C = s.C, T = s.T, chunk = s.chunk < nv ? s.chunk : nv;
    if (T == 0) return;
    const ChunkScratch cs = carve_chunk_scratch(workspace, C, chunk, T, wtype);
    float * rescale = reinterpret_cast<float *>(cs.rest);
    int32_t * ids = reinterpret_cast<int32_t *>(cs.rest + align256(size_t(T) * 4));
    if (v0 == 0) start_state(st, T, stream);
    ce_rescale_init_kernel<<<blocks_for(T, kElemThreads), kElemThreads, 0, stream>>>(rescale, T);
    check_launch("lm_head_ce_range (rescale init)");
    const char * wbytes = static_cast<const char *>(W_range);
    for (int64_t j = 0; j < nv; j += chunk)
        fold_chunk(s, v0 + j, chunk < nv - j ? chunk : nv - j, h, wbytes + j * w_row_bytes, wtype, w_row_bytes, labels, st, cs.tile, cs.gemm,
                   cs.gemm_bytes, rescale, ids, stream);
}

void lm_head_ce_finish(const LmHeadCEShape & s, const int32_t * labels, float loss_scale, const LmHeadCEState & st, double * loss,
                       void * workspace, size_t workspace_bytes, int * bad_label, cudaStream_t stream, const LmHeadCEAux & aux) {
    const char * op = "lm_head_ce_finish";
    require(s.C >= 1 && s.V >= 1 && s.T >= 0 && s.T <= 0x7fffffff, op, "bad shape C=" + std::to_string(s.C) + " V=" + std::to_string(s.V) +
                                                                          " T=" + std::to_string(s.T));
    require(!aux.unit_dh_out || (st.unit && st.label_rows), op, "unit gradients asked of a state that did not form them");
    require(workspace_bytes >= lm_head_ce_finish_workspace_bytes(s.T), op, "workspace too small");
    const int64_t T = s.T;
    if (T == 0) {
        check(cudaMemsetAsync(loss, 0, sizeof(double), stream), "cuda lm_head_ce_finish");
        return;
    }
    char * p = static_cast<char *>(workspace);
    auto floats = [&] { float * f = reinterpret_cast<float *>(p); p += align256(size_t(T) * 4); return f; };
    float * lse = floats();
    float * rest = floats();
    float * inv = floats();
    float * coef = floats();
    double * tokloss = reinterpret_cast<double *>(p);
    finish_state(s, labels, loss_scale, st, lse, rest, tokloss, inv, coef, nullptr, nullptr, nullptr, gguf::TensorType::F32, 0, loss,
                 bad_label, stream, aux);
}

// ---- node entries ----
namespace {
__global__ void __launch_bounds__(1) store_loss_kernel(const double * loss, float * out_) { *out_ = static_cast<float>(*loss); }

// dloss of LM_HEAD_CE_BACK on the host: a FILL's value, or a synchronous read of the device scalar.
float host_dloss(const Tensor * dloss, const NodeRun & r) {
    if (dloss->op == Op::FILL) return dloss->param_f32(0);
    check(cudaMemcpyAsync(r.host_scalar, dloss->data, sizeof(float), cudaMemcpyDeviceToHost, r.stream),
          "cuda lm_head_ce_back: cudaMemcpyAsync of dloss");
    check(cudaStreamSynchronize(r.stream), "cuda lm_head_ce_back: cudaStreamSynchronize for dloss");
    return *r.host_scalar;
}

// (V: the whole vocabulary, which a streamed head's node and a range node hold as a parameter)
LmHeadCEShape shape_of(const Tensor * n, int64_t V) {
    LmHeadCEShape sh;
    sh.C = n->src[0]->ne[0];
    sh.V = V;
    sh.T = n->src[0]->ne[1];
    sh.chunk = std::max<int64_t>(1, n->param_i32(1));
    sh.softcap = n->param_f32(2);
    return sh;
}


void run_lm_head_ce(Tensor * n, const NodeRun & r) {
    const Tensor * W = n->src[1];  // a streamed head's: its state
    const bool per_token = lm_head_per_token(n);
    LmHeadCEAux aux;
    aux.lse_out = node::aux(n, 0);
    aux.rest_out = node::aux(n, lm_head_rest_offset(n));
    aux.token_loss = per_token ? out<float>(n) : nullptr;
    aux.unit_dh_out = lm_head_forms_grad(n) ? node::aux(n, lm_head_unit_dh_offset(n)) : nullptr;
    const int64_t V = lm_head_vocab(n);
    const LmHeadCEShape s = shape_of(n, V);
    if (lm_head_streamed(n))
        lm_head_ce_finish(s, in<int32_t>(n->src[2]), n->param_f32(0), lm_head_state_at(W->data, s.C, s.T, lm_head_forms_grad(n)), r.loss,
                          r.scratch, r.scratch_bytes, r.flag, r.stream, aux);
    else
        lm_head_ce(s, in<float>(n->src[0]), W->data, W->type, W->nb[1], in<int32_t>(n->src[2]), n->param_f32(0), r.loss, nullptr, nullptr,
                   0, r.scratch, r.scratch_bytes, r.flag, r.stream, aux);
    if (per_token) return;
    store_loss_kernel<<<1, 1, 0, r.stream>>>(r.loss, out<float>(n));
    check_launch("lm_head_ce (store loss)");
}

void run_lm_head_ce_back(Tensor * n, const NodeRun & r) {
    const Tensor * W = n->src[1];
    const Tensor * dW = n->src[4];
    // The per-token form reads its dloss vector on the device; the sum its scalar on the host.
    const bool per_token = lm_head_per_token(n);
    const float scale = per_token ? n->param_f32(0) : n->param_f32(0) * host_dloss(n->src[3], r);
    const Tensor * ce = n->src[5];  // the forward node: its logsumexps (and unit gradients) in its aux bytes
    LmHeadCEAux aux;
    aux.lse_in = node::aux(ce, 0);
    aux.rest_in = node::aux(ce, lm_head_rest_offset(ce));
    aux.token_scale = per_token ? in<float>(n->src[3]) : nullptr;
    aux.unit_dh_in = lm_head_forms_grad(ce) ? node::aux(ce, lm_head_unit_dh_offset(ce)) : nullptr;
    // (a streamed head: W is its state, never read: the unit gradients are scaled, and there is no dW)
    lm_head_ce(shape_of(n, lm_head_vocab(n)), in<float>(n->src[0]), W->data, W->type, W->nb[1], in<int32_t>(n->src[2]), scale, r.loss,
               out<float>(n), dW ? out<float>(dW) : nullptr, dW ? static_cast<int64_t>(dW->nb[1] / sizeof(float)) : 0,
               r.scratch, r.scratch_bytes, r.flag, r.stream, aux);
}

void run_lm_head_ce_range(Tensor * n, const NodeRun & r) {
    const Tensor * W = n->src[1];
    const Tensor * h = n->src[0];
    lm_head_ce_range(shape_of(n, n->param_i32(3)), n->param_i32(0), W->ne[1], in<float>(h), W->data, W->type, W->nb[1],
                     in<int32_t>(n->src[2]), lm_head_state_at(n->src[3]->data, h->ne[0], h->ne[1], n->param_i32(4) != 0), r.scratch, r.scratch_bytes,
                     r.stream);
    check(cudaMemsetAsync(out<float>(n), 0, sizeof(float), r.stream), "cuda lm_head_ce_range");  // (the node holds nothing)
}

const RegisterNodeKernels kRegister{{Op::LM_HEAD_CE, run_lm_head_ce}, {Op::LM_HEAD_CE_BACK, run_lm_head_ce_back},
                                    {Op::LM_HEAD_CE_RANGE, run_lm_head_ce_range}};
} // namespace

} // namespace rp::cuda
