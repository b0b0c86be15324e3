// The counter-based RNG (ggml_rp/core/counter_rng.h): Philox-4x32-10 against Random123's published
// known-answer vectors, the stream layout (four values per block), pinned values of rng_key / rng_u32 /
// rng_uniform (any change to them changes every dropout mask: checkpoints would stop being reproducible),
// key order sensitivity and basic uniformity.
#include "ggml_rp/core/counter_rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

using rp::Philox4x32;

namespace {

void expect_block(const Philox4x32 & got, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    EXPECT_EQ(got.v[0], a);
    EXPECT_EQ(got.v[1], b);
    EXPECT_EQ(got.v[2], c);
    EXPECT_EQ(got.v[3], d);
}

} // namespace

TEST(CounterRng, PhiloxRandom123KnownAnswers) {
    // Random123 tests/kat_vectors, philox4x32 10 rounds: counter words, key words, expected output.
    expect_block(rp::philox4x32_10({{0, 0, 0, 0}}, 0, 0), 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u);
    expect_block(rp::philox4x32_10({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu),
                 0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu);
    expect_block(rp::philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u),
                 0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u);
}

TEST(CounterRng, StreamLayoutIsFourWordsPerBlock) {
    const uint64_t key = 0x0123456789abcdefull;
    for (uint64_t block : {0ull, 1ull, 12345ull, 0x100000000ull, 0x3fffffffffffffffull}) {
        // The 64-bit block index fills counter words 0 (low) and 1 (high); the key words are low, high.
        const Philox4x32 b = rp::philox4x32_10({{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0, 0}},
                                               0x89abcdefu, 0x01234567u);
        for (uint64_t j = 0; j < 4; ++j) EXPECT_EQ(rp::rng_u32(key, 4 * block + j), b.v[j]) << block << " " << j;
    }
}

TEST(CounterRng, PinnedValues) {
    // Computed once from this implementation (whose Philox matches the vectors above) and pinned.
    EXPECT_EQ(rp::rng_key(0, 0), 0xb7f28f1ac61cda72ull);
    EXPECT_EQ(rp::rng_key(42, 7), 0x1a8a03b7bbfe46c5ull);
    const uint64_t k = rp::rng_key(42, 1, 2, 3, 4);
    EXPECT_EQ(k, 0x7d8deaf6645cc441ull);
    EXPECT_EQ(rp::rng_u32(k, 0), 0xb43f69d3u);
    EXPECT_EQ(rp::rng_u32(k, 1), 0x479bcd9au);
    EXPECT_EQ(rp::rng_u32(k, 2), 0x5c6780c7u);
    EXPECT_EQ(rp::rng_u32(k, 3), 0xf908962cu);
    EXPECT_EQ(rp::rng_u32(k, 4), 0xa60efa9au);
    EXPECT_EQ(rp::rng_u32(k, 1000003), 0xff81553fu);
    EXPECT_EQ(rp::rng_u32(k, UINT64_MAX), 0x98aba9dau);
    // uniform = (u32 >> 8) / 2^24 exactly.
    EXPECT_EQ(rp::rng_uniform(k, 0), static_cast<float>(0xb43f69d3u >> 8) / 16777216.0f);
    EXPECT_EQ(rp::rng_uniform(k, 1), static_cast<float>(0x479bcd9au >> 8) / 16777216.0f);
}

TEST(CounterRng, KeyDependsOnEveryIdAndTheirOrder) {
    const uint64_t s = 1234;
    EXPECT_NE(rp::rng_key(s, 1, 2), rp::rng_key(s, 2, 1));
    EXPECT_NE(rp::rng_key(s, 0, 1), rp::rng_key(s, 1, 0));
    EXPECT_NE(rp::rng_key(s, 1, 2, 3, 4), rp::rng_key(s, 1, 2, 4, 3));
    EXPECT_NE(rp::rng_key(s, 1, 2, 3, 4), rp::rng_key(s, 4, 3, 2, 1));
    EXPECT_NE(rp::rng_key(s, 5), rp::rng_key(s + 1, 5));
    // Omitted ids are zeros.
    EXPECT_EQ(rp::rng_key(s, 5), rp::rng_key(s, 5, 0, 0, 0));
    // Each id position changes the key, and a one-bit change flips about half of its bits (avalanche).
    const uint64_t base = rp::rng_key(s, 10, 20, 30, 40);
    const uint64_t flips[5] = {rp::rng_key(s ^ 1, 10, 20, 30, 40), rp::rng_key(s, 11, 20, 30, 40),
                               rp::rng_key(s, 10, 21, 30, 40), rp::rng_key(s, 10, 20, 31, 40),
                               rp::rng_key(s, 10, 20, 30, 41)};
    for (uint64_t f : flips) {
        const int changed = __builtin_popcountll(base ^ f);
        EXPECT_GE(changed, 12) << std::hex << f;   // expected 32 of 64, sd 4: 5 sd each side
        EXPECT_LE(changed, 52) << std::hex << f;
    }
}

TEST(CounterRng, UniformRangeGridAndMoments) {
    const uint64_t key = rp::rng_key(7, 3);
    const int64_t n = 1000000;
    constexpr int kBins = 64;
    std::vector<int64_t> bins(kBins, 0);
    std::vector<int64_t> bit_ones(32, 0);
    double sum = 0.0, sum2 = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const float u = rp::rng_uniform(key, static_cast<uint64_t>(i));
        ASSERT_GE(u, 0.0f);
        ASSERT_LT(u, 1.0f);
        const float scaled = u * 16777216.0f;
        ASSERT_EQ(scaled, std::floor(scaled)) << "not on the 2^-24 grid: " << u;
        sum += u;
        sum2 += static_cast<double>(u) * u;
        ++bins[static_cast<size_t>(u * kBins)];
        const uint32_t w = rp::rng_u32(key, static_cast<uint64_t>(i));
        for (int b = 0; b < 32; ++b) bit_ones[static_cast<size_t>(b)] += (w >> b) & 1u;
    }
    // Mean 1/2 with sd sqrt(1/12 / n); variance 1/12 with sd sqrt(1/180 / n) (fourth central moment 1/80).
    const double mean = sum / n, var = sum2 / n - mean * mean;
    EXPECT_NEAR(mean, 0.5, 5.0 * std::sqrt(1.0 / 12.0 / n));
    EXPECT_NEAR(var, 1.0 / 12.0, 5.0 * std::sqrt((1.0 / 80.0 - 1.0 / 144.0) / n));
    // Chi-square over 64 bins, 63 degrees of freedom: mean 63, sd 11.2; 130 is about 6 sd (p < 1e-6).
    const double expect = static_cast<double>(n) / kBins;
    double chi2 = 0.0;
    for (int64_t c : bins) chi2 += (c - expect) * (c - expect) / expect;
    EXPECT_LT(chi2, 130.0);
    // Every bit of the 32-bit words is set half the time (binomial sd 500 over 1e6).
    for (int b = 0; b < 32; ++b) EXPECT_NEAR(static_cast<double>(bit_ones[static_cast<size_t>(b)]), n / 2.0, 5.0 * 500.0) << "bit " << b;
}

TEST(CounterRng, NeighbouringKeysAndCountersAreUncorrelated) {
    // Keys of consecutive steps and streams at consecutive counters: the sign bits agree half the time and
    // the Pearson correlation of the uniforms is ~0 (sd 1/sqrt(n)).
    const int64_t n = 200000;
    const uint64_t k1 = rp::rng_key(99, 5, 0), k2 = rp::rng_key(99, 6, 0);
    const double sd = 1.0 / std::sqrt(static_cast<double>(n));
    auto corr = [&](auto a, auto b) {
        double sa = 0, sb = 0, saa = 0, sbb = 0, sab = 0;
        for (int64_t i = 0; i < n; ++i) {
            const double x = a(i), y = b(i);
            sa += x; sb += y; saa += x * x; sbb += y * y; sab += x * y;
        }
        const double cov = sab / n - (sa / n) * (sb / n);
        return cov / std::sqrt((saa / n - (sa / n) * (sa / n)) * (sbb / n - (sb / n) * (sb / n)));
    };
    const auto u = [](uint64_t key, int64_t off) {
        return [key, off](int64_t i) { return static_cast<double>(rp::rng_uniform(key, static_cast<uint64_t>(i + off))); };
    };
    EXPECT_NEAR(corr(u(k1, 0), u(k2, 0)), 0.0, 5.0 * sd);  // two steps, same positions
    EXPECT_NEAR(corr(u(k1, 0), u(k1, 1)), 0.0, 5.0 * sd);  // lag 1 (inside a block)
    EXPECT_NEAR(corr(u(k1, 0), u(k1, 4)), 0.0, 5.0 * sd);  // lag 4 (next block, same word)
    EXPECT_NEAR(corr(u(k1, 0), u(rp::rng_key(100, 5, 0), 0)), 0.0, 5.0 * sd);  // seeds 99 and 100
}
