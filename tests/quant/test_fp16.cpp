// f16 / bf16 conversions against references computed from the IEEE definitions in double precision.
#include "ggml_rp/core/fp16.h"
#include "quant_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace {

bool is_f16_nan(uint16_t h) { return ((h >> 10) & 31) == 31 && (h & 1023) != 0; }

// Every non-negative f16 value, by bit pattern 0x0000..0x7C00, with 0x7C00 (inf) read as 65536 = 2^16: the
// next value of the f16 grid past 65504, so that rounding to nearest lands on inf exactly where IEEE says.
const std::vector<double> & f16_grid() {
    static const std::vector<double> g = [] {
        std::vector<double> v;
        for (uint32_t h = 0; h < 0x7C00; ++h) v.push_back(qref::f16(static_cast<uint16_t>(h)));
        v.push_back(65536.0);
        return v;
    }();
    return g;
}

// IEEE round-to-nearest-even of a finite float onto the f16 grid, by searching the grid.
uint16_t f16_nearest_even(float x) {
    const std::vector<double> & g = f16_grid();
    const double a = std::fabs(static_cast<double>(x));
    uint16_t h;
    if (a >= g.back()) {
        h = 0x7C00;
    } else {
        const size_t up = static_cast<size_t>(std::lower_bound(g.begin(), g.end(), a) - g.begin());
        if (g[up] == a) {
            h = static_cast<uint16_t>(up);
        } else {
            const size_t dn = up - 1;
            const double ddn = a - g[dn], dup = g[up] - a;
            h = static_cast<uint16_t>(ddn < dup ? dn : dup < ddn ? up : (dn % 2 == 0 ? dn : up));
        }
    }
    return static_cast<uint16_t>(h | (std::signbit(x) ? 0x8000 : 0));
}

// bf16 rounding from the definition: the two bf16 neighbours of |x| are its bit pattern truncated to 16 bits
// and the next one up; take the nearer value, the even pattern on a tie.
uint16_t bf16_nearest_even(float x) {
    const uint32_t u = qref::bits(x);
    const uint32_t mag = u & 0x7FFFFFFF, sign = u & 0x80000000;
    const uint32_t dn = mag & 0xFFFF0000, up = dn + 0x10000;
    const double a = qref::f32_fields(mag), vdn = qref::f32_fields(dn), vup = qref::f32_fields(up);
    uint32_t r;
    if (a - vdn < vup - a) r = dn;
    else if (vup - a < a - vdn) r = up;
    else r = ((dn >> 16) & 1) == 0 ? dn : up;
    return static_cast<uint16_t>((sign | r) >> 16);
}

} // namespace

TEST(Fp16, DecodeAllPatterns) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float got = rp::fp16_to_fp32(static_cast<uint16_t>(h));
        const double want = qref::f16(static_cast<uint16_t>(h));
        if (is_f16_nan(static_cast<uint16_t>(h))) {
            ASSERT_TRUE(std::isnan(got)) << std::hex << h;
            // The payload moves up into the high mantissa bits (quiet bit 9 -> bit 22).
            ASSERT_EQ(qref::bits(got), ((h & 0x8000u) << 16) | 0x7F800000u | ((h & 1023u) << 13)) << std::hex << h;
        } else {
            ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
            ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;
        }
    }
}

TEST(Fp16, RoundTripAllPatterns) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const uint16_t back = rp::fp32_to_fp16(rp::fp16_to_fp32(static_cast<uint16_t>(h)));
        // A signalling NaN comes back quiet (bit 9 set), as with hardware conversions; everything else exact.
        const uint16_t want = is_f16_nan(static_cast<uint16_t>(h)) ? static_cast<uint16_t>(h | 0x200) : h;
        ASSERT_EQ(back, want) << std::hex << h;
    }
}

TEST(Fp16, EncodeMatchesNearestEven) {
    std::vector<float> xs = {
        0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65519.996f, 65520.0f, -65520.0f, 1e9f, 0.1f, 1.0f / 3.0f,
        std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(3.0f, -26),
        std::ldexp(1.0f, -26), std::ldexp(1023.5f, -24), std::ldexp(1.5f, -24), std::ldexp(2.5f, -24),
        1.0f + std::ldexp(1.0f, -11), 1.0f + std::ldexp(3.0f, -11), 2048.0f + 1.0f, 2048.0f + 3.0f,
        std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(),
    };
    // Every f16 value and the midpoints between neighbours (the tie cases), plus a sweep of random bits.
    for (uint32_t h = 0; h < 0x7C00; ++h) {
        const double v = qref::f16(static_cast<uint16_t>(h)), next = qref::f16(static_cast<uint16_t>(h + 1));
        xs.push_back(static_cast<float>(v));
        const double mid = 0.5 * (v + (h + 1 == 0x7C00 ? 65536.0 : next));
        xs.push_back(static_cast<float>(mid));  // exact in f32: f16 midpoints need only 12 bits
        xs.push_back(std::nextafter(static_cast<float>(mid), 0.0f));
        xs.push_back(std::nextafter(static_cast<float>(mid), 1e30f));
    }
    std::mt19937 rng(1234);
    for (int i = 0; i < 400000; ++i) xs.push_back(qref::from_bits(static_cast<uint32_t>(rng())));
    for (float x : xs) {
        if (std::isnan(x)) {
            const uint16_t h = rp::fp32_to_fp16(x);
            ASSERT_TRUE(is_f16_nan(h)) << x;
            ASSERT_EQ((h & 0x8000) != 0, std::signbit(x));
            continue;
        }
        ASSERT_EQ(rp::fp32_to_fp16(x), f16_nearest_even(x)) << std::hexfloat << x;
    }
}

TEST(Bf16, DecodeIsHighHalf) {
    for (uint32_t b = 0; b < 65536; ++b) {
        const float got = rp::bf16_to_fp32(static_cast<uint16_t>(b));
        if ((b & 0x7F80) == 0x7F80 && (b & 0x7F)) { ASSERT_TRUE(std::isnan(got)); continue; }
        if ((b & 0x7FFF) == 0x7F80) { ASSERT_TRUE(std::isinf(got)); continue; }
        ASSERT_EQ(static_cast<double>(got), qref::f32_fields(b << 16)) << std::hex << b;
    }
}

TEST(Bf16, EncodeTiesToEvenAndNan) {
    // Hand-checked ties: 1 + 2^-8 lies halfway between 0x3F80 (even) and 0x3F81; 1 + 3*2^-8 between 0x3F81 and
    // 0x3F82 (even).
    EXPECT_EQ(rp::fp32_to_bf16(qref::from_bits(0x3F808000)), 0x3F80);
    EXPECT_EQ(rp::fp32_to_bf16(qref::from_bits(0x3F818000)), 0x3F82);
    EXPECT_EQ(rp::fp32_to_bf16(qref::from_bits(0x3F808001)), 0x3F81);
    EXPECT_EQ(rp::fp32_to_bf16(qref::from_bits(0x3F807FFF)), 0x3F80);
    EXPECT_EQ(rp::fp32_to_bf16(-1.0f), 0xBF80);
    EXPECT_EQ(rp::fp32_to_bf16(qref::from_bits(0x7F7FFFFF)), 0x7F80);  // past the largest bf16 -> inf
    EXPECT_EQ(rp::fp32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
    // NaN -> quiet NaN: the high half with the quiet bit (0x40) forced, sign kept.
    EXPECT_EQ(rp::fp32_to_bf16(qref::from_bits(0x7F800001)), 0x7FC0);  // signalling, payload in the low half
    EXPECT_EQ(rp::fp32_to_bf16(qref::from_bits(0xFFC00000)), 0xFFC0);
    EXPECT_EQ(rp::fp32_to_bf16(qref::from_bits(0x7F810000)), 0x7FC1);

    std::mt19937 rng(99);
    for (int i = 0; i < 400000; ++i) {
        const float x = qref::from_bits(static_cast<uint32_t>(rng()));
        const uint16_t got = rp::fp32_to_bf16(x);
        if (std::isnan(x)) {
            ASSERT_TRUE(std::isnan(rp::bf16_to_fp32(got)));
            ASSERT_EQ(got & 0x40, 0x40);
            ASSERT_EQ((got & 0x8000) != 0, std::signbit(x));
            continue;
        }
        ASSERT_EQ(got, bf16_nearest_even(x)) << std::hex << qref::bits(x);
    }
}
