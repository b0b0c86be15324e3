// SSM_CONV, SSM_CONV_BACK: one thread per output element, sums in a fixed order. DELTA_NET: one warp per value
// column of a head (the state's columns never mix), the column's Dk elements over the lanes, the dot products
// warp sums (a fixed butterfly). DELTA_NET_BACK: one block per (sequence, value head), its warps walking their
// columns back through each chunk from the chunk's saved state (recomputed by the forward's step: the same
// bits), their partial gradients summed over the warps in order; dq and dk per value head, then per key head.
#include "ggml_rp/cuda/delta_net.cuh"

#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/node_kernel.cuh"

namespace rp::cuda {

namespace {

// ---- ssm_conv ----

__global__ void __launch_bounds__(kElemThreads) ssm_conv_kernel(const float * x, const float * w, const float * prefix, const int32_t * seg,
                                                               float * y, ConvDims d) {
    const int64_t n = d.C * d.T * d.B, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t c = e % d.C, t = (e / d.C) % d.T, b = e / (d.C * d.T), start = example_start(seg, t, d.T, b);
        float acc = 0.0f;
        for (int64_t j = 0; j < d.K; ++j) acc += w[j + d.K * c] * conv_input(x, prefix, d, c, t + j - (d.K - 1), b, start);
        y[e] = acc;
    }
}

__global__ void __launch_bounds__(kElemThreads) ssm_conv_state_kernel(const float * x, const float * prefix, float * state, ConvDims d) {
    const int64_t n = d.C * (d.K - 1) * d.B, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t c = e % d.C, i = (e / d.C) % (d.K - 1), b = e / (d.C * (d.K - 1));
        state[e] = conv_input(x, prefix, d, c, d.T - (d.K - 1) + i, b, 0);
    }
}

__global__ void __launch_bounds__(kElemThreads) ssm_conv_dx_kernel(const float * w, const float * dy, const int32_t * seg, float * dx, ConvDims d) {
    const int64_t n = d.C * d.T * d.B, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t c = e % d.C, tau = (e / d.C) % d.T, b = e / (d.C * d.T);
        float acc = 0.0f;
        for (int64_t j = 0; j < d.K; ++j) {
            const int64_t t = tau + (d.K - 1) - j;
            if (t >= d.T || tau < example_start(seg, t, d.T, b)) continue;
            acc += w[j + d.K * c] * dy[c + d.C * (t + d.T * b)];
        }
        dx[e] = acc;
    }
}

__global__ void __launch_bounds__(kElemThreads) ssm_conv_dw_kernel(const float * x, const float * dy, const float * prefix, const int32_t * seg,
                                                                  float * dw, ConvDims d) {
    const int64_t n = d.K * d.C, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t j = e % d.K, c = e / d.K;
        float acc = 0.0f;
        for (int64_t b = 0; b < d.B; ++b)
            for (int64_t t = 0; t < d.T; ++t)
                acc += dy[c + d.C * (t + d.T * b)] * conv_input(x, prefix, d, c, t + j - (d.K - 1), b, example_start(seg, t, d.T, b));
        dw[e] = acc;
    }
}

// ---- delta rule ----

constexpr int kM = static_cast<int>(kDeltaMaxPerLane);

// Offsets as in the CPU kernel: q / k of key head hk, v / o of value head h, g / beta, a state's column j.
struct Idx {
    DeltaDims d;
    __device__ int64_t qk(int64_t hk, int64_t t, int64_t b) const { return d.Dk * (hk + d.Hk * (t + d.T * b)); }
    __device__ int64_t vo(int64_t j, int64_t h, int64_t t, int64_t b) const { return j + d.Dv * (h + d.Hv * (t + d.T * b)); }
    __device__ int64_t gb(int64_t h, int64_t t, int64_t b) const { return h + d.Hv * (t + d.T * b); }
    __device__ int64_t col(int64_t j, int64_t h, int64_t b) const { return d.Dk * (j + d.Dv * (h + d.Hv * b)); }
    __device__ int64_t state_floats() const { return d.Dk * d.Dv * d.Hv * d.B; }
};


// The warp's dot of its lanes' elements (element i = lane + 32 m) with a vector in memory.
__device__ inline float warp_dot(const float (&s)[kM], const float * x, int64_t Dk, int lane) {
    float p = 0.0f;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
        const int64_t i = lane + 32 * m;
        if (i < Dk) p += s[m] * x[i];
    }
    return warp_sum(p);
}

// One token's update of a column (the CPU kernel's column_step): decay, u = s . k, s += beta (v - u) k. Returns u.
__device__ inline float column_step(float (&s)[kM], const float * k, float a, float beta, float v, int64_t Dk, int lane) {
#pragma unroll
    for (int m = 0; m < kM; ++m) s[m] *= a;
    const float u = warp_dot(s, k, Dk, lane);
    const float dd = beta * (v - u);
#pragma unroll
    for (int m = 0; m < kM; ++m) {
        const int64_t i = lane + 32 * m;
        if (i < Dk) s[m] += dd * k[i];
    }
    return u;
}

__device__ inline void load_col(float (&s)[kM], const float * src, int64_t Dk, int lane) {
#pragma unroll
    for (int m = 0; m < kM; ++m) {
        const int64_t i = lane + 32 * m;
        s[m] = src && i < Dk ? src[i] : 0.0f;
    }
}

__device__ inline void store_col(const float (&s)[kM], float * dst, int64_t Dk, int lane) {
#pragma unroll
    for (int m = 0; m < kM; ++m) {
        const int64_t i = lane + 32 * m;
        if (i < Dk) dst[i] = s[m];
    }
}

// One warp per (column j, value head h, sequence b).
__global__ void __launch_bounds__(128) delta_net_fwd_kernel(const float * q, const float * k, const float * v, const float * g,
                                                            const float * beta, const float * state0, const int32_t * seg, float scale,
                                                            float * o, float * states, DeltaDims d) {
    const Idx ix{d};
    const int lane = threadIdx.x & 31;
    const int64_t wid = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (wid >= d.Dv * d.Hv * d.B) return;
    const int64_t j = wid % d.Dv, h = (wid / d.Dv) % d.Hv, b = wid / (d.Dv * d.Hv), hk = h % d.Hk;
    const int64_t n_chunks = (d.T + d.chunk - 1) / d.chunk;
    float s[kM];
    load_col(s, state0 ? state0 + ix.col(j, h, b) : nullptr, d.Dk, lane);
    for (int64_t t = 0; t < d.T; ++t) {
        if (t % d.chunk == 0) store_col(s, states + ix.state_floats() * (t / d.chunk) + ix.col(j, h, b), d.Dk, lane);
        if (state_restarts(seg, t, d.T, b)) load_col(s, nullptr, d.Dk, lane);
        column_step(s, k + ix.qk(hk, t, b), expf(g[ix.gb(h, t, b)]), beta[ix.gb(h, t, b)], v[ix.vo(j, h, t, b)], d.Dk, lane);
        const float out = warp_dot(s, q + ix.qk(hk, t, b), d.Dk, lane);
        if (lane == 0) o[ix.vo(j, h, t, b)] = scale * out;
    }
    store_col(s, states + ix.state_floats() * n_chunks + ix.col(j, h, b), d.Dk, lane);
}

// The backward of one (value head h, sequence b) per block of kDeltaWarps warps. work: this block's floats
// (delta_net_bwd_block_floats); dq_h, dk_h: [Dk, Hv, T, B], summed over value heads afterwards.
__global__ void __launch_bounds__(32 * kDeltaWarps) delta_net_bwd_kernel(const float * q, const float * k, const float * v, const float * g,
                                                                        const float * beta, const int32_t * seg, const float * states,
                                                                        const float * dout, float scale, float * dq_h, float * dk_h,
                                                                        float * dv, float * dg, float * dbeta, float * dstate0, float * work,
                                                                        int64_t block_floats, DeltaDims d) {
    const Idx ix{d};
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t h = blockIdx.x % d.Hv, b = blockIdx.x / d.Hv, hk = h % d.Hk, Dk = d.Dk;
    const int64_t c = d.chunk < d.T ? d.chunk : d.T, n_chunks = (d.T + d.chunk - 1) / d.chunk;
    float * block = work + static_cast<int64_t>(blockIdx.x) * block_floats;
    const int64_t per_warp = (c + 1) * Dk + 2 * c * Dk + 2 * c;
    float * hist = block + w * per_warp;     // (c + 1) Dk: the column's states over the chunk
    float * pq = hist + (c + 1) * Dk;        // c Dk: this warp's part of dq per token of the chunk
    float * pk = pq + c * Dk;                // c Dk: of dk
    float * pb = pk + c * Dk;                // c: of dbeta
    float * pa = pb + c;                     // c: of d exp(g)
    float * dS = block + kDeltaWarps * per_warp;  // Dk Dv: the state's gradient, column by column
    for (int64_t i = threadIdx.x; i < Dk * d.Dv; i += blockDim.x) dS[i] = 0.0f;
    __syncthreads();
    for (int64_t ch = n_chunks - 1; ch >= 0; --ch) {
        const int64_t t0 = ch * d.chunk, t1 = t0 + d.chunk < d.T ? t0 + d.chunk : d.T;
        for (int64_t i = lane; i < per_warp - (c + 1) * Dk; i += 32) pq[i] = 0.0f;
        __syncwarp();
        for (int64_t j = w; j < d.Dv; j += kDeltaWarps) {
            float s[kM];
            load_col(s, states + ix.state_floats() * ch + ix.col(j, h, b), Dk, lane);
            store_col(s, hist, Dk, lane);
            for (int64_t t = t0; t < t1; ++t) {
                if (state_restarts(seg, t, d.T, b)) load_col(s, nullptr, Dk, lane);
                column_step(s, k + ix.qk(hk, t, b), expf(g[ix.gb(h, t, b)]), beta[ix.gb(h, t, b)], v[ix.vo(j, h, t, b)], Dk, lane);
                store_col(s, hist + (t - t0 + 1) * Dk, Dk, lane);
            }
            __syncwarp();
            float ds[kM], sprev[kM], stilde[kM], dsv[kM];
            load_col(ds, dS + Dk * j, Dk, lane);
            for (int64_t t = t1 - 1; t >= t0; --t) {
                const float * kt = k + ix.qk(hk, t, b);
                const float * qt = q + ix.qk(hk, t, b);
                const bool rs = state_restarts(seg, t, d.T, b);
                load_col(sprev, rs ? nullptr : hist + (t - t0) * Dk, Dk, lane);
                const float a = expf(g[ix.gb(h, t, b)]), bt = beta[ix.gb(h, t, b)], vt = v[ix.vo(j, h, t, b)];
#pragma unroll
                for (int m = 0; m < kM; ++m) stilde[m] = sprev[m] * a;
                const float u = warp_dot(stilde, kt, Dk, lane);
                const float dlt = bt * (vt - u);
                const float dot_o = dout[ix.vo(j, h, t, b)] * scale;
                const float * snew = hist + (t - t0 + 1) * Dk;
                float * pqt = pq + (t - t0) * Dk;
                float * pkt = pk + (t - t0) * Dk;
#pragma unroll
                for (int m = 0; m < kM; ++m) {
                    const int64_t i = lane + 32 * m;
                    if (i < Dk) {
                        ds[m] += dot_o * qt[i];
                        pqt[i] += dot_o * snew[i];
                    }
                }
                const float dd = warp_dot(ds, kt, Dk, lane);
                const float du = -bt * dd;
#pragma unroll
                for (int m = 0; m < kM; ++m) {
                    const int64_t i = lane + 32 * m;
                    dsv[m] = i < Dk ? ds[m] + du * kt[i] : 0.0f;
                    if (i < Dk) pkt[i] += dlt * ds[m] + du * stilde[m];
                }
                float da = 0.0f;
#pragma unroll
                for (int m = 0; m < kM; ++m) da += dsv[m] * sprev[m];
                da = warp_sum(da);
                if (lane == 0) {
                    pb[t - t0] += dd * (vt - u);
                    pa[t - t0] += da;
                    dv[ix.vo(j, h, t, b)] = bt * dd;
                }
#pragma unroll
                for (int m = 0; m < kM; ++m) ds[m] = rs ? 0.0f : a * dsv[m];
                __syncwarp();
            }
            store_col(ds, dS + Dk * j, Dk, lane);
        }
        __syncthreads();
        // The warps' parts, summed in warp order.
        for (int64_t e = threadIdx.x; e < (t1 - t0) * Dk; e += blockDim.x) {
            const int64_t tt = e / Dk, i = e % Dk;
            float sq = 0.0f, sk = 0.0f;
            for (int ww = 0; ww < kDeltaWarps; ++ww) {
                sq += block[ww * per_warp + (c + 1) * Dk + tt * Dk + i];
                sk += block[ww * per_warp + (c + 1) * Dk + c * Dk + tt * Dk + i];
            }
            const int64_t at = i + Dk * (h + d.Hv * (t0 + tt + d.T * b));
            dq_h[at] = sq;
            dk_h[at] = sk;
        }
        for (int64_t tt = threadIdx.x; tt < t1 - t0; tt += blockDim.x) {
            float sb = 0.0f, sa = 0.0f;
            for (int ww = 0; ww < kDeltaWarps; ++ww) {
                sb += block[ww * per_warp + (c + 1) * Dk + 2 * c * Dk + tt];
                sa += block[ww * per_warp + (c + 1) * Dk + 2 * c * Dk + c + tt];
            }
            dbeta[ix.gb(h, t0 + tt, b)] = sb;
            dg[ix.gb(h, t0 + tt, b)] = expf(g[ix.gb(h, t0 + tt, b)]) * sa;
        }
        __syncthreads();
    }
    if (dstate0)
        for (int64_t e = threadIdx.x; e < Dk * d.Dv; e += blockDim.x) dstate0[Dk * d.Dv * (h + d.Hv * b) + e] = dS[e];
}

// dq / dk of key head hk: the value heads h = hk, hk + Hk, ... in order.
__global__ void __launch_bounds__(kElemThreads) delta_net_sum_heads_kernel(const float * dq_h, const float * dk_h, float * dq, float * dk,
                                                                         DeltaDims d) {
    const int64_t n = d.Dk * d.Hk * d.T * d.B, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t i = e % d.Dk, hk = (e / d.Dk) % d.Hk, tb = e / (d.Dk * d.Hk);  // tb = t + T b
        float sq = 0.0f, sk = 0.0f;
        for (int64_t h = hk; h < d.Hv; h += d.Hk) {
            sq += dq_h[i + d.Dk * (h + d.Hv * tb)];
            sk += dk_h[i + d.Dk * (h + d.Hv * tb)];
        }
        dq[e] = sq;
        dk[e] = sk;
    }
}

void check_dims(const char * op, const DeltaDims & d) {
    require(d.Dk >= 1 && d.Dk <= kDeltaMaxDk && d.Dv >= 1 && d.Hk >= 1 && d.Hv % d.Hk == 0 && d.T >= 1 && d.B >= 1 && d.chunk >= 1, op,
            "bad shape Dk=" + std::to_string(d.Dk) + " Dv=" + std::to_string(d.Dv) + " Hk=" + std::to_string(d.Hk) + " Hv=" + std::to_string(d.Hv) +
                " (a key head of at most " + std::to_string(kDeltaMaxDk) + ")");
}

} // namespace

void ssm_conv_fwd(const float * x, const float * w, const float * prefix, const int32_t * seg_start, float * y, float * state,
                  const ConvDims & d, cudaStream_t stream) {
    require(d.C >= 1 && d.T >= 1 && d.B >= 1 && d.K >= 1, "ssm_conv", "bad shape");
    ssm_conv_kernel<<<static_cast<unsigned>(elementwise_grid(d.C * d.T * d.B)), kElemThreads, 0, stream>>>(x, w, prefix, seg_start, y, d);
    check_launch("ssm_conv");
    if (d.K > 1) {
        ssm_conv_state_kernel<<<static_cast<unsigned>(elementwise_grid(d.C * (d.K - 1) * d.B)), kElemThreads, 0, stream>>>(x, prefix, state, d);
        check_launch("ssm_conv_state");
    }
}

void ssm_conv_bwd(const float * x, const float * w, const float * dy, const float * prefix, const int32_t * seg_start, float * out, int which,
                  const ConvDims & d, cudaStream_t stream) {
    require(d.C >= 1 && d.T >= 1 && d.B >= 1 && d.K >= 1 && (which == 0 || which == 1), "ssm_conv_back", "bad shape or which");
    if (which == 0) {
        ssm_conv_dx_kernel<<<static_cast<unsigned>(elementwise_grid(d.C * d.T * d.B)), kElemThreads, 0, stream>>>(w, dy, seg_start, out, d);
        check_launch("ssm_conv_back dx");
        return;
    }
    ssm_conv_dw_kernel<<<static_cast<unsigned>(elementwise_grid(d.K * d.C)), kElemThreads, 0, stream>>>(x, dy, prefix, seg_start, out, d);
    check_launch("ssm_conv_back dw");
}

void delta_net_fwd(const float * q, const float * k, const float * v, const float * g, const float * beta, const float * state0,
                   const int32_t * seg_start, float scale, float * o, float * states, const DeltaDims & d, cudaStream_t stream) {
    check_dims("delta_net", d);
    const int64_t warps = d.Dv * d.Hv * d.B;
    delta_net_fwd_kernel<<<static_cast<unsigned>(ceil_div(warps, 4)), 128, 0, stream>>>(q, k, v, g, beta, state0, seg_start, scale, o, states, d);
    check_launch("delta_net");
}

void delta_net_bwd(const float * q, const float * k, const float * v, const float * g, const float * beta, const int32_t * seg_start,
                   const float * states, const float * dout, float scale, float * dq, float * dk, float * dv, float * dg, float * dbeta,
                   float * dstate0, void * work, const DeltaDims & d, cudaStream_t stream) {
    check_dims("delta_net_back", d);
    float * dq_h = static_cast<float *>(work);
    float * dk_h = dq_h + d.Dk * d.Hv * d.T * d.B;
    float * blocks = dk_h + d.Dk * d.Hv * d.T * d.B;
    delta_net_bwd_kernel<<<static_cast<unsigned>(d.Hv * d.B), 32 * kDeltaWarps, 0, stream>>>(q, k, v, g, beta, seg_start, states, dout, scale,
                                                                                             dq_h, dk_h, dv, dg, dbeta, dstate0, blocks,
                                                                                             static_cast<int64_t>(delta_net_bwd_block_floats(d.Dk, d.Dv, d.chunk < d.T ? d.chunk : d.T)), d);
    check_launch("delta_net_back");
    delta_net_sum_heads_kernel<<<static_cast<unsigned>(elementwise_grid(d.Dk * d.Hk * d.T * d.B)), kElemThreads, 0, stream>>>(dq_h, dk_h, dq, dk, d);
    check_launch("delta_net_back heads");
}

// ---- node entries ----
namespace {

ConvDims conv_dims(const Tensor * x, const Tensor * w) { return {x->ne[0], x->ne[1], x->ne[2], w->ne[0]}; }

void run_ssm_conv(Tensor * n, const NodeRun & r) {
    float * state = reinterpret_cast<float *>(static_cast<char *>(n->data) + n->nbytes());
    ssm_conv_fwd(in<float>(n->src[0]), in<float>(n->src[1]), in<float>(n->src[2]), in<int32_t>(n->src[3]), out<float>(n), state,
                 conv_dims(n->src[0], n->src[1]), r.stream);
}

void run_ssm_conv_back(Tensor * n, const NodeRun & r) {
    // (dx has no x source: its dims are the node's)
    ssm_conv_bwd(in<float>(n->src[0]), in<float>(n->src[1]), in<float>(n->src[2]), in<float>(n->src[3]), in<int32_t>(n->src[4]), out<float>(n),
                 n->param_i32(0), conv_dims(n->src[0] ? n->src[0] : n, n->src[1]), r.stream);
}

DeltaDims delta_dims(const Tensor * q, const Tensor * v, const Tensor * node) {
    return {q->ne[0], q->ne[1], v->ne[0], v->ne[1], q->ne[2], q->ne[3], node->param_i32(1)};
}

void run_delta_net(Tensor * n, const NodeRun & r) {
    float * states = reinterpret_cast<float *>(static_cast<char *>(n->data) + n->nbytes());
    delta_net_fwd(in<float>(n->src[0]), in<float>(n->src[1]), in<float>(n->src[2]), in<float>(n->src[3]), in<float>(n->src[4]),
                  in<float>(n->src[5]), in<int32_t>(n->src[6]), n->param_f32(0), out<float>(n), states, delta_dims(n->src[0], n->src[2], n), r.stream);
}

void run_delta_net_back(Tensor * n, const NodeRun & r) {
    const DeltaDims d = delta_dims(n->src[0], n->src[2], n);  // (the node has the forward's chunk)
    const float * states = in<float>(n->src[7]);  // the forward's saved chunk states
    float * dk = reinterpret_cast<float *>(static_cast<char *>(n->data) + n->nbytes());
    float * dv = dk + d.Dk * d.Hk * d.T * d.B;
    float * dg = dv + d.Dv * d.Hv * d.T * d.B;
    float * dbeta = dg + d.Hv * d.T * d.B;
    float * dstate0 = n->src[5] ? dbeta + d.Hv * d.T * d.B : nullptr;
    delta_net_bwd(in<float>(n->src[0]), in<float>(n->src[1]), in<float>(n->src[2]), in<float>(n->src[3]), in<float>(n->src[4]), in<int32_t>(n->src[6]),
                  states, in<float>(n->src[8]), n->param_f32(0), out<float>(n), dk, dv, dg, dbeta, dstate0, r.scratch, d, r.stream);
}

const RegisterNodeKernels kRegister{{Op::SSM_CONV, run_ssm_conv},
                                    {Op::SSM_CONV_BACK, run_ssm_conv_back},
                                    {Op::DELTA_NET, run_delta_net},
                                    {Op::DELTA_NET_BACK, run_delta_net_back}};

} // namespace

} // namespace rp::cuda
