// CPU matrix products: one packed, register-tiled GEMM engine (GotoBLAS / BLIS structure) behind matmul_fwd,
// matmul_bwd_x, matmul_bwd_w and gemm_f32_serial.
//
//     C[i, j] (+)= sum_p A(i, p) * B(p, j)        C row-major (j contiguous), A f32, B f32 or any weight type
//
// A is packed into micro-panels of MR rows ([p][MR]), B into micro-panels of NR columns ([p][NR]); a micro-kernel
// keeps an MR x NR block of C in registers and does one broadcast-FMA rank-1 update per reduction step.
// Quantized / half B rows are decoded (decode_row: rp::dequantize_row's values, vectorized) into a per-thread f32 tile
// right before packing.
//
// Determinism: every C element is C_old (or 0) + s_0 + s_1 + ... where s_b is the FMA chain over reduction
// block b of kGemmKC steps, computed by one micro-kernel call in order. Nothing else (tile position, task
// split, thread count) enters the arithmetic, so the result is bit-identical for any number of threads.
// (The opt-in row-dot path for one token, matvec_dot.h, has its own fixed order per row.)
#include "ggml_rp/cpu/gemm.h"
#include "ggml_rp/cpu/kernel_scratch.h"

#include "ggml_rp/cpu/gemm_int8.h"
#include "ggml_rp/cpu/matvec_dot.h"
#include "ggml_rp/cpu/parallel_tasks.h"
#include "ggml_rp/cpu/row_decode.h"

#include "ggml_rp/core/quant.h"
#include "ggml_rp/core/quant_block.h"
#include "base/error.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)) || defined(__F16C__)
#include <immintrin.h>
#endif
// The one-row product (generation): 16 rows per group with AVX-512, 8 with AVX2 + FMA + F16C.
#if defined(__AVX512F__)
#define RP_ONE_ROW 16
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define RP_ONE_ROW 8
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef RP_HAVE_BLAS
#include <cblas.h>
#endif

namespace rp::cpu {

namespace {

constexpr int64_t KC = kGemmKC;   // reduction block: fixes the summation order
constexpr int64_t NC = 256;       // B columns per task; a multiple of every NR and of 256 (K-quant blocks)
constexpr int64_t MC = 120;       // rows of A swept per B micro-panel (a multiple of every MR)
constexpr int64_t MC_MIN = 48;    // smallest row block of a task (when columns alone give too few tasks)
constexpr size_t kKeptApackBytes = size_t(16) << 20;   // packed A kept per calling thread up to this size

// ---- micro-kernels ------------------------------------------------------------------------------------------
// A kernel type gives the vector type V of W floats, NV vectors per C row (NR = W * NV) and MR rows.

struct PortableKernel {
    static constexpr int W = 1, NV = 8, MR = 4;
    using V = float;
    static V zero() { return 0.0f; }
    static V load(const float * p) { return *p; }
    static V bcast(const float * p) { return *p; }
    static V fma(V a, V b, V c) { return a * b + c; }
    static V add(V a, V b) { return a + b; }
    static void store(float * p, V v) { *p = v; }
    static constexpr const char * name = "portable 4x8";
};

#if defined(__AVX512F__)
struct SimdKernel {
    static constexpr int W = 16, NV = 2, MR = 12;   // 24 accumulators of 32 zmm
    using V = __m512;
    static V zero() { return _mm512_setzero_ps(); }
    static V load(const float * p) { return _mm512_loadu_ps(p); }
    static V bcast(const float * p) { return _mm512_set1_ps(*p); }
    static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
    static V add(V a, V b) { return _mm512_add_ps(a, b); }
    static void store(float * p, V v) { _mm512_storeu_ps(p, v); }
    static constexpr const char * name = "avx512 12x32";
};
#elif defined(__AVX2__) && defined(__FMA__)
struct SimdKernel {
    static constexpr int W = 8, NV = 2, MR = 6;     // 12 accumulators of 16 ymm
    using V = __m256;
    static V zero() { return _mm256_setzero_ps(); }
    static V load(const float * p) { return _mm256_loadu_ps(p); }
    static V bcast(const float * p) { return _mm256_broadcast_ss(p); }
    static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
    static V add(V a, V b) { return _mm256_add_ps(a, b); }
    static void store(float * p, V v) { _mm256_storeu_ps(p, v); }
    static constexpr const char * name = "avx2 6x16";
};
#else
using SimdKernel = PortableKernel;
#endif

// C[ROWS x NR] = (add ? C : 0) + Ap^T Bp over kc steps. ap: [kc][MR], bp: [kc][NR].
template <class Kn, int ROWS>
void micro_kernel(int64_t kc, const float * __restrict ap, const float * __restrict bp, float * c, int64_t ldc,
                  bool add) {
    using V = typename Kn::V;
    constexpr int NV = Kn::NV, W = Kn::W;
    V acc[ROWS][NV];
    // The C tile is read only after the loop; fetch it now (its rows are a whole row stride apart).
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 16
        for (int q = 0; q < NV * W; q += 16) __builtin_prefetch(c + r * ldc + q, 1, 3);
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) acc[r][v] = Kn::zero();
    for (int64_t p = 0; p < kc; ++p) {
        V b[NV];
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) b[v] = Kn::load(bp + v * W);
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r) {
            const V a = Kn::bcast(ap + r);
#pragma GCC unroll 16
            for (int v = 0; v < NV; ++v) acc[r][v] = Kn::fma(a, b[v], acc[r][v]);
        }
        ap += Kn::MR;
        bp += NV * W;
    }
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) {
            float * cp = c + r * ldc + v * W;
            Kn::store(cp, add ? Kn::add(Kn::load(cp), acc[r][v]) : acc[r][v]);
        }
}

using MicroFn = void (*)(int64_t, const float *, const float *, float *, int64_t, bool);

template <class Kn, size_t... I>
constexpr auto micro_table(std::index_sequence<I...>) {
    return std::array<MicroFn, sizeof...(I)>{&micro_kernel<Kn, int(I) + 1>...};
}

// ---- operands -------------------------------------------------------------------------------------------------

// A(i, p) = t ? a[p*ld + i] : a[i*ld + p]
struct OperandA {
    const float * a;
    int64_t ld;
    bool t;
};

// B as rows of a typed matrix. t: row j holds B(., j) (p contiguous); !t: row p holds B(p, .) (j contiguous).
struct OperandB {
    const char * base;
    size_t row_bytes;
    TensorType type;
    bool t;
};

// 64-byte aligned float buffer that only grows.
struct GrowingBuffer {
    float * p = nullptr;
    size_t n = 0;
    ~GrowingBuffer() { std::free(p); }
    float * get(size_t want) {
        if (want > n) {
            std::free(p);
            n = (want + 15) & ~size_t(15);
            p = static_cast<float *>(std::aligned_alloc(64, n * sizeof(float)));
            if (!p) throw Error("gemm: out of memory for a " + std::to_string(n * 4) + "-byte packing buffer");
        }
        return p;
    }
};

#if defined(__AVX512F__)
// 16 x 16 transpose in registers: r[i] holds row i (16 consecutive reduction steps), o[q] receives step q of the
// 16 rows. 4 rounds of shuffles instead of 256 strided scalar moves. (The maskz forms with full masks avoid
// GCC 12's false "uninitialized" warning on the plain intrinsics.)
inline void transpose16(const __m512 r[16], __m512 o[16]) {
    constexpr __mmask16 all16 = 0xFFFF;
    constexpr __mmask8 all8 = 0xFF;
    __m512 t[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_maskz_unpacklo_ps(all16, r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_maskz_unpackhi_ps(all16, r[2 * i], r[2 * i + 1]);
    }
    // u[4g + k]: rows 4g..4g+3 at columns k, k+4, k+8, k+12 (one per 128-bit chunk)
    __m512 u[16];
    for (int g = 0; g < 4; ++g) {
        const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * g + 2]), e = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g + 0] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(all8, a, c));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(all8, a, c));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(all8, b, e));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(all8, b, e));
    }
    for (int k = 0; k < 4; ++k) {
        // Column 4c + k gathers 128-bit chunk c of u[k], u[4+k], u[8+k], u[12+k].
        auto shuf = [](__m512 a, __m512 b, auto imm) { return _mm512_maskz_shuffle_f32x4(all16, a, b, decltype(imm)::value); };
        using I44 = std::integral_constant<int, 0x44>;
        using IEE = std::integral_constant<int, 0xEE>;
        using I88 = std::integral_constant<int, 0x88>;
        using IDD = std::integral_constant<int, 0xDD>;
        const __m512 v01 = shuf(u[k], u[4 + k], I44{}), w01 = shuf(u[8 + k], u[12 + k], I44{});
        const __m512 v23 = shuf(u[k], u[4 + k], IEE{}), w23 = shuf(u[8 + k], u[12 + k], IEE{});
        o[k] = shuf(v01, w01, I88{});
        o[4 + k] = shuf(v01, w01, IDD{});
        o[8 + k] = shuf(v23, w23, I88{});
        o[12 + k] = shuf(v23, w23, IDD{});
    }
}
#endif

constexpr int64_t kTransposePrefetch = 64;   // floats ahead in each row (4 cache lines)
constexpr int64_t kRowsAhead = 8;            // rows ahead in a strided (row-by-row) packing stream

// d[p*dstride + r] = rows[r][p] for r < nrows (<= 16), p < kc, where rows[r] = src + r*ld; lanes r in
// [nrows, lanes) are written as 0, lanes past `lanes` are not written.
void transpose_rows(const float * src, int64_t ld, int nrows, int64_t kc, float * d, int64_t dstride, int lanes) {
#if defined(__AVX512F__)
    const __mmask16 store_mask = __mmask16((1u << lanes) - 1);
    for (int64_t p = 0; p < kc; p += 16) {
        const int np = int(std::min<int64_t>(16, kc - p));
        const __mmask16 load_mask = __mmask16((1u << np) - 1);
        __m512 r[16], o[16];
        for (int i = 0; i < 16; ++i)
            r[i] = i < nrows ? _mm512_maskz_loadu_ps(load_mask, src + i * ld + p) : _mm512_setzero_ps();
        // 16 row streams: the hardware prefetchers alone leave each load waiting on memory when the operand is
        // out of cache (a weight or activation last touched a layer ago).
        if (p + kTransposePrefetch < kc)
            for (int i = 0; i < nrows; ++i) _mm_prefetch(reinterpret_cast<const char *>(src + i * ld + p + kTransposePrefetch), _MM_HINT_T0);
        transpose16(r, o);
        for (int q = 0; q < np; ++q) _mm512_mask_storeu_ps(d + (p + q) * dstride, store_mask, o[q]);
    }
#else
    for (int r = 0; r < nrows; ++r) {
        const float * s = src + r * ld;
        for (int64_t p = 0; p < kc; ++p) d[p * dstride + r] = s[p];
    }
    for (int r = nrows; r < lanes; ++r)
        for (int64_t p = 0; p < kc; ++p) d[p * dstride + r] = 0.0f;
#endif
}

// Rows [i0, i0+mc) x steps [p0, p0+kc) of A -> micro-panels of MR rows at dst (panel q at dst + q*MR*kc).
template <int MR>
void pack_a(const OperandA & A, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float * dst) {
    for (int64_t ir = 0; ir < mc; ir += MR) {
        const int rows = int(std::min<int64_t>(MR, mc - ir));
        float * d = dst + ir * kc;
        if (A.t) {
            for (int64_t p = 0; p < kc; ++p) {
                const float * s = A.a + (p0 + p) * A.ld + i0 + ir;
                if (p + kRowsAhead < kc) __builtin_prefetch(s + kRowsAhead * A.ld, 0, 3);
                for (int r = 0; r < rows; ++r) d[p * MR + r] = s[r];
            }
        } else if (MR <= 16) {
            transpose_rows(A.a + (i0 + ir) * A.ld + p0, A.ld, rows, kc, d, MR, MR);
        } else {
            for (int r = 0; r < rows; ++r) {
                const float * s = A.a + (i0 + ir + r) * A.ld + p0;
                for (int64_t p = 0; p < kc; ++p) d[p * MR + r] = s[p];
            }
        }
    }
}

// B(p0 .. p0+kc, j0 .. j0+nc) given as f32 rows (src, ld floats, t as in OperandB) -> micro-panels of NR
// columns at dst (panel q at dst + q*NR*kc), columns past nc zeroed.
template <int NR>
void pack_b_f32(const float * src, int64_t ld, bool t, int64_t j0, int64_t nc, int64_t p0, int64_t kc,
                float * dst) {
    for (int64_t jr = 0; jr < nc; jr += NR) {
        const int cols = int(std::min<int64_t>(NR, nc - jr));
        float * d = dst + jr * kc;
        if (t) {
            // 16 columns at a time (zero-filled past cols).
            for (int c0 = 0; c0 < NR; c0 += 16) {
                const int lanes = std::min(16, NR - c0);
                transpose_rows(src + (j0 + jr + c0) * ld + p0, ld, std::clamp(cols - c0, 0, lanes), kc, d + c0, NR,
                               lanes);
            }
        } else {
            if (cols == NR) {
                for (int64_t p = 0; p < kc; ++p) {
                    const float * s = src + (p0 + p) * ld + j0 + jr;
                    if (p + kRowsAhead < kc)   // a strided stream: fetch the rows ahead (as transpose_rows)
                        for (int q = 0; q < NR; q += 16) __builtin_prefetch(s + kRowsAhead * ld + q, 0, 3);
                    for (int q = 0; q < NR; ++q) d[p * NR + q] = s[q];   // fixed length: vector moves, no call
                }
            } else {
                for (int64_t p = 0; p < kc; ++p) {
                    const float * s = src + (p0 + p) * ld + j0 + jr;
                    std::memcpy(d + p * NR, s, sizeof(float) * cols);
                    std::memset(d + p * NR + cols, 0, sizeof(float) * (NR - cols));
                }
            }
        }
    }
}

// Per-thread buffers of the B side: the packed block and the dequantized tile.
struct ThreadScratch {
    GrowingBuffer bpack, deq, apack, ctile;
};
ThreadScratch & thread_scratch() {
    static thread_local ThreadScratch s;
    return s;
}

// Pack B(p0.., j0..) of any type: f32 directly, other types through a dequantized f32 tile.
template <int NR>
void pack_b(const OperandB & B, int64_t j0, int64_t nc, int64_t p0, int64_t kc, float * dst, GrowingBuffer & deq) {
    if (B.type == TensorType::F32) {
        pack_b_f32<NR>(reinterpret_cast<const float *>(B.base), int64_t(B.row_bytes / sizeof(float)), B.t, j0, nc,
                       p0, kc, dst);
        return;
    }
    // Dequantize whole blocks: p0 (t) or j0 (!t) is a multiple of 256 and the length is a multiple of the block.
    if (B.t) {
        float * tile = deq.get(size_t(nc * kc));   // nc rows of kc
        const size_t off = gguf::row_bytes(B.type, p0);
        for (int64_t c = 0; c < nc; ++c)
            decode_row(B.type, B.base + (j0 + c) * B.row_bytes + off, tile + c * kc, kc);
        pack_b_f32<NR>(tile, kc, true, 0, nc, 0, kc, dst);
    } else {
        float * tile = deq.get(size_t(kc * nc));   // kc rows of nc
        const size_t off = gguf::row_bytes(B.type, j0);
        for (int64_t p = 0; p < kc; ++p)
            decode_row(B.type, B.base + (p0 + p) * B.row_bytes + off, tile + p * nc, nc);
        pack_b_f32<NR>(tile, nc, false, 0, nc, 0, kc, dst);
    }
}

// The source rows pack_b reads for B(p0 .. p0+kc, j0 .. j0+nc): rows [0, rows) at base + r * stride, bytes
// [b0, b1) of each.
struct BlockRows {
    const char * base = nullptr;
    size_t stride = 0, b0 = 0, b1 = 0;
    int64_t rows = 0;
    void prefetch(int64_t r0, int64_t r1) const {
        for (int64_t r = r0; r < r1; ++r)
            for (size_t o = b0; o < b1; o += 64) __builtin_prefetch(base + r * stride + o, 0, 2);
    }
};
BlockRows block_rows(const OperandB & B, int64_t j0, int64_t nc, int64_t p0, int64_t kc) {
    if (B.t) return {B.base + j0 * B.row_bytes, B.row_bytes, gguf::row_bytes(B.type, p0), gguf::row_bytes(B.type, p0 + kc), nc};
    return {B.base + p0 * B.row_bytes, B.row_bytes, gguf::row_bytes(B.type, j0), gguf::row_bytes(B.type, j0 + nc), kc};
}

// ---- the driver -----------------------------------------------------------------------------------------------

struct Problem {
    int64_t M, N, K;
    OperandA A;
    OperandB B;
    float * C;
    int64_t ldc;
    bool accumulate;
};

#if defined(RP_ONE_ROW)
// ---- one row (generation: one token per step) ------------------------------------------------------------------
// C[0, j] (+)= sum_p A(0, p) B(p, j) with B's columns stored as rows (B.t: weight rows) of f32, bf16 or f16: the
// rows are read once where they lie, 16 rows x 16 steps are transposed in registers and fed to one vector of 16
// sums, so nothing is packed or stored on the way. The arithmetic is the packed kernel's exactly: per reduction
// block of KC steps a chain of FMAs from +0 in step order, then C = (add ? C + s : s); so a token evaluated
// alone gives the bits of its column in a batch. (AVX2: the same with 8 rows x 8 steps.)
#if RP_ONE_ROW == 16
template <TensorType WT>
inline __m512 load_row16(const char * row, int64_t p, __mmask16 m) {
    if constexpr (WT == TensorType::F32) {
        return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float *>(row) + p);
    } else if constexpr (WT == TensorType::BF16) {
        const __m256i h = _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t *>(row) + p);
        return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16));
    } else {
        return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t *>(row) + p));
    }
}

// One reduction block [p0, kend) of 16 rows (nrows valid, row i at rows + i * row_bytes, element p at
// load_row16<WT>(row, p - base)), then C[0, r0 ..] = (add ? C + s : s).
template <TensorType WT>
inline void one_row_tile(const float * x, const char * rows, size_t row_bytes, int nrows, int64_t p0, int64_t kend,
                         int64_t base, bool add, float * c) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t p = p0; p < kend; p += 16) {
        const int np = int(std::min<int64_t>(16, kend - p));
        const __mmask16 m = __mmask16((1u << np) - 1);
        __m512 r[16], o[16];
        for (int i = 0; i < 16; ++i) r[i] = i < nrows ? load_row16<WT>(rows + i * row_bytes, p - base, m) : _mm512_setzero_ps();
        transpose16(r, o);
        for (int q = 0; q < np; ++q) acc = _mm512_fmadd_ps(_mm512_set1_ps(x[p + q]), o[q], acc);
    }
    const __mmask16 sm = __mmask16((1u << nrows) - 1);
    _mm512_mask_storeu_ps(c, sm, add ? _mm512_add_ps(_mm512_maskz_loadu_ps(sm, c), acc) : acc);
}
#else
// 8 x 8 transpose in registers: r[i] holds row i (8 consecutive reduction steps), o[q] receives step q of the 8 rows.
inline void transpose8(const __m256 r[8], __m256 o[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; ++i) {   // t[2i]: rows 2i, 2i+1 at steps 0, 1 | 4, 5; t[2i+1]: steps 2, 3 | 6, 7
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 2; ++g) {   // u[4g + k]: rows 4g .. 4g+3 at step k | k + 4
        u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
        u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (int k = 0; k < 4; ++k) {
        o[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
        o[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
    }
}

// 8 elements of a row from element p as floats (np < 8 valid: the rest 0).
template <TensorType WT>
inline __m256 load_row8(const char * row, int64_t p, int np) {
    if (np < 8) {
        alignas(32) float v[8] = {};
        for (int q = 0; q < np; ++q) {
            if constexpr (WT == TensorType::F32) v[q] = reinterpret_cast<const float *>(row)[p + q];
            else if constexpr (WT == TensorType::BF16) v[q] = bf16_to_fp32(reinterpret_cast<const uint16_t *>(row)[p + q]);
            else v[q] = fp16_to_fp32(reinterpret_cast<const uint16_t *>(row)[p + q]);
        }
        return _mm256_load_ps(v);
    }
    if constexpr (WT == TensorType::F32) return _mm256_loadu_ps(reinterpret_cast<const float *>(row) + p);
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(reinterpret_cast<const uint16_t *>(row) + p));
    if constexpr (WT == TensorType::BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    else return _mm256_cvtph_ps(h);
}

template <TensorType WT>
inline void one_row_tile(const float * x, const char * rows, size_t row_bytes, int nrows, int64_t p0, int64_t kend,
                         int64_t base, bool add, float * c) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t p = p0; p < kend; p += 8) {
        const int np = int(std::min<int64_t>(8, kend - p));
        __m256 r[8], o[8];
        for (int i = 0; i < 8; ++i) r[i] = i < nrows ? load_row8<WT>(rows + i * row_bytes, p - base, np) : _mm256_setzero_ps();
        transpose8(r, o);
        for (int q = 0; q < np; ++q) acc = _mm256_fmadd_ps(_mm256_set1_ps(x[p + q]), o[q], acc);
    }
    alignas(32) float s[8];
    _mm256_store_ps(s, acc);
    for (int i = 0; i < nrows; ++i) c[i] = add ? c[i] + s[i] : s[i];
}
#endif

// Rows [j0, j1) of B (columns of C), 16 (AVX2: 8) at a time over all reduction blocks. (Interleaving 2 or 4 groups of
// 16 rows, to run more FMA chains at once, measured slower: 32 or 64 row streams defeat the prefetchers; so
// does software prefetching.) f32, bf16, f16 rows are read where they lie; other types are dequantized 16
// (8) rows x one block at a time into an L1 tile (the same values rp::dequantize_row gives).
template <TensorType WT>
void one_row_block(const Problem & P, int64_t j0, int64_t j1) {
    constexpr int R = RP_ONE_ROW;   // rows per group
    const float * x = P.A.a;
    float * tile = nullptr;
    if constexpr (WT != TensorType::F32 && WT != TensorType::BF16 && WT != TensorType::F16)
        tile = thread_scratch().deq.get(size_t(R * KC));
    for (int64_t r0 = j0; r0 < j1; r0 += R) {
        const int nrows = int(std::min<int64_t>(R, j1 - r0));
        const char * rows = P.B.base + r0 * P.B.row_bytes;
        for (int64_t p0 = 0; p0 < P.K; p0 += KC) {
            const int64_t kend = std::min(P.K, p0 + KC);
            const bool add = p0 > 0 || P.accumulate;
            if (r0 + R < j1) {   // the next group's same reduction block, one group ahead (bf16 0.6B: +15%)
                const size_t b0 = gguf::row_bytes(P.B.type, p0), b1 = gguf::row_bytes(P.B.type, kend);
                const int nnext = int(std::min<int64_t>(R, j1 - r0 - R));
                for (int i = 0; i < nnext; ++i)
                    for (size_t b = b0; b < b1; b += 64) _mm_prefetch(rows + (R + i) * P.B.row_bytes + b, _MM_HINT_T0);
            }
            if constexpr (WT == TensorType::F32 || WT == TensorType::BF16 || WT == TensorType::F16) {
                one_row_tile<WT>(x, rows, P.B.row_bytes, nrows, p0, kend, 0, add, P.C + r0);
            } else {
                const size_t off = gguf::row_bytes(P.B.type, p0);  // p0: a multiple of KC, so of every block
                for (int i = 0; i < nrows; ++i) decode_row(P.B.type, rows + i * P.B.row_bytes + off, tile + i * KC, kend - p0);
                one_row_tile<TensorType::F32>(x, reinterpret_cast<const char *>(tile), KC * sizeof(float), nrows, p0, kend, p0,
                                              add, P.C + r0);
            }
        }
    }
}

// The row blocks as tasks (64 rows each, at least): the split decides only who computes, never how.
bool run_one_row(const Problem & P, bool parallel);
#endif

// Packed A for all rows: reduction block b at apack + b*KC*Mpad, micro-panel q of it at + q*MR*kc.
template <class Kn>
int64_t padded_rows(int64_t M) {
    return (M + Kn::MR - 1) / Kn::MR * Kn::MR;
}

// One output tile: rows [i0, i0+mt) x columns [j0, j0+nc), all reduction blocks in order.
template <class Kn>
void run_tile(const Problem & P, const float * apack, int64_t i0, int64_t mt, int64_t j0, int64_t nc) {
    constexpr int MR = Kn::MR, NR = Kn::NV * Kn::W;
    static constexpr auto micro = micro_table<Kn>(std::make_index_sequence<MR>{});
    ThreadScratch & ts = thread_scratch();
    const int64_t nc_pad = (nc + NR - 1) / NR * NR;
    float * bp = ts.bpack.get(size_t(nc_pad * KC));
    float * ctile = ts.ctile.get(size_t(MR * NR));
    const int64_t Mpad = padded_rows<Kn>(P.M);
    const int64_t n_jr = (nc + NR - 1) / NR;
    for (int64_t p0 = 0, b = 0; p0 < P.K; p0 += KC, ++b) {
        const int64_t kc = std::min(KC, P.K - p0);
        const bool add = p0 > 0 || P.accumulate;
        pack_b<NR>(P.B, j0, nc, p0, kc, bp, ts.deq);
        const float * ablock = apack + b * KC * Mpad;
        // The next reduction block's B rows, fetched into L2 a slice per column panel of the first row chunk:
        // the operand is usually out of cache (a weight or an activation last touched a layer ago), and its
        // packing would otherwise wait on memory with nothing to overlap.
        const BlockRows next = p0 + KC < P.K ? block_rows(P.B, j0, nc, p0 + KC, std::min(KC, P.K - p0 - KC)) : BlockRows{};
        // Row chunks of MC keep the chunk's A panels and C rows in L2 while B's micro-panels sweep over them.
        for (int64_t ic = 0; ic < mt; ic += MC) {
            const int64_t ic_end = std::min(mt, ic + MC);
            for (int64_t jr = 0; jr < nc; jr += NR) {
                if (ic == 0 && next.rows > 0) next.prefetch(next.rows * (jr / NR) / n_jr, next.rows * (jr / NR + 1) / n_jr);
                const int64_t cols = std::min<int64_t>(NR, nc - jr);
                const float * bpanel = bp + jr * kc;
                for (int64_t ir = ic; ir < ic_end; ir += MR) {
                    const int rows = int(std::min<int64_t>(MR, ic_end - ir));
                    const float * apanel = ablock + (i0 + ir) * kc;
                    float * c = P.C + (i0 + ir) * P.ldc + j0 + jr;
                    if (cols == NR) {
                        micro[rows - 1](kc, apanel, bpanel, c, P.ldc, add);
                    } else {
                        // Partial column panel: compute a full tile aside, then add the valid columns the same way.
                        micro[rows - 1](kc, apanel, bpanel, ctile, NR, false);
                        for (int r = 0; r < rows; ++r)
                            for (int64_t q = 0; q < cols; ++q)
                                c[r * P.ldc + q] = add ? c[r * P.ldc + q] + ctile[r * NR + q] : ctile[r * NR + q];
                    }
                }
            }
        }
    }
}

#if defined(RP_ONE_ROW)
// A few tokens as row dots (matvec_dot.h): each column prepared once, each weight row dotted where it lies with
// every column in turn (the row stays in L1 after the first), so the weights stream in once for all of them and
// every column gets the bits it gets alone. A task's rows are one contiguous stream (the kernels fetch it ahead
// where the CPU needs that). Up to dot_columns(type) tokens: beyond, the packed GEMM's one pass over the weights
// for all columns wins (2-core Xeon, GB/s of weights at 2 / 4 / 8 tokens, row dots vs the GEMM: q4_k 21.9 / 11.4
// / 5.6 vs 4.1 / 4.0 / 3.7, q8_0 33.1 / 18.6 / 8.9 vs 7.4 / 7.6 / 6.9; bf16, its row loaded once for all columns:
// 52.8 / 19.4 / 15.5 vs 12.9 / 11.1 / 12.2; f16, its row converted once for 4 columns: 22.5 / 15.0 / 9.5 vs 12.9 /
// 12.7 / 10.9; f32, whose GEMM streams the f32 weights as they are, loses already at 2 tokens: 25.3 vs 27.8).
int64_t dot_columns(TensorType t) {
    return t == TensorType::F32 ? 1 : t == TensorType::F16 ? 4 : 8;
}

void dot_rows(const Problem & P, int64_t j0, int64_t j1, const std::vector<DotColumn> & x) {
    const DotColumn * cols[kRowDotColumns];
    float v[kRowDotColumns];
    for (int64_t j = j0; j < j1; ++j) {
        const char * row = P.B.base + j * P.B.row_bytes;
        for (int64_t i0 = 0; i0 < P.M; i0 += kRowDotColumns) {  // (up to 8 columns per pass over the row)
            const int n = static_cast<int>(std::min<int64_t>(kRowDotColumns, P.M - i0));
            for (int c = 0; c < n; ++c) cols[c] = &x[size_t(i0 + c)];
            row_dot_columns(P.B.type, row, cols, n, v);
            for (int c = 0; c < n; ++c) {
                float & out = P.C[(i0 + c) * P.ldc + j];
                out = P.accumulate ? out + v[c] : v[c];
            }
        }
    }
}

bool run_one_row(const Problem & P, bool parallel) {
    if (!P.B.t || P.A.t || P.M < 1) return false;
    // (Only where the dot has its instructions: the portable loops are slower than the path below.)
    const bool dots = row_dots() && row_dot_supports(P.B.type, P.K) && row_dot_is_simd(P.B.type);
    const int64_t max_columns = row_dot_max_columns() > 0 ? row_dot_max_columns() : dot_columns(P.B.type);
    if (P.M != 1 && !(dots && P.M <= max_columns)) return false;
    static thread_local std::vector<DotColumn> scratch;
    std::vector<DotColumn> & columns = scratch;   // (a name the lambda captures: inside it `scratch` is each thread's own)
    if (dots) {
        if (columns.size() < size_t(P.M)) columns.resize(size_t(P.M));
        for (int64_t i = 0; i < P.M; ++i) prepare_column(P.B.type, P.A.a + i * P.A.ld, P.K, columns[size_t(i)]);
    }
    void (*block)(const Problem &, int64_t, int64_t) = nullptr;
    switch (P.B.type) {
    case TensorType::F32: block = &one_row_block<TensorType::F32>; break;
    case TensorType::BF16: block = &one_row_block<TensorType::BF16>; break;
    case TensorType::F16: block = &one_row_block<TensorType::F16>; break;
    default: block = &one_row_block<TensorType::Q8_0>; break;  // any other type: Q8_0 stands for "through the L1 tile"
    }
    int nthreads = 1;
#ifdef _OPENMP
    if (parallel) nthreads = omp_get_max_threads();
#endif
    const int64_t rows_per_task = std::max<int64_t>(64, (P.N / (8 * int64_t(nthreads)) + 63) / 64 * 64);
    const int64_t ntasks = (P.N + rows_per_task - 1) / rows_per_task;
    for_tasks(ntasks, parallel && double(P.N) * double(P.K) > double(1 << 16), [&](int64_t task) {
        const int64_t j0 = task * rows_per_task;
        if (dots) dot_rows(P, j0, std::min(P.N, j0 + rows_per_task), columns);
        else block(P, j0, std::min(P.N, j0 + rows_per_task));
    });
    return true;
}

// More tokens than the row dots take, in a process that asked for their numerics (row_dots(), no session's scope
// limiting them to its decode steps): quantized weights through the int8 product (gemm_int8.h), which decodes a
// block of rows once for all the tokens, where the row dots decode each row once per 8 tokens.
bool run_int8(const Problem & P, bool parallel) {
    if (!P.B.t || P.A.t || !row_dots() || row_dot_max_columns() > 0 || !int8_matmul_supports(P.B.type, P.K)) return false;
    int8_matmul_fwd(P.K, P.N, P.M, P.B.base, P.B.type, P.B.row_bytes, P.A.a, P.A.ld, P.C, P.ldc, P.accumulate, parallel);
    return true;
}
#endif

#if defined(RP_ONE_ROW)
// ---- few output columns (LoRA's rank-r sides: A x, the gradient of A x, B's gradient) ----------------------------
// C[i, j] (+)= sum_p A(i, p) B(p, j) with N <= 8 and f32 B. The packed kernel pads such a product to its NR-wide
// panels (16 or 32 columns: most of its work thrown away) and packs both operands for it. Here B's columns are
// transposed once into [p][8], and 8 values of C share one vector: a row's 8 columns (A stored by rows: p
// contiguous, each A value broadcast), or a column's 8 rows (A stored transposed: i contiguous, each B value
// broadcast). The arithmetic is the packed kernel's exactly: per reduction block of KC steps an FMA chain from +0
// in step order, then C = (add ? C + s : s), so the bits are the same.
constexpr int64_t kFewColumns = 8;

bool run_few_columns(const Problem & P, bool parallel) {
    if (P.N > kFewColumns || P.M < 8 || P.B.type != TensorType::F32) return false;
    const int64_t M = P.M, N = P.N, K = P.K;
    const float * b = reinterpret_cast<const float *>(P.B.base);
    const int64_t ldb = int64_t(P.B.row_bytes / sizeof(float));
    std::vector<float> bt(static_cast<size_t>(K * kFewColumns), 0.0f);  // bt[p * 8 + j] = B(p, j), 0 for j >= N
    for (int64_t p = 0; p < K; ++p)
        for (int64_t j = 0; j < N; ++j) bt[size_t(p * kFewColumns + j)] = P.B.t ? b[j * ldb + p] : b[p * ldb + j];
    const int64_t blocks = (M + 7) / 8, per_task = 16;  // 8 rows a block, 128 rows a task
    const int64_t ntasks = (blocks + per_task - 1) / per_task;
    const bool worth = parallel && double(M) * double(N) * double(K) > double(1 << 18);
    const float * a = P.A.a;
    const int64_t lda = P.A.ld;
    for_tasks(ntasks, worth, [&](int64_t task) {
        for (int64_t blk = task * per_task; blk < std::min(blocks, (task + 1) * per_task); ++blk) {
            const int64_t i0 = blk * 8;
            const int rows = int(std::min<int64_t>(8, M - i0));
            for (int64_t p0 = 0; p0 < K; p0 += KC) {
                const int64_t p1 = std::min(K, p0 + KC);
                const bool add = p0 > 0 || P.accumulate;
                __m256 acc[8];
                for (int v = 0; v < 8; ++v) acc[v] = _mm256_setzero_ps();
                alignas(32) float out[8][8];
                if (!P.A.t) {  // acc[r]: row i0 + r's 8 columns (a short block repeats its last row, not stored)
                    const float * ar[8];
                    for (int r = 0; r < 8; ++r) ar[r] = a + (i0 + std::min(r, rows - 1)) * lda;
                    for (int64_t p = p0; p < p1; ++p) {
                        const __m256 bv = _mm256_loadu_ps(bt.data() + p * kFewColumns);
                        for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(ar[r] + p), bv, acc[r]);
                    }
                    for (int r = 0; r < 8; ++r) _mm256_store_ps(out[r], acc[r]);
                } else {  // acc[j]: column j's 8 rows i0 .. i0 + 7 (masked past M)
                    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(rows), lanes);
                    for (int64_t p = p0; p < p1; ++p) {
                        const __m256 av = rows == 8 ? _mm256_loadu_ps(a + p * lda + i0) : _mm256_maskload_ps(a + p * lda + i0, mask);
                        const float * bp = bt.data() + p * kFewColumns;
                        for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(av, _mm256_broadcast_ss(bp + j), acc[j]);
                    }
                    alignas(32) float col[8][8];
                    for (int j = 0; j < 8; ++j) _mm256_store_ps(col[j], acc[j]);
                    for (int r = 0; r < 8; ++r)
                        for (int j = 0; j < 8; ++j) out[r][j] = col[j][r];
                }
                for (int r = 0; r < rows; ++r) {
                    float * c = P.C + (i0 + r) * P.ldc;
                    for (int64_t j = 0; j < N; ++j) c[j] = add ? c[j] + out[r][j] : out[r][j];
                }
            }
        }
    });
    return true;
}
#endif

template <class Kn>
void pack_all_a(const Problem & P, float * apack, bool parallel) {
    const int64_t Mpad = padded_rows<Kn>(P.M);
    const int64_t nblocks = (P.K + KC - 1) / KC;
    const int64_t rows_per_task = 8 * Kn::MR;
    const int64_t ntasks_i = (P.M + rows_per_task - 1) / rows_per_task;
    const int64_t ntasks = nblocks * ntasks_i;
    for_tasks(ntasks, parallel && P.M * P.K > (1 << 16), [&](int64_t task) {
        const int64_t b = task / ntasks_i, i0 = task % ntasks_i * rows_per_task;
        const int64_t p0 = b * KC, kc = std::min(KC, P.K - p0);
        pack_a<Kn::MR>(P.A, i0, std::min(rows_per_task, P.M - i0), p0, kc, apack + b * KC * Mpad + i0 * kc);
    });
}

template <class Kn>
void run_problem(const Problem & P, bool parallel) {
    const int64_t Mpad = padded_rows<Kn>(P.M);
    const size_t apack_n = size_t(Mpad * ((P.K + KC - 1) / KC) * KC);
    // A serial call (inside another kernel's parallel loop) and a parallel one of up to kKeptApackBytes reuse
    // the calling thread's buffer (a fresh allocation of that size is a fresh mmap to fault in: see
    // bench/design-measurements.md); a larger one takes the node's kernel scratch (planned with the graph:
    // pack_scratch_bytes), so no thread keeps a buffer the size of a whole long-sequence activation alive.
    std::optional<Scratch> big;
    float * apack;
    if (parallel && apack_n * sizeof(float) > kKeptApackBytes) {
        big.emplace(apack_n * sizeof(float));
        apack = big->take<float>(apack_n);
    } else {
        apack = thread_scratch().apack.get(apack_n);
    }
    pack_all_a<Kn>(P, apack, parallel);

    // Tasks: column blocks of NC, and row blocks when columns alone do not keep every thread busy. The split
    // only decides who computes a tile, never how, so it may depend on the thread count.
    int nthreads = 1;
#ifdef _OPENMP
    if (parallel) nthreads = omp_get_max_threads();
#endif
    // A few rows (generation: one token per step) stream the whole of B once and do 2 flops per element: the
    // work is the bytes of B, not M x N x K. One micro-panel of columns per task then keeps every thread
    // streaming (a 768-column weight in blocks of 256 gave 2 threads 3 tasks; one panel measured fastest of
    // 1, 2 and 4 panels); B's rows are whole columns here (B.t), so a panel keeps dequantization on whole blocks.
    const bool few_rows = P.M <= 8 && P.B.t;
    constexpr int64_t NR = Kn::NV * Kn::W;
    int64_t nc_task = few_rows && nthreads > 1 ? NR : NC;
    // Too few column blocks for the threads: narrower blocks first (down to 2 micro-panels), since splitting
    // rows makes every row block pack (and read from memory) the same B block again. (On llama-20M's training
    // products, 2 threads, weights out of cache, it measured within noise of the row split: kept because it
    // never reads B twice.) Whole 256-column blocks stay where dequantization needs them (B.t false: a block
    // runs along the columns).
    const bool narrow_ok = P.B.t || P.B.type == TensorType::F32 || P.B.type == TensorType::BF16 || P.B.type == TensorType::F16;
    if (narrow_ok && nthreads > 1)
        while (nc_task > 2 * NR && (P.N + nc_task - 1) / nc_task < 4 * nthreads) nc_task /= 2;
    // The column tasks: whole micro-panels, split as evenly as they go into a multiple of the thread count (11
    // blocks of 128 columns gave one of 2 threads 6 and the other 5; bench/design-measurements.md).
    const int64_t panels = (P.N + NR - 1) / NR;
    int64_t nj = (P.N + nc_task - 1) / nc_task;
    const bool even = narrow_ok && nthreads > 1 && !few_rows;
    if (even) nj = std::min(panels, (nj + nthreads - 1) / nthreads * nthreads);
    auto column_start = [&](int64_t jb) {
        return even ? std::min(P.N, panels * jb / nj * NR) : std::min(P.N, jb * nc_task);
    };
    int64_t mt = P.M;
    if (nthreads > 1 && nj < 4 * nthreads) {
        const int64_t want_i = (4 * nthreads + nj - 1) / nj;
        mt = std::max<int64_t>(MC_MIN, (P.M + want_i - 1) / want_i);
        mt = (mt + Kn::MR - 1) / Kn::MR * Kn::MR;
    }
    const int64_t ni = (P.M + mt - 1) / mt;
    const int64_t ntasks = ni * nj;
    const double flops = double(P.M) * double(P.N) * double(P.K);
    const bool worth_threads = few_rows ? double(P.N) * double(P.K) > double(1 << 16) : flops > 2e6;
    for_tasks(ntasks, parallel && worth_threads, [&](int64_t task) {
        const int64_t jb = task / ni, ib = task % ni;
        const int64_t i0 = ib * mt, j0 = column_start(jb);
        run_tile<Kn>(P, apack, i0, std::min(mt, P.M - i0), j0, column_start(jb + 1) - j0);
    });
}

// What run_problem takes from the kernel scratch for an M x K left operand, whichever micro-kernel runs it.
size_t pack_scratch_bytes(int64_t M, int64_t K) {
    const int64_t Mpad = std::max(padded_rows<PortableKernel>(M), padded_rows<SimdKernel>(M));
    const size_t bytes = size_t(Mpad * ((K + KC - 1) / KC) * KC) * sizeof(float);
    return bytes > kKeptApackBytes ? scratch_round(bytes) : 0;
}

std::atomic<GemmBackend> g_backend{GemmBackend::Auto};

#ifdef RP_HAVE_BLAS
// f32 x f32 through OpenBLAS: one single-threaded call per fixed tile (rows: all, columns: NC), so each element
// comes out of the same call shape for any number of our threads.
void run_blas(const Problem & P, bool parallel) {
    static const bool once = [] {
        openblas_set_num_threads(1);
        return true;
    }();
    (void)once;
    const float * B = reinterpret_cast<const float *>(P.B.base);
    const int64_t ldb = int64_t(P.B.row_bytes / sizeof(float));
    const int64_t nj = (P.N + NC - 1) / NC;
    for_tasks(nj, parallel, [&](int64_t jb) {
        const int64_t j0 = jb * NC, nc = std::min(NC, P.N - j0);
        cblas_sgemm(CblasRowMajor, P.A.t ? CblasTrans : CblasNoTrans, P.B.t ? CblasTrans : CblasNoTrans,
                    int(P.M), int(nc), int(P.K), 1.0f, P.A.a, int(P.A.ld),
                    P.B.t ? B + j0 * ldb : B + j0, int(ldb), P.accumulate ? 1.0f : 0.0f, P.C + j0, int(P.ldc));
    });
}
#endif

void run(const Problem & P, bool parallel) {
    if (P.M <= 0 || P.N <= 0) return;
    if (P.K <= 0) {
        if (!P.accumulate)
            for (int64_t i = 0; i < P.M; ++i) std::memset(P.C + i * P.ldc, 0, sizeof(float) * size_t(P.N));
        return;
    }
    switch (g_backend.load(std::memory_order_relaxed)) {
    case GemmBackend::Portable: run_problem<PortableKernel>(P, parallel); return;
#if defined(RP_ONE_ROW)
    case GemmBackend::Auto:
    case GemmBackend::Simd:
        if (run_one_row(P, parallel)) return;
        if (run_int8(P, parallel)) return;
        if (run_few_columns(P, parallel)) return;
        run_problem<SimdKernel>(P, parallel);
        return;
#endif
    case GemmBackend::Blas:
#ifdef RP_HAVE_BLAS
        // cblas takes int sizes.
        if (P.B.type == TensorType::F32 &&
            std::max({P.M, P.N, P.K, P.A.ld, P.ldc, int64_t(P.B.row_bytes / sizeof(float))}) <= INT32_MAX) {
            run_blas(P, parallel);
            return;
        }
#endif
        [[fallthrough]];
    default: run_problem<SimdKernel>(P, parallel); return;
    }
}

// Checks a weight type and its row length; returns the row stride to use.
void check_weight(const char * fn, TensorType t, int64_t row_len, size_t row_bytes) {
    if (!can_dequantize(t))
        throw Error(std::string(fn) + ": weight type " + gguf::type_name(uint32_t(t)) + " is not supported");
    const gguf::TypeTraits * tt = gguf::type_traits(uint32_t(t));
    if (row_len % tt->block_size != 0)
        throw Error(std::string(fn) + ": a weight row of " + std::to_string(row_len) + " elements is not a multiple "
                    "of the " + tt->name + " block size " + std::to_string(tt->block_size));
    if (row_bytes < gguf::row_bytes(t, row_len))
        throw Error(std::string(fn) + ": weight row stride " + std::to_string(row_bytes) + " bytes is smaller than a " +
                    std::to_string(row_len) + "-element " + tt->name + " row");
    if (t == TensorType::F32 && row_bytes % sizeof(float) != 0)
        throw Error(std::string(fn) + ": f32 weight row stride " + std::to_string(row_bytes) +
                    " is not a multiple of 4 bytes");
}

} // namespace

void matmul_fwd(int64_t K, int64_t N, int64_t T, const void * W, TensorType wtype, size_t w_row_bytes,
                const float * X, int64_t x_col, float * Y, int64_t y_col, bool accumulate) {
    check_weight("matmul_fwd", wtype, K, w_row_bytes);
    // Y^T[t, n] = sum_k X^T[t, k] W[n, k]: A = X^T (k contiguous), B(p=k, j=n) = W row n.
    run({T, N, K, {X, x_col, false}, {static_cast<const char *>(W), w_row_bytes, wtype, true}, Y, y_col, accumulate},
        true);
}

void matmul_bwd_x(int64_t K, int64_t N, int64_t T, const void * W, TensorType wtype, size_t w_row_bytes,
                  const float * dY, int64_t dy_col, float * dX, int64_t dx_col, bool accumulate) {
    check_weight("matmul_bwd_x", wtype, K, w_row_bytes);
    // dX^T[t, k] = sum_n dY^T[t, n] W[n, k]: B(p=n, j=k) = W row n (k contiguous).
    run({T, K, N, {dY, dy_col, false}, {static_cast<const char *>(W), w_row_bytes, wtype, false}, dX, dx_col,
         accumulate},
        true);
}

void matmul_bwd_w(int64_t K, int64_t N, int64_t T, const float * X, int64_t x_col, const float * dY, int64_t dy_col,
                  float * dW, int64_t dw_row, bool accumulate) {
    // dW[n, k] = sum_t dY^T[t, n] X^T[t, k]: A(i=n, p=t) = dY[t*dy_col + n], B(p=t, j=k) = X[t*x_col + k].
    run({N, K, T, {dY, dy_col, true},
         {reinterpret_cast<const char *>(X), size_t(x_col) * sizeof(float), TensorType::F32, false}, dW, dw_row,
         accumulate},
        true);
}

// The left operands: matmul_fwd's X (T x K), matmul_bwd_x's dY (T x N), matmul_bwd_w's dY^T (N x T).
size_t matmul_fwd_scratch_bytes(int64_t K, int64_t N, int64_t T) { return pack_scratch_bytes(T, K); }
size_t matmul_bwd_x_scratch_bytes(int64_t K, int64_t N, int64_t T) { return pack_scratch_bytes(T, N); }
size_t matmul_bwd_w_scratch_bytes(int64_t K, int64_t N, int64_t T) { return pack_scratch_bytes(N, T); }

void gemm_f32_serial(int64_t M, int64_t N, int64_t K, const float * A, int64_t lda, bool a_t, const float * B,
                     int64_t ldb, bool b_t, float * C, int64_t ldc, bool accumulate) {
    run({M, N, K, {A, lda, a_t}, {reinterpret_cast<const char *>(B), size_t(ldb) * sizeof(float), TensorType::F32, b_t},
         C, ldc, accumulate},
        false);
}

void set_gemm_backend(GemmBackend b) { g_backend.store(b); }
GemmBackend gemm_backend() { return g_backend.load(); }

bool gemm_have_blas() {
#ifdef RP_HAVE_BLAS
    return true;
#else
    return false;
#endif
}

const char * gemm_backend_name(GemmBackend b) {
    switch (b) {
    case GemmBackend::Auto: return "auto";
    case GemmBackend::Simd: return "simd";
    case GemmBackend::Portable: return "portable";
    case GemmBackend::Blas: return "blas";
    }
    return "?";
}

const char * gemm_simd_name() { return SimdKernel::name; }

double gemm_micro_kernel_resident(int64_t calls) {
    constexpr int MR = SimdKernel::MR, NR = SimdKernel::NV * SimdKernel::W;
    GrowingBuffer a, b, c;
    float * ap = a.get(size_t(MR * KC));
    float * bp = b.get(size_t(KC * NR));
    float * cp = c.get(size_t(MR * NR));
    for (int64_t i = 0; i < MR * KC; ++i) ap[i] = 1.0f / float(1 + i % 7);
    for (int64_t i = 0; i < KC * NR; ++i) bp[i] = 1.0f / float(1 + i % 5);
    for (int64_t i = 0; i < MR * NR; ++i) cp[i] = 0.0f;
    for (int64_t i = 0; i < calls; ++i) micro_kernel<SimdKernel, MR>(KC, ap, bp, cp, NR, i > 0);
    volatile float keep = cp[0];   // the tile is used: the calls are not dead code
    (void)keep;
    return double(calls) * 2.0 * MR * NR * KC;
}

int gemm_one_row_lanes() {
#if defined(RP_ONE_ROW)
    return RP_ONE_ROW;
#else
    return 0;
#endif
}

bool openblas_matmul_fwd(int64_t K, int64_t N, int64_t T, const float * W, const float * X, float * Y, int threads) {
#ifdef RP_HAVE_BLAS
    openblas_set_num_threads(threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(N), int(K), 1.0f, X, int(K), W, int(K), 0.0f, Y,
                int(N));
    openblas_set_num_threads(1);   // back to what the Blas backend expects
    return true;
#else
    (void)K, (void)N, (void)T, (void)W, (void)X, (void)Y, (void)threads;
    return false;
#endif
}

int openblas_threads() {
#ifdef RP_HAVE_BLAS
    return openblas_get_num_threads();
#else
    return 0;
#endif
}

const char * openblas_core_name() {
#ifdef RP_HAVE_BLAS
    return openblas_get_corename();
#else
    return "";
#endif
}

} // namespace rp::cpu
