// Flash attention forward and backward (FlashAttention-2 algorithm; see attention.cuh for the contract).
// Every tile product goes through block_gemm on shared memory: wmma 16x16x16 tensor-core fragments for
// f16/bf16 operands with fp32 accumulators, a plain fp32 FMA loop for f32 operands. Tiles are zero-padded to
// the tile shape and the head dim to a multiple of 16, so padded rows and columns add exact zeros.
#include "ggml_rp/cuda/attention.cuh"

#include "ggml_rp/cuda/backend_plan.h"
#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/copy.cuh"
#include "ggml_rp/cuda/half_scale.h"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/mul_mat.cuh"
#include "ggml_rp/cuda/node_kernel.cuh"
#include "ggml_rp/ops/node_args.h"

#include <mma.h>
#include <type_traits>

namespace rp::cuda {

size_t device_smem_optin() {
    int dev = 0, bytes = 0;
    check(cudaGetDevice(&dev), "cuda attention: cudaGetDevice");
    check(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
          "cuda attention: shared memory limit");
    return static_cast<size_t>(bytes);
}

extern __shared__ __align__(128) unsigned char attn_smem[];

namespace {

// C[M x N] (f32, row stride ldc) = (acc ? C : 0) + A B. A(i, p) = ARow ? A[i*lda + p] : A[p*lda + i];
// B(p, j) = BRow ? B[p*ldb + j] : B[j*ldb + p]. M, N, K multiples of 16; all operands in shared memory.
// Called by the whole block; each output tile is owned by one warp and reduced in order over K.
template <class T, bool ARow, bool BRow>
__device__ void block_gemm(int M, int N, int K, const T * A, int lda, const T * B, int ldb, float * C, int ldc,
                           bool acc) {
    if constexpr (std::is_same_v<T, float>) {
        for (int e = threadIdx.x; e < M * N; e += blockDim.x) {
            const int i = e / N, j = e % N;
            float s = acc ? C[i * ldc + j] : 0.0f;
            for (int p = 0; p < K; ++p)
                s = fmaf(ARow ? A[i * lda + p] : A[p * lda + i], BRow ? B[p * ldb + j] : B[j * ldb + p], s);
            C[i * ldc + j] = s;
        }
    } else {
        namespace wmma = nvcuda::wmma;
        using LA = std::conditional_t<ARow, wmma::row_major, wmma::col_major>;
        using LB = std::conditional_t<BRow, wmma::row_major, wmma::col_major>;
        const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
        const int tn = N / 16, tiles = M / 16 * tn;
        for (int tile = warp; tile < tiles; tile += nw) {
            const int i = tile / tn * 16, j = tile % tn * 16;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
            if (acc) wmma::load_matrix_sync(c, C + i * ldc + j, ldc, wmma::mem_row_major);
            else wmma::fill_fragment(c, 0.0f);
            for (int p = 0; p < K; p += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> b;
                wmma::load_matrix_sync(a, ARow ? A + i * lda + p : A + p * lda + i, lda);
                wmma::load_matrix_sync(b, BRow ? B + p * ldb + j : B + j * ldb + p, ldb);
                wmma::mma_sync(c, a, b, c);
            }
            wmma::store_matrix_sync(C + i * ldc + j, c, ldc, wmma::mem_row_major);
        }
    }
}

// Hands out 128-byte aligned sections of dynamic shared memory, in the order launch.h's attn_smem_bytes counts.
struct Carve {
    unsigned char * p;
    template <class X>
    __device__ X * take(int64_t count) {
        X * r = reinterpret_cast<X *>(p);
        p += (static_cast<size_t>(count) * sizeof(X) + 127) / 128 * 128;   // launch.h's smem_section
        return r;
    }
};

// The tile of probabilities in the MMA operand type: its own section for f16/bf16, the f32 scores themselves
// (overwritten element by element) for f32.
template <class T>
__device__ T * operand_tile(Carve & cv, float * scores, int64_t count) {
    if constexpr (std::is_same_v<T, float>) return scores;
    else return cv.take<T>(count);
}

// Keys of the tile starting at j0 (bk of them) that query t sees: the first `visible`.
__device__ inline int visible(int64_t t, int64_t off, int64_t j0, int64_t bk) {
    const int64_t n = t + off - j0 + 1;
    return static_cast<int>(n < 0 ? 0 : (n > bk ? bk : n));
}

// The first key query t of sequence b sees: key_start[b * Tq + t] (0 without key_start) and, with a sliding
// window w > 0, no earlier than t + off - w + 1; clamped into [0, t + off], as the CPU reference
// (cpu/attention.cpp) clamps it.
__device__ inline int64_t first_key(const int32_t * ks, int64_t w, int64_t b, int64_t Tq, int64_t t, int64_t off) {
    int64_t f = ks ? ks[b * Tq + t] : 0;
    if (w > 0 && t + off - w + 1 > f) f = t + off - w + 1;
    return f < 0 ? 0 : (f > t + off ? t + off : f);
}
// Keys of the tile starting at j0 (bk of them) before the first one query t sees: masked like the future.
__device__ inline int hidden(const int32_t * ks, int64_t w, int64_t b, int64_t Tq, int64_t t, int64_t off, int64_t j0, int64_t bk) {
    const int64_t n = first_key(ks, w, b, Tq, t, off) - j0;
    return static_cast<int>(n < 0 ? 0 : (n > bk ? bk : n));
}
// The first key any query of the tile [t0, t0 + bq) sees (every thread computes it: a uniform value).
__device__ inline int64_t first_key_of_tile(const int32_t * ks, int64_t w, int64_t b, int64_t Tq, int64_t t0, int64_t bq, int64_t off) {
    if (!ks && w <= 0) return 0;
    int64_t lo = first_key(ks, w, b, Tq, t0, off);
    for (int64_t i = 1; i < bq; ++i) {
        const int64_t f = first_key(ks, w, b, Tq, t0 + i, off);
        lo = f < lo ? f : lo;
    }
    return lo;
}

// rows [r0, r0 + nrows) of a [*, H, T, B] tensor at head h, sequence b -> tile [rows x DP] with row pitch
// `pitch` (>= DP; the columns past DP are never read), zero-padded.
template <class T>
__device__ void load_tile(T * dst, const T * src, int64_t b, int64_t r0, int64_t nrows, int64_t h, int64_t H,
                          int64_t Tn, int64_t D, int rows, int DP, int pitch) {
    for (int e = threadIdx.x; e < rows * DP; e += blockDim.x) {
        const int i = e / DP, d = e % DP;
        dst[i * pitch + d] = (i < nrows && d < D) ? src[((b * Tn + r0 + i) * H + h) * D + d] : from_f32<T>(0.0f);
    }
}

template <class T>
__global__ void __launch_bounds__(kAttnThreads)
attn_fwd_kernel(AttentionShape s, const T * __restrict__ q, const T * __restrict__ k, const T * __restrict__ v,
                float * __restrict__ o, float * __restrict__ lse, const int32_t * __restrict__ ks,
                const float * __restrict__ sinks, int BQ, int BK, int DP, int KP) {
    Carve cv{attn_smem};
    T * Qs = cv.take<T>(BQ * DP);
    T * Ks = cv.take<T>(BK * KP);
    T * Vs = cv.take<T>(BK * KP);
    float * S = cv.take<float>(BQ * BK);
    T * P = operand_tile<T>(cv, S, BQ * BK);
    float * O = cv.take<float>(BQ * DP);
    float * m = cv.take<float>(BQ);
    float * l = cv.take<float>(BQ);
    float * alpha = cv.take<float>(BQ);

    const int64_t h = blockIdx.y, b = blockIdx.z, hk = h / (s.Hq / s.Hkv);
    const int64_t off = s.Tk - s.Tq, t0 = static_cast<int64_t>(blockIdx.x) * BQ;
    const int64_t bq = s.Tq - t0 < BQ ? s.Tq - t0 : BQ;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;

    load_tile(Qs, q, b, t0, bq, h, s.Hq, s.Tq, s.D, BQ, DP, DP);
    for (int e = threadIdx.x; e < BQ * DP; e += blockDim.x) O[e] = 0.0f;
    for (int i = threadIdx.x; i < BQ; i += blockDim.x) { m[i] = -INFINITY; l[i] = 0.0f; }
    const int64_t kend = s.Tk < t0 + bq + off ? s.Tk : t0 + bq + off;   // keys past the last query's horizon
    // Keys between sequences: a KV cache of several sequences is read in place by the f32 kernel; the rounded inputs
    // are contiguous casts (and their kernels keep their registers).
    const int64_t kv_rows = std::is_same_v<T, float> ? s.kv_seq_rows() : s.Tk;
    // From the tile of the first key any query sees (packed sequences skip the earlier documents).
    for (int64_t j0 = first_key_of_tile(ks, s.window, b, s.Tq, t0, bq, off) / BK * BK; j0 < kend; j0 += BK) {
        const int64_t bk = kend - j0 < BK ? kend - j0 : BK;
        __syncthreads();   // the previous tile's K, V, P are consumed
        load_tile(Ks, k, b, j0, bk, hk, s.Hkv, kv_rows, s.D, BK, DP, KP);
        load_tile(Vs, v, b, j0, bk, hk, s.Hkv, kv_rows, s.D, BK, DP, KP);
        __syncthreads();
        block_gemm<T, true, false>(BQ, BK, DP, Qs, DP, Ks, KP, S, BK, false);   // S = Q K^T
        __syncthreads();
        for (int i = warp; i < BQ; i += nw) {   // online softmax, one warp per query row
            const int nv = i < bq ? visible(t0 + i, off, j0, bk) : 0;
            const int lo = i < bq ? hidden(ks, s.window, b, s.Tq, t0 + i, off, j0, bk) : 0;
            const float mold = m[i];
            float mx = mold;
            float t;  // the soft-cap's tanh (unused here)
            for (int j = lo + lane; j < nv; j += 32) mx = fmaxf(mx, attention_logit(S[i * BK + j] * s.scale, s.softcap, t));
            mx = warp_max(mx);
            float rs = 0.0f;
            for (int j = lane; j < BK; j += 32) {
                const float p = j >= lo && j < nv ? expf(attention_logit(S[i * BK + j] * s.scale, s.softcap, t) - mx) : 0.0f;
                P[i * BK + j] = from_f32<T>(p);
                rs += p;
            }
            rs = warp_sum(rs);
            if (lane == 0) {
                const float a = mx == -INFINITY ? 1.0f : expf(mold - mx);   // no key seen yet: nothing to rescale
                l[i] = l[i] * a + rs;
                m[i] = mx;
                alpha[i] = a;
            }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < BQ * DP; e += blockDim.x) O[e] *= alpha[e / DP];
        __syncthreads();
        block_gemm<T, true, true>(BQ, DP, BK, P, BK, Vs, KP, O, DP, true);   // O += P V
    }
    __syncthreads();
    // The head's sink logit joins each row's max and sum (no value): O is rescaled as by a key tile.
    for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
        alpha[i] = 1.0f;
        if (sinks && i < bq) {
            const float mx = fmaxf(m[i], sinks[h]);
            alpha[i] = expf(m[i] - mx);
            l[i] = l[i] * alpha[i] + expf(sinks[h] - mx);
            m[i] = mx;
        }
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < bq * s.D; e += blockDim.x) {
        const int64_t i = e / s.D, d = e % s.D;
        o[((b * s.Tq + t0 + i) * s.Hq + h) * s.D + d] = O[i * DP + d] * alpha[i] / l[i];
    }
    for (int64_t i = threadIdx.x; i < bq; i += blockDim.x) lse[(b * s.Tq + t0 + i) * s.Hq + h] = m[i] + logf(l[i]);
}

// D_i = rowsum(dO_i * O_i): one warp per row.
template <class T>
__global__ void __launch_bounds__(kElemThreads) attn_rowdot_kernel(const T * __restrict__ dout, const float * __restrict__ o, float * __restrict__ Di,
                                   int64_t rows, int64_t D) {
    const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    float sum = 0.0f;
    for (int64_t d = lane; d < D; d += 32) sum = fmaf(to_f32(dout[r * D + d]), o[r * D + d], sum);
    sum = warp_sum(sum);
    if (lane == 0) Di[r] = sum;
}

// The sinks' gradient: dsink_h = -sum over the head's rows of exp(sink_h - lse) * D_i, one block per head,
// summed in double in a fixed order (each thread its strided rows, then a tree over the threads).
__global__ void __launch_bounds__(kElemThreads) attn_dsinks_kernel(const float * __restrict__ sinks, const float * __restrict__ lse,
                                                                   const float * __restrict__ Di, float * __restrict__ dsinks,
                                                                   int64_t rows_per_head, int64_t Hq,
                                                                   const float * __restrict__ unscale) {
    __shared__ double part[kElemThreads];
    const int64_t h = blockIdx.x;
    double sum = 0.0;
    for (int64_t bt = threadIdx.x; bt < rows_per_head; bt += blockDim.x) {
        const int64_t r = bt * Hq + h;
        sum -= static_cast<double>(expf(sinks[h] - lse[r])) * Di[r];
    }
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int w = kElemThreads / 2; w > 0; w >>= 1) {
        if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) dsinks[h] = static_cast<float>(part[0]) * (unscale ? *unscale : 1.0f);
}

// P = exp(S*scale - lse) on the visible part (0 elsewhere), dS = P * (dP - D_i); both rounded to T. With a soft-cap
// the logit is cap tanh(S*scale / cap) and dS carries the tanh's derivative 1 - t^2.
template <class T>
__device__ void probs_and_grads(const float * S, const float * dP, const float * ls, const float * ds, T * P, T * dS,
                                int BQ, int BK, int64_t bq, int64_t t0, int64_t off, int64_t j0, int64_t bk,
                                float scale, float softcap, const int32_t * ks, int64_t w, int64_t b, int64_t Tq) {
    for (int e = threadIdx.x; e < BQ * BK; e += blockDim.x) {
        const int i = e / BK, j = e % BK;
        const int nv = i < bq ? visible(t0 + i, off, j0, bk) : 0;
        const int lo = i < bq ? hidden(ks, w, b, Tq, t0 + i, off, j0, bk) : 0;
        float t = 0.0f;
        const float p = j >= lo && j < nv ? expf(attention_logit(S[e] * scale, softcap, t) - ls[i]) : 0.0f;
        if (P) P[e] = from_f32<T>(p);
        dS[e] = from_f32<T>(p * (dP[e] - ds[i]) * (1.0f - t * t));
    }
}

template <class T>
__global__ void __launch_bounds__(kAttnThreads)
attn_bwd_kv_kernel(AttentionShape s, const T * __restrict__ q, const T * __restrict__ k, const T * __restrict__ v,
                   const T * __restrict__ dout, const float * __restrict__ lse, const float * __restrict__ Di,
                   float * __restrict__ dk, float * __restrict__ dv, const int32_t * __restrict__ ks, int BQ, int BK,
                   int DP, int KP, const float * __restrict__ unscale) {
    Carve cv{attn_smem};
    T * Ks = cv.take<T>(BK * KP);
    T * Vs = cv.take<T>(BK * KP);
    T * Qs = cv.take<T>(BQ * DP);
    T * dOs = cv.take<T>(BQ * DP);
    float * S = cv.take<float>(BQ * BK);
    float * dP = cv.take<float>(BQ * BK);
    T * P = operand_tile<T>(cv, S, BQ * BK);
    T * dS = operand_tile<T>(cv, dP, BQ * BK);
    float * dK = cv.take<float>(BK * DP);
    float * dV = cv.take<float>(BK * DP);
    float * ls = cv.take<float>(BQ);
    float * ds = cv.take<float>(BQ);

    const int64_t hk = blockIdx.y, b = blockIdx.z, group = s.Hq / s.Hkv;
    const int64_t off = s.Tk - s.Tq, j0 = static_cast<int64_t>(blockIdx.x) * BK;
    const int64_t bk = s.Tk - j0 < BK ? s.Tk - j0 : BK;
    load_tile(Ks, k, b, j0, bk, hk, s.Hkv, s.Tk, s.D, BK, DP, KP);
    load_tile(Vs, v, b, j0, bk, hk, s.Hkv, s.Tk, s.D, BK, DP, KP);
    for (int e = threadIdx.x; e < BK * DP; e += blockDim.x) { dK[e] = 0.0f; dV[e] = 0.0f; }
    const int64_t t_first = j0 - off > 0 ? j0 - off : 0;   // the first query that sees key j0
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t t0 = t_first / BQ * BQ; t0 < s.Tq; t0 += BQ) {
            const int64_t bq = s.Tq - t0 < BQ ? s.Tq - t0 : BQ;
            // Every query's document starts after this key tile: nothing to add (uniform over the block).
            if (first_key_of_tile(ks, s.window, b, s.Tq, t0, bq, off) >= j0 + bk) continue;
            __syncthreads();   // the previous tile's Q, dO, P, dS are consumed
            load_tile(Qs, q, b, t0, bq, h, s.Hq, s.Tq, s.D, BQ, DP, DP);
            load_tile(dOs, dout, b, t0, bq, h, s.Hq, s.Tq, s.D, BQ, DP, DP);
            for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
                const int64_t r = (b * s.Tq + t0 + i) * s.Hq + h;
                ls[i] = i < bq ? lse[r] : 0.0f;
                ds[i] = i < bq ? Di[r] : 0.0f;
            }
            __syncthreads();
            block_gemm<T, true, false>(BQ, BK, DP, Qs, DP, Ks, KP, S, BK, false);    // S  = Q K^T
            block_gemm<T, true, false>(BQ, BK, DP, dOs, DP, Vs, KP, dP, BK, false);  // dP = dO V^T
            __syncthreads();
            probs_and_grads(S, dP, ls, ds, P, dS, BQ, BK, bq, t0, off, j0, bk, s.scale, s.softcap, ks, s.window, b, s.Tq);
            __syncthreads();
            block_gemm<T, false, true>(BK, DP, BQ, P, BK, dOs, DP, dV, DP, true);    // dV += P^T dO
            block_gemm<T, false, true>(BK, DP, BQ, dS, BK, Qs, DP, dK, DP, true);    // dK += dS^T Q
        }
    }
    __syncthreads();
    const float u = unscale ? *unscale : 1.0f;  // 2^-k of a scaled dout (half_scale.h): exact
    for (int64_t e = threadIdx.x; e < bk * s.D; e += blockDim.x) {
        const int64_t j = e / s.D, d = e % s.D;
        const int64_t idx = ((b * s.Tk + j0 + j) * s.Hkv + hk) * s.D + d;
        dk[idx] = dK[j * DP + d] * s.scale * u;
        dv[idx] = dV[j * DP + d] * u;
    }
}

template <class T>
__global__ void __launch_bounds__(kAttnThreads)
attn_bwd_q_kernel(AttentionShape s, const T * __restrict__ q, const T * __restrict__ k, const T * __restrict__ v,
                  const T * __restrict__ dout, const float * __restrict__ lse, const float * __restrict__ Di,
                  float * __restrict__ dq, const int32_t * __restrict__ ks, int BQ, int BK, int DP, int KP,
                  const float * __restrict__ unscale) {
    Carve cv{attn_smem};
    T * Qs = cv.take<T>(BQ * DP);
    T * dOs = cv.take<T>(BQ * DP);
    T * Ks = cv.take<T>(BK * KP);
    T * Vs = cv.take<T>(BK * KP);
    float * S = cv.take<float>(BQ * BK);
    float * dP = cv.take<float>(BQ * BK);
    T * dS = operand_tile<T>(cv, dP, BQ * BK);
    float * dQ = cv.take<float>(BQ * DP);
    float * ls = cv.take<float>(BQ);
    float * ds = cv.take<float>(BQ);

    const int64_t h = blockIdx.y, b = blockIdx.z, hk = h / (s.Hq / s.Hkv);
    const int64_t off = s.Tk - s.Tq, t0 = static_cast<int64_t>(blockIdx.x) * BQ;
    const int64_t bq = s.Tq - t0 < BQ ? s.Tq - t0 : BQ;
    load_tile(Qs, q, b, t0, bq, h, s.Hq, s.Tq, s.D, BQ, DP, DP);
    load_tile(dOs, dout, b, t0, bq, h, s.Hq, s.Tq, s.D, BQ, DP, DP);
    for (int e = threadIdx.x; e < BQ * DP; e += blockDim.x) dQ[e] = 0.0f;
    for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
        const int64_t r = (b * s.Tq + t0 + i) * s.Hq + h;
        ls[i] = i < bq ? lse[r] : 0.0f;
        ds[i] = i < bq ? Di[r] : 0.0f;
    }
    const int64_t kend = s.Tk < t0 + bq + off ? s.Tk : t0 + bq + off;
    for (int64_t j0 = first_key_of_tile(ks, s.window, b, s.Tq, t0, bq, off) / BK * BK; j0 < kend; j0 += BK) {
        const int64_t bk = kend - j0 < BK ? kend - j0 : BK;
        __syncthreads();
        load_tile(Ks, k, b, j0, bk, hk, s.Hkv, s.Tk, s.D, BK, DP, KP);
        load_tile(Vs, v, b, j0, bk, hk, s.Hkv, s.Tk, s.D, BK, DP, KP);
        __syncthreads();
        block_gemm<T, true, false>(BQ, BK, DP, Qs, DP, Ks, KP, S, BK, false);
        block_gemm<T, true, false>(BQ, BK, DP, dOs, DP, Vs, KP, dP, BK, false);
        __syncthreads();
        probs_and_grads<T>(S, dP, ls, ds, nullptr, dS, BQ, BK, bq, t0, off, j0, bk, s.scale, s.softcap, ks, s.window, b, s.Tq);
        __syncthreads();
        block_gemm<T, true, true>(BQ, DP, BK, dS, BK, Ks, KP, dQ, DP, true);   // dQ += dS K
    }
    __syncthreads();
    const float u = unscale ? *unscale : 1.0f;
    for (int64_t e = threadIdx.x; e < bq * s.D; e += blockDim.x) {
        const int64_t i = e / s.D, d = e % s.D;
        dq[((b * s.Tq + t0 + i) * s.Hq + h) * s.D + d] = dQ[i * DP + d] * s.scale * u;
    }
}

void check_shape(const AttentionShape & s, gguf::TensorType type, const char * fn) {
    require(type == gguf::TensorType::F32 || type == gguf::TensorType::F16 || type == gguf::TensorType::BF16, fn,
            std::string("input type ") + gguf::type_name(static_cast<uint32_t>(type)) + " is not f32, f16 or bf16");
    require(s.D >= 1 && s.D <= kAttnMaxHeadDim, fn, "head_dim D=" + std::to_string(s.D) + " is outside [1, 256]");
    require(s.Hq >= 1 && s.Hkv >= 1 && s.Hq % s.Hkv == 0, fn,
            "query heads " + std::to_string(s.Hq) + " are not a positive multiple of kv heads " + std::to_string(s.Hkv));
    require(s.Tq >= 0 && s.Tk >= s.Tq, fn,
            "Tq=" + std::to_string(s.Tq) + ", Tk=" + std::to_string(s.Tk) + ": need 0 <= Tq <= Tk");
    require(s.B >= 0 && s.B <= 65535 && s.Hq <= 65535, fn,
            "B=" + std::to_string(s.B) + " or Hq=" + std::to_string(s.Hq) + " exceeds the grid limit 65535");
    require(s.Tk <= 0x7fffffff, fn, "Tk=" + std::to_string(s.Tk) + " exceeds int");
    require(s.window >= 0, fn, "negative window " + std::to_string(s.window));
    require(s.kv_rows == 0 || s.kv_rows >= s.Tk, fn,
            "kv_rows=" + std::to_string(s.kv_rows) + " is below Tk=" + std::to_string(s.Tk) + ": the sequences' keys would overlap");
}

// Tiles for this device and the kernel's shared-memory opt-in; throws when nothing fits.
template <class Kernel>
AttnTiles prepare(Kernel kernel, AttnKernel which, const AttentionShape & s, size_t elem, const char * fn) {
    const size_t limit = device_smem_optin();
    cudaFuncAttributes attr{};
    check(cudaFuncGetAttributes(&attr, kernel), (std::string("cuda ") + fn + ": cudaFuncGetAttributes").c_str());
    const AttnTiles t = attention_tiles(which, s.D, elem, limit, attr.sharedSizeBytes);
    require(t.bq > 0, fn, "no tile shape for head_dim " + std::to_string(s.D) + " fits " + std::to_string(limit) +
                              " bytes of shared memory");
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(t.smem)),
          (std::string("cuda ") + fn + ": shared memory opt-in").c_str());
    return t;
}

dim3 to_dim3(const Grid3 & g) {
    return dim3(static_cast<unsigned>(g.x), static_cast<unsigned>(g.y), static_cast<unsigned>(g.z));
}

template <class T>
void fwd(const AttentionShape & s, const void * q, const void * k, const void * v, float * o, float * lse,
         const int32_t * ks, const float * sinks, cudaStream_t stream) {
    const AttnTiles t = prepare(attn_fwd_kernel<T>, AttnKernel::Forward, s, sizeof(T), "attention");
    const Grid3 g = attention_grid(AttnKernel::Forward, s.Tq, s.Tk, s.Hq, s.Hkv, s.B, t);
    attn_fwd_kernel<T><<<to_dim3(g), kAttnThreads, t.smem, stream>>>(
        s, static_cast<const T *>(q), static_cast<const T *>(k), static_cast<const T *>(v), o, lse, ks, sinks,
        static_cast<int>(t.bq), static_cast<int>(t.bk), static_cast<int>(t.dp), static_cast<int>(t.kp));
    check_launch("attention");
}

template <class T>
void bwd(const AttentionShape & s, const void * q, const void * k, const void * v, const float * o,
         const float * lse, const void * dout, float * dq, float * dk, float * dv, float * Di, const int32_t * ks,
         cudaStream_t stream, const float * unscale, const float * sinks, float * dsinks) {
    const int64_t rows = s.B * s.Tq * s.Hq;
    if (rows > 0)
        attn_rowdot_kernel<T><<<static_cast<unsigned>(ceil_div(rows * 32, kElemThreads)), kElemThreads, 0, stream>>>(
        static_cast<const T *>(dout), o, Di, rows, s.D);
    check_launch("attention_back (rowdot)");
    if (sinks && dsinks && s.Hq > 0) {
        attn_dsinks_kernel<<<static_cast<unsigned>(s.Hq), kElemThreads, 0, stream>>>(sinks, lse, Di, dsinks, s.B * s.Tq, s.Hq, unscale);
        check_launch("attention_back (dsinks)");
    }
    const T * qt = static_cast<const T *>(q);
    const T * kt = static_cast<const T *>(k);
    const T * vt = static_cast<const T *>(v);
    const T * dot = static_cast<const T *>(dout);
    const AttnTiles tkv = prepare(attn_bwd_kv_kernel<T>, AttnKernel::BackwardKV, s, sizeof(T), "attention_back");
    const Grid3 gkv = attention_grid(AttnKernel::BackwardKV, s.Tq, s.Tk, s.Hq, s.Hkv, s.B, tkv);
    attn_bwd_kv_kernel<T><<<to_dim3(gkv), kAttnThreads, tkv.smem, stream>>>(
        s, qt, kt, vt, dot, lse, Di, dk, dv, ks, static_cast<int>(tkv.bq), static_cast<int>(tkv.bk), static_cast<int>(tkv.dp),
        static_cast<int>(tkv.kp), unscale);
    check_launch("attention_back (dk, dv)");
    const AttnTiles tq = prepare(attn_bwd_q_kernel<T>, AttnKernel::BackwardQ, s, sizeof(T), "attention_back");
    const Grid3 gq = attention_grid(AttnKernel::BackwardQ, s.Tq, s.Tk, s.Hq, s.Hkv, s.B, tq);
    if (gq.x > 0)
        attn_bwd_q_kernel<T><<<to_dim3(gq), kAttnThreads, tq.smem, stream>>>(
            s, qt, kt, vt, dot, lse, Di, dq, ks, static_cast<int>(tq.bq), static_cast<int>(tq.bk), static_cast<int>(tq.dp),
            static_cast<int>(tq.kp), unscale);
    check_launch("attention_back (dq)");
}

} // namespace

void attention_fwd(const AttentionShape & s, gguf::TensorType type, const void * q, const void * k, const void * v,
                   float * o, float * lse, cudaStream_t stream, const int32_t * key_start, const float * sinks) {
    check_shape(s, type, "attention");
    if (s.Tq == 0 || s.B == 0) return;
    switch (type) {
    case gguf::TensorType::F16: return fwd<__half>(s, q, k, v, o, lse, key_start, sinks, stream);
    case gguf::TensorType::BF16: return fwd<__nv_bfloat16>(s, q, k, v, o, lse, key_start, sinks, stream);
    default: return fwd<float>(s, q, k, v, o, lse, key_start, sinks, stream);
    }
}

void attention_bwd(const AttentionShape & s, gguf::TensorType type, const void * q, const void * k, const void * v,
                   const float * o, const float * lse, const void * dout, float * dq, float * dk, float * dv,
                   void * workspace, size_t workspace_bytes, cudaStream_t stream, const int32_t * key_start,
                   const float * grad_unscale, const float * sinks, float * dsinks) {
    check_shape(s, type, "attention_back");
    require(s.kv_seq_rows() == s.Tk, "attention_back", "kv_rows=" + std::to_string(s.kv_rows) + ": the backward needs contiguous keys");
    const size_t need = attention_bwd_workspace_bytes(s.Hq, s.Tq, s.B);
    require(workspace_bytes >= need, "attention_back", "workspace of " + std::to_string(workspace_bytes) +
                                                           " bytes is smaller than the " + std::to_string(need) + " needed");
    if (s.B == 0 || s.Tk == 0) {
        if (dsinks && s.Hq > 0) check(cudaMemsetAsync(dsinks, 0, size_t(s.Hq) * sizeof(float), stream), "cuda attention_back: dsinks");
        return;
    }
    float * Di = static_cast<float *>(workspace);
    switch (type) {
    case gguf::TensorType::F16:
        return bwd<__half>(s, q, k, v, o, lse, dout, dq, dk, dv, Di, key_start, stream, grad_unscale, sinks, dsinks);
    case gguf::TensorType::BF16:
        return bwd<__nv_bfloat16>(s, q, k, v, o, lse, dout, dq, dk, dv, Di, key_start, stream, grad_unscale, sinks, dsinks);
    default: return bwd<float>(s, q, k, v, o, lse, dout, dq, dk, dv, Di, key_start, stream, grad_unscale, sinks, dsinks);
    }
}

// ---- node entries ----
namespace {

// The f16 backward's scale of dout (backend_plan.h's header): max |dout| and max |v| (float bits), 2^k and 2^-k.
struct GradScale {
    unsigned dout_max_bits;
    unsigned v_max_bits;
    float scale;
    float unscale;
};

__global__ void __launch_bounds__(1) grad_scale_kernel(GradScale * g, int64_t D) {
    const int k = attention_grad_scale_exponent(__uint_as_float(g->dout_max_bits), __uint_as_float(g->v_max_bits), D);
    g->scale = ldexpf(1.0f, k);
    g->unscale = ldexpf(1.0f, -k);
}

// The node's inputs as the kernels read them: as they are, or (f32 inputs with an f16 / bf16 accelerated
// type, ops/attention.h) cast into scratch at `area` so the tile products run on tensor cores. An f16 backward
// scales dout by a power of two first (half_scale.h): unscale then points at 2^-k for the kernels' results.
struct AttentionInputs {
    gguf::TensorType type;
    const void * p[6] = {};
    Tensor cast[6];
    const float * unscale = nullptr;
};

AttentionInputs attention_inputs(const Tensor * n, char * area, cudaStream_t stream) {
    AttentionInputs x;
    x.type = n->src[0]->type;
    for (int i = 0; i < 6; ++i) x.p[i] = n->src[i] ? n->src[i]->data : nullptr;
    if (!attention_casts_inputs(n)) return x;
    x.type = node::attention_accelerated_type(n);
    GradScale * gs = nullptr;
    if (attention_scales_grads(n)) {
        gs = reinterpret_cast<GradScale *>(area);
        area += kAttentionGradHeader;
        const Tensor * dout = n->src[5];
        const Tensor * v = n->src[2];
        check(cudaMemsetAsync(gs, 0, 2 * sizeof(unsigned), stream), "cuda attention_back (gradient scale)");
        absmax_into(in<float>(dout), dout->nelements(), dout->nelements(), 1, &gs->dout_max_bits, stream);
        absmax_into(in<float>(v), v->nelements(), v->nelements(), 1, &gs->v_max_bits, stream);
        grad_scale_kernel<<<1, 1, 0, stream>>>(gs, n->src[0]->ne[0]);
        check_launch("attention_back (gradient scale)");
        x.unscale = &gs->unscale;
    }
    for (int i : {0, 1, 2, 5}) {
        if (i == 5 && n->op != Op::ATTENTION_BACK) continue;
        const Tensor * src = n->src[i];
        Tensor & c = x.cast[i];
        c = *src;
        c.type = x.type;
        set_contiguous_strides(&c);
        c.view_src = nullptr;
        c.view_offs = 0;
        c.data = area;
        area += (size_t(src->nelements()) * 2 + 255) / 256 * 256;
        if (i == 5 && gs) {
            // dout (packed, kPackedIn) times 2^k, rounded to f16.
            round_to_half(gguf::TensorType::F16, in<float>(src), src->nelements(), src->nelements(), 1, c.data, &gs->scale, stream);
        } else {
            enqueue_cpy(src, &c, stream);
        }
        x.p[i] = c.data;
    }
    return x;
}

void run_attention(Tensor * n, const NodeRun & r) {
    const AttentionInputs x = attention_inputs(n, static_cast<char *>(r.scratch), r.stream);
    AttentionShape s = node::attention_shape(n);
    if (attention_casts_inputs(n)) s.kv_rows = 0;  // (the casts are contiguous)
    attention_fwd(s, x.type, x.p[0], x.p[1], x.p[2], out<float>(n), node::aux(n, 0), r.stream,
                  node::attention_key_start_data(n), node::attention_sinks_data(n));
}

void run_attention_back(Tensor * n, const NodeRun & r) {
    const Tensor * q = n->src[0];
    const Tensor * k = n->src[1];
    const size_t own = (attention_bwd_workspace_bytes(q->ne[1], q->ne[2], q->ne[3]) + 255) / 256 * 256;
    const AttentionInputs x = attention_inputs(n, static_cast<char *>(r.scratch) + own, r.stream);
    attention_bwd(node::attention_shape(n), x.type, x.p[0], x.p[1], x.p[2], in<float>(n->src[3]), in<float>(n->src[4]),
                  x.p[5], out<float>(n), node::aux(n, 0), node::aux(n, k->nbytes()), r.scratch, own, r.stream,
                  node::attention_key_start_data(n), x.unscale, node::attention_sinks_data(n), node::attention_dsinks(n));
}

const RegisterNodeKernels kRegister{{Op::ATTENTION, run_attention}, {Op::ATTENTION_BACK, run_attention_back}};
} // namespace

} // namespace rp::cuda
