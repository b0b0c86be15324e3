// The one-token row dots (ggml_rp/cpu/matvec_dot.h): their stated numerics against double references,
// determinism, and their place behind matmul_fwd.
//
//  1. The prepared column is within the stated rounding of x: int8 d_b / 2 per 32-block, bf16 2^-8 |x|, f32 0.
//  2. The dot of a weight row with the prepared column equals, up to f32 accumulation, the double-precision
//     sum of rp::dequantize_row's weights times the column's values x'; against the exact column the error
//     is within that plus sum |w_i| |x_i - x'_i|.
//  3. matmul_fwd with the switch on: one token is that dot for every row, bit-identical on 1 and 2 threads;
//     with it off (the default) one token is its column of a batch, bit for bit.
#include "ggml_rp/cpu/matvec_dot.h"

#include "ggml_rp/cpu/gemm.h"
#include "ggml_rp/cpu/gemm_int8.h"
#include "kernels_util.h"

#include <gtest/gtest.h>

#include <bit>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

namespace {

using namespace kt;

const std::vector<TensorType> kDotTypes = {TensorType::F32,  TensorType::F16,  TensorType::BF16, TensorType::Q4_0,
                                          TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0,
                                          TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K,
                                          TensorType::Q6_K, TensorType::MXFP4};

bool is_int8(TensorType t) { return t != TensorType::F32 && t != TensorType::F16 && t != TensorType::BF16; }

// The column value row_dot multiplies element k by.
double used_value(TensorType t, const rp::cpu::DotColumn & c, int64_t k) {
    if (t == TensorType::BF16) return rp::bf16_to_fp32(c.bf16[size_t(k)]);
    if (is_int8(t)) return double(c.d[size_t(k / 32)]) * c.q[size_t(k)];
    return c.x[k];
}

// A column with blocks of very different scales, one all-zero block and one with a single large value.
std::vector<float> test_column(int64_t K, Rng & rng) {
    std::vector<float> x(static_cast<size_t>(K));
    for (int64_t b = 0; 32 * b < K; ++b) {
        const float amp = b % 5 == 1 ? 0.0f : std::pow(10.0f, float(int(b % 7)) - 3.0f);
        for (int64_t i = 32 * b; i < std::min(K, 32 * b + 32); ++i) x[size_t(i)] = rng.uniform(-amp, amp);
        if (b % 5 == 3 && 32 * b + 7 < K) x[size_t(32 * b + 7)] = 50.0f * amp;
    }
    return x;
}

TEST(MatvecDot, QuantizedColumnIsWithinHalfAStepOfEveryValue) {
    Rng rng(3);
    const int64_t K = 768;
    const std::vector<float> x = test_column(K, rng);
    rp::cpu::DotColumn c;
    rp::cpu::quantize_column(x.data(), K, c);
    for (int64_t b = 0; b < K / 32; ++b) {
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[size_t(32 * b + i)]));
        EXPECT_EQ(c.d[size_t(b)], amax / 127.0f);
        int s16[2] = {0, 0};
        for (int i = 0; i < 32; ++i) {
            const int q = c.q[size_t(32 * b + i)];
            ASSERT_LE(std::abs(q), 127);
            EXPECT_LE(std::fabs(double(c.d[size_t(b)]) * q - x[size_t(32 * b + i)]), 0.5 * c.d[size_t(b)] * (1 + 1e-6)) << b << " " << i;
            // the stated rule itself (the SIMD loop must give its bits): round(clamp(x / d)), ties to even
            const float id = c.d[size_t(b)] > 0.0f ? 1.0f / c.d[size_t(b)] : 0.0f;
            EXPECT_EQ(q, int(std::nearbyint(std::min(127.0f, std::max(-127.0f, x[size_t(32 * b + i)] * id))))) << b << " " << i;
            s16[i / 16] += q;
        }
        EXPECT_EQ(c.dsum16[size_t(2 * b)], c.d[size_t(b)] * float(s16[0]));
        EXPECT_EQ(c.dsum16[size_t(2 * b + 1)], c.d[size_t(b)] * float(s16[1]));
        EXPECT_EQ(c.dsum32[size_t(b)], c.dsum16[size_t(2 * b)] + c.dsum16[size_t(2 * b + 1)]);
    }
}

TEST(MatvecDot, DotMatchesDoubleReferencesForEveryType) {
    Rng rng(17);
    for (TensorType t : kDotTypes)
        // (blocks of 32: also lengths whose block count is not a multiple of 8, the SIMD scales' group)
        for (int64_t K : !is_int8(t) ? std::vector<int64_t>{256, 768, 3072, 1, 17, 100, 333}
                         : gguf::type_traits(uint32_t(t))->block_size == 32 ? std::vector<int64_t>{256, 768, 3072, 352, 96}
                                                                           : std::vector<int64_t>{256, 768, 3072}) {
            const char * name = gguf::type_name(uint32_t(t));
            ASSERT_TRUE(rp::cpu::row_dot_supports(t, K)) << name;
            const int64_t N = 6;
            const Weight w = make_weight(t, K, N, rng);
            const std::vector<float> x = test_column(K, rng);
            rp::cpu::DotColumn c;
            rp::cpu::prepare_column(t, x.data(), K, c);
            for (int64_t k = 0; k < K; ++k) {   // the column's stated rounding
                const double e = std::fabs(used_value(t, c, k) - x[size_t(k)]);
                const double bound = t == TensorType::BF16 ? std::ldexp(std::fabs(x[size_t(k)]), -8)
                                     : is_int8(t)           ? 0.5 * c.d[size_t(k / 32)] * (1 + 1e-6)
                                                            : 0.0;
                ASSERT_LE(e, bound) << name << " element " << k;
            }
            double worst_accum = 0.0, worst_round = 0.0;   // each error as a fraction of its bound
            for (int64_t n = 0; n < N; ++n) {
                const float got = rp::cpu::row_dot(t, w.bytes.data() + size_t(n) * w.row_bytes, c);
                double same = 0.0, exact = 0.0, mag = 0.0, wmax = 0.0, xsum = 0.0, round = 0.0;
                for (int64_t k = 0; k < K; ++k) {
                    const double wk = w.deq[size_t(n * K + k)], xk = used_value(t, c, k);
                    same += wk * xk;
                    exact += wk * x[size_t(k)];
                    mag += std::fabs(wk * xk);
                    wmax = std::max(wmax, std::fabs(wk));
                    xsum += std::fabs(xk);
                    round += std::fabs(wk) * std::fabs(xk - x[size_t(k)]);
                }
                // f32 accumulation: chains of K/16 or fewer terms per lane, then 16 lanes. The int8 types'
                // sub-block factoring (w = s q - m) adds terms as large as max|w| |x'|.
                const double accum_bound = double(K / 16 + 16) * std::ldexp(1.0, -24) * (mag + (is_int8(t) ? wmax * xsum : 0.0)) + 1e-30;
                const double e_same = std::fabs(got - same), e_exact = std::fabs(got - exact);
                EXPECT_LE(e_same, accum_bound) << name << " K=" << K << " row " << n;
                EXPECT_LE(e_exact, round + accum_bound) << name << " K=" << K << " row " << n;
                worst_accum = std::max(worst_accum, e_same / accum_bound);
                worst_round = std::max(worst_round, e_exact / (round + accum_bound));
            }
            std::printf("  %-5s K=%-5lld (%s) accumulation error %.2g of its bound, error vs the f32 column %.2g of its bound\n",
                        name, static_cast<long long>(K), rp::cpu::row_dot_is_simd(t) ? "simd" : "portable", worst_accum, worst_round);
        }
}

TEST(MatvecDot, MatmulOneTokenIsTheDotOnAnyThreadCount) {
    Rng rng(23);
    const int64_t K = 512, N = 333;   // rows not a multiple of any task size
    for (TensorType t : kDotTypes) {
        const Weight w = make_weight(t, K, N, rng, 12);
        const std::vector<float> x = test_column(K, rng);
        rp::cpu::DotColumn c;
        rp::cpu::prepare_column(t, x.data(), K, c);
        std::vector<float> want(static_cast<size_t>(N));
        for (int64_t n = 0; n < N; ++n) want[size_t(n)] = rp::cpu::row_dot(t, w.bytes.data() + size_t(n) * w.row_bytes, c);

        std::vector<float> off(static_cast<size_t>(N)), y1(off), y2(off), acc(off.size(), 0.25f);
        rp::cpu::matmul_fwd(K, N, 1, w.data(), t, w.row_bytes, x.data(), K, off.data(), N, false);
        {
            RowDotSwitch on(true);
            {
                ScopedThreads th(1);
                rp::cpu::matmul_fwd(K, N, 1, w.data(), t, w.row_bytes, x.data(), K, y1.data(), N, false);
            }
            {
                ScopedThreads th(2);
                rp::cpu::matmul_fwd(K, N, 1, w.data(), t, w.row_bytes, x.data(), K, y2.data(), N, false);
                rp::cpu::matmul_fwd(K, N, 1, w.data(), t, w.row_bytes, x.data(), K, acc.data(), N, true);
            }
        }
        const char * name = gguf::type_name(uint32_t(t));
        // (no one-row path in a build without AVX2 / AVX-512: a token goes through the packed kernel)
        const bool taken = rp::cpu::gemm_one_row_lanes() > 0 && rp::cpu::row_dot_is_simd(t);
        if (taken) {
            EXPECT_TRUE(bit_equal(y1, want)) << name;
            for (int64_t n = 0; n < N; ++n) EXPECT_EQ(acc[size_t(n)], 0.25f + want[size_t(n)]) << name << " row " << n;
            EXPECT_FALSE(bit_equal(y1, off)) << name << ": the exact path (switch off) gave the row dots' bits";
        } else {
            // Where the dot would be the portable loop, matmul_fwd keeps the exact path: the switch changes nothing.
            EXPECT_TRUE(bit_equal(y1, off)) << name;
        }
        EXPECT_TRUE(bit_equal(y1, y2)) << name << ": 1 vs 2 threads";
    }
}

// The software prefetch distance (matvec_dot.h set_row_prefetch_bytes) is a hint: every type's dots are the
// same bits with none, a short one, the default and a long one.
TEST(MatvecDot, ThePrefetchDistanceChangesNoBit) {
    Rng rng(31);
    const int64_t K = 1024, N = 40;
    for (TensorType t : kDotTypes) {
        const Weight w = make_weight(t, K, N, rng);
        const std::vector<float> x = test_column(K, rng);
        rp::cpu::DotColumn c;
        rp::cpu::prepare_column(t, x.data(), K, c);
        std::vector<float> first;
        for (const int64_t ahead : {int64_t(0), int64_t(64), int64_t(-1), int64_t(65536)}) {
            rp::cpu::set_row_prefetch_bytes(ahead);
            std::vector<float> y;
            for (int64_t n = 0; n < N; ++n) y.push_back(rp::cpu::row_dot(t, w.bytes.data() + size_t(n) * w.row_bytes, c));
            if (first.empty()) first = y;
            EXPECT_TRUE(bit_equal(y, first)) << gguf::type_name(uint32_t(t)) << " prefetching " << ahead << " bytes ahead";
        }
        rp::cpu::set_row_prefetch_bytes(-1);
    }
}

// A few tokens at once (batched decoding): with row dots on, each of up to 4 (float types) or 8 (int8 types)
// columns gets exactly the bits it gets alone, written at its row of the output (ldc), with and without
// accumulation; more columns go through the int8 product (gemm_int8.h) where it takes the type, else the packed
// GEMM (the exact path's bits, as with the switch off).
TEST(MatvecDot, MatmulFewTokensAreEachTheirOwnDot) {
    Rng rng(29);
    const int64_t K = 512, N = 131;
    for (TensorType t : kDotTypes) {
        const char * name = gguf::type_name(uint32_t(t));
        if (!(rp::cpu::gemm_one_row_lanes() > 0 && rp::cpu::row_dot_is_simd(t))) continue;  // (no row dots in this build)
        // (gemm.cpp's dot_columns: f32 rows stream through the GEMM as fast from 2 tokens on, f16 from 5)
        const int64_t limit = t == TensorType::F32 ? 1 : t == TensorType::F16 ? 4 : 8;
        const Weight w = make_weight(t, K, N, rng, 12);
        for (const int64_t T : {int64_t(2), limit, limit + 1}) {
            std::vector<float> x;
            for (int64_t i = 0; i < T; ++i) {
                const std::vector<float> c = test_column(K, rng);
                x.insert(x.end(), c.begin(), c.end());
            }
            const int64_t ldc = N + 3;
            std::vector<float> y(static_cast<size_t>(ldc * T), -7.0f), acc(y.size(), 0.25f), exact(y.size(), 0.0f);
            {
                RowDotSwitch on(true);
                ScopedThreads th(2);
                rp::cpu::matmul_fwd(K, N, T, w.data(), t, w.row_bytes, x.data(), K, y.data(), ldc, false);
                rp::cpu::matmul_fwd(K, N, T, w.data(), t, w.row_bytes, x.data(), K, acc.data(), ldc, true);
            }
            rp::cpu::matmul_fwd(K, N, T, w.data(), t, w.row_bytes, x.data(), K, exact.data(), ldc, false);
            // (beyond the row dots: the int8 product where it takes the type, gemm_int8.h; else the exact path)
            std::vector<float> beyond = exact;
            if (rp::cpu::int8_matmul_supports(t, K))
                rp::cpu::int8_matmul_fwd(K, N, T, w.data(), t, w.row_bytes, x.data(), K, beyond.data(), ldc, false, true);
            for (int64_t i = 0; i < T; ++i) {
                std::vector<float> alone(static_cast<size_t>(N));
                {
                    RowDotSwitch on(true);
                    rp::cpu::matmul_fwd(K, N, 1, w.data(), t, w.row_bytes, x.data() + i * K, K, alone.data(), N, false);
                }
                for (int64_t n = 0; n < N; ++n) {
                    const float got = y[size_t(i * ldc + n)];
                    if (T <= limit) {
                        ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(alone[size_t(n)])) << name << " T=" << T << " column " << i << " row " << n;
                        ASSERT_EQ(acc[size_t(i * ldc + n)], 0.25f + alone[size_t(n)]) << name << " T=" << T;
                    } else {
                        ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(beyond[size_t(i * ldc + n)])) << name << " T=" << T << ": the GEMM";
                    }
                }
                for (int64_t n = N; n < ldc; ++n) ASSERT_EQ(y[size_t(i * ldc + n)], -7.0f) << name << ": past the row";
            }
        }
    }
}

// A NaN or inf in the column makes every row dot NaN (or inf), never a finite number: a diverged
// generation must show as such (the int8 quantizer would otherwise clamp NaN to 127).
TEST(MatvecDot, NonFiniteColumnGivesNonFiniteDots) {
    Rng rng(37);
    const int64_t K = 512;
    for (TensorType t : kDotTypes)
        for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
            const Weight w = make_weight(t, K, 2, rng);
            std::vector<float> x = test_column(K, rng);
            x[size_t(K - 5)] = bad;
            rp::cpu::DotColumn c;
            rp::cpu::prepare_column(t, x.data(), K, c);
            if (is_int8(t)) {   // the block's scale is NaN; its quants stay in [-127, 127] (what the kernels assume)
                EXPECT_TRUE(std::isnan(c.d[size_t((K - 5) / 32)]));
                for (int64_t k = (K - 5) / 32 * 32; k < (K - 5) / 32 * 32 + 32; ++k) EXPECT_LE(std::abs(int(c.q[size_t(k)])), 127);
            }
            for (int64_t n = 0; n < 2; ++n) {
                const float v = rp::cpu::row_dot(t, w.bytes.data() + size_t(n) * w.row_bytes, c);
                EXPECT_FALSE(std::isfinite(v)) << gguf::type_name(uint32_t(t)) << " column with " << bad << ": " << v;
            }
        }
}

// Off by default; then one token is the batch arithmetic: the bits of its column in a batch of two.
TEST(MatvecDot, OffByDefaultOneTokenIsItsBatchColumn) {
    EXPECT_FALSE(rp::cpu::row_dots());
    Rng rng(31);
    const int64_t K = 512, N = 70;
    for (TensorType t : kDotTypes) {
        const Weight w = make_weight(t, K, N, rng);
        std::vector<float> x = test_column(K, rng), x2 = test_column(K, rng);
        x2.insert(x2.begin(), x.begin(), x.end());   // [K, 2]: x first
        std::vector<float> one(static_cast<size_t>(N)), two(static_cast<size_t>(2 * N));
        rp::cpu::matmul_fwd(K, N, 1, w.data(), t, w.row_bytes, x.data(), K, one.data(), N, false);
        rp::cpu::matmul_fwd(K, N, 2, w.data(), t, w.row_bytes, x2.data(), K, two.data(), N, false);
        EXPECT_TRUE(bit_equal(one, std::vector<float>(two.begin(), two.begin() + N))) << gguf::type_name(uint32_t(t));
    }
    // Rows whose length is not a whole number of blocks of the type are refused.
    EXPECT_FALSE(rp::cpu::row_dot_supports(TensorType::Q4_K, 288));
    EXPECT_FALSE(rp::cpu::row_dot_supports(TensorType::Q8_0, 48));
}

}  // namespace

// RowDotScope switches the row dots for its own thread only (a decode session beside training threads), with the
// column limit it names, and restores the thread's earlier state when it ends.
TEST(MatvecDot, AScopeSwitchesItsOwnThreadOnly) {
    rp::cpu::set_row_dots(false);
    {
        rp::cpu::RowDotScope on(true, 16);
        EXPECT_TRUE(rp::cpu::row_dots());
        EXPECT_EQ(rp::cpu::row_dot_max_columns(), 16);
        bool other = true;
        int64_t other_columns = -1;
        std::thread t([&] {
            other = rp::cpu::row_dots();
            other_columns = rp::cpu::row_dot_max_columns();
        });
        t.join();
        EXPECT_FALSE(other);
        EXPECT_EQ(other_columns, 0);
        {
            rp::cpu::RowDotScope off(false);
            EXPECT_FALSE(rp::cpu::row_dots());
        }
        EXPECT_TRUE(rp::cpu::row_dots());
        EXPECT_EQ(rp::cpu::row_dot_max_columns(), 16);
    }
    EXPECT_FALSE(rp::cpu::row_dots());
    EXPECT_EQ(rp::cpu::row_dot_max_columns(), 0);
}

namespace {

// row_dot_columns on `rows` rows of type t and length K gives every one of 1 to 8 columns row_dot's bits.
void expect_columns_are_own_dots(TensorType t, int64_t K, int64_t rows, Rng & rng) {
    const Weight w = make_weight(t, K, rows, rng, 12);
    std::vector<rp::cpu::DotColumn> cols(rp::cpu::kRowDotColumns);
    std::vector<std::vector<float>> xs;
    for (auto & c : cols) {
        xs.push_back(test_column(K, rng));
        rp::cpu::prepare_column(t, xs.back().data(), K, c);
    }
    for (int n = 1; n <= rp::cpu::kRowDotColumns; ++n) {
        std::vector<const rp::cpu::DotColumn *> ptrs;
        for (int c = 0; c < n; ++c) ptrs.push_back(&cols[size_t(c)]);
        for (int64_t r = 0; r < rows; ++r) {
            const void * row = static_cast<const uint8_t *>(w.data()) + r * int64_t(w.row_bytes);
            float out[rp::cpu::kRowDotColumns];
            rp::cpu::row_dot_columns(t, row, ptrs.data(), n, out);
            for (int c = 0; c < n; ++c)
                ASSERT_EQ(std::bit_cast<uint32_t>(out[c]), std::bit_cast<uint32_t>(rp::cpu::row_dot(t, row, cols[size_t(c)])))
                    << gguf::type_name(uint32_t(t)) << " K=" << K << " n=" << n << " column " << c << " row " << r;
        }
    }
}

} // namespace

// 8 lanes added as matvec_dot.cpp's hsum adds them: (v0 + v4) + (v2 + v6), plus (v1 + v5) + (v3 + v7).
float stated_lane_sum(const float v[8]) {
    const float s0 = v[0] + v[4], s1 = v[1] + v[5], s2 = v[2] + v[6], s3 = v[3] + v[7];
    return (s0 + s2) + (s1 + s3);
}

// The arithmetic matvec_dot.cpp states for the SIMD row dots of Q8_0 and MXFP4 (signed_block; signed_pair does two
// blocks at once in 512-bit registers and must give the same bits): block b's 8 lane sums (lane j: the exact integer
// sum of elements 4j .. 4j+3's products w q), each times the block's scale d_w d_x (one f32 product) by FMA into lane j
// of acc0 (b even) or acc1 (b odd); then v = acc0 + acc1 and its lanes added as hsum adds them.
float stated_signed_dot(const std::vector<int> & w, const std::vector<float> & dw, const rp::cpu::DotColumn & c) {
    float acc[2][8] = {};
    for (size_t b = 0; b < dw.size(); ++b) {
        const float scale = dw[b] * c.d[b];
        for (int j = 0; j < 8; ++j) {
            int s = 0;
            for (int i = 4 * j; i < 4 * j + 4; ++i) s += w[32 * b + size_t(i)] * c.q[32 * b + size_t(i)];
            acc[b % 2][j] = std::fma(float(s), scale, acc[b % 2][j]);
        }
    }
    float v[8];
    for (int j = 0; j < 8; ++j) v[j] = acc[0][j] + acc[1][j];
    return stated_lane_sum(v);
}

// Q8_0 and MXFP4 rows of 19 blocks (two groups of 8, whose blocks go in pairs with AVX-512 VNNI, and a tail of 3 one
// by one) give the stated arithmetic's bits, for 1 to 8 columns at once; weights with -128 (Q8_0) and zeros.
TEST(MatvecDot, SignedTypesAreTheirStatedArithmeticBitForBit) {
    Rng rng(47);
    const int64_t K = 19 * 32;
    for (TensorType t : {TensorType::Q8_0, TensorType::MXFP4}) {
        if (!rp::cpu::row_dot_is_simd(t)) GTEST_SKIP() << "the portable loop states other arithmetic";
        // Columns of one magnitude: every block's rounding reaches the result (test_column's blocks of very different
        // scales would let the largest hide how the others were added).
        std::vector<rp::cpu::DotColumn> cols(rp::cpu::kRowDotColumns);
        std::vector<std::vector<float>> xs;
        for (auto & c : cols) {
            xs.emplace_back(static_cast<size_t>(K));
            for (float & v : xs.back()) v = rng.uniform(-1.0f, 1.0f);
            rp::cpu::prepare_column(t, xs.back().data(), K, c);
        }
        for (int r = 0; r < 4; ++r) {
            std::vector<uint8_t> row;
            std::vector<int> w(static_cast<size_t>(K));
            std::vector<float> dw(static_cast<size_t>(K / 32));
            if (t == TensorType::Q8_0) {
                std::vector<rp::block_q8_0> blocks(size_t(K / 32));
                for (size_t b = 0; b < blocks.size(); ++b) {
                    blocks[b].d = rp::fp32_to_fp16(rng.uniform(0.5f, 2.0f));
                    dw[b] = rp::fp16_to_fp32(blocks[b].d);
                    for (int i = 0; i < 32; ++i) {
                        const int q = (i + r) % 9 == 0 ? -128 : (i + int(b)) % 7 == 0 ? 0 : int(rng.uniform(-127.0f, 127.0f));
                        blocks[b].qs[i] = int8_t(q);
                        w[32 * b + size_t(i)] = q;
                    }
                }
                row.assign(reinterpret_cast<const uint8_t *>(blocks.data()), reinterpret_cast<const uint8_t *>(blocks.data() + blocks.size()));
            } else {
                std::vector<rp::block_mxfp4> blocks(size_t(K / 32));
                for (size_t b = 0; b < blocks.size(); ++b) {
                    blocks[b].e = uint8_t(126 + (b + size_t(r)) % 4);
                    dw[b] = rp::e8m0_to_fp32_half(blocks[b].e);
                    for (int j = 0; j < 16; ++j) {
                        const int lo = int(rng.uniform(0.0f, 15.99f)), hi = (j + int(b)) % 5 == 0 ? 0 : int(rng.uniform(0.0f, 15.99f));
                        blocks[b].qs[j] = uint8_t(lo | hi << 4);
                        w[32 * b + size_t(j)] = rp::mxfp4_value(lo);
                        w[32 * b + 16 + size_t(j)] = rp::mxfp4_value(hi);
                    }
                }
                row.assign(reinterpret_cast<const uint8_t *>(blocks.data()), reinterpret_cast<const uint8_t *>(blocks.data() + blocks.size()));
            }
            for (int n = 1; n <= rp::cpu::kRowDotColumns; ++n) {
                std::vector<const rp::cpu::DotColumn *> ptrs;
                for (int c = 0; c < n; ++c) ptrs.push_back(&cols[size_t(c)]);
                float out[rp::cpu::kRowDotColumns];
                rp::cpu::row_dot_columns(t, row.data(), ptrs.data(), n, out);
                for (int c = 0; c < n; ++c)
                    ASSERT_EQ(std::bit_cast<uint32_t>(out[c]), std::bit_cast<uint32_t>(stated_signed_dot(w, dw, cols[size_t(c)])))
                        << gguf::type_name(uint32_t(t)) << " row " << r << " n=" << n << " column " << c;
            }
        }
    }
}

// The arithmetic matvec_dot.cpp states for the SIMD BF16 row dots, which is vdpbf16ps's (the AVX-512 BF16, AVX-512F and
// AVX2 paths must all give it): 16 lanes; lane j of the 32-element block at k adds the products of elements k + 2j + 1
// and then k + 2j (exact in f32), zeros past K; in every full 64 elements the first block into chain a0, the second
// into a1, a last partial 64's blocks into a0; then v = a0 + a1, its halves added (lanes j and j + 8), then as hsum.
float stated_bf16_dot(const uint16_t * w, const std::vector<uint16_t> & x, int64_t K) {
    float acc[2][16] = {};
    const int64_t full = K / 64 * 64;
    for (int64_t k = 0; k < K; k += 32) {
        float * a = acc[k < full && k % 64 == 32 ? 1 : 0];
        for (int j = 0; j < 16; ++j)
            for (int64_t e : {k + 2 * j + 1, k + 2 * j})
                if (e < K) a[j] += rp::bf16_to_fp32(w[e]) * rp::bf16_to_fp32(x[size_t(e)]);
    }
    float v[8];
    for (int j = 0; j < 8; ++j) v[j] = (acc[0][j] + acc[1][j]) + (acc[0][j + 8] + acc[1][j + 8]);
    return stated_lane_sum(v);
}

// BF16 rows of normal values (vdpbf16ps counts subnormals as zero, the FMA paths keep them) of lengths with full
// 64-element steps, a last full or partial 32-element block and a short row give the stated arithmetic's bits, for
// 1 to 8 columns at once: the same bits on every CPU with SIMD row dots.
TEST(MatvecDot, Bf16IsItsStatedArithmeticBitForBit) {
    if (!rp::cpu::row_dot_is_simd(TensorType::BF16)) GTEST_SKIP() << "the portable loop states other arithmetic";
    Rng rng(53);
    for (int64_t K : {int64_t(544), int64_t(500), int64_t(96), int64_t(17)}) {
        std::vector<rp::cpu::DotColumn> cols(rp::cpu::kRowDotColumns);
        std::vector<std::vector<float>> xs;
        for (auto & c : cols) {   // columns of one magnitude: every block's rounding reaches the result
            xs.emplace_back(static_cast<size_t>(K));
            for (float & v : xs.back()) v = rng.uniform(-1.0f, 1.0f);
            rp::cpu::prepare_column(TensorType::BF16, xs.back().data(), K, c);
        }
        for (int r = 0; r < 4; ++r) {
            std::vector<uint16_t> row(static_cast<size_t>(K));
            for (auto & v : row) v = rp::fp32_to_bf16(std::copysign(rng.uniform(0.5f, 2.0f), rng.uniform(-1.0f, 1.0f)));
            for (int n = 1; n <= rp::cpu::kRowDotColumns; ++n) {
                std::vector<const rp::cpu::DotColumn *> ptrs;
                for (int c = 0; c < n; ++c) ptrs.push_back(&cols[size_t(c)]);
                float out[rp::cpu::kRowDotColumns];
                rp::cpu::row_dot_columns(TensorType::BF16, row.data(), ptrs.data(), n, out);
                for (int c = 0; c < n; ++c)
                    ASSERT_EQ(std::bit_cast<uint32_t>(out[c]), std::bit_cast<uint32_t>(stated_bf16_dot(row.data(), cols[size_t(c)].bf16, K)))
                        << "K=" << K << " row " << r << " n=" << n << " column " << c;
            }
        }
    }
}

// BF16, F32 and F16 rows of lengths with a tail (a partial 64-element step, a partial 32- or 16-element block):
// row_dot_columns' row loaded once for a group of columns gives each column row_dot's bits, for 1 to 8 columns.
TEST(MatvecDot, FloatColumnsAtOnceWithTailsAreEachTheirOwnDot) {
    Rng rng(37);
    for (TensorType t : {TensorType::BF16, TensorType::F32, TensorType::F16})
        for (int64_t K : {int64_t(544), int64_t(500), int64_t(17)}) expect_columns_are_own_dots(t, K, 5, rng);
}

// MXFP4's scales 2^(e - 128) for every exponent, e = 0 and 1 the subnormals, made 8 blocks at a time: a row whose only
// non-zero block (of 8, or of 9: the one-by-one tail) has exponent e, against the double dot of the dequantized
// block in double (the column scaled so the products stay normal).
TEST(MatvecDot, MxFp4EveryScaleExponent) {
    Rng rng(43);
    for (int64_t K : {int64_t(256), int64_t(288)})
        for (int e = 0; e < 256; ++e) {
            std::vector<rp::block_mxfp4> row(size_t(K / 32));
            for (auto & b : row) b = rp::block_mxfp4{};
            rp::block_mxfp4 & b = row[size_t(K / 32 - 1 - e % 3)];
            b.e = uint8_t(e);
            for (auto & q : b.qs) q = uint8_t(rng.uniform(0.0f, 255.99f));
            const float amp = e < 64 ? 1e30f : e > 192 ? 1e-30f : 1.0f;
            std::vector<float> x(static_cast<size_t>(K));
            for (float & v : x) v = rng.uniform(-amp, amp);
            rp::cpu::DotColumn c;
            rp::cpu::prepare_column(TensorType::MXFP4, x.data(), K, c);
            double want = 0.0, mag = 0.0;  // (in double: the largest scales' f32 values overflow)
            for (int64_t k = 0; k < K; ++k) {
                const rp::block_mxfp4 & bk = row[size_t(k / 32)];
                const int j = int(k % 32), code = j < 16 ? bk.qs[j] & 0xF : bk.qs[j - 16] >> 4;
                const double wk = double(rp::mxfp4_value(code)) * double(rp::e8m0_to_fp32_half(bk.e));
                const double p = wk * used_value(TensorType::MXFP4, c, k);
                want += p;
                mag += std::fabs(p);
            }
            const float got = rp::cpu::row_dot(TensorType::MXFP4, row.data(), c);
            ASSERT_LE(std::fabs(got - want), 1e-5 * mag + 1e-37) << "e=" << e << " K=" << K << " got " << got << " want " << want;
        }
}

// row_dot_columns (a decode step's sequences at once; the int8 types decode each block once for all) gives every
// column row_dot's bits, for 1 to 8 columns of every type.
TEST(MatvecDot, ColumnsAtOnceAreEachTheirOwnDot) {
    Rng rng(31);
    for (TensorType t : kDotTypes) expect_columns_are_own_dots(t, 512, 7, rng);
}
