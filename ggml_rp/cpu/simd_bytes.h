// Byte-level AVX2 helpers the int8 kernels share (matvec_dot.cpp's row dots, gemm_int8.cpp's product): loads and
// stores of 32 bytes, nibbles and bit fields of every byte, bits spread to bytes.
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>

#include <cstdint>

namespace rp::cpu::simd {

inline __m256i load256(const void * p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }
inline void store256(void * p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i *>(p), v); }
inline __m256i low4(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
inline __m256i high4(__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
// Bits [s, s+w) of every byte (mask: w ones), moved to [up, up+w) (s + w <= 8 and up + w <= 8): one 16-bit shift by
// the difference and one mask, which keeps in each byte only bits that came from the same byte.
inline __m256i bits(__m256i v, int s, int mask, int up) {
    const __m256i moved = s >= up ? _mm256_srli_epi16(v, s - up) : _mm256_slli_epi16(v, up - s);
    return _mm256_and_si256(moved, _mm256_set1_epi8(char(mask << up)));
}
// Byte j = value where bit j of `bits` is set, else 0.
inline __m256i bit_bytes(uint32_t bits, char value) {
    const __m256i byte_of_bit = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(int(bits)), byte_of_bit);   // byte j = byte j / 8 of bits
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));               // bit j % 8
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(value));
}

// Four rows of 8 dwords transposed within each 128-bit half: b[q] holds dword q of a[0..3] in its low half and dword
// q + 4 of a[0..3] in its high half.
inline void transpose4x4_halves(const __m256i a[4], __m256i b[4]) {
    const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    b[0] = _mm256_unpacklo_epi64(t0, t2);
    b[1] = _mm256_unpackhi_epi64(t0, t2);
    b[2] = _mm256_unpacklo_epi64(t1, t3);
    b[3] = _mm256_unpackhi_epi64(t1, t3);
}

#if defined(__AVX512F__)
// transpose4x4_halves in each 128-bit quarter of a 512-bit register: b[q] holds dword q of a[0..3] in quarters 0 and
// 2, dword q + 4 in quarters 1 and 3 (two 256-bit transposes side by side).
inline void transpose4x4_halves(const __m512i a[4], __m512i b[4]) {
    const __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]), t1 = _mm512_unpackhi_epi32(a[0], a[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]), t3 = _mm512_unpackhi_epi32(a[2], a[3]);
    b[0] = _mm512_unpacklo_epi64(t0, t2);
    b[1] = _mm512_unpackhi_epi64(t0, t2);
    b[2] = _mm512_unpacklo_epi64(t1, t3);
    b[3] = _mm512_unpackhi_epi64(t1, t3);
}
#endif

// Dword j of a[i] -> dword i of a[j] (an 8 x 8 transpose).
inline void transpose8x8(__m256i a[8]) {
    __m256i v[8];   // v[q] (q < 4): dword q of rows 0-3 in its low half, dword q + 4 in its high half; v[4 + q]: rows 4-7
    transpose4x4_halves(a, v);
    transpose4x4_halves(a + 4, v + 4);
    for (int q = 0; q < 4; ++q) {
        a[q] = _mm256_permute2x128_si256(v[q], v[4 + q], 0x20);
        a[q + 4] = _mm256_permute2x128_si256(v[q], v[4 + q], 0x31);
    }
}

} // namespace rp::cpu::simd
#endif
