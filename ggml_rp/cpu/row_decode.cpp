// Vectorized decoding of weight rows, bit-identical to rp::dequantize_row (see row_decode.h).
//
// Each decoder below is its block's dequantize_block_<t> (core/quant_block.h) 16 elements at a time: the same
// per-element float operations, in the same order and with the same operand order (so even a NaN scale gives
// the same NaN). The float arithmetic uses the masked intrinsics with a full mask because GCC contracts the
// plain _mm512_mul_ps / _mm512_sub_ps pair into an FMA under -ffp-contract=fast, which would round once
// instead of twice and change the values; it does not fuse the masked forms.
#include "ggml_rp/cpu/row_decode.h"

#include "ggml_rp/core/quant.h"
#include "ggml_rp/core/quant_block.h"

#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace rp::cpu {

using gguf::TensorType;

namespace {

#if defined(__AVX512F__)
constexpr __mmask16 kAll = 0xFFFF;

inline __m512i u8x16(const uint8_t * p) {
    return _mm512_maskz_cvtepu8_epi32(kAll, _mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
}
inline __m512i i8x16(const int8_t * p) {
    return _mm512_maskz_cvtepi8_epi32(kAll, _mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
}
inline __m512i band(__m512i a, int m) { return _mm512_maskz_and_epi32(kAll, a, _mm512_set1_epi32(m)); }
inline __m512i bor(__m512i a, __m512i b) { return _mm512_maskz_or_epi32(kAll, a, b); }
inline __m512i shr(__m512i a, int s) { return _mm512_maskz_srlv_epi32(kAll, a, _mm512_set1_epi32(s)); }
inline __m512i shl(__m512i a, int s) { return _mm512_maskz_sllv_epi32(kAll, a, _mm512_set1_epi32(s)); }
inline __m512i isub(__m512i a, int b) { return _mm512_maskz_sub_epi32(kAll, a, _mm512_set1_epi32(b)); }
inline __m512 to_float(__m512i v) { return _mm512_maskz_cvtepi32_ps(kAll, v); }
inline __m512 fmul(__m512 a, __m512 b) { return _mm512_maskz_mul_ps(kAll, a, b); }
inline __m512 fadd(__m512 a, __m512 b) { return _mm512_maskz_add_ps(kAll, a, b); }
inline __m512 fsub(__m512 a, __m512 b) { return _mm512_maskz_sub_ps(kAll, a, b); }
inline void store(float * y, __m512 v) { _mm512_storeu_ps(y, v); }

// The 5th bits of a Q5_0 / Q5_1 block: lanes 0..15 take bits first..first+15 of qh.
inline __m512i qh_bits(uint32_t qh, int first) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i sh = _mm512_maskz_add_epi32(kAll, lane, _mm512_set1_epi32(first));
    return band(_mm512_maskz_srlv_epi32(kAll, _mm512_set1_epi32(int(qh)), sh), 1);
}

void decode_q4_0(const block_q4_0 & b, float * y) {     // (q - 8) * d
    const __m512 d = _mm512_set1_ps(fp16_to_fp32(b.d));
    const __m512i q = u8x16(b.qs);
    store(y, fmul(to_float(isub(band(q, 0xF), 8)), d));
    store(y + 16, fmul(to_float(isub(shr(q, 4), 8)), d));
}

void decode_mxfp4(const block_mxfp4 & b, float * y) {  // ggml's doubled E2M1 value of the code, times 2^(e - 128)
    const __m512 d = _mm512_set1_ps(e8m0_to_fp32_half(b.e));
    const __m512i values = _mm512_setr_epi32(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m512i q = u8x16(b.qs);
    store(y, fmul(to_float(_mm512_maskz_permutexvar_epi32(kAll, band(q, 0xF), values)), d));
    store(y + 16, fmul(to_float(_mm512_maskz_permutexvar_epi32(kAll, shr(q, 4), values)), d));
}

void decode_q4_1(const block_q4_1 & b, float * y) {     // q * d + m
    const __m512 d = _mm512_set1_ps(fp16_to_fp32(b.d)), m = _mm512_set1_ps(fp16_to_fp32(b.m));
    const __m512i q = u8x16(b.qs);
    store(y, fadd(fmul(to_float(band(q, 0xF)), d), m));
    store(y + 16, fadd(fmul(to_float(shr(q, 4)), d), m));
}

void decode_q5_0(const block_q5_0 & b, float * y) {     // (q | h << 4) - 16, times d
    const __m512 d = _mm512_set1_ps(fp16_to_fp32(b.d));
    const uint32_t qh = load_le32(b.qh);
    const __m512i q = u8x16(b.qs);
    store(y, fmul(to_float(isub(bor(band(q, 0xF), shl(qh_bits(qh, 0), 4)), 16)), d));
    store(y + 16, fmul(to_float(isub(bor(shr(q, 4), shl(qh_bits(qh, 16), 4)), 16)), d));
}

void decode_q5_1(const block_q5_1 & b, float * y) {     // (q | h << 4) * d + m
    const __m512 d = _mm512_set1_ps(fp16_to_fp32(b.d)), m = _mm512_set1_ps(fp16_to_fp32(b.m));
    const uint32_t qh = load_le32(b.qh);
    const __m512i q = u8x16(b.qs);
    store(y, fadd(fmul(to_float(bor(band(q, 0xF), shl(qh_bits(qh, 0), 4))), d), m));
    store(y + 16, fadd(fmul(to_float(bor(shr(q, 4), shl(qh_bits(qh, 16), 4))), d), m));
}

void decode_q8_0(const block_q8_0 & b, float * y) {     // q * d
    const __m512 d = _mm512_set1_ps(fp16_to_fp32(b.d));
    store(y, fmul(to_float(i8x16(b.qs)), d));
    store(y + 16, fmul(to_float(i8x16(b.qs + 16)), d));
}

void decode_q2_K(const block_q2_K & b, float * y) {     // (d*sc)*q - dmin*m per sub-block of 16
    const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
    for (int n = 0; n < 2; ++n)
        for (int j = 0; j < 4; ++j)
            for (int half = 0; half < 2; ++half) {
                const uint8_t sc = b.scales[8 * n + 2 * j + half];
                const __m512 dl = _mm512_set1_ps(mul_rn(d, float(sc & 0xF)));
                const __m512 ml = _mm512_set1_ps(mul_rn(dmin, float(sc >> 4)));
                const __m512i q = band(shr(u8x16(b.qs + 32 * n + 16 * half), 2 * j), 3);
                store(y + 128 * n + 32 * j + 16 * half, fsub(fmul(dl, to_float(q)), ml));
            }
}

void decode_q3_K(const block_q3_K & b, float * y) {     // (d*sc) * (q - (h ? 0 : 4))
    const float d = fp16_to_fp32(b.d);
    for (int n = 0; n < 2; ++n)
        for (int j = 0; j < 4; ++j) {
            const int hbit = 4 * n + j;
            for (int half = 0; half < 2; ++half) {
                const __m512 dl = _mm512_set1_ps(mul_rn(d, float(q3k_scale(8 * n + 2 * j + half, b.scales))));
                const __m512i lo = band(shr(u8x16(b.qs + 32 * n + 16 * half), 2 * j), 3);
                const __m512i h4 = shl(band(shr(u8x16(b.hmask + 16 * half), hbit), 1), 2);   // 4 where the bit is set
                const __m512i q = _mm512_maskz_add_epi32(kAll, isub(lo, 4), h4);
                store(y + 128 * n + 32 * j + 16 * half, fmul(dl, to_float(q)));
            }
        }
}

// Q4_K and Q5_K: sub-blocks 2c (low nibbles) and 2c+1 (high nibbles) of 32, each (d*sc)*q - dmin*m.
template <bool FIVE_BITS, class Block>
void decode_q45_K(const Block & b, float * y) {
    const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
    for (int c = 0; c < 4; ++c) {
        int sc, m;
        k4_scale_min(2 * c, b.scales, sc, m);
        const __m512 d1 = _mm512_set1_ps(mul_rn(d, float(sc))), m1 = _mm512_set1_ps(mul_rn(dmin, float(m)));
        k4_scale_min(2 * c + 1, b.scales, sc, m);
        const __m512 d2 = _mm512_set1_ps(mul_rn(d, float(sc))), m2 = _mm512_set1_ps(mul_rn(dmin, float(m)));
        for (int h = 0; h < 32; h += 16) {
            const __m512i q = u8x16(b.qs + 32 * c + h);
            __m512i lo = band(q, 0xF), hi = shr(q, 4);
            if constexpr (FIVE_BITS) {
                const __m512i qh = u8x16(b.qh + h);
                lo = bor(lo, shl(band(shr(qh, 2 * c), 1), 4));
                hi = bor(hi, shl(band(shr(qh, 2 * c + 1), 1), 4));
            }
            store(y + 64 * c + h, fsub(fmul(d1, to_float(lo)), m1));
            store(y + 64 * c + 32 + h, fsub(fmul(d2, to_float(hi)), m2));
        }
    }
}

void decode_q6_K(const block_q6_K & b, float * y) {     // (d*sc) * ((ql | qh << 4) - 32) per sub-block of 16
    const float d = fp16_to_fp32(b.d);
    for (int n = 0; n < 2; ++n) {
        const uint8_t * ql = b.ql + 64 * n;
        const uint8_t * qh = b.qh + 32 * n;
        const int8_t * sc = b.scales + 8 * n;
        float * yn = y + 128 * n;
        for (int h = 0; h < 32; h += 16) {
            const int is = h / 16;
            const __m512i a = u8x16(ql + h), c = u8x16(ql + 32 + h), hb = u8x16(qh + h);
            const __m512i q1 = isub(bor(band(a, 0xF), shl(band(hb, 3), 4)), 32);
            const __m512i q2 = isub(bor(band(c, 0xF), shl(band(shr(hb, 2), 3), 4)), 32);
            const __m512i q3 = isub(bor(shr(a, 4), shl(band(shr(hb, 4), 3), 4)), 32);
            const __m512i q4 = isub(bor(shr(c, 4), shl(shr(hb, 6), 4)), 32);
            store(yn + h, fmul(_mm512_set1_ps(mul_rn(d, float(sc[is + 0]))), to_float(q1)));
            store(yn + 32 + h, fmul(_mm512_set1_ps(mul_rn(d, float(sc[is + 2]))), to_float(q2)));
            store(yn + 64 + h, fmul(_mm512_set1_ps(mul_rn(d, float(sc[is + 4]))), to_float(q3)));
            store(yn + 96 + h, fmul(_mm512_set1_ps(mul_rn(d, float(sc[is + 6]))), to_float(q4)));
        }
    }
}

// Whole blocks only; false (nothing written) for a partial one, which rp::dequantize_row reports.
template <class Block, int QK, void (*DECODE)(const Block &, float *)>
bool decode_blocks(const void * src, float * dst, int64_t n) {
    if (n % QK != 0) return false;
    const Block * blk = static_cast<const Block *>(src);
    for (int64_t i = 0; i < n / QK; ++i) DECODE(blk[i], dst + i * QK);
    return true;
}
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
// MXFP4 on AVX2 (gpt-oss's experts; the scalar reference is a branch an element): the codes' values by one byte
// shuffle, widened and converted exactly, times the power-of-two scale (one rounding, as dequantize_block_mxfp4's
// mul_rn: no add follows that could fuse with it).
void decode_mxfp4_avx2(const block_mxfp4 & b, float * y) {
    const __m256 d = _mm256_set1_ps(e8m0_to_fp32_half(b.e));
    const __m128i values = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b.qs)), nibble = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_shuffle_epi8(values, _mm_and_si128(q, nibble));                      // elements 0..15
    const __m128i hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(q, 4), nibble));  // elements 16..31
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])), d));
}
#endif

// bf16 is the upper half of an f32: a 16-bit shift, exact.
void decode_bf16(const uint16_t * h, float * dst, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        // (maskz forms with full masks: GCC 12 warns falsely on the plain ones)
        const __m512i w = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + i)));
        _mm512_storeu_si512(dst + i, _mm512_maskz_slli_epi32(0xFFFF, w, 16));
    }
#elif defined(__AVX2__)
    for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + i)));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst + i), _mm256_slli_epi32(w, 16));
    }
#endif
    for (; i < n; ++i) {
        const uint32_t bits = uint32_t(h[i]) << 16;
        std::memcpy(dst + i, &bits, sizeof bits);
    }
}

} // namespace

void decode_row(TensorType t, const void * src, float * dst, int64_t n) {
    if (t == TensorType::BF16) return decode_bf16(static_cast<const uint16_t *>(src), dst, n);
#if defined(__F16C__)
    if (t == TensorType::F16) {   // the F16C conversion is exact, as fp16_to_fp32
        const uint16_t * h = static_cast<const uint16_t *>(src);
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + i))));
        if (i < n) dequantize_row(t, h + i, dst + i, n - i);
        return;
    }
#endif
#if defined(__AVX512F__)
    bool done = false;
    switch (t) {
    case TensorType::Q4_0: done = decode_blocks<block_q4_0, QK4_0, decode_q4_0>(src, dst, n); break;
    case TensorType::Q4_1: done = decode_blocks<block_q4_1, QK4_1, decode_q4_1>(src, dst, n); break;
    case TensorType::Q5_0: done = decode_blocks<block_q5_0, QK5_0, decode_q5_0>(src, dst, n); break;
    case TensorType::Q5_1: done = decode_blocks<block_q5_1, QK5_1, decode_q5_1>(src, dst, n); break;
    case TensorType::Q8_0: done = decode_blocks<block_q8_0, QK8_0, decode_q8_0>(src, dst, n); break;
    case TensorType::Q2_K: done = decode_blocks<block_q2_K, QK_K, decode_q2_K>(src, dst, n); break;
    case TensorType::Q3_K: done = decode_blocks<block_q3_K, QK_K, decode_q3_K>(src, dst, n); break;
    case TensorType::Q4_K: done = decode_blocks<block_q4_K, QK_K, decode_q45_K<false, block_q4_K>>(src, dst, n); break;
    case TensorType::Q5_K: done = decode_blocks<block_q5_K, QK_K, decode_q45_K<true, block_q5_K>>(src, dst, n); break;
    case TensorType::Q6_K: done = decode_blocks<block_q6_K, QK_K, decode_q6_K>(src, dst, n); break;
    case TensorType::MXFP4: done = decode_blocks<block_mxfp4, QK_MXFP4, decode_mxfp4>(src, dst, n); break;
    default: break;
    }
    if (done) return;
#elif defined(__AVX2__)
    if (t == TensorType::MXFP4 && n % QK_MXFP4 == 0) {
        const block_mxfp4 * blk = static_cast<const block_mxfp4 *>(src);
        for (int64_t i = 0; i < n / QK_MXFP4; ++i) decode_mxfp4_avx2(blk[i], dst + i * QK_MXFP4);
        return;
    }
#endif
    dequantize_row(t, src, dst, n);
}

} // namespace rp::cpu
