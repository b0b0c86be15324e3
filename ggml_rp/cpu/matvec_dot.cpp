// One-token dot products of weight rows with a prepared column (see matvec_dot.h for the numerics).
//
// Every row's sum is formed in one fixed order: per sub-block an exact int32 sum (int8 types) or per pair of
// elements a product pair (bf16) or an FMA (f32), accumulated into per-lane f32 accumulators in element order,
// the lanes added at the end in a fixed order; the int8 types' min / offset terms are accumulated separately
// (Q4_0 .. Q5_1: in 8 lanes, block b in lane b % 8) and subtracted last. The portable loops (CPUs without AVX2)
// have the same numerics in another float order.
//
// Two instruction sets, one order: the int8 products are summed exactly in int32 either by VNNI (AVX-512 VNNI or
// AVX-VNNI: vpdpbusd, 4 products a lane) or by AVX2 (vpmaddubsw pairs into int16, then vpmaddwd into int32: exact too,
// since every unsigned operand here is at most 128 and every signed one at most 127 in magnitude, so a pair is
// at most 2 * 128 * 127 = 32512 < 2^15); the float work after the int32 sums is the same 8-lane code, so both
// give the same bits. The f32 / f16 / bf16 dots keep 16 logical lanes: one zmm, or two ymm on AVX2.
#include "ggml_rp/cpu/matvec_dot.h"

#include "ggml_rp/cpu/simd_bytes.h"
#include "ggml_rp/core/quant_block.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define RP_INT8_SIMD 1
#define RP_INT8_VNNI 1
#elif defined(__AVX2__)
#define RP_INT8_SIMD 1
#endif
// BF16 rows (dot_bf16_n): vdpbf16ps on zmm, or its arithmetic by FMAs (RP_BF16_FMA) on zmm (AVX-512 CPUs without BF16:
// Skylake-X .. Ice Lake) or on ymm (AVX2).
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define RP_BF16_SIMD 512
#define RP_BF16_DPBF16 1
#elif defined(__AVX512F__)
#define RP_BF16_SIMD 512
#define RP_BF16_FMA 1
#elif defined(__AVX2__) && defined(__FMA__)
#define RP_BF16_SIMD 256
#define RP_BF16_FMA 1
#endif
#if defined(__AVX512F__)
#define RP_FLOAT_SIMD 512
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define RP_FLOAT_SIMD 256
#endif
#if defined(__AVX__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace rp::cpu {

using gguf::TensorType;

namespace {

std::atomic<bool> g_row_dots{false};

inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);   // exact, as fp16_to_fp32
#else
    return fp16_to_fp32(h);
#endif
}

// The weight stream is read once and decoded slower than memory delivers it. Where the hardware prefetchers
// (which stop at 4 KiB pages and run a short distance ahead) leave the lines arriving late, every kernel asks for
// the lines row_prefetch_bytes() past the block it decodes, one request per line as the decoding proceeds; a
// prefetch past the matrix's end is a harmless hint. The lines go to L2, not L1 (prefetcht1): a request for L1 holds
// one of the core's few L1 miss buffers until its line arrives, and with 16 KiB in flight those, not the memory, cap
// the stream (and the lines would evict the column the dot rereads). The distance is chosen by vendor
// (set_row_prefetch_bytes overrides it; the measurements: bench/design-measurements.md).
std::atomic<int64_t> g_prefetch{-1};  // -1: the vendor's default

int64_t default_prefetch_bytes() {
#if defined(__x86_64__) || defined(__i386__)
    static const int64_t bytes = __builtin_cpu_is("amd") ? 0 : 16384;
    return bytes;
#else
    return 0;
#endif
}

inline int64_t prefetch_distance() {
    const int64_t b = g_prefetch.load(std::memory_order_relaxed);
    return b >= 0 ? b : default_prefetch_bytes();
}

inline void prefetch_ahead(const void * p, size_t bytes, int64_t ahead) {
    if (ahead <= 0) return;
    const char * c = static_cast<const char *>(p) + ahead;
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 2);  // locality 2: prefetcht1, into L2
}

#if defined(__F16C__)
// The fp16 field F (a scale d, a min m) of 8 consecutive blocks as 8 floats: one conversion for all.
template <class Block, uint16_t Block::*F>
inline __m256 halves8(const Block * k) {
    return _mm256_cvtph_ps(_mm_setr_epi16(short(k[0].*F), short(k[1].*F), short(k[2].*F), short(k[3].*F), short(k[4].*F),
                                          short(k[5].*F), short(k[6].*F), short(k[7].*F)));
}
#endif

#if defined(__AVX__)
// The 8 lanes added in a fixed order.
inline float hsum(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#endif

#if defined(RP_INT8_SIMD)
using namespace simd;
// Per int32 lane the exact sum of its 4 products u_i s_i (u unsigned <= 128, s signed; see the top of the file).
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(RP_INT8_VNNI)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
// Exact int32 sums of 4 product vectors (32 elements each, lanes 0..3 its first 16, lanes 4..7 its last 16):
// [p0 first 16, p1 first 16, p2 first 16, p3 first 16 | p0 last 16, p1 last 16, p2 last 16, p3 last 16].
inline __m256i sums_of_halves(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
}
// Exact int32 sums of 8 product vectors: lane j = the sum of p[j]'s 8 lanes.
inline __m256i sums_of_8(const __m256i p[8]) {
    const __m256i a = sums_of_halves(p[0], p[1], p[2], p[3]), b = sums_of_halves(p[4], p[5], p[6], p[7]);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}
// The order sums_of_halves leaves 8 sub-blocks of 16 in: 0, 2, 4, 6 | 1, 3, 5, 7.
inline __m256i evens_then_odds(__m256i v) { return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)); }
// The exact sums of 8 sub-blocks of 16 (sums_of_halves' order: half a super-block) times the weight scales in that
// order (dscf) and their column blocks' activation scales d_b (xd: the half's 4 blocks, each for 2 lanes), into acc.
inline __m256 fma_scaled(__m256i sums, const float * xd, __m256 dscf, __m256 acc) {
    const __m256 scale = _mm256_mul_ps(dscf, _mm256_broadcast_ps(reinterpret_cast<const __m128 *>(xd)));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc);
}
// Four 32-element groups of one column (its int8 quants at xq, the groups 32 apart; their activation scales d_b at
// xd) times the unsigned quants u: their 8 sub-blocks of 16's exact sums (sums_of_halves' order), times the weight
// scales in that order (dscf) and d_b, added into acc. (Q2_K / Q3_K and Q6_K: half a super-block.)
inline __m256 fma_four_groups(const __m256i u[4], const int8_t * xq, const float * xd, __m256 dscf, __m256 acc) {
    __m256i p[4];
    for (int k = 0; k < 4; ++k) p[k] = dot_u8s8(u[k], load256(xq + 32 * k));
    return fma_scaled(sums_of_halves(p[0], p[1], p[2], p[3]), xd, dscf, acc);
}
// dot_u8s8 added into acc.
inline __m256i dot_u8s8_add(__m256i acc, __m256i u, __m256i s) {
#if defined(RP_INT8_VNNI)
    return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, dot_u8s8(u, s));
#endif
}
// The same 8 exact sums as sums_of_halves of half h's four groups' products, from the groups' quants transposed
// (transpose4x4_halves of u) and the column's qt of the super-block (DotColumn::qt): lane j accumulates its
// sub-block over four multiply-adds, with no horizontal sums. (Several columns: the transpose is paid once for all.)
inline __m256i sums_transposed(const __m256i w[4], const int8_t * xqt, int h) {
    xqt += 32 * h;
    const __m256i s01 = dot_u8s8_add(dot_u8s8(w[0], load256(xqt)), w[1], load256(xqt + 64));   // (two chains: half the latency)
    const __m256i s23 = dot_u8s8_add(dot_u8s8(w[2], load256(xqt + 128)), w[3], load256(xqt + 192));
    return _mm256_add_epi32(s01, s23);
}
// Whether the K-quant row dots of N columns at once transpose the decoded weights (sums_transposed) rather than
// sum each column's products horizontally (sums_of_halves): the transpose costs 8 shuffles a half super-block, once;
// the horizontal sums 3 hadds (6 shuffles) a half, per column. One column keeps the horizontal sums (the same
// speed); 2 to 8 gain (bench/design-measurements.md).
template <int N>
constexpr bool kTransposeKQuants = N >= 2;
#endif

// Q4_0, Q4_1, Q5_0, Q5_1: blocks of 32, element j in the low nibble of qs[j] (j < 16) or the high nibble of
// qs[j - 16], Q5's fifth bit j in qh. w = d (q - 8) / d (q - 16) or w = d q + m, so per block
// y = d d_b (sum q q') - offset d (d_b sum q')  or  d d_b (sum q q') + m (d_b sum q').
// The portable loop (CPUs without AVX2).
template <class Block, bool FIVE_BITS, bool HAS_MIN>
[[maybe_unused]] float dot_q45_small_portable(const Block * w, const DotColumn & x) {
    [[maybe_unused]] const int64_t ahead = prefetch_distance();
    const int64_t nb = x.K / 32;
    constexpr float offset = HAS_MIN ? 0.0f : (FIVE_BITS ? 16.0f : 8.0f);
    float extra = 0.0f, acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
        const Block & blk = w[b];
        if (b % 4 == 0) prefetch_ahead(w + b, 4 * sizeof(Block), ahead);
        const float d = half_to_float(blk.d), dx = x.d[size_t(b)];
        const float xsum = x.dsum16[size_t(2 * b)] + x.dsum16[size_t(2 * b + 1)];
        if constexpr (HAS_MIN) extra += half_to_float(blk.m) * xsum;
        else extra -= offset * d * xsum;
        uint32_t qh = 0;
        if constexpr (FIVE_BITS) qh = load_le32(blk.qh);
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) {
            int q = j < 16 ? (blk.qs[j] & 0xF) : (blk.qs[j - 16] >> 4);
            if constexpr (FIVE_BITS) q |= int((qh >> j) & 1u) << 4;
            s += q * x.q[size_t(32 * b + j)];
        }
        acc += float(s) * (d * dx);
    }
    return acc + extra;
}

// The row dots of the integer types below, through dot_mxfp4_n. (GCC 12 warns of the 512-bit intrinsics' own undefined
// upper halves, _mm512_undefined_*, once inlined: a false positive of its headers.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#if defined(RP_INT8_VNNI) && defined(__AVX512F__)
// signed_block on blocks b (even) and b + 1 at once: their 64 weights in one register wq = [b | b + 1], one product
// instruction per column, the int32 lane sums (block b's in lanes 0-7, b + 1's in 8-15: signed_block's exact sums)
// times scale(c) ([b's d_w d_x x 8 | b + 1's x 8]) into acc01[c] = [acc0 | acc1]: each lane the same FMA chain as
// signed_block's, so the same bits, with half the instructions (the x s8 sign applied by a masked negation; where w
// is 0 the product is 0 either way).
template <int N, class Scale>
inline void signed_pair(__m512i wq, int64_t b, const DotColumn * const * xs, Scale scale, __m512 * acc01) {
    const __m512i wa = _mm512_abs_epi8(wq);
    const __mmask64 negative = _mm512_movepi8_mask(wq);
    for (int c = 0; c < N; ++c) {
        const __m512i x = _mm512_loadu_si512(xs[c]->q.data() + 32 * b);
        const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wa, _mm512_mask_sub_epi8(x, negative, _mm512_setzero_si512(), x));
        acc01[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale(c), acc01[c]);
    }
}

// Whether N columns go through signed_pair: 2 to 8 gain; one does not (the 512-bit shuffles and products share two
// ports, and one column's row is read at the stream's speed already). Measured: bench/design-measurements.md.
template <int N>
constexpr bool kPairs = N >= 2;

// The even and odd blocks' chains, kept in pairs as [acc0 | acc1], go on in the 256-bit accumulators.
template <int N>
inline void split_pairs(const __m512 * acc01, __m256 * acc0, __m256 * acc1) {
    for (int c = 0; c < N; ++c) {
        acc0[c] = _mm512_castps512_ps256(acc01[c]);
        acc1[c] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc01[c]), 1));
    }
}

// [block j's of the 8 in sc x 8 | block j + 1's x 8]
inline __m512 pair_scales(__m256 sc, int j) {
    const __m512i idx = _mm512_set_epi32(j + 1, j + 1, j + 1, j + 1, j + 1, j + 1, j + 1, j + 1, j, j, j, j, j, j, j, j);
    return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(sc));
}
#endif

// SIMD, for N columns at once (one, or a decode step's sequences; N a compile-time count): each block's unsigned
// quants (and 8 blocks' scales and mins) decoded once. Per column, block b's exact sum times its scale d d_b, even
// blocks into acc0, odd ones into acc1; the offset (or min) terms in 8 lanes (block b in lane b % 8; one running
// scalar sum would chain every block behind the last), the tail's in a scalar. Every column has its own
// accumulators and the same operations in the same order, so its bits are the same whatever N.
// Whether Q4_0 .. Q5_1 row dots of N columns take blocks in 512-bit pairs (with AVX-512 VNNI): from 2 columns; one
// column is quicker in 256-bit blocks (bench/design-measurements.md).
template <int N>
constexpr bool kSmallPairs = N >= 2;

template <int N, class Block, bool FIVE_BITS, bool HAS_MIN>
void dot_q45_small_n(const Block * w, const DotColumn * const * xs, float * out) {
#if defined(RP_INT8_SIMD)
    [[maybe_unused]] const int64_t ahead = prefetch_distance();
    const int64_t nb = xs[0]->K / 32;
    constexpr float offset = HAS_MIN ? 0.0f : (FIVE_BITS ? 16.0f : 8.0f);
    float extra[N];  // the offset or min terms
    __m256 acc0[N], acc1[N];
    for (int c = 0; c < N; ++c) {
        extra[c] = 0.0f;
        acc0[c] = acc1[c] = _mm256_setzero_ps();
    }
    // scale(c) gives block b's d d_b of column c
    auto block = [&](int64_t b, auto scale) {
        const Block & blk = w[b];
        // [qs | qs] >> [0 | 4]: the low nibbles, then the high ones (no cross-lane insert)
        const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(blk.qs)));
        __m256i v = _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
        if constexpr (FIVE_BITS) v = _mm256_or_si256(v, bit_bytes(load_le32(blk.qh), 0x10));
        for (int c = 0; c < N; ++c) {
            const __m256i s = dot_u8s8(v, load256(xs[c]->q.data() + 32 * b));
            if (b % 2 == 0) acc0[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale(c), acc0[c]);
            else acc1[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale(c), acc1[c]);
        }
    };
    int64_t b0 = 0;
#if defined(__F16C__)
#if defined(RP_INT8_VNNI) && defined(__AVX512F__)
    // With 512-bit registers, blocks b (even) and b + 1 at once: their quants in one register [b's 32 | b + 1's
    // 32], one product instruction per column, and per column one accumulator [acc0 | acc1]: each lane the same
    // exact int32 sum and the same FMA chain as the 256-bit code, so the same bits.
    __m512 acc01[N];
    for (int c = 0; c < N; ++c) acc01[c] = _mm512_setzero_ps();
    auto pair = [&](int64_t b, auto scale) {  // scale(c): [block b's d d_b x 8 | block b + 1's x 8] of column c
        const __m256i q = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i *>(w[b + 1].qs)),
                                           _mm_loadu_si128(reinterpret_cast<const __m128i *>(w[b].qs)));
        // [q | q] >> [0 | 4] per 16-bit lane, low nibbles: [lo b, lo b+1, hi b, hi b+1]; then each block's 32
        // elements in order: [lo b, hi b, lo b+1, hi b+1]
        const __m512i shift = _mm512_set_epi64(0x0004000400040004, 0x0004000400040004, 0x0004000400040004, 0x0004000400040004, 0, 0, 0, 0);
        const __m512i both = _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i64x4(q), shift), _mm512_set1_epi8(0x0F));
        __m512i v = _mm512_shuffle_i64x2(both, both, _MM_SHUFFLE(3, 1, 2, 0));
        if constexpr (FIVE_BITS) {  // the fifth bits: byte j of the 64 = 0x10 where bit j of [qh b | qh b+1] is set
            const __mmask64 bits5 = _cvtu64_mask64(uint64_t(load_le32(w[b].qh)) | uint64_t(load_le32(w[b + 1].qh)) << 32);
            v = _mm512_or_si512(v, _mm512_maskz_mov_epi8(bits5, _mm512_set1_epi8(0x10)));
        }
        for (int c = 0; c < N; ++c) {
            const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, _mm512_loadu_si512(xs[c]->q.data() + 32 * b));
            acc01[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale(c), acc01[c]);
        }
    };
#endif
    // 8 blocks at a time: their 8 scales in one conversion and one product per column.
    __m256 extra8[N];
    for (int c = 0; c < N; ++c) extra8[c] = _mm256_setzero_ps();
    for (; b0 + 8 <= nb; b0 += 8) {
        const Block * k = w + b0;
        prefetch_ahead(k, 8 * sizeof(Block), ahead);
        const __m256 d8 = halves8<Block, &Block::d>(k);
        __m256 m8 = _mm256_setzero_ps();
        if constexpr (HAS_MIN) m8 = halves8<Block, &Block::m>(k);
        __m256 sc[N];
        for (int c = 0; c < N; ++c) {
            const __m256 xsum8 = _mm256_loadu_ps(xs[c]->dsum32.data() + b0);
            if constexpr (HAS_MIN) extra8[c] = _mm256_add_ps(extra8[c], _mm256_mul_ps(m8, xsum8));
            else extra8[c] = _mm256_sub_ps(extra8[c], _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(offset), d8), xsum8));
            sc[c] = _mm256_mul_ps(d8, _mm256_loadu_ps(xs[c]->d.data() + b0));
        }
#if defined(RP_INT8_VNNI) && defined(__AVX512F__)
        if constexpr (kSmallPairs<N>) {
            for (int j = 0; j < 8; j += 2) pair(b0 + j, [&](int c) { return pair_scales(sc[c], j); });
            continue;
        }
#endif
        for (int j = 0; j < 8; ++j) block(b0 + j, [&](int c) { return _mm256_permutevar8x32_ps(sc[c], _mm256_set1_epi32(j)); });
    }
    for (int c = 0; c < N; ++c) extra[c] = hsum(extra8[c]);
#if defined(RP_INT8_VNNI) && defined(__AVX512F__)
    if constexpr (kSmallPairs<N>) split_pairs<N>(acc01, acc0, acc1);
#endif
#endif
    for (int64_t b = b0; b < nb; ++b) {
        const Block & blk = w[b];
        const float d = half_to_float(blk.d);
        for (int c = 0; c < N; ++c) {
            const DotColumn & x = *xs[c];
            const float xsum = x.dsum16[size_t(2 * b)] + x.dsum16[size_t(2 * b + 1)];
            if constexpr (HAS_MIN) extra[c] += half_to_float(blk.m) * xsum;
            else extra[c] -= offset * d * xsum;
        }
        block(b, [&](int c) { return _mm256_set1_ps(d * xs[c]->d[size_t(b)]); });
    }
    for (int c = 0; c < N; ++c) out[c] = hsum(_mm256_add_ps(acc0[c], acc1[c])) + extra[c];
#else
    for (int c = 0; c < N; ++c) out[c] = dot_q45_small_portable<Block, FIVE_BITS, HAS_MIN>(w, *xs[c]);
#endif
}

template <class Block, bool FIVE_BITS, bool HAS_MIN>
struct Q45Small {
    template <int N>
    struct Cols {
        static void run(const Block * w, const DotColumn * const * xs, float * out) { dot_q45_small_n<N, Block, FIVE_BITS, HAS_MIN>(w, xs, out); }
    };
};

template <class Block, bool FIVE_BITS, bool HAS_MIN>
float dot_q45_small(const Block * w, const DotColumn & x) {
    const DotColumn * xs[1] = {&x};
    float out;
    dot_q45_small_n<1, Block, FIVE_BITS, HAS_MIN>(w, xs, &out);
    return out;
}

// The portable loop (CPUs without AVX2).
[[maybe_unused]] float dot_q8_0_portable(const block_q8_0 * w, const DotColumn & x) {
    const int64_t nb = x.K / QK8_0;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
        int32_t s = 0;
        for (int i = 0; i < QK8_0; ++i) s += int32_t(w[b].qs[i]) * x.q[size_t(32 * b + i)];
        acc += float(s) * (half_to_float(w[b].d) * x.d[size_t(b)]);
    }
    return acc;
}

#if defined(RP_INT8_SIMD)
// Block b's 32 signed int8 weights wq times each of N columns' int8 values: |w| times x with w's sign (the exact
// products, in the u8 x s8 form VNNI multiplies), the lanes' int32 sums times scale(c) (block b's d_w d_x of column
// c), added into acc0[c] (even blocks) or acc1[c] (odd ones). Q8_0's step (and MXFP4's for many columns).
template <int N, class Scale>
inline void signed_block(__m256i wq, int64_t b, const DotColumn * const * xs, Scale scale, __m256 * acc0, __m256 * acc1) {
    const __m256i wa = _mm256_abs_epi8(wq);
    for (int c = 0; c < N; ++c) {
        const __m256i s = dot_u8s8(wa, _mm256_sign_epi8(load256(xs[c]->q.data() + 32 * b), wq));
        __m256 & acc = b % 2 == 0 ? acc0[c] : acc1[c];
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale(c), acc);
    }
}
#endif

// SIMD, for N columns at once (one, or a decode step's sequences; N a compile-time count): a block's product is |w|
// (unsigned, formed once) times each column's x with w's sign (the exact products, in the u8 x s8 form VNNI
// multiplies), scaled; even blocks into acc0, odd ones into acc1, per column. Every column has its own accumulators
// and the same operations in the same order, so its bits are the same whatever N.
template <int N>
void dot_q8_0_n(const block_q8_0 * w, const DotColumn * const * xs, float * out) {
#if defined(RP_INT8_SIMD)
    [[maybe_unused]] const int64_t ahead = prefetch_distance();
    const int64_t nb = xs[0]->K / QK8_0;
    __m256 acc0[N], acc1[N];
    for (int c = 0; c < N; ++c) acc0[c] = acc1[c] = _mm256_setzero_ps();
    // scale(c) gives block b's d_w d_x of column c
    auto block = [&](int64_t b, auto scale) { signed_block<N>(load256(w[b].qs), b, xs, scale, acc0, acc1); };
    int64_t b = 0;
#if defined(__F16C__)
#if defined(RP_INT8_VNNI) && defined(__AVX512F__)
    __m512 acc01[N];  // [acc0 | acc1]: blocks in pairs (signed_pair)
    for (int c = 0; c < N; ++c) acc01[c] = _mm512_setzero_ps();
#endif
    // 8 blocks at a time: their 8 scales d_w d_x in one conversion and one product (the same bits as one by one).
    for (; b + 8 <= nb; b += 8) {
        prefetch_ahead(w + b, 8 * sizeof(block_q8_0), ahead);
        const __m256 dw = halves8<block_q8_0, &block_q8_0::d>(w + b);
        __m256 sc[N];
        for (int c = 0; c < N; ++c) sc[c] = _mm256_mul_ps(dw, _mm256_loadu_ps(xs[c]->d.data() + b));
#if defined(RP_INT8_VNNI) && defined(__AVX512F__)
        if constexpr (kPairs<N>) {
            for (int j = 0; j < 8; j += 2) {
                const __m512i wq = _mm512_inserti64x4(_mm512_castsi256_si512(load256(w[b + j].qs)), load256(w[b + j + 1].qs), 1);
                signed_pair<N>(wq, b + j, xs, [&](int c) { return pair_scales(sc[c], j); }, acc01);
            }
            continue;
        }
#endif
        for (int j = 0; j < 8; ++j) block(b + j, [&](int c) { return _mm256_permutevar8x32_ps(sc[c], _mm256_set1_epi32(j)); });
    }
#if defined(RP_INT8_VNNI) && defined(__AVX512F__)
    if constexpr (kPairs<N>) split_pairs<N>(acc01, acc0, acc1);
#endif
#endif
    for (; b < nb; ++b) {
        const float dw = half_to_float(w[b].d);
        block(b, [&](int c) { return _mm256_set1_ps(dw * xs[c]->d[size_t(b)]); });
    }
    for (int c = 0; c < N; ++c) out[c] = hsum(_mm256_add_ps(acc0[c], acc1[c]));
#else
    for (int c = 0; c < N; ++c) out[c] = dot_q8_0_portable(w, *xs[c]);
#endif
}

// MXFP4 (gpt-oss's experts): blocks of 32 E2M1 codes, ggml's doubled values v (0 1 2 3 4 6 8 12, the sign in bit 3;
// element j in qs[j]'s low nibble, j + 16 in its high one) times the power of two d = 2^(e - 128); per block
// y = d d_b (sum v q'), the integer sum exact (|v q'| <= 12 x 127). The portable loop.
[[maybe_unused]] float dot_mxfp4_portable(const block_mxfp4 * w, const DotColumn & x) {
    const int64_t nb = x.K / QK_MXFP4;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
        int32_t s = 0;
        for (int j = 0; j < QK_MXFP4 / 2; ++j)
            s += mxfp4_value(w[b].qs[j] & 0xF) * x.q[size_t(32 * b + j)] + mxfp4_value(w[b].qs[j] >> 4) * x.q[size_t(32 * b + 16 + j)];
        acc += float(s) * (e8m0_to_fp32_half(w[b].e) * x.d[size_t(b)]);
    }
    return acc;
}

// Whether the MXFP4 row dots of N columns take the codes' values offset by 12 and the columns' bias12 (one product
// instruction a block and column) rather than the signed values (Q8_0's sign work a block and column): up to 4 columns
// gain; with more, their int8 values and biases (2 K bytes each) no longer fit L1 next to each other
// (bench/design-measurements.md).
template <int N>
constexpr bool kMxBias = N <= 4;

// SIMD, N columns at once: a block's 32 codes become their values by one table lookup (the low nibbles the first 16
// bytes, the high ones the last 16: x's order), with kMxBias offset by 12 (unsigned) and the lanes' products started
// from the column's bias12, else signed and multiplied as Q8_0's; both give the exact signed sums. Then Q8_0's scaling
// and accumulators (even blocks into acc0, odd into acc1, per column; the same bits whatever N).
template <int N>
void dot_mxfp4_n(const block_mxfp4 * w, const DotColumn * const * xs, float * out) {
#if defined(RP_INT8_SIMD)
    [[maybe_unused]] const int64_t ahead = prefetch_distance();
    const int64_t nb = xs[0]->K / QK_MXFP4;
    const __m256i values = kMxBias<N> ? _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16, 18,
                                                         20, 24, 12, 11, 10, 9, 8, 6, 4, 0)
                                      : _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3, 4, 6, 8,
                                                         12, 0, -1, -2, -3, -4, -6, -8, -12);
    __m256 acc0[N], acc1[N];
    for (int c = 0; c < N; ++c) acc0[c] = acc1[c] = _mm256_setzero_ps();
    auto codes_of = [&](int64_t b) {   // [qs | qs] >> [0 | 4]: the low nibbles, then the high ones
        const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(w[b].qs)));
        return _mm256_shuffle_epi8(values, _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F)));
    };
    // block b's codes times each column, scaled by scale(c), into acc0[c] (b even) or acc1[c]
    auto block = [&](int64_t b, auto scale) {
        if constexpr (!kMxBias<N>) return signed_block<N>(codes_of(b), b, xs, scale, acc0, acc1);
        const __m256i v = codes_of(b);
        for (int c = 0; c < N; ++c) {
            const DotColumn & x = *xs[c];
            const __m256i s = dot_u8s8_add(load256(x.bias12.data() + 8 * b), v, load256(x.q.data() + 32 * b));
            __m256 & acc = b % 2 == 0 ? acc0[c] : acc1[c];
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale(c), acc);
        }
    };
    int64_t b = 0;
#if defined(RP_INT8_VNNI) && defined(__AVX512F__)
    __m512 acc01[N];  // [acc0 | acc1]: blocks in pairs, as signed_pair
    for (int c = 0; c < N; ++c) acc01[c] = _mm512_setzero_ps();
    const __m512i values2 = _mm512_broadcast_i64x4(values);
    auto codes_of_pair = [&](int64_t even) {  // [codes_of(even) | codes_of(even + 1)], one table lookup
        const __m256i q = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i *>(w[even + 1].qs)),
                                           _mm_loadu_si128(reinterpret_cast<const __m128i *>(w[even].qs)));
        const __m256i nibble2 = _mm256_set1_epi8(0x0F);
        const __m512i lh = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(q, nibble2)),
                                              _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble2), 1);  // [lo b, lo b+1, hi b, hi b+1]
        return _mm512_shuffle_epi8(values2, _mm512_shuffle_i64x2(lh, lh, _MM_SHUFFLE(3, 1, 2, 0)));
    };
    // blocks even, even + 1 times each column, scaled by scale(c) ([even's x 8 | even + 1's x 8]), into acc01[c]
    auto pair = [&](int64_t even, auto scale) {
        if constexpr (!kMxBias<N>) return signed_pair<N>(codes_of_pair(even), even, xs, scale, acc01);
        const __m512i v = codes_of_pair(even);
        for (int c = 0; c < N; ++c) {
            const DotColumn & x = *xs[c];
            const __m512i s = _mm512_dpbusd_epi32(_mm512_loadu_si512(x.bias12.data() + 8 * even), v, _mm512_loadu_si512(x.q.data() + 32 * even));
            acc01[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale(c), acc01[c]);
        }
    };
#endif
    // 8 blocks at a time: their 8 scales 2^(e - 128) made together (e8m0_to_fp32_half's bits, e < 2 as its
    // subnormals) and times the columns' in one product (the same bits as one by one).
    for (; b + 8 <= nb; b += 8) {
        prefetch_ahead(w + b, 8 * sizeof(block_mxfp4), ahead);
        const __m256i e = _mm256_setr_epi32(w[b].e, w[b + 1].e, w[b + 2].e, w[b + 3].e, w[b + 4].e, w[b + 5].e, w[b + 6].e, w[b + 7].e);
        const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
        const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
        const __m256 dw = _mm256_castsi256_ps(_mm256_blendv_epi8(subnormal, normal, _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1))));
        __m256 sc[N];
        for (int c = 0; c < N; ++c) sc[c] = _mm256_mul_ps(dw, _mm256_loadu_ps(xs[c]->d.data() + b));
#if defined(RP_INT8_VNNI) && defined(__AVX512F__)
        if constexpr (kPairs<N>) {
            for (int j = 0; j < 8; j += 2) pair(b + j, [&](int c) { return pair_scales(sc[c], j); });
            continue;
        }
#endif
        for (int j = 0; j < 8; ++j) block(b + j, [&](int c) { return _mm256_permutevar8x32_ps(sc[c], _mm256_set1_epi32(j)); });
    }
#if defined(RP_INT8_VNNI) && defined(__AVX512F__)
    if constexpr (kPairs<N>) split_pairs<N>(acc01, acc0, acc1);
#endif
    for (; b < nb; ++b) {
        const float dw = e8m0_to_fp32_half(w[b].e);
        block(b, [&](int c) { return _mm256_set1_ps(dw * xs[c]->d[size_t(b)]); });
    }
    for (int c = 0; c < N; ++c) out[c] = hsum(_mm256_add_ps(acc0[c], acc1[c]));
#else
    for (int c = 0; c < N; ++c) out[c] = dot_mxfp4_portable(w, *xs[c]);
#endif
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

template <int N>
struct MxCols {
    static void run(const block_mxfp4 * w, const DotColumn * const * xs, float * out) { dot_mxfp4_n<N>(w, xs, out); }
};

float dot_q8_0(const block_q8_0 * w, const DotColumn & x) {
    const DotColumn * xs[1] = {&x};
    float out;
    dot_q8_0_n<1>(w, xs, &out);
    return out;
}

// Q4_K and Q5_K: per super-block of 256, sub-blocks j = 0..7 of 32 with w = (d*sc_j) q - (dmin*m_j). The portable
// loop (CPUs without AVX2):
template <bool FIVE_BITS, class Block>
float dot_q45_K_portable(const Block * w, const DotColumn & x) {
    [[maybe_unused]] const int64_t ahead = prefetch_distance();
    const int64_t nsb = x.K / QK_K;
    float acc = 0.0f, mins = 0.0f;
    for (int64_t s = 0; s < nsb; ++s) {
        const Block & b = w[s];
        prefetch_ahead(&b, sizeof(Block), ahead);
        const float d = half_to_float(b.d), dmin = half_to_float(b.dmin);
        const int8_t * xq = x.q.data() + QK_K * s;
        const float * xd = x.d.data() + 8 * s;
        const float * xs = x.dsum16.data() + 16 * s;
        for (int c = 0; c < 4; ++c) {
            int sc_a, m_a, sc_b, m_b;
            k4_scale_min(2 * c, b.scales, sc_a, m_a);
            k4_scale_min(2 * c + 1, b.scales, sc_b, m_b);
            mins += dmin * float(m_a) * (xs[4 * c] + xs[4 * c + 1]) + dmin * float(m_b) * (xs[4 * c + 2] + xs[4 * c + 3]);
            int32_t sa = 0, sb = 0;
            for (int l = 0; l < 32; ++l) {
                int qa = b.qs[32 * c + l] & 0xF, qb = b.qs[32 * c + l] >> 4;
                if constexpr (FIVE_BITS) {
                    qa |= ((b.qh[l] >> (2 * c)) & 1) << 4;
                    qb |= ((b.qh[l] >> (2 * c + 1)) & 1) << 4;
                }
                sa += qa * xq[64 * c + l];
                sb += qb * xq[64 * c + 32 + l];
            }
            acc += float(sa) * (d * float(sc_a) * xd[2 * c]) + float(sb) * (d * float(sc_b) * xd[2 * c + 1]);
        }
    }
    return acc - mins;
}

// SIMD, for n columns at once (one, or a decode step's sequences): each super-block's quants and scales decoded once;
// per column the 8 sub-blocks' exact int32 sums side by side in one vector, times their 8 scales (d sc_j) d_b, into
// one 8-lane accumulator, the mins likewise (8 lanes of (dmin m_j) (d_b sum q')). Every column has its own
// accumulators and the same operations in the same order, so its bits are the same whatever n.
// (N a compile-time count: one column compiles to the single-column loop, registers and all.)
template <int N, bool FIVE_BITS, class Block>
void dot_q45_K_n(const Block * w, const DotColumn * const * xs, float * out) {
#if defined(RP_INT8_SIMD)
    [[maybe_unused]] const int64_t ahead = prefetch_distance();
    const int64_t nsb = xs[0]->K / QK_K;
    constexpr int n = N;
    __m256 acc[N], mins[N];
    for (int c = 0; c < n; ++c) acc[c] = mins[c] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; ++s) {
        const Block & b = w[s];
        prefetch_ahead(&b, sizeof(Block), ahead);
        uint32_t sc[2], m[2];
        k4_scales_mins_packed(b.scales, sc, m);
        const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(uint64_t(sc[1]) << 32 | sc[0]))));
        const __m256 mf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(uint64_t(m[1]) << 32 | m[0]))));
        const __m256 dsc = _mm256_mul_ps(_mm256_set1_ps(half_to_float(b.d)), scf);
        const __m256 dmf = _mm256_mul_ps(_mm256_set1_ps(half_to_float(b.dmin)), mf);
        __m256i qh = _mm256_setzero_si256();
        if constexpr (FIVE_BITS) qh = load256(b.qh);
        __m256i u[8];  // the 8 sub-blocks' unsigned quants
        for (int c = 0; c < 4; ++c) {
            const __m256i q = load256(b.qs + 32 * c);
            u[2 * c] = low4(q);
            u[2 * c + 1] = high4(q);
            if constexpr (FIVE_BITS) {
                u[2 * c] = _mm256_or_si256(u[2 * c], bits(qh, 2 * c, 1, 4));
                u[2 * c + 1] = _mm256_or_si256(u[2 * c + 1], bits(qh, 2 * c + 1, 1, 4));
            }
        }
        __m256i ut[2][4];   // (kTransposeKQuants: the two halves' groups transposed)
        if constexpr (kTransposeKQuants<N>) {
            transpose4x4_halves(u, ut[0]);
            transpose4x4_halves(u + 4, ut[1]);
        }
#pragma GCC unroll 8
        for (int col = 0; col < n; ++col) {
            const DotColumn & x = *xs[col];
            __m256i sums;   // lane j: sub-block j's exact sum
            if constexpr (kTransposeKQuants<N>) {
                // each half's lanes: its groups' first 16 | last 16; the halves' 128-bit halves added pairwise
                const int8_t * xqt = x.qt.data() + QK_K * s;
                const __m256i s0 = sums_transposed(ut[0], xqt, 0), s1 = sums_transposed(ut[1], xqt, 1);
                sums = _mm256_add_epi32(_mm256_permute2x128_si256(s0, s1, 0x20), _mm256_permute2x128_si256(s0, s1, 0x31));
            } else {
                const int8_t * xq = x.q.data() + QK_K * s;
                __m256i p[8];
                for (int j = 0; j < 8; ++j) p[j] = dot_u8s8(u[j], load256(xq + 32 * j));
                sums = sums_of_8(p);
            }
            acc[col] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dsc, _mm256_loadu_ps(x.d.data() + 8 * s)), acc[col]);
            mins[col] = _mm256_fmadd_ps(dmf, _mm256_loadu_ps(x.dsum32.data() + 8 * s), mins[col]);
        }
    }
    for (int c = 0; c < n; ++c) out[c] = hsum(acc[c]) - hsum(mins[c]);
#else
    for (int c = 0; c < N; ++c) out[c] = dot_q45_K_portable<FIVE_BITS>(w, *xs[c]);
#endif
}

// The columns n (1 .. 8) as a compile-time count.
template <template <int> class Kernel, class... A>
void with_columns(int n, A... a) {
    switch (n) {
    case 1: return Kernel<1>::run(a...);
    case 2: return Kernel<2>::run(a...);
    case 3: return Kernel<3>::run(a...);
    case 4: return Kernel<4>::run(a...);
    case 5: return Kernel<5>::run(a...);
    case 6: return Kernel<6>::run(a...);
    case 7: return Kernel<7>::run(a...);
    default: return Kernel<8>::run(a...);
    }
}

template <int N>
struct Q80Cols {
    static void run(const block_q8_0 * w, const DotColumn * const * xs, float * out) { dot_q8_0_n<N>(w, xs, out); }
};

template <bool FIVE_BITS, class Block>
struct Q45K {
    template <int N>
    struct Cols {
        static void run(const Block * w, const DotColumn * const * xs, float * out) { dot_q45_K_n<N, FIVE_BITS>(w, xs, out); }
    };
};

template <bool FIVE_BITS, class Block>
void dot_q45_K_columns(const Block * w, const DotColumn * const * xs, int n, float * out) {
    with_columns<Q45K<FIVE_BITS, Block>::template Cols>(n, w, xs, out);
}

template <bool FIVE_BITS, class Block>
float dot_q45_K(const Block * w, const DotColumn & x) {
    const DotColumn * xs[1] = {&x};
    float out;
    dot_q45_K_n<1, FIVE_BITS>(w, xs, &out);
    return out;
}

// Q2_K and Q3_K: per super-block of 256, groups g = 4n + j of 32 elements 128n + 32j + l (l < 32) whose 2-bit
// quants are bits 2j of qs[32n + l]; sub-block s = 2g + l / 16 has its own scale. Q2_K: w = (d*sc_s) q -
// (dmin*m_s), q in [0, 3]. Q3_K: w = (d*sc_s) (u - 4), u = q + 4 * (bit 4n + j of hmask[l]) in [0, 7], sc_s
// signed. So per sub-block y = d sc_s d_b (sum u q') - (dmin m_s | 4 d sc_s) (d_b sum q'), the second term from
// dsum16, accumulated apart and subtracted last (as Q4_K's mins and Q6_K's offset).
// The portable loop (CPUs without AVX2).
template <bool Q3>
[[maybe_unused]] float dot_q23_K_portable(const void * row, const DotColumn & x) {
    [[maybe_unused]] const int64_t ahead = prefetch_distance();
    constexpr size_t kBlockBytes = Q3 ? sizeof(block_q3_K) : sizeof(block_q2_K);
    const int64_t nsb = x.K / QK_K;
    float acc = 0.0f, offset = 0.0f;
    for (int64_t sb = 0; sb < nsb; ++sb) {
        prefetch_ahead(static_cast<const uint8_t *>(row) + sb * int64_t(kBlockBytes), kBlockBytes, ahead);
        const uint8_t * qs;
        const uint8_t * hmask = nullptr;
        float d, dmin = 0.0f;
        int sc[16], m[16] = {};
        if constexpr (Q3) {
            const block_q3_K & b = static_cast<const block_q3_K *>(row)[sb];
            qs = b.qs, hmask = b.hmask, d = half_to_float(b.d);
            for (int i = 0; i < 16; ++i) sc[i] = q3k_scale(i, b.scales);
        } else {
            const block_q2_K & b = static_cast<const block_q2_K *>(row)[sb];
            qs = b.qs, d = half_to_float(b.d), dmin = half_to_float(b.dmin);
            for (int i = 0; i < 16; ++i) sc[i] = b.scales[i] & 0xF, m[i] = b.scales[i] >> 4;
        }
        const int8_t * xq = x.q.data() + QK_K * sb;
        const float * xd = x.d.data() + 8 * sb;
        const float * xs = x.dsum16.data() + 16 * sb;
        for (int i = 0; i < 16; ++i) offset += (Q3 ? 4.0f * d * float(sc[i]) : dmin * float(m[i])) * xs[i];
        for (int n = 0; n < 2; ++n)
            for (int j = 0; j < 4; ++j) {
                const int g = 4 * n + j;
                const float dx = xd[g];
                int32_t sa = 0, sb2 = 0;
                for (int l = 0; l < 32; ++l) {
                    int u = (qs[32 * n + l] >> (2 * j)) & 3;
                    if constexpr (Q3) u |= ((hmask[l] >> g) & 1) << 2;
                    (l < 16 ? sa : sb2) += u * xq[32 * g + l];
                }
                acc += float(sa) * (d * float(sc[2 * g]) * dx) + float(sb2) * (d * float(sc[2 * g + 1]) * dx);
            }
    }
    return acc - offset;
}

#if defined(RP_INT8_SIMD)
// A super-block of a 16-sub-block K-quant (Q2_K, Q3_K, Q6_K) decoded for the row dots: per half h (groups 4h .. 4h+3
// of 32 elements) the groups' unsigned quants u[h], the scales d sc_s of its 8 sub-blocks in sums_of_halves' order
// (dscf[h]); and per sub-block s the factor of d_b sum q' in the offset term (off[0]: s = 0 .. 7, off[1]: 8 .. 15).
struct K16Block {
    __m256i u[2][4];
    __m256 dscf[2];
    __m256 off[2];
};

#if defined(RP_INT8_VNNI) && defined(__AVX512F__)
#if defined(__GNUC__) && !defined(__clang__)   // (GCC 12's false warning on its own 512-bit intrinsics, as above)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// The transposed path with the two halves side by side in 512-bit registers (k16_dots): [acc0 | acc1] and
// [offs0 | offs1] per column, each lane the same chain as the 256-bit code's (the same bits), with half the
// instructions per column (qt's interleaved halves load as one vector). The weights: [half 0's group g | half 1's]
// transposed, and the two halves' scales and offset factors side by side.
struct K16Block512 {
    __m512i ut[4];
    __m512 dscf, off;
};
inline K16Block512 widen(const K16Block & b) {
    K16Block512 w;
    __m512i u[4];
    for (int g = 0; g < 4; ++g) u[g] = _mm512_inserti64x4(_mm512_castsi256_si512(b.u[0][g]), b.u[1][g], 1);
    transpose4x4_halves(u, w.ut);
    const auto pair = [](__m256 lo, __m256 hi) {
        return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
    };
    w.dscf = pair(b.dscf[0], b.dscf[1]);
    w.off = pair(b.off[0], b.off[1]);
    return w;
}
// One column's step: acc += (the 16 sub-blocks' exact sums) (dscf d_b), offs += off (d_b sum q').
inline void k16_column512(const K16Block512 & w, const DotColumn & x, int64_t sb, __m512 & acc, __m512 & offs) {
    const int8_t * xqt = x.qt.data() + QK_K * sb;
    offs = _mm512_fmadd_ps(w.off, _mm512_loadu_ps(x.dsum16.data() + 16 * sb), offs);
    const __m512i s01 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w.ut[0], _mm512_loadu_si512(xqt)), w.ut[1],
                                            _mm512_loadu_si512(xqt + 64));
    const __m512i s23 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w.ut[2], _mm512_loadu_si512(xqt + 128)), w.ut[3],
                                            _mm512_loadu_si512(xqt + 192));
    // [d_b of blocks 0-3 twice | blocks 4-7 twice], as fma_scaled broadcasts them per half
    const __m512 xd4 = _mm512_castps256_ps512(_mm256_loadu_ps(x.d.data() + 8 * sb));
    const __m512 scale = _mm512_mul_ps(w.dscf, _mm512_shuffle_f32x4(xd4, xd4, _MM_SHUFFLE(1, 1, 0, 0)));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s01, s23)), scale, acc);
}
#endif

// The row dots of the 16-sub-block K-quants for N columns (one, or a decode step's sequences; N a compile-time
// count): decode(sb) gives super-block sb as a K16Block, decoded once for all the columns. Per column, groups
// 4h .. 4h+3: their 8 sub-blocks' exact sums in one vector (sums_of_halves' order), times the matching scales
// (d sc_s) d_b, into acc_h, and the offsets' terms from the column's dsum16 into offs_h; then
// y = hsum(acc0 + acc1) - off_scale hsum(offs0 + offs1). Every column has its own accumulators and the same
// operations in the same order, so its bits are the same whatever N.
template <int N, class Decode>
void k16_dots(int64_t nsb, const DotColumn * const * xs, float off_scale, Decode decode, float * out) {
    __m256 acc0[N], acc1[N], offs0[N], offs1[N];
    for (int c = 0; c < N; ++c) acc0[c] = acc1[c] = offs0[c] = offs1[c] = _mm256_setzero_ps();
#if defined(RP_INT8_VNNI) && defined(__AVX512F__)
    if constexpr (kTransposeKQuants<N>) {
        __m512 acc[N], offs[N];
        for (int c = 0; c < N; ++c) acc[c] = offs[c] = _mm512_setzero_ps();
        for (int64_t sb = 0; sb < nsb; ++sb) {
            const K16Block512 w = widen(decode(sb));
#pragma GCC unroll 8
            for (int c = 0; c < N; ++c) k16_column512(w, *xs[c], sb, acc[c], offs[c]);
        }
        split_pairs<N>(acc, acc0, acc1);
        split_pairs<N>(offs, offs0, offs1);
    } else
#endif
    for (int64_t sb = 0; sb < nsb; ++sb) {
        const K16Block b = decode(sb);
        __m256i ut[2][4];   // (kTransposeKQuants: each half's groups transposed)
        if constexpr (kTransposeKQuants<N>)
            for (int h = 0; h < 2; ++h) transpose4x4_halves(b.u[h], ut[h]);
#pragma GCC unroll 8
        for (int c = 0; c < N; ++c) {
            const DotColumn & x = *xs[c];
            const float * xd = x.d.data() + 8 * sb;
            const float * xsum = x.dsum16.data() + 16 * sb;
            offs0[c] = _mm256_fmadd_ps(b.off[0], _mm256_loadu_ps(xsum), offs0[c]);
            offs1[c] = _mm256_fmadd_ps(b.off[1], _mm256_loadu_ps(xsum + 8), offs1[c]);
            if constexpr (kTransposeKQuants<N>) {
                const int8_t * xqt = x.qt.data() + QK_K * sb;
                acc0[c] = fma_scaled(sums_transposed(ut[0], xqt, 0), xd, b.dscf[0], acc0[c]);
                acc1[c] = fma_scaled(sums_transposed(ut[1], xqt, 1), xd + 4, b.dscf[1], acc1[c]);
            } else {
                const int8_t * xq = x.q.data() + QK_K * sb;
                acc0[c] = fma_four_groups(b.u[0], xq, xd, b.dscf[0], acc0[c]);
                acc1[c] = fma_four_groups(b.u[1], xq + 128, xd + 4, b.dscf[1], acc1[c]);
            }
        }
    }
    for (int c = 0; c < N; ++c) out[c] = hsum(_mm256_add_ps(acc0[c], acc1[c])) - off_scale * hsum(_mm256_add_ps(offs0[c], offs1[c]));
}
#if defined(RP_INT8_VNNI) && defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

// Q2_K / Q3_K through k16_dots: per super-block the scales, offsets and 2-bit (Q3: 3-bit) quants.
template <int N, bool Q3>
void dot_q23_K_n(const void * row, const DotColumn * const * xs, float * out) {
#if defined(RP_INT8_SIMD)
    [[maybe_unused]] const int64_t ahead = prefetch_distance();
    constexpr size_t kBlockBytes = Q3 ? sizeof(block_q3_K) : sizeof(block_q2_K);
    k16_dots<N>(xs[0]->K / QK_K, xs, 1.0f, [&](int64_t sb) {
        prefetch_ahead(static_cast<const uint8_t *>(row) + sb * int64_t(kBlockBytes), kBlockBytes, ahead);
        K16Block k;
        const uint8_t * qs;
        const uint8_t * hmask = nullptr;
        float d;
        __m128i sc16;   // the 16 sub-blocks' scales, int8
        // per sub-block the factor of d_b sum q' in the offset: 4 d sc_s (Q3) or dmin m_s (Q2)
        if constexpr (Q3) {
            const block_q3_K & b = static_cast<const block_q3_K *>(row)[sb];
            qs = b.qs, hmask = b.hmask, d = half_to_float(b.d);
            // q3k_scale's values, 4 sub-blocks to a word.
            uint32_t w[4];
            q3k_scales_packed(b.scales, w);
            sc16 = _mm_sub_epi8(_mm_setr_epi32(int(w[0]), int(w[1]), int(w[2]), int(w[3])), _mm_set1_epi8(32));
            const __m256 d4 = _mm256_set1_ps(4.0f * d);
            k.off[0] = _mm256_mul_ps(d4, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc16)));
            k.off[1] = _mm256_mul_ps(d4, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc16, 8))));
        } else {
            const block_q2_K & b = static_cast<const block_q2_K *>(row)[sb];
            qs = b.qs, d = half_to_float(b.d);
            const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b.scales));
            sc16 = _mm_and_si128(v, _mm_set1_epi8(0x0F));
            const __m128i m16 = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
            const __m256 dmin = _mm256_set1_ps(half_to_float(b.dmin));
            k.off[0] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m16)));
            k.off[1] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(m16, 8))));
        }
        // Groups g = 4n + j (elements 128n + 32j + l have bits 2j of qs[32n + l]): their unsigned quants, and per n
        // the scales d sc_s of their 8 sub-blocks in sums_of_halves' order.
        const __m256i q = load256(qs), q2 = load256(qs + 32);
        __m256i hm = _mm256_setzero_si256();
        if constexpr (Q3) hm = load256(hmask);
        for (int n = 0; n < 2; ++n) {
            for (int j = 0; j < 4; ++j) {
                k.u[n][j] = bits(n == 0 ? q : q2, 2 * j, 3, 0);
                if constexpr (Q3) k.u[n][j] = _mm256_or_si256(k.u[n][j], bits(hm, 4 * n + j, 1, 2));
            }
            const __m256 scf = _mm256_cvtepi32_ps(evens_then_odds(_mm256_cvtepi8_epi32(n == 0 ? sc16 : _mm_srli_si128(sc16, 8))));
            k.dscf[n] = _mm256_mul_ps(_mm256_set1_ps(d), scf);
        }
        return k;
    }, out);
#else
    for (int c = 0; c < N; ++c) out[c] = dot_q23_K_portable<Q3>(row, *xs[c]);
#endif
}

template <bool Q3>
struct Q23K {
    template <int N>
    struct Cols {
        static void run(const void * row, const DotColumn * const * xs, float * out) { dot_q23_K_n<N, Q3>(row, xs, out); }
    };
};

template <bool Q3>
float dot_q23_K(const void * row, const DotColumn & x) {
    const DotColumn * xs[1] = {&x};
    float out;
    dot_q23_K_n<1, Q3>(row, xs, &out);
    return out;
}

// Q6_K: sub-blocks of 16 with w = (d*sc) (q - 32), q in [0, 63].
[[maybe_unused]] float dot_q6_K_portable(const block_q6_K * w, const DotColumn & x) {
    [[maybe_unused]] const int64_t ahead = prefetch_distance();
    const int64_t nsb = x.K / QK_K;
    float acc = 0.0f, off = 0.0f;
    for (int64_t s = 0; s < nsb; ++s) {
        const block_q6_K & b = w[s];
        prefetch_ahead(&b, sizeof(block_q6_K), ahead);
        const float d = half_to_float(b.d);
        const int8_t * xq = x.q.data() + QK_K * s;
        const float * xd = x.d.data() + 8 * s;
        const float * xs = x.dsum16.data() + 16 * s;
        for (int n = 0; n < 2; ++n)
            for (int l = 0; l < 32; ++l) {
                const uint8_t lo = b.ql[64 * n + l], hi = b.ql[64 * n + 32 + l], hb = b.qh[32 * n + l];
                const int q[4] = {(lo & 0xF) | ((hb & 3) << 4), (hi & 0xF) | (((hb >> 2) & 3) << 4),
                                  (lo >> 4) | (((hb >> 4) & 3) << 4), (hi >> 4) | (((hb >> 6) & 3) << 4)};
                for (int k = 0; k < 4; ++k) {
                    const int e = 128 * n + 32 * k + l;
                    acc += float(q[k] * xq[e]) * (d * float(b.scales[e / 16]) * xd[e / 32]);
                }
            }
        for (int sub = 0; sub < 16; ++sub) off += float(b.scales[sub]) * d * xs[sub];
    }
    return acc - 32.0f * off;
}

// Q6_K through k16_dots: per super-block the 6-bit quants (elements 128h + 32k + l: sub-blocks 8h + 2k, 8h + 2k + 1
// of column block 4h + k) and scale factors; the -32 of every element is d * sum over sub-blocks of sc * (d_b * sum
// q'), 16 sub-blocks at once, times 32.
template <int N>
void dot_q6_K_n(const block_q6_K * w, const DotColumn * const * xs, float * out) {
#if defined(RP_INT8_SIMD)
    [[maybe_unused]] const int64_t ahead = prefetch_distance();
    k16_dots<N>(xs[0]->K / QK_K, xs, 32.0f, [&](int64_t s) {
        const block_q6_K & b = w[s];
        prefetch_ahead(&b, sizeof(block_q6_K), ahead);
        K16Block k;
        const __m256 dv = _mm256_set1_ps(half_to_float(b.d));
        const __m128i sc16 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b.scales));
        k.off[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc16)), dv);
        k.off[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc16, 8))), dv);
        for (int h2 = 0; h2 < 2; ++h2) {
            const __m256i a = load256(b.ql + 64 * h2), c = load256(b.ql + 64 * h2 + 32), h = load256(b.qh + 32 * h2);
            k.u[h2][0] = _mm256_or_si256(low4(a), bits(h, 0, 3, 4));
            k.u[h2][1] = _mm256_or_si256(low4(c), bits(h, 2, 3, 4));
            k.u[h2][2] = _mm256_or_si256(high4(a), bits(h, 4, 3, 4));
            k.u[h2][3] = _mm256_or_si256(high4(c), bits(h, 6, 3, 4));
            const __m256 scf = _mm256_cvtepi32_ps(evens_then_odds(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(b.scales + 8 * h2)))));
            k.dscf[h2] = _mm256_mul_ps(dv, scf);
        }
        return k;
    }, out);
#else
    for (int c = 0; c < N; ++c) out[c] = dot_q6_K_portable(w, *xs[c]);
#endif
}

template <int N>
struct Q6KCols {
    static void run(const block_q6_K * w, const DotColumn * const * xs, float * out) { dot_q6_K_n<N>(w, xs, out); }
};

void dot_q6_K_columns(const block_q6_K * w, const DotColumn * const * xs, int n, float * out) { with_columns<Q6KCols>(n, w, xs, out); }

float dot_q6_K(const block_q6_K * w, const DotColumn & x) {
    const DotColumn * xs[1] = {&x};
    float out;
    dot_q6_K_n<1>(w, xs, &out);
    return out;
}

#if RP_FLOAT_SIMD == 512 || RP_BF16_SIMD == 512
// The 16 lanes added in a fixed order (through memory: GCC 12 warns falsely on the 512-bit extracts).
inline float hsum512(__m512 v) {
    alignas(64) float t[16];
    _mm512_store_ps(t, v);
    return hsum(_mm256_add_ps(_mm256_load_ps(t), _mm256_load_ps(t + 8)));
}
#endif
#if RP_FLOAT_SIMD == 512
// 16 weights from element k of an f32 / f16 row as floats (m: the lanes to load, the others 0).
template <TensorType WT>
inline __m512 load16(const void * row, int64_t k, __mmask16 m) {
    if constexpr (WT == TensorType::F32) return _mm512_maskz_loadu_ps(m, static_cast<const float *>(row) + k);
    else return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t *>(row) + k));
}
#endif
#if RP_FLOAT_SIMD == 256 || RP_BF16_SIMD == 256
// The zmm code's 16 lanes as two ymm (lanes 0..7, 8..15), lane for lane: the same operations give the same bits.
struct Lanes16 {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
};
inline Lanes16 add16(Lanes16 a, Lanes16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline float hsum16(Lanes16 v) { return hsum(_mm256_add_ps(v.lo, v.hi)); }
#endif
#if RP_FLOAT_SIMD == 256
// 8 weights from element k of an f32 / f16 row as floats.
template <TensorType WT>
inline __m256 load8(const void * row, int64_t k) {
    if constexpr (WT == TensorType::F32) return _mm256_loadu_ps(static_cast<const float *>(row) + k);
    else return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(static_cast<const uint16_t *>(row) + k)));
}
#endif

// F32 and F16 rows, the portable loop (CPUs without AVX2 and F16C).
template <TensorType WT>
[[maybe_unused]] float dot_float_portable(const void * row, const float * x, int64_t K) {
    float acc = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
        float w;
        if constexpr (WT == TensorType::F32) w = static_cast<const float *>(row)[k];
        else w = half_to_float(static_cast<const uint16_t *>(row)[k]);
        acc += w * x[k];
    }
    return acc;
}

// F32 and F16 rows with N columns (one, or a decode step's sequences). Per column one FMA chain per lane over 64
// elements at a time (4 accumulators of 16 lanes; 2 FMA ports x 4 cycles of latency would want 8, but the loads,
// not the FMAs, are the limit), then the lanes; the tail through masked loads (AVX2: zero-padded copies, the same
// bits). Every column has its own accumulators and the same operations in the same order, so its bits are the same
// whatever N. Each part of the row is loaded (f16: converted) once for a group of columns (AVX-512: 4, whose 16
// accumulators and the 4 row registers fit the 32 zmm; AVX2: 2, the rest of the row's registers spilled to L1
// costing less than a second pass).
template <TensorType WT, int N>
void dot_float_n(const void * row, const DotColumn * const * xs, float * out) {
    const int64_t K = xs[0]->K;
    [[maybe_unused]] const int64_t ahead = prefetch_distance();
    [[maybe_unused]] constexpr size_t kElem = WT == TensorType::F32 ? 4 : 2;
#if RP_FLOAT_SIMD == 512
    constexpr int kGroup = 4;
    for (int c0 = 0; c0 < N; c0 += kGroup) {
        constexpr int G = N < kGroup ? N : kGroup;
        const int n = std::min(G, N - c0);
        __m512 a[G][4];
        for (int c = 0; c < G; ++c) a[c][0] = a[c][1] = a[c][2] = a[c][3] = _mm512_setzero_ps();
        int64_t k = 0;
        for (; k + 64 <= K; k += 64) {
            prefetch_ahead(static_cast<const char *>(row) + k * int64_t(kElem), 64 * kElem, ahead);
            const __m512 w0 = load16<WT>(row, k, 0xFFFF), w1 = load16<WT>(row, k + 16, 0xFFFF), w2 = load16<WT>(row, k + 32, 0xFFFF),
                         w3 = load16<WT>(row, k + 48, 0xFFFF);
            for (int c = 0; c < n; ++c) {
                const float * x = xs[c0 + c]->x;
                a[c][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + k), a[c][0]);
                a[c][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + k + 16), a[c][1]);
                a[c][2] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(x + k + 32), a[c][2]);
                a[c][3] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(x + k + 48), a[c][3]);
            }
        }
        for (; k < K; k += 16) {
            const __mmask16 m = __mmask16(K - k >= 16 ? 0xFFFF : (1u << (K - k)) - 1);
            const __m512 wt = load16<WT>(row, k, m);
            for (int c = 0; c < n; ++c) a[c][0] = _mm512_fmadd_ps(wt, _mm512_maskz_loadu_ps(m, xs[c0 + c]->x + k), a[c][0]);
        }
        for (int c = 0; c < n; ++c) out[c0 + c] = hsum512(_mm512_add_ps(_mm512_add_ps(a[c][0], a[c][1]), _mm512_add_ps(a[c][2], a[c][3])));
    }
#elif RP_FLOAT_SIMD == 256
    constexpr int kGroup = 2;
    for (int c0 = 0; c0 < N; c0 += kGroup) {
        constexpr int G = N < kGroup ? N : kGroup;
        const int n = std::min(G, N - c0);
        Lanes16 a[G][4];
        // acc += the 16 row values w (two ymm) times x[k .. k + 16)
        auto fma = [](Lanes16 acc, const __m256 (&w)[2], const float * x) {
            return Lanes16{_mm256_fmadd_ps(w[0], _mm256_loadu_ps(x), acc.lo), _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), acc.hi)};
        };
        int64_t k = 0;
        for (; k + 64 <= K; k += 64) {
            prefetch_ahead(static_cast<const char *>(row) + k * int64_t(kElem), 64 * kElem, ahead);
            for (int part = 0; part < 4; ++part) {
                const __m256 w[2] = {load8<WT>(row, k + 16 * part), load8<WT>(row, k + 16 * part + 8)};
                for (int c = 0; c < n; ++c) a[c][part] = fma(a[c][part], w, xs[c0 + c]->x + k + 16 * part);
            }
        }
        for (; k < K; k += 16) {   // the tail through zero-padded copies (the zmm code's masked loads)
            alignas(32) float w16[16] = {};
            for (int64_t i = 0; i < std::min<int64_t>(16, K - k); ++i) {
                if constexpr (WT == TensorType::F32) w16[i] = static_cast<const float *>(row)[k + i];
                else w16[i] = half_to_float(static_cast<const uint16_t *>(row)[k + i]);
            }
            const __m256 w[2] = {_mm256_load_ps(w16), _mm256_load_ps(w16 + 8)};
            for (int c = 0; c < n; ++c) {
                alignas(32) float x16[16] = {};
                for (int64_t i = 0; i < std::min<int64_t>(16, K - k); ++i) x16[i] = xs[c0 + c]->x[k + i];
                a[c][0] = fma(a[c][0], w, x16);
            }
        }
        for (int c = 0; c < n; ++c) out[c0 + c] = hsum16(add16(add16(a[c][0], a[c][1]), add16(a[c][2], a[c][3])));
    }
#else
    for (int c = 0; c < N; ++c) out[c] = dot_float_portable<WT>(row, xs[c]->x, K);
#endif
}

template <TensorType WT>
float dot_float(const void * row, const DotColumn & x) {
    const DotColumn * xs[1] = {&x};
    float out;
    dot_float_n<WT, 1>(row, xs, &out);
    return out;
}

template <TensorType WT>
struct FloatCols {
    template <int N>
    struct Cols {
        static void run(const void * row, const DotColumn * const * xs, float * out) { dot_float_n<WT, N>(row, xs, out); }
    };
};

// BF16 rows, the stated arithmetic (matvec_dot.h), which is vdpbf16ps's: 16 lanes, lane j of a 32-element block at
// k adding the products of elements k + 2j + 1 and then k + 2j (each exact in f32, so an FMA rounds as its add
// would); the blocks of each 64 elements into two chains a0 (the first 32) and a1 (the last 32), a partial block's
// zeros past K into a0, then a0 + a1 and its lanes in hsum512's order. Three ways to the same bits:
//   AVX-512 BF16: vdpbf16ps on the bf16 column (subnormal bf16 inputs count as zero, as the instruction does);
//   AVX-512F / AVX2 (RP_BF16_FMA): the row's and the column's odd and even elements split out as f32 by a mask and a
//     shift, two FMAs per lane, on one zmm or two ymm per 16 lanes (subnormals kept, as in the portable loop). (A
//     column split once into f32 halves instead needs 4x its bytes, which with 4 or 8 columns outgrow L1: slower.)
#if defined(RP_BF16_FMA) && RP_BF16_SIMD == 512
// 32 bf16 values (a block of the row or of the column) as f32: the odd elements (the bf16 in each 32-bit pair's
// high half, masked) and the even ones (the low half, shifted up). (The shift as its zero-masked form, all lanes
// kept: the plain one's undefined pass-through operand makes GCC 12 warn falsely once inlined.)
struct Bf16Halves {
    __m512 odd, even;
};
inline Bf16Halves split_bf16(const uint16_t * w) {
    const __m512i v = _mm512_loadu_si512(w);
    return {_mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xFFFF0000u)))),
            _mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xFFFF), v, 16))};
}
// acc += the row block r times the column's block at x, in the stated order
inline __m512 dot_halves(__m512 acc, const Bf16Halves & r, const uint16_t * x) {
    const Bf16Halves c = split_bf16(x);
    return _mm512_fmadd_ps(r.even, c.even, _mm512_fmadd_ps(r.odd, c.odd, acc));
}
#elif defined(RP_BF16_FMA) && RP_BF16_SIMD == 256
// The same on two ymm: lanes 0..7 (elements 0..15 of the block) and 8..15 (elements 16..31).
struct Bf16Halves {
    __m256 odd_lo, even_lo, odd_hi, even_hi;
};
inline Bf16Halves split_bf16(const uint16_t * w) {
    const __m256i high = _mm256_set1_epi32(int(0xFFFF0000u));
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(w));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(w + 16));
    return {_mm256_castsi256_ps(_mm256_and_si256(lo, high)), _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(hi, high)), _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16))};
}
inline Lanes16 dot_halves(Lanes16 acc, const Bf16Halves & r, const uint16_t * x) {
    const Bf16Halves c = split_bf16(x);
    acc.lo = _mm256_fmadd_ps(r.even_lo, c.even_lo, _mm256_fmadd_ps(r.odd_lo, c.odd_lo, acc.lo));
    acc.hi = _mm256_fmadd_ps(r.even_hi, c.even_hi, _mm256_fmadd_ps(r.odd_hi, c.odd_hi, acc.hi));
    return acc;
}
#endif
#if defined(RP_BF16_FMA)
// A row's last partial block, through a zero-padded copy (what the vdpbf16ps code's masked load gives).
inline Bf16Halves split_bf16_tail(const uint16_t * w, int64_t n) {
    uint16_t w32[32] = {};
    std::memcpy(w32, w, size_t(n) * sizeof(uint16_t));
    return split_bf16(w32);
}
#endif

// BF16 rows with N bf16 columns (one, or a decode step's sequences): every column its own chains in the stated order,
// so its bits are the same whatever N; the row is loaded (FMA paths: and split) once for all columns (AVX2: for each
// pair of columns, whose 8 accumulators and a block's 4 row registers fit the 16 ymm).
template <int N>
void dot_bf16_n(const uint16_t * w, const DotColumn * const * xs, float * out) {
    const int64_t K = xs[0]->K;
    [[maybe_unused]] const int64_t ahead = prefetch_distance();
#if defined(RP_BF16_DPBF16)
    __m512 a0[N], a1[N];
    for (int c = 0; c < N; ++c) a0[c] = a1[c] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        prefetch_ahead(w + k, 128, ahead);
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k), w1 = (__m512bh)_mm512_loadu_si512(w + k + 32);
        for (int c = 0; c < N; ++c) {
            const uint16_t * x = xs[c]->bf16.data();
            a0[c] = _mm512_dpbf16_ps(a0[c], w0, (__m512bh)_mm512_loadu_si512(x + k));
            a1[c] = _mm512_dpbf16_ps(a1[c], w1, (__m512bh)_mm512_loadu_si512(x + k + 32));
        }
    }
    for (; k < K; k += 32) {   // a partial tail loads zeros past K
        const __mmask32 m = K - k >= 32 ? 0xFFFFFFFFu : (__mmask32(1) << (K - k)) - 1;
        const __m512bh wt = (__m512bh)_mm512_maskz_loadu_epi16(m, w + k);
        for (int c = 0; c < N; ++c) a0[c] = _mm512_dpbf16_ps(a0[c], wt, (__m512bh)_mm512_maskz_loadu_epi16(m, xs[c]->bf16.data() + k));
    }
    for (int c = 0; c < N; ++c) out[c] = hsum512(_mm512_add_ps(a0[c], a1[c]));
#elif defined(RP_BF16_FMA) && RP_BF16_SIMD == 512
    __m512 a0[N], a1[N];
    for (int c = 0; c < N; ++c) a0[c] = a1[c] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        prefetch_ahead(w + k, 128, ahead);
        const Bf16Halves r0 = split_bf16(w + k), r1 = split_bf16(w + k + 32);
        for (int c = 0; c < N; ++c) {
            a0[c] = dot_halves(a0[c], r0, xs[c]->bf16.data() + k);
            a1[c] = dot_halves(a1[c], r1, xs[c]->bf16.data() + k + 32);
        }
    }
    for (; k < K; k += 32) {
        const Bf16Halves r = split_bf16_tail(w + k, std::min<int64_t>(32, K - k));
        for (int c = 0; c < N; ++c) a0[c] = dot_halves(a0[c], r, xs[c]->bf16.data() + k);  // (the column's copy: zero-padded)
    }
    for (int c = 0; c < N; ++c) out[c] = hsum512(_mm512_add_ps(a0[c], a1[c]));
#elif defined(RP_BF16_FMA) && RP_BF16_SIMD == 256
    for (int c0 = 0; c0 < N; c0 += 2) {
        constexpr int G = N < 2 ? N : 2;
        const int n = std::min(G, N - c0);
        Lanes16 a0[G], a1[G];
        int64_t k = 0;
        for (; k + 64 <= K; k += 64) {
            prefetch_ahead(w + k, 128, ahead);
            const Bf16Halves r0 = split_bf16(w + k);
            for (int c = 0; c < n; ++c) a0[c] = dot_halves(a0[c], r0, xs[c0 + c]->bf16.data() + k);
            const Bf16Halves r1 = split_bf16(w + k + 32);
            for (int c = 0; c < n; ++c) a1[c] = dot_halves(a1[c], r1, xs[c0 + c]->bf16.data() + k + 32);
        }
        for (; k < K; k += 32) {
            const Bf16Halves r = split_bf16_tail(w + k, std::min<int64_t>(32, K - k));
            for (int c = 0; c < n; ++c) a0[c] = dot_halves(a0[c], r, xs[c0 + c]->bf16.data() + k);
        }
        for (int c = 0; c < n; ++c) out[c0 + c] = hsum16(add16(a0[c], a1[c]));
    }
#else
    for (int c = 0; c < N; ++c) {   // the portable loop: the same values, summed in element order
        const uint16_t * x = xs[c]->bf16.data();
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) acc += bf16_to_fp32(w[k]) * bf16_to_fp32(x[k]);
        out[c] = acc;
    }
#endif
}

float dot_bf16(const uint16_t * w, const DotColumn & x) {
    const DotColumn * xs[1] = {&x};
    float out;
    dot_bf16_n<1>(w, xs, &out);
    return out;
}

template <int N>
struct Bf16Cols {
    static void run(const uint16_t * w, const DotColumn * const * xs, float * out) { dot_bf16_n<N>(w, xs, out); }
};

bool is_k_quant(TensorType t) {
    return t == TensorType::Q2_K || t == TensorType::Q3_K || t == TensorType::Q4_K || t == TensorType::Q5_K || t == TensorType::Q6_K;
}

} // namespace

void quantize_column(const float * x, int64_t K, DotColumn & out) {
    out.K = K;
    out.q.resize(size_t(K));
    out.d.resize(size_t(K / 32));
    out.dsum16.resize(size_t(K / 16));
    out.dsum32.resize(size_t(K / 32));
    for (int64_t b = 0; b < K / 32; ++b) {
        const float * xb = x + 32 * b;
#if defined(__AVX2__)
        // The loop below, 8 values at a time: the same operations on each value (round to nearest even, as
        // nearbyint in the default rounding mode), so the same bits; exact int32 sums.
        {
            const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
            __m256 v[4], amax8 = _mm256_setzero_ps();
            int bad = 0;
            for (int i = 0; i < 4; ++i) {
                v[i] = _mm256_loadu_ps(xb + 8 * i);
                const __m256 a = _mm256_andnot_ps(sign, v[i]);
                bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ));   // inf or NaN
                amax8 = _mm256_max_ps(amax8, a);
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            const float d = bad == 0 ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
            const float id = bad == 0 && d > 0.0f ? 1.0f / d : 0.0f;
            const __m256 idv = _mm256_set1_ps(id), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
            __m256i q[4];
            for (int i = 0; i < 4; ++i)
                q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[i], idv), lo), hi),
                                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            // (max / min return their second operand for a NaN: -127, as std::max(-127.0f, NaN) below)
            // int32 -> int8 in element order (the packs interleave the 128-bit halves; the permute undoes it)
            const __m256i q16 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(out.q.data() + 32 * b),
                                _mm256_permutevar8x32_epi32(q16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            int sums[2];
            for (int h = 0; h < 2; ++h) {
                const __m256i s8 = _mm256_add_epi32(q[2 * h], q[2 * h + 1]);
                __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
                sums[h] = _mm_cvtsi128_si32(s4);
            }
            out.d[size_t(b)] = d;
            out.dsum16[size_t(2 * b)] = d * float(sums[0]);
            out.dsum16[size_t(2 * b + 1)] = d * float(sums[1]);
            out.dsum32[size_t(b)] = out.dsum16[size_t(2 * b)] + out.dsum16[size_t(2 * b + 1)];
            continue;
        }
#endif
        float amax = 0.0f;
        bool finite = true;
        for (int i = 0; i < 32; ++i) {
            amax = std::max(amax, std::fabs(xb[i]));
            finite = finite && std::isfinite(xb[i]);
        }
        // A NaN or inf activation makes its block's scale NaN, so every dot over it is NaN: a diverged
        // column must not come out as finite numbers (the clamp below would turn NaN into 127).
        const float d = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
        const float id = finite && d > 0.0f ? 1.0f / d : 0.0f;
        int sums[2] = {0, 0};
        for (int i = 0; i < 32; ++i) {
            const int q = int(std::nearbyint(std::min(127.0f, std::max(-127.0f, xb[i] * id))));
            out.q[size_t(32 * b + i)] = int8_t(q);
            sums[i / 16] += q;
        }
        out.d[size_t(b)] = d;
        out.dsum16[size_t(2 * b)] = d * float(sums[0]);
        out.dsum16[size_t(2 * b + 1)] = d * float(sums[1]);
        out.dsum32[size_t(b)] = out.dsum16[size_t(2 * b)] + out.dsum16[size_t(2 * b + 1)];
    }
}

void prepare_column(TensorType t, const float * x, int64_t K, DotColumn & out) {
    out.K = K;
    out.x = x;
    if (t == TensorType::BF16) {
        out.bf16.assign(size_t((K + 31) / 32 * 32), 0);   // (zeros past K: whole 32-element blocks)
        for (int64_t k = 0; k < K; ++k) out.bf16[size_t(k)] = fp32_to_bf16(x[k]);
    } else if (t != TensorType::F32 && t != TensorType::F16) {
        quantize_column(x, K, out);
        if (t == TensorType::MXFP4) {   // bias12 (matvec_dot.h)
            out.bias12.resize(size_t(K / 4));
            for (int64_t i = 0; i < K / 4; ++i)
                out.bias12[size_t(i)] = -12 * (int32_t(out.q[size_t(4 * i)]) + out.q[size_t(4 * i + 1)] + out.q[size_t(4 * i + 2)] + out.q[size_t(4 * i + 3)]);
        }
        if (is_k_quant(t)) {   // qt (matvec_dot.h)
            out.qt.resize(size_t(K));
            for (int64_t i = 0; i < K; ++i) {
                const int64_t r = i % QK_K, k = r / 64, h = (r / 32) % 2, L = (r % 32) / 4;
                out.qt[size_t(i)] = out.q[size_t(i - r + 128 * h + 32 * (L % 4) + 16 * (L / 4) + 4 * k + r % 4)];
            }
        }
    }
}

bool row_dot_supports(TensorType t, int64_t K) {
    switch (t) {
    case TensorType::F32: case TensorType::F16: case TensorType::BF16: return K > 0;
    case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1:
    case TensorType::Q8_0: case TensorType::MXFP4: return K > 0 && K % 32 == 0;
    case TensorType::Q2_K: case TensorType::Q3_K: case TensorType::Q4_K: case TensorType::Q5_K: case TensorType::Q6_K:
        return K > 0 && K % QK_K == 0;
    default: return false;
    }
}

float row_dot(TensorType t, const void * row, const DotColumn & x) {
    switch (t) {
    case TensorType::F32: return dot_float<TensorType::F32>(row, x);
    case TensorType::F16: return dot_float<TensorType::F16>(row, x);
    case TensorType::BF16: return dot_bf16(static_cast<const uint16_t *>(row), x);
    case TensorType::Q4_0: return dot_q45_small<block_q4_0, false, false>(static_cast<const block_q4_0 *>(row), x);
    case TensorType::Q4_1: return dot_q45_small<block_q4_1, false, true>(static_cast<const block_q4_1 *>(row), x);
    case TensorType::Q5_0: return dot_q45_small<block_q5_0, true, false>(static_cast<const block_q5_0 *>(row), x);
    case TensorType::Q5_1: return dot_q45_small<block_q5_1, true, true>(static_cast<const block_q5_1 *>(row), x);
    case TensorType::Q8_0: return dot_q8_0(static_cast<const block_q8_0 *>(row), x);
    case TensorType::MXFP4: {
        const DotColumn * xs[1] = {&x};
        float out;
        dot_mxfp4_n<1>(static_cast<const block_mxfp4 *>(row), xs, &out);
        return out;
    }
    case TensorType::Q2_K: return dot_q23_K<false>(row, x);
    case TensorType::Q3_K: return dot_q23_K<true>(row, x);
    case TensorType::Q4_K: return dot_q45_K<false>(static_cast<const block_q4_K *>(row), x);
    case TensorType::Q5_K: return dot_q45_K<true>(static_cast<const block_q5_K *>(row), x);
    case TensorType::Q6_K: return dot_q6_K(static_cast<const block_q6_K *>(row), x);
    default: break;
    }
    assert(false && "row_dot: a type row_dot_supports refuses");
    return 0.0f;
}

void row_dot_columns(TensorType t, const void * row, const DotColumn * const * xs, int n, float * out) {
    assert(n >= 1 && n <= kRowDotColumns);
    switch (t) {
    case TensorType::Q8_0: return with_columns<Q80Cols>(n, static_cast<const block_q8_0 *>(row), xs, out);
    case TensorType::Q4_K: return dot_q45_K_columns<false>(static_cast<const block_q4_K *>(row), xs, n, out);
    case TensorType::Q5_K: return dot_q45_K_columns<true>(static_cast<const block_q5_K *>(row), xs, n, out);
    case TensorType::Q6_K: return dot_q6_K_columns(static_cast<const block_q6_K *>(row), xs, n, out);
    case TensorType::Q4_0: return with_columns<Q45Small<block_q4_0, false, false>::Cols>(n, static_cast<const block_q4_0 *>(row), xs, out);
    case TensorType::Q4_1: return with_columns<Q45Small<block_q4_1, false, true>::Cols>(n, static_cast<const block_q4_1 *>(row), xs, out);
    case TensorType::Q5_0: return with_columns<Q45Small<block_q5_0, true, false>::Cols>(n, static_cast<const block_q5_0 *>(row), xs, out);
    case TensorType::Q5_1: return with_columns<Q45Small<block_q5_1, true, true>::Cols>(n, static_cast<const block_q5_1 *>(row), xs, out);
    case TensorType::Q2_K: return with_columns<Q23K<false>::Cols>(n, row, xs, out);
    case TensorType::Q3_K: return with_columns<Q23K<true>::Cols>(n, row, xs, out);
    case TensorType::BF16: return with_columns<Bf16Cols>(n, static_cast<const uint16_t *>(row), xs, out);
    case TensorType::F32: return with_columns<FloatCols<TensorType::F32>::Cols>(n, row, xs, out);
    case TensorType::F16: return with_columns<FloatCols<TensorType::F16>::Cols>(n, row, xs, out);
    case TensorType::MXFP4: return with_columns<MxCols>(n, static_cast<const block_mxfp4 *>(row), xs, out);
    default:
        for (int c = 0; c < n; ++c) out[c] = row_dot(t, row, *xs[c]);
    }
}

bool row_dot_is_simd(TensorType t) {
    switch (t) {
#if defined(RP_FLOAT_SIMD)
    case TensorType::F32: case TensorType::F16: return true;
#endif
#if defined(RP_BF16_SIMD)
    case TensorType::BF16: return true;
#endif
#if defined(RP_INT8_SIMD)
    case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1:
    case TensorType::Q8_0: case TensorType::Q2_K: case TensorType::Q3_K: case TensorType::Q4_K: case TensorType::Q5_K:
    case TensorType::Q6_K: case TensorType::MXFP4: return true;
#endif
    default: return false;
    }
}

namespace {
thread_local int t_row_dots = -1;  // -1: the process-wide switch
thread_local int64_t t_row_dot_columns = 0;
} // namespace

void set_row_dots(bool on) { g_row_dots.store(on, std::memory_order_relaxed); }
bool row_dots() { return t_row_dots >= 0 ? t_row_dots != 0 : g_row_dots.load(std::memory_order_relaxed); }
int64_t row_dot_max_columns() { return t_row_dot_columns; }

RowDotScope::RowDotScope(bool on, int64_t max_columns) : saved_(t_row_dots), saved_columns_(t_row_dot_columns) {
    t_row_dots = on ? 1 : 0;
    t_row_dot_columns = max_columns;
}
RowDotScope::~RowDotScope() {
    t_row_dots = saved_;
    t_row_dot_columns = saved_columns_;
}

void set_row_prefetch_bytes(int64_t bytes) { g_prefetch.store(bytes < 0 ? -1 : bytes, std::memory_order_relaxed); }
int64_t row_prefetch_bytes() { return prefetch_distance(); }

} // namespace rp::cpu
