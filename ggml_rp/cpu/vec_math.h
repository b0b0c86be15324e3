// Small vector-friendly math for the softmax loops of the CPU kernels (attention, cross-entropy, SiLU).
//
// vec_exp: exp(x) written so that a loop over it vectorizes under the project's flags
// (std::exp does not without -ffast-math): no branches, no float->int conversion, no floor.
// Cody-Waite reduction x = n ln2 + r (|r| <= ln2/2), n rounded with the 1.5*2^23 trick so the bits of the sum
// hold n, then a degree-6 polynomial for e^r. Relative error below 3e-7 (tests/kernels check it) for
// x in [-87, 88]; x below -87, including -inf (masked scores), gives exactly 0.
//
// exp_affine: vec_exp(x * mul - sub) over a row. GCC does not vectorize vec_exp's selects where it cannot prove
// the comparisons raise nothing (AVX2 builds: scalar, a large part of attention's time), so the
// row form spells the same operations out in 8-lane AVX2 vectors: every step is one IEEE operation (the fmas
// written as such), lane for lane, so the vector lanes and the scalar tail give the bits vec_exp gives.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace rp::cpu {

inline float vec_exp(float x) {
    const bool underflow = x < -87.0f;
    x = underflow ? -87.0f : (x > 88.0f ? 88.0f : x);
    constexpr float kRound = 12582912.0f;   // 1.5 * 2^23: adding it rounds to an integer kept in the low bits
    const float t = std::fma(x, 1.44269504088896341f, kRound);
    const float n = t - kRound;
    float r = std::fma(n, -0.693145751953125f, x);   // ln2 split into a part exact in float ...
    r = std::fma(n, -1.428606765330187e-06f, r);      // ... and the rest
    float p = 1.0f / 720.0f;
    p = std::fma(p, r, 1.0f / 120.0f);
    p = std::fma(p, r, 1.0f / 24.0f);
    p = std::fma(p, r, 1.0f / 6.0f);
    p = std::fma(p, r, 0.5f);
    p = std::fma(p, r, 1.0f);
    p = std::fma(p, r, 1.0f);
    // 2^n from its exponent bits: bits(t) = bits(kRound) + n, and n + 127 is in [1, 254] after the clamp.
    const float two_n = std::bit_cast<float>((std::bit_cast<uint32_t>(t) - 0x4B400000u + 127u) << 23);
    return underflow ? 0.0f : p * two_n;
}

#if defined(__AVX2__) && defined(__FMA__)
// vec_exp on 8 lanes, the same operations in the same order.
inline __m256 vec_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(lo, x));   // (max/min return x when it is NaN)
    const __m256 round = _mm256_set1_ps(12582912.0f);
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), round);
    const __m256 n = _mm256_sub_ps(t, round);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693145751953125f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B400000)),
                                                         _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
#endif

// y[j] = vec_exp(x[j] * mul - sub) for j < n, x * mul - sub as one fma (y may be x): the same bits whichever
// lanes take an element.
inline void exp_affine(const float * x, float * y, int64_t n, float mul, float sub) {
    int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 m = _mm256_set1_ps(mul), s = _mm256_set1_ps(sub);
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(y + j, vec_exp8(_mm256_fmsub_ps(_mm256_loadu_ps(x + j), m, s)));
#endif
    for (; j < n; ++j) y[j] = vec_exp(std::fma(x[j], mul, -sub));
}

// Max of init and x[0..n) (NaNs skipped, as x > m ? x : m does): 8 lanes (element j goes to lane j % 8 while
// 8 remain), combined in a tree, then the rest in order. The same value whatever the build (max is exact);
// the tree keeps a short row (a 64-key attention block) from paying a 16-step serial combine.
inline float max_of(const float * x, int64_t n, float init) {
    float m[8];
    int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_set1_ps(init);
    for (; j + 8 <= n; j += 8) acc = _mm256_max_ps(_mm256_loadu_ps(x + j), acc);   // (x > acc ? x : acc)
    _mm256_storeu_ps(m, acc);
#else
    for (float & v : m) v = init;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; ++l) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
#endif
    auto mx = [](float a, float b) { return a > b ? a : b; };
    float r = mx(mx(mx(m[0], m[4]), mx(m[2], m[6])), mx(mx(m[1], m[5]), mx(m[3], m[7])));
    for (; j < n; ++j) r = mx(x[j], r);
    return r;
}

// exp_affine that also returns the sum of the values it wrote, in one order whatever the build: 8 lane sums
// (element j into lane j % 8 while 8 remain), combined ((0+4)+(2+6))+((1+5)+(3+7)), then the rest in order.
inline float exp_affine_sum(const float * x, float * y, int64_t n, float mul, float sub) {
    float lanes[8] = {};
    int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 m = _mm256_set1_ps(mul), s = _mm256_set1_ps(sub);
    __m256 acc = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        const __m256 e = vec_exp8(_mm256_fmsub_ps(_mm256_loadu_ps(x + j), m, s));
        _mm256_storeu_ps(y + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    _mm256_storeu_ps(lanes, acc);
#else
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; ++l) lanes[l] += y[j + l] = vec_exp(std::fma(x[j + l], mul, -sub));
#endif
    float sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    for (; j < n; ++j) sum += y[j] = vec_exp(std::fma(x[j], mul, -sub));
    return sum;
}

} // namespace rp::cpu
