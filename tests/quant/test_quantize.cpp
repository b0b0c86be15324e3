// Quantizers: hand-derived bytes of ggml's reference quantizers on small examples, and quantize -> dequantize
// error bounds on random data (bounds derived from the scale each format defines, computed here in double).
#include "ggml_rp/core/quant.h"
#include "base/error.h"
#include "quant_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace {

using gguf::TensorType;

std::vector<uint8_t> quantize(TensorType t, const std::vector<float> & x, size_t bytes) {
    std::vector<uint8_t> out(bytes, 0xAA);
    rp::quantize_row(t, x.data(), out.data(), static_cast<int64_t>(x.size()));
    return out;
}

std::vector<float> dequantize(TensorType t, const std::vector<uint8_t> & q, size_t n) {
    std::vector<float> y(n);
    rp::dequantize_row(t, q.data(), y.data(), static_cast<int64_t>(n));
    return y;
}

std::vector<uint8_t> bytes_of(std::initializer_list<int> v) {
    std::vector<uint8_t> b;
    for (int x : v) b.push_back(static_cast<uint8_t>(x));
    return b;
}

} // namespace

// ---- ggml's reference bytes, derived by hand ------------------------------------------------------------

TEST(QuantizeBytes, Q8_0) {
    // amax 127 -> d = 1 (f16 0x3C00), q = round(x) with halves away from zero.
    std::vector<float> x(32, 0.0f);
    const float v[] = {127, -127, 0.4f, 0.5f, -0.5f, 1.5f, 2.5f, -2.5f, 3.49f, -3.51f, 100.2f};
    std::copy(std::begin(v), std::end(v), x.begin());
    std::vector<uint8_t> want = bytes_of({0x00, 0x3C,  // d
                                          0x7F, 0x81, 0x00, 0x01, 0xFF, 0x02, 0x03, 0xFD, 0x03, 0xFC, 0x64});
    want.resize(34, 0);
    EXPECT_EQ(quantize(TensorType::Q8_0, x, 34), want);
    // amax 63.5 -> d = 0.5 (0x3800), 1/d = 2: 1.3 -> 2.6 -> 3, 0.2 -> 0, -1.25 -> -2.5 -> -3.
    std::vector<float> x2(32, 0.0f);
    x2[0] = -63.5f, x2[1] = 1.3f, x2[2] = 0.2f, x2[3] = -1.25f;
    std::vector<uint8_t> want2 = bytes_of({0x00, 0x38, 0x81, 0x03, 0x00, 0xFD});
    want2.resize(34, 0);
    EXPECT_EQ(quantize(TensorType::Q8_0, x2, 34), want2);
    // All zeros: d = 0 and q = 0.
    EXPECT_EQ(quantize(TensorType::Q8_0, std::vector<float>(32, 0.0f), 34), std::vector<uint8_t>(34, 0));
}

TEST(QuantizeBytes, Q4_0) {
    // The value of largest magnitude is -8 (first seen; the later +8 ties and does not replace it), so d = -8/-8
    // = 1 and q = min(15, trunc(x + 8.5)). Byte j = q[j] | q[j+16] << 4.
    std::vector<float> x(32, 0.0f);
    x[0] = -8, x[1] = 7.4f, x[2] = -0.5f, x[3] = 0.49f, x[4] = 0.5f, x[5] = 8, x[6] = -7.6f, x[7] = -7.4f;
    x[16] = 3, x[17] = -3, x[31] = 6.6f;
    // q: 0, 15, 8, 8, 9, 15 (16 clamped), 0, 1, ...8...; q[16] = 11, q[17] = 5, q[31] = 15 (15.1)
    std::vector<uint8_t> want = bytes_of({0x00, 0x3C, 0xB0, 0x5F, 0x88, 0x88, 0x89, 0x8F, 0x80, 0x81,
                                          0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0xF8});
    EXPECT_EQ(quantize(TensorType::Q4_0, x, 18), want);
    // Mirror: +8 seen first -> d = -1 (0xBC00), 1/d = -1; -8 -> 16.5 -> 15; +8 -> 0.5 -> 0.
    std::vector<float> y(32, 0.0f);
    y[0] = 8, y[1] = -8, y[16] = 2.2f;  // 2.2 -> -2.2 + 8.5 = 6.3 -> 6
    std::vector<uint8_t> want2 = bytes_of({0x00, 0xBC, 0x60, 0x8F});
    want2.resize(18, 0x88);
    EXPECT_EQ(quantize(TensorType::Q4_0, y, 18), want2);
    // Zeros: d = 0 / -8 = -0 (f16 0x8000), 1/d taken as 0, every q = trunc(8.5) = 8.
    std::vector<uint8_t> want3(18, 0x88);
    want3[0] = 0x00, want3[1] = 0x80;
    EXPECT_EQ(quantize(TensorType::Q4_0, std::vector<float>(32, 0.0f), 18), want3);
}

TEST(QuantizeBytes, Q4_1) {
    // min -1, max 14 -> d = 15/15 = 1 (0x3C00), m = -1 (0xBC00); q = min(15, trunc(x + 1 + 0.5)).
    std::vector<float> x(32, 0.0f);
    x[0] = -1, x[16] = 14, x[1] = 2.4f, x[17] = 2.5f;  // q: 0, 15, 3, 4; zeros -> 1
    std::vector<uint8_t> want = bytes_of({0x00, 0x3C, 0x00, 0xBC, 0xF0, 0x43});
    want.resize(20, 0x11);
    EXPECT_EQ(quantize(TensorType::Q4_1, x, 20), want);
    // A constant block: d = 0, m = the constant (2.0 = 0x4000), q = 0.
    std::vector<uint8_t> want2 = bytes_of({0x00, 0x00, 0x00, 0x40});
    want2.resize(20, 0);
    const std::vector<uint8_t> got2 = quantize(TensorType::Q4_1, std::vector<float>(32, 2.0f), 20);
    EXPECT_EQ(got2, want2);
    EXPECT_EQ(dequantize(TensorType::Q4_1, got2, 32), std::vector<float>(32, 2.0f));
}

TEST(QuantizeBytes, Q5_0) {
    // max -16 -> d = 1; q = min(31, trunc(x + 16.5)); low nibbles in qs, bit 4 of element e in qh bit e.
    std::vector<float> x(32, 0.0f);
    x[0] = -16, x[1] = 15.2f, x[2] = 0.5f, x[16] = 16, x[17] = -0.6f;
    // q: e0 0, e1 31, e2 17, e3..15 16, e16 31 (32 clamped), e17 15, e18..31 16.
    // qs: [0] 0|15<<4, [1] 15|15<<4, [2] 1|0<<4, rest 0. qh: every bit but 0 and 17 -> 0xFFFDFFFE.
    std::vector<uint8_t> want = bytes_of({0x00, 0x3C, 0xFE, 0xFF, 0xFD, 0xFF, 0xF0, 0xFF, 0x01});
    want.resize(22, 0);
    EXPECT_EQ(quantize(TensorType::Q5_0, x, 22), want);
}

TEST(QuantizeBytes, Q5_1) {
    // min 0, max 31 -> d = 1, m = 0; q = trunc(x + 0.5).
    std::vector<float> x(32, 3.0f);
    x[0] = 0, x[1] = 31, x[2] = 16.4f, x[3] = 16.5f, x[16] = 7.49f, x[17] = 1;
    // q: e0 0, e1 31, e2 16, e3 17, e4..15 3, e16 7, e17 1, e18..31 3. qh = bits 1, 2, 3 = 0x0E.
    std::vector<uint8_t> want = bytes_of({0x00, 0x3C, 0x00, 0x00, 0x0E, 0x00, 0x00, 0x00, 0x70, 0x1F, 0x30, 0x31});
    want.resize(24, 0x33);
    EXPECT_EQ(quantize(TensorType::Q5_1, x, 24), want);
}

TEST(QuantizeBytes, F16AndBf16) {
    const std::vector<float> x = {1.0f, 65504.0f, 1.0f / 3.0f, std::ldexp(1.0f, -24), -2.0f, 1e6f};
    // 1/3 = 0x3555 (0.333251953), 1e6 overflows to inf.
    const std::vector<uint8_t> want = bytes_of({0x00, 0x3C, 0xFF, 0x7B, 0x55, 0x35,
                                                0x01, 0x00, 0x00, 0xC0, 0x00, 0x7C});
    EXPECT_EQ(quantize(TensorType::F16, x, 12), want);
    // bf16: 1/3 = 0x3EAAAAAB -> 0x3EAB (round up: low half 0xAAAB > 0x8000); 65504 = 0x477FE000 -> 0x4780.
    const std::vector<uint8_t> wantb = bytes_of({0x80, 0x3F, 0x80, 0x47, 0xAB, 0x3E,
                                                 0x80, 0x33, 0x00, 0xC0, 0x74, 0x49});
    EXPECT_EQ(quantize(TensorType::BF16, x, 12), wantb);
}

// ---- quantize -> dequantize error bounds ----------------------------------------------------------------

namespace {

// Data sets: Gaussian, uniform at several scales, positive-only, and blocks with one outlier.
std::vector<std::vector<float>> datasets() {
    std::mt19937 rng(2024);
    std::vector<std::vector<float>> sets;
    const size_t n = 32 * 1024;
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    for (float scale : {1e-4f, 1.0f, 300.0f}) {
        std::vector<float> v(n);
        for (auto & x : v) x = scale * gauss(rng);
        sets.push_back(v);
    }
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<float> u(n), pos(n), outl(n);
    for (size_t i = 0; i < n; ++i) {
        u[i] = 7.0f * uni(rng);
        pos[i] = 10.0f + uni(rng);
        outl[i] = (i % 32 == 5) ? 50.0f * uni(rng) : 0.1f * uni(rng);
    }
    sets.push_back(u);
    sets.push_back(pos);
    sets.push_back(outl);
    return sets;
}

struct BlockStats {
    double amax = 0, signed_max = 0, mn = 0, mx = 0;  // signed_max: first value of largest magnitude
};

BlockStats stats(const float * x) {
    BlockStats s;
    s.mn = s.mx = x[0];
    for (int j = 0; j < 32; ++j) {
        if (std::fabs(x[j]) > s.amax) { s.amax = std::fabs(x[j]); s.signed_max = x[j]; }
        s.mn = std::min(s.mn, static_cast<double>(x[j]));
        s.mx = std::max(s.mx, static_cast<double>(x[j]));
    }
    return s;
}

// The stored f16 scale must be the f16 rounding of the exact one: relative 2^-11 (absolute 2^-25 when tiny).
void expect_f16_of(double stored, double exact) {
    ASSERT_LE(std::fabs(stored - exact), std::max(std::fabs(exact) * std::ldexp(1.0, -11), std::ldexp(1.0, -25)))
        << "stored " << stored << " exact " << exact;
}

// Rounding noise of computing x * (1/d) in f32 instead of x / d exactly: a few ulps of the quotient (<= 32),
// i.e. far below 1e-4 of a quantization step.
constexpr double kSlack = 1e-4;

} // namespace

TEST(QuantizeError, Q8_0) {
    for (const auto & x : datasets()) {
        const auto q = quantize(TensorType::Q8_0, x, x.size() / 32 * 34);
        const auto y = dequantize(TensorType::Q8_0, q, x.size());
        for (size_t b = 0; b < x.size() / 32; ++b) {
            const BlockStats s = stats(&x[32 * b]);
            const double d = s.amax / 127, dq = qref::f16(qref::rd16(&q[34 * b]));
            expect_f16_of(dq, d);
            for (size_t j = 32 * b; j < 32 * b + 32; ++j)
                ASSERT_LE(std::fabs(x[j] - y[j]), d * (0.5 + kSlack) + 127 * std::fabs(d - dq)) << j;
        }
    }
}

TEST(QuantizeError, Q4_0AndQ5_0) {
    // d = max / -2^(bits-1); s = x / d in [-2^(bits-1), 2^(bits-1)]. q - offset = round(s), except that the top
    // code is clamped to 2^(bits-1) - 1: there the error is |d| * (s - (2^(bits-1) - 1)) <= |d|.
    struct Case { TensorType t; int half; int type_size; int d_offset; };
    for (const Case c : {Case{TensorType::Q4_0, 8, 18, 0}, Case{TensorType::Q5_0, 16, 22, 0}}) {
        for (const auto & x : datasets()) {
            const auto q = quantize(c.t, x, x.size() / 32 * c.type_size);
            const auto y = dequantize(c.t, q, x.size());
            for (size_t b = 0; b < x.size() / 32; ++b) {
                const BlockStats s = stats(&x[32 * b]);
                const double d = s.signed_max / -c.half, dq = qref::f16(qref::rd16(&q[c.type_size * b]));
                expect_f16_of(dq, d);
                for (size_t j = 32 * b; j < 32 * b + 32; ++j) {
                    const double sj = x[j] / d;
                    const double step = std::max(0.5, sj - (c.half - 1));
                    ASSERT_LE(std::fabs(x[j] - y[j]), std::fabs(d) * (step + kSlack) + c.half * std::fabs(d - dq)) << j;
                }
            }
        }
    }
}

TEST(QuantizeError, Q4_1AndQ5_1) {
    // d = (max - min) / (2^bits - 1), m = min: every x is within d/2 of a code.
    struct Case { TensorType t; int levels; int type_size; };
    for (const Case c : {Case{TensorType::Q4_1, 15, 20}, Case{TensorType::Q5_1, 31, 24}}) {
        for (const auto & x : datasets()) {
            const auto q = quantize(c.t, x, x.size() / 32 * c.type_size);
            const auto y = dequantize(c.t, q, x.size());
            for (size_t b = 0; b < x.size() / 32; ++b) {
                const BlockStats s = stats(&x[32 * b]);
                const double d = (s.mx - s.mn) / c.levels;
                const double dq = qref::f16(qref::rd16(&q[c.type_size * b]));
                const double mq = qref::f16(qref::rd16(&q[c.type_size * b + 2]));
                expect_f16_of(dq, d);
                expect_f16_of(mq, s.mn);
                const double bound = d * (0.5 + kSlack) + c.levels * std::fabs(d - dq) + std::fabs(s.mn - mq);
                for (size_t j = 32 * b; j < 32 * b + 32; ++j) ASSERT_LE(std::fabs(x[j] - y[j]), bound) << j;
            }
        }
    }
}

TEST(QuantizeError, F16AndBf16Relative) {
    for (const auto & x : datasets()) {
        const auto h = quantize(TensorType::F16, x, x.size() * 2);
        const auto yh = dequantize(TensorType::F16, h, x.size());
        const auto b = quantize(TensorType::BF16, x, x.size() * 2);
        const auto yb = dequantize(TensorType::BF16, b, x.size());
        for (size_t i = 0; i < x.size(); ++i) {
            const double a = std::fabs(x[i]);
            // Below 2^-14 f16 is subnormal with a fixed step of 2^-24: absolute error <= 2^-25.
            ASSERT_LE(std::fabs(x[i] - yh[i]), std::max(a * std::ldexp(1.0, -11), std::ldexp(1.0, -25))) << i;
            ASSERT_LE(std::fabs(x[i] - yb[i]), a * std::ldexp(1.0, -8)) << i;
        }
    }
}

// K types: the final step of ggml's quantizers rounds every value to the nearest level its sub-block's
// decoded scale and min allow, so each dequantized value must be the level nearest to the input (within
// float rounding); the levels are read from the block bytes (formats.md §2.6: sub-block scales). And the
// error falls with the bits: Q2_K > Q3_K > Q4_K > Q5_K > Q6_K in RMS on every dataset.
namespace {

struct SubBlock {
    double d = 0, m = 0;  // value = d * l - m
    int lo = 0, hi = 0;   // l in [lo, hi]
};

// The 6-bit scales, decoded from formats.md §2.6 (independent of quant_block.h, like quant_ref.h).
int q3k_scale_of(const uint8_t * sc, int s) {
    const int low4 = s < 8 ? (sc[s] & 0xF) : (sc[s - 8] >> 4);
    const int high2 = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    return (low4 | (high2 << 4)) - 32;
}
void k4_scale_min_of(const uint8_t * q, int i, int & sc, int & m) {
    if (i < 4) {
        sc = q[i] & 63, m = q[i + 4] & 63;
    } else {
        sc = (q[i + 4] & 0xF) | ((q[i - 4] >> 6) << 4), m = (q[i + 4] >> 4) | ((q[i] >> 6) << 4);
    }
}

SubBlock k_sub_block(TensorType t, const uint8_t * b, int e) {
    SubBlock s;
    switch (t) {
    case TensorType::Q2_K: {  // scales[16], qs[64], d, dmin
        const uint8_t sc = b[e / 16];
        s.d = qref::f16(qref::rd16(b + 80)) * (sc & 0xF), s.m = qref::f16(qref::rd16(b + 82)) * (sc >> 4), s.lo = 0, s.hi = 3;
        break;
    }
    case TensorType::Q3_K:  // hmask[32], qs[64], scales[12], d
        s.d = qref::f16(qref::rd16(b + 108)) * q3k_scale_of(b + 96, e / 16), s.lo = -4, s.hi = 3;
        break;
    case TensorType::Q4_K: case TensorType::Q5_K: {  // d, dmin, scales[12], ...
        int sc, m;
        k4_scale_min_of(b + 4, e / 32, sc, m);
        s.d = qref::f16(qref::rd16(b)) * sc, s.m = qref::f16(qref::rd16(b + 2)) * m;
        s.lo = 0, s.hi = t == TensorType::Q4_K ? 15 : 31;
        break;
    }
    case TensorType::Q6_K:  // ql[128], qh[64], scales[16] (int8), d
        s.d = qref::f16(qref::rd16(b + 208)) * static_cast<int8_t>(b[192 + e / 16]), s.lo = -32, s.hi = 31;
        break;
    default: break;
    }
    return s;
}

} // namespace

TEST(QuantizeError, KTypesRoundEveryValueToTheNearestLevel) {
    const TensorType types[] = {TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};
    const size_t block_bytes[] = {84, 110, 144, 176, 210};
    int set = 0;
    for (const auto & x : datasets()) {
        SCOPED_TRACE("dataset " + std::to_string(set++));
        double prev_rms = 1e300;
        for (int k = 0; k < 5; ++k) {
            const TensorType t = types[k];
            const auto q = quantize(t, x, x.size() / 256 * block_bytes[k]);
            const auto y = dequantize(t, q, x.size());
            double se = 0, checked = 0;
            for (size_t i = 0; i < x.size(); ++i) {
                se += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
                const SubBlock s = k_sub_block(t, &q[(i / 256) * block_bytes[k]], static_cast<int>(i % 256));
                if (s.d == 0) {  // the sub-block's scale rounded to 0 against the block's largest: all decode to -m
                    ASSERT_EQ(static_cast<double>(y[i]), -s.m) << gguf::type_name(static_cast<uint32_t>(t)) << " element " << i;
                    continue;
                }
                const double l = std::clamp(std::nearbyint((x[i] + s.m) / s.d), static_cast<double>(s.lo), static_cast<double>(s.hi));
                const double nearest = s.d * l - s.m;
                ASSERT_LE(std::fabs(x[i] - y[i]), std::fabs(x[i] - nearest) + std::fabs(s.d) * kSlack + 1e-6 * std::fabs(x[i]))
                    << gguf::type_name(static_cast<uint32_t>(t)) << " element " << i;
                ++checked;
            }
            EXPECT_GT(checked, 0.4 * static_cast<double>(x.size())) << gguf::type_name(static_cast<uint32_t>(t));
            const double rms = std::sqrt(se / static_cast<double>(x.size()));
            // More bits, less error — on zero-centred data of ordinary scale (sets 1-3). Not a law elsewhere, and
            // llama.cpp's bytes (test_quantize_oracle.cpp) behave the same: at 1e-4 Q6_K's super-block scale
            // d = max/128 is an f16 subnormal; on all-positive data the K4 types' min is forced to <= 0; in the
            // outlier set most sub-block scales round to 0.
            if (set >= 2 && set <= 4) {
                EXPECT_LT(rms, prev_rms) << gguf::type_name(static_cast<uint32_t>(t)) << " is not more precise than the type below it";
            }
            prev_rms = rms;
        }
    }
}
