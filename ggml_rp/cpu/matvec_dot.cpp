// One-token dot products of weight rows with a prepared column (see matvec_dot.h for the numerics).
//
// Every row's sum is formed in one fixed order: per sub-block an exact int32 sum (int8 types) or per pair of
// elements a product pair (bf16) or an FMA (f32), accumulated into per-lane f32 accumulators in element order,
// the lanes added at the end in a fixed order; the int8 types' min / offset terms are accumulated separately
// and subtracted last. The portable loops (CPUs without AVX-512 VNNI / BF16) have the same numerics in
// another float order.
#include "ggml_rp/cpu/matvec_dot.h"

#include "ggml_rp/core/quant_block.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define RP_INT8_SIMD 1
#endif
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define RP_BF16_SIMD 1
#endif
#if defined(__AVX512F__) || defined(__F16C__)
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

#if defined(__AVX512F__)
// The 8 lanes added in a fixed order.
inline float hsum(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#endif

#if defined(RP_INT8_SIMD)
inline __m256i load256(const void * p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }
inline __m256i dot_u8s8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
inline __m256i low4(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
inline __m256i high4(__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
// Bits [s, s+w) of every byte, shifted up by `up` (w + up <= 8, so nothing crosses a byte).
inline __m256i bits(__m256i v, int s, int mask, int up) {
    const __m256i b = _mm256_and_si256(_mm256_srli_epi16(v, s), _mm256_set1_epi8(char(mask)));
    return _mm256_slli_epi16(b, up);
}
#endif

// Q4_0, Q4_1, Q5_0, Q5_1: blocks of 32, element j in the low nibble of qs[j] (j < 16) or the high nibble of
// qs[j - 16], Q5's fifth bit j in qh. w = d (q - 8) / d (q - 16) or w = d q + m, so per block
// y = d d_b (sum q q') - offset d (d_b sum q')  or  d d_b (sum q q') + m (d_b sum q').
template <class Block, bool FIVE_BITS, bool HAS_MIN>
float dot_q45_small(const Block * w, const DotColumn & x) {
    const int64_t nb = x.K / 32;
    constexpr float offset = HAS_MIN ? 0.0f : (FIVE_BITS ? 16.0f : 8.0f);
    float extra = 0.0f;   // the offset or min terms
#if defined(RP_INT8_SIMD)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
#else
    float acc = 0.0f;
#endif
    for (int64_t b = 0; b < nb; ++b) {
        const Block & blk = w[b];
        const float d = half_to_float(blk.d), dx = x.d[size_t(b)];
        const float xsum = x.dsum16[size_t(2 * b)] + x.dsum16[size_t(2 * b + 1)];
        if constexpr (HAS_MIN) extra += half_to_float(blk.m) * xsum;
        else extra -= offset * d * xsum;
#if defined(RP_INT8_SIMD)
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk.qs));
        const __m128i m4 = _mm_set1_epi8(0x0F);
        __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
        if constexpr (FIVE_BITS) v = _mm256_or_si256(v, _mm256_maskz_mov_epi8(__mmask32(load_le32(blk.qh)), _mm256_set1_epi8(0x10)));
        const __m256i s = dot_u8s8(v, load256(x.q.data() + 32 * b));
        const __m256 scale = _mm256_set1_ps(d * dx);
        if (b % 2 == 0) acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc0);
        else acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc1);
#else
        uint32_t qh = 0;
        if constexpr (FIVE_BITS) qh = load_le32(blk.qh);
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) {
            int q = j < 16 ? (blk.qs[j] & 0xF) : (blk.qs[j - 16] >> 4);
            if constexpr (FIVE_BITS) q |= int((qh >> j) & 1u) << 4;
            s += q * x.q[size_t(32 * b + j)];
        }
        acc += float(s) * (d * dx);
#endif
    }
#if defined(RP_INT8_SIMD)
    return hsum(_mm256_add_ps(acc0, acc1)) + extra;
#else
    return acc + extra;
#endif
}

float dot_q8_0(const block_q8_0 * w, const DotColumn & x) {
    const int64_t nb = x.K / QK8_0;
#if defined(RP_INT8_SIMD)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const __m256i wq = load256(w[b].qs), xq = load256(x.q.data() + 32 * b);
        // |w| (unsigned) times x with w's sign: the exact products, in the u8 x s8 form VNNI multiplies.
        const __m256i s = dot_u8s8(_mm256_abs_epi8(wq), _mm256_sign_epi8(xq, wq));
        const __m256 scale = _mm256_set1_ps(half_to_float(w[b].d) * x.d[size_t(b)]);
        if (b % 2 == 0) acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc0);
        else acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc1);
    }
    return hsum(_mm256_add_ps(acc0, acc1));
#else
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
        int32_t s = 0;
        for (int i = 0; i < QK8_0; ++i) s += int32_t(w[b].qs[i]) * x.q[size_t(32 * b + i)];
        acc += float(s) * (half_to_float(w[b].d) * x.d[size_t(b)]);
    }
    return acc;
#endif
}

// Q4_K and Q5_K: per super-block of 256, sub-blocks j = 0..7 of 32 with w = (d*sc_j) q - (dmin*m_j).
template <bool FIVE_BITS, class Block>
float dot_q45_K(const Block * w, const DotColumn & x) {
    const int64_t nsb = x.K / QK_K;
    float mins = 0.0f;
#if defined(RP_INT8_SIMD)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
#else
    float acc = 0.0f;
#endif
    for (int64_t s = 0; s < nsb; ++s) {
        const Block & b = w[s];
        const float d = half_to_float(b.d), dmin = half_to_float(b.dmin);
        const int8_t * xq = x.q.data() + QK_K * s;
        const float * xd = x.d.data() + 8 * s;
        const float * xs = x.dsum16.data() + 16 * s;
#if defined(RP_INT8_SIMD)
        __m256i qh = _mm256_setzero_si256();
        if constexpr (FIVE_BITS) qh = load256(b.qh);
#endif
        for (int c = 0; c < 4; ++c) {
            int sc_a, m_a, sc_b, m_b;
            k4_scale_min(2 * c, b.scales, sc_a, m_a);
            k4_scale_min(2 * c + 1, b.scales, sc_b, m_b);
            mins += dmin * float(m_a) * (xs[4 * c] + xs[4 * c + 1]) + dmin * float(m_b) * (xs[4 * c + 2] + xs[4 * c + 3]);
#if defined(RP_INT8_SIMD)
            const __m256i q = load256(b.qs + 32 * c);
            __m256i lo = low4(q), hi = high4(q);
            if constexpr (FIVE_BITS) {
                lo = _mm256_or_si256(lo, bits(qh, 2 * c, 1, 4));
                hi = _mm256_or_si256(hi, bits(qh, 2 * c + 1, 1, 4));
            }
            const __m256i sa = dot_u8s8(lo, load256(xq + 64 * c)), sb = dot_u8s8(hi, load256(xq + 64 * c + 32));
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_set1_ps(d * float(sc_a) * xd[2 * c]), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sb), _mm256_set1_ps(d * float(sc_b) * xd[2 * c + 1]), acc1);
#else
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
#endif
        }
    }
#if defined(RP_INT8_SIMD)
    return hsum(_mm256_add_ps(acc0, acc1)) - mins;
#else
    return acc - mins;
#endif
}

// Q2_K and Q3_K: per super-block of 256, groups g = 4n + j of 32 elements 128n + 32j + l (l < 32) whose 2-bit
// quants are bits 2j of qs[32n + l]; sub-block s = 2g + l / 16 has its own scale. Q2_K: w = (d*sc_s) q -
// (dmin*m_s), q in [0, 3]. Q3_K: w = (d*sc_s) (u - 4), u = q + 4 * (bit 4n + j of hmask[l]) in [0, 7], sc_s
// signed. So per sub-block y = d sc_s d_b (sum u q') - (dmin m_s | 4 d sc_s) (d_b sum q'), the second term from
// dsum16, accumulated apart and subtracted last (as Q4_K's mins and Q6_K's offset).
template <bool Q3>
float dot_q23_K(const void * row, const DotColumn & x) {
    const int64_t nsb = x.K / QK_K;
    float offset = 0.0f;
#if defined(RP_INT8_SIMD)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
#else
    float acc = 0.0f;
#endif
    for (int64_t sb = 0; sb < nsb; ++sb) {
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
        for (int n = 0; n < 2; ++n) {
#if defined(RP_INT8_SIMD)
            const __m256i q = load256(qs + 32 * n);
            __m256i hm = _mm256_setzero_si256();
            if constexpr (Q3) hm = load256(hmask);
#endif
            for (int j = 0; j < 4; ++j) {
                const int g = 4 * n + j;
                const float dx = xd[g];
#if defined(RP_INT8_SIMD)
                __m256i u = bits(q, 2 * j, 3, 0);
                if constexpr (Q3) u = _mm256_or_si256(u, bits(hm, g, 1, 2));
                const __m256i p = dot_u8s8(u, load256(xq + 32 * g));
                const __m256 scale = _mm256_set_m128(_mm_set1_ps(d * float(sc[2 * g + 1]) * dx), _mm_set1_ps(d * float(sc[2 * g]) * dx));
                if (j % 2 == 0) acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc0);
                else acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc1);
#else
                int32_t sa = 0, sb2 = 0;
                for (int l = 0; l < 32; ++l) {
                    int u = (qs[32 * n + l] >> (2 * j)) & 3;
                    if constexpr (Q3) u |= ((hmask[l] >> g) & 1) << 2;
                    (l < 16 ? sa : sb2) += u * xq[32 * g + l];
                }
                acc += float(sa) * (d * float(sc[2 * g]) * dx) + float(sb2) * (d * float(sc[2 * g + 1]) * dx);
#endif
            }
        }
    }
#if defined(RP_INT8_SIMD)
    return hsum(_mm256_add_ps(acc0, acc1)) - offset;
#else
    return acc - offset;
#endif
}

// Q6_K: sub-blocks of 16 with w = (d*sc) (q - 32), q in [0, 63].
float dot_q6_K(const block_q6_K * w, const DotColumn & x) {
    const int64_t nsb = x.K / QK_K;
#if defined(RP_INT8_SIMD)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 offs0 = _mm256_setzero_ps(), offs1 = _mm256_setzero_ps();
#else
    float acc = 0.0f, off = 0.0f;
#endif
    for (int64_t s = 0; s < nsb; ++s) {
        const block_q6_K & b = w[s];
        const float d = half_to_float(b.d);
        const int8_t * xq = x.q.data() + QK_K * s;
        const float * xd = x.d.data() + 8 * s;
        const float * xs = x.dsum16.data() + 16 * s;
#if defined(RP_INT8_SIMD)
        // The -32 of every element: d * sum over sub-blocks of sc * (d_b * sum q'), 16 sub-blocks at once.
        const __m128i sc16 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b.scales));
        const __m256 dv = _mm256_set1_ps(d);
        offs0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc16)), dv), _mm256_loadu_ps(xs), offs0);
        offs1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc16, 8))), dv),
                                _mm256_loadu_ps(xs + 8), offs1);
        for (int n = 0; n < 2; ++n) {
            const __m256i a = load256(b.ql + 64 * n), c = load256(b.ql + 64 * n + 32), h = load256(b.qh + 32 * n);
            const __m256i q[4] = {_mm256_or_si256(low4(a), bits(h, 0, 3, 4)), _mm256_or_si256(low4(c), bits(h, 2, 3, 4)),
                                  _mm256_or_si256(high4(a), bits(h, 4, 3, 4)), _mm256_or_si256(high4(c), bits(h, 6, 3, 4))};
            for (int k = 0; k < 4; ++k) {
                const int sub = 8 * n + 2 * k;   // elements 16*sub .. 16*sub + 31: sub-blocks sub and sub + 1
                const float dx = xd[4 * n + k];
                const __m256 scale = _mm256_set_m128(_mm_set1_ps(d * float(b.scales[sub + 1]) * dx),
                                                     _mm_set1_ps(d * float(b.scales[sub]) * dx));
                const __m256i p = dot_u8s8(q[k], load256(xq + 128 * n + 32 * k));
                if (k % 2 == 0) acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc0);
                else acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc1);
            }
        }
#else
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
#endif
    }
#if defined(RP_INT8_SIMD)
    return hsum(_mm256_add_ps(acc0, acc1)) - 32.0f * hsum(_mm256_add_ps(offs0, offs1));
#else
    return acc - 32.0f * off;
#endif
}

#if defined(__AVX512F__)
// The 16 lanes added in a fixed order (through memory: GCC 12 warns falsely on the 512-bit extracts).
inline float hsum512(__m512 v) {
    alignas(64) float t[16];
    _mm512_store_ps(t, v);
    return hsum(_mm256_add_ps(_mm256_load_ps(t), _mm256_load_ps(t + 8)));
}
// 16 weights from element k of an f32 / f16 row as floats (m: the lanes to load, the others 0).
template <TensorType WT>
inline __m512 load16(const void * row, int64_t k, __mmask16 m) {
    if constexpr (WT == TensorType::F32) return _mm512_maskz_loadu_ps(m, static_cast<const float *>(row) + k);
    else return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t *>(row) + k));
}
#endif

// F32 and F16 rows: one FMA chain per lane over 32 elements at a time (2 accumulators), then the lanes.
template <TensorType WT>
float dot_float(const void * row, const float * x, int64_t K) {
#if defined(__AVX512F__)
    // 4 chains: 2 FMA ports x 4 cycles of latency would want 8, but the loads, not the FMAs, are the limit.
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        a0 = _mm512_fmadd_ps(load16<WT>(row, k, 0xFFFF), _mm512_loadu_ps(x + k), a0);
        a1 = _mm512_fmadd_ps(load16<WT>(row, k + 16, 0xFFFF), _mm512_loadu_ps(x + k + 16), a1);
        a2 = _mm512_fmadd_ps(load16<WT>(row, k + 32, 0xFFFF), _mm512_loadu_ps(x + k + 32), a2);
        a3 = _mm512_fmadd_ps(load16<WT>(row, k + 48, 0xFFFF), _mm512_loadu_ps(x + k + 48), a3);
    }
    for (; k < K; k += 16) {
        const __mmask16 m = __mmask16(K - k >= 16 ? 0xFFFF : (1u << (K - k)) - 1);
        a0 = _mm512_fmadd_ps(load16<WT>(row, k, m), _mm512_maskz_loadu_ps(m, x + k), a0);
    }
    return hsum512(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#else
    float acc = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
        float w;
        if constexpr (WT == TensorType::F32) w = static_cast<const float *>(row)[k];
        else w = half_to_float(static_cast<const uint16_t *>(row)[k]);
        acc += w * x[k];
    }
    return acc;
#endif
}

// BF16 rows with a bf16 column: each product exact in f32, summed in f32.
float dot_bf16(const uint16_t * w, const uint16_t * x, int64_t K) {
#if defined(RP_BF16_SIMD)
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + k), (__m512bh)_mm512_loadu_si512(x + k));
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w + k + 32), (__m512bh)_mm512_loadu_si512(x + k + 32));
    }
    for (; k < K; k += 32) {   // a partial tail loads zeros past K
        const __mmask32 m = K - k >= 32 ? 0xFFFFFFFFu : (__mmask32(1) << (K - k)) - 1;
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_maskz_loadu_epi16(m, w + k), (__m512bh)_mm512_maskz_loadu_epi16(m, x + k));
    }
    return hsum512(_mm512_add_ps(a0, a1));
#else
    float acc = 0.0f;
    for (int64_t k = 0; k < K; ++k) acc += bf16_to_fp32(w[k]) * bf16_to_fp32(x[k]);
    return acc;
#endif
}

} // namespace

void quantize_column(const float * x, int64_t K, DotColumn & out) {
    out.K = K;
    out.q.resize(size_t(K));
    out.d.resize(size_t(K / 32));
    out.dsum16.resize(size_t(K / 16));
    for (int64_t b = 0; b < K / 32; ++b) {
        const float * xb = x + 32 * b;
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
    }
}

void prepare_column(TensorType t, const float * x, int64_t K, DotColumn & out) {
    out.K = K;
    out.x = x;
    if (t == TensorType::BF16) {
        out.bf16.resize(size_t(K));
        for (int64_t k = 0; k < K; ++k) out.bf16[size_t(k)] = fp32_to_bf16(x[k]);
    } else if (t != TensorType::F32 && t != TensorType::F16) {
        quantize_column(x, K, out);
    }
}

bool row_dot_supports(TensorType t, int64_t K) {
    switch (t) {
    case TensorType::F32: case TensorType::F16: case TensorType::BF16: return K > 0;
    case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1:
    case TensorType::Q8_0: return K > 0 && K % 32 == 0;
    case TensorType::Q2_K: case TensorType::Q3_K: case TensorType::Q4_K: case TensorType::Q5_K: case TensorType::Q6_K:
        return K > 0 && K % QK_K == 0;
    default: return false;
    }
}

float row_dot(TensorType t, const void * row, const DotColumn & x) {
    switch (t) {
    case TensorType::F32: return dot_float<TensorType::F32>(row, x.x, x.K);
    case TensorType::F16: return dot_float<TensorType::F16>(row, x.x, x.K);
    case TensorType::BF16: return dot_bf16(static_cast<const uint16_t *>(row), x.bf16.data(), x.K);
    case TensorType::Q4_0: return dot_q45_small<block_q4_0, false, false>(static_cast<const block_q4_0 *>(row), x);
    case TensorType::Q4_1: return dot_q45_small<block_q4_1, false, true>(static_cast<const block_q4_1 *>(row), x);
    case TensorType::Q5_0: return dot_q45_small<block_q5_0, true, false>(static_cast<const block_q5_0 *>(row), x);
    case TensorType::Q5_1: return dot_q45_small<block_q5_1, true, true>(static_cast<const block_q5_1 *>(row), x);
    case TensorType::Q8_0: return dot_q8_0(static_cast<const block_q8_0 *>(row), x);
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

bool row_dot_is_simd(TensorType t) {
    switch (t) {
#if defined(__AVX512F__)
    case TensorType::F32: case TensorType::F16: return true;
#endif
#if defined(RP_BF16_SIMD)
    case TensorType::BF16: return true;
#endif
#if defined(RP_INT8_SIMD)
    case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1:
    case TensorType::Q8_0: case TensorType::Q2_K: case TensorType::Q3_K: case TensorType::Q4_K: case TensorType::Q5_K:
    case TensorType::Q6_K: return true;
#endif
    default: return false;
    }
}

void set_row_dots(bool on) { g_row_dots.store(on, std::memory_order_relaxed); }
bool row_dots() { return g_row_dots.load(std::memory_order_relaxed); }

} // namespace rp::cpu
