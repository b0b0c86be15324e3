// The int8 product of quantized weights with many tokens (ggml_rp/cpu/gemm_int8.h): its stated numerics against
// double references, its determinism (thread count, batch size, passes of tokens), and its place behind
// matmul_fwd (the row dots' switch, a session's scope, the types it does not take).
#include "ggml_rp/cpu/gemm_int8.h"

#include "ggml_rp/cpu/gemm.h"
#include "ggml_rp/cpu/matvec_dot.h"
#include "kernels_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using namespace kt;

const std::vector<TensorType> kInt8Types = {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1,
                                            TensorType::Q8_0, TensorType::MXFP4, TensorType::Q2_K, TensorType::Q3_K,
                                            TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};

// Tokens with blocks of very different scales, an all-zero block and a single large value.
std::vector<float> test_tokens(int64_t K, int64_t T, Rng & rng) {
    std::vector<float> x(static_cast<size_t>(K * T));
    for (int64_t t = 0; t < T; ++t)
        for (int64_t b = 0; 32 * b < K; ++b) {
            const float amp = (b + t) % 5 == 1 ? 0.0f : std::pow(10.0f, float(int((b + 3 * t) % 7)) - 3.0f);
            for (int64_t i = 32 * b; i < 32 * b + 32; ++i) x[size_t(t * K + i)] = rng.uniform(-amp, amp);
            if ((b + t) % 5 == 3) x[size_t(t * K + 32 * b + 7)] = 50.0f * amp;
        }
    return x;
}

int64_t sub_block(TensorType t) { return t == TensorType::Q2_K || t == TensorType::Q3_K || t == TensorType::Q6_K ? 16 : 32; }

TEST(GemmInt8, SupportsTheTypesItStates) {
    if (!rp::cpu::int8_matmul_supports(TensorType::Q8_0, 32)) GTEST_SKIP() << "no AVX2: the exact path serves every product";
    for (TensorType t : weight_types()) {
        const bool want = std::find(kInt8Types.begin(), kInt8Types.end(), t) != kInt8Types.end();
        EXPECT_EQ(rp::cpu::int8_matmul_supports(t, 512), want) << gguf::type_name(uint32_t(t));
    }
    EXPECT_FALSE(rp::cpu::int8_matmul_supports(TensorType::Q4_K, 128));   // not whole super-blocks
    EXPECT_FALSE(rp::cpu::int8_matmul_supports(TensorType::Q8_0, 48));
}

// Every output equals, up to f32 accumulation, the double-precision sum of rp::dequantize_row's weights times the
// quantized token (quantize_column's d_b q'); against the exact token within that plus sum |w| |x - x'|. The bound is
// the row dots' (matvec_dot_test.cpp) for one chain of 2 K / G terms.
TEST(GemmInt8, MatchesDoubleReferencesForEveryType) {
    for (TensorType t : kInt8Types) {
        Rng rng(41);
        const char * name = gguf::type_name(uint32_t(t));
        for (int64_t K : block_size(t) == 32 ? std::vector<int64_t>{96, 352, 768, 3072} : std::vector<int64_t>{256, 768, 3072}) {
            if (!rp::cpu::int8_matmul_supports(t, K)) GTEST_SKIP() << "no AVX2";
            const int64_t N = 45, T = 11;   // rows: one full panel and a partial one; tokens: a tail of the kernel's group
            const Weight w = make_weight(t, K, N, rng, 8);
            const std::vector<float> x = test_tokens(K, T, rng);
            std::vector<float> y(size_t(N * T), -1.0f);
            rp::cpu::int8_matmul_fwd(K, N, T, w.data(), t, w.row_bytes, x.data(), K, y.data(), N, false, true);
            double worst_accum = 0.0, worst_round = 0.0;
            for (int64_t tok = 0; tok < T; ++tok) {
                rp::cpu::DotColumn c;
                rp::cpu::quantize_column(x.data() + tok * K, K, c);
                for (int64_t n = 0; n < N; ++n) {
                    double same = 0.0, exact = 0.0, mag = 0.0, wmax = 0.0, xsum = 0.0, round = 0.0;
                    for (int64_t k = 0; k < K; ++k) {
                        const double wk = w.at(k, n), xq = double(c.d[size_t(k / 32)]) * c.q[size_t(k)], xk = x[size_t(tok * K + k)];
                        same += wk * xq;
                        exact += wk * xk;
                        mag += std::fabs(wk * xq);
                        wmax = std::max(wmax, std::fabs(wk));
                        xsum += std::fabs(xq);
                        round += std::fabs(wk) * std::fabs(xq - xk);
                    }
                    const double bound = double(2 * K / sub_block(t) + 16) * std::ldexp(1.0, -24) * (mag + wmax * xsum) + 1e-30;
                    const double got = y[size_t(tok * N + n)];
                    ASSERT_LE(std::fabs(got - same), bound) << name << " K=" << K << " token " << tok << " row " << n;
                    ASSERT_LE(std::fabs(got - exact), round + bound) << name << " K=" << K << " token " << tok << " row " << n;
                    worst_accum = std::max(worst_accum, std::fabs(got - same) / bound);
                    worst_round = std::max(worst_round, std::fabs(got - exact) / (round + bound));
                }
            }
            std::printf("  %-5s K=%-5lld accumulation error %.2g of its bound, error vs the f32 tokens %.2g of its bound\n", name,
                        static_cast<long long>(K), worst_accum, worst_round);
        }
    }
}

// A token's outputs are its own bits: the same alone, in any batch (across the passes of 512 tokens), on 1 or 2
// threads; accumulate adds them to what was there.
TEST(GemmInt8, ATokensBitsDoNotDependOnItsBatchOrThreads) {
    for (TensorType t : kInt8Types) {
        const int64_t K = 256, N = 70, T = 530;
        if (!rp::cpu::int8_matmul_supports(t, K)) GTEST_SKIP() << "no AVX2";
        const char * name = gguf::type_name(uint32_t(t));
        Rng rng(43);
        const Weight w = make_weight(t, K, N, rng);
        const std::vector<float> x = test_tokens(K, T, rng);
        std::vector<float> y1(size_t(N * T)), y2(y1.size()), acc(y1.size(), 0.25f);
        {
            ScopedThreads th(1);
            rp::cpu::int8_matmul_fwd(K, N, T, w.data(), t, w.row_bytes, x.data(), K, y1.data(), N, false, true);
        }
        {
            ScopedThreads th(2);
            rp::cpu::int8_matmul_fwd(K, N, T, w.data(), t, w.row_bytes, x.data(), K, y2.data(), N, false, true);
            rp::cpu::int8_matmul_fwd(K, N, T, w.data(), t, w.row_bytes, x.data(), K, acc.data(), N, true, true);
        }
        EXPECT_TRUE(bit_equal(y1, y2)) << name << ": 1 vs 2 threads";
        for (size_t i = 0; i < y1.size(); ++i) ASSERT_EQ(acc[i], 0.25f + y1[i]) << name << " element " << i;
        for (int64_t tok : {int64_t(0), int64_t(5), int64_t(511), int64_t(512), int64_t(529)}) {
            std::vector<float> alone(static_cast<size_t>(N));
            rp::cpu::int8_matmul_fwd(K, N, 1, w.data(), t, w.row_bytes, x.data() + tok * K, K, alone.data(), N, false, false);
            EXPECT_EQ(std::memcmp(alone.data(), y1.data() + tok * N, size_t(N) * sizeof(float)), 0) << name << " token " << tok;
        }
    }
}

// A non-finite token makes its own outputs non-finite (a diverged run is not hidden), the others stay as they were.
TEST(GemmInt8, NonFiniteTokenGivesNonFiniteOutputsOnlyForItself) {
    const TensorType t = TensorType::Q4_K;
    const int64_t K = 512, N = 40, T = 9;
    if (!rp::cpu::int8_matmul_supports(t, K)) GTEST_SKIP() << "no AVX2";
    Rng rng(47);
    const Weight w = make_weight(t, K, N, rng);
    std::vector<float> x = test_tokens(K, T, rng), y(size_t(N * T)), clean(y.size());
    rp::cpu::int8_matmul_fwd(K, N, T, w.data(), t, w.row_bytes, x.data(), K, clean.data(), N, false, true);
    x[size_t(4 * K + 300)] = std::numeric_limits<float>::quiet_NaN();
    rp::cpu::int8_matmul_fwd(K, N, T, w.data(), t, w.row_bytes, x.data(), K, y.data(), N, false, true);
    for (int64_t tok = 0; tok < T; ++tok)
        for (int64_t n = 0; n < N; ++n) {
            const float v = y[size_t(tok * N + n)];
            if (tok == 4) EXPECT_FALSE(std::isfinite(v)) << "row " << n;
            else EXPECT_EQ(v, clean[size_t(tok * N + n)]) << "token " << tok << " row " << n;
        }
}

// matmul_fwd takes the int8 product for more tokens than the row dots take when the process asked for the row
// dots' numerics; the exact path otherwise: switch off, a session's scope that limits them to its decode steps, a
// type the int8 product does not take.
TEST(GemmInt8, MatmulTakesItOnlyWhereAsked) {
    const int64_t K = 512, N = 50, T = 20;
    for (TensorType t : {TensorType::Q8_0, TensorType::Q4_K, TensorType::Q6_K, TensorType::Q4_0, TensorType::BF16, TensorType::F16}) {
        const char * name = gguf::type_name(uint32_t(t));
        Rng rng(53);
        const Weight w = make_weight(t, K, N, rng);
        const std::vector<float> x = test_tokens(K, T, rng);
        std::vector<float> exact(size_t(N * T)), on(exact.size()), scoped(exact.size()), direct(exact.size());
        rp::cpu::matmul_fwd(K, N, T, w.data(), t, w.row_bytes, x.data(), K, exact.data(), N, false);
        {
            RowDotSwitch sw(true);
            rp::cpu::matmul_fwd(K, N, T, w.data(), t, w.row_bytes, x.data(), K, on.data(), N, false);
            rp::cpu::RowDotScope scope(true, 4);   // a session decoding 4 sequences: 20 tokens are a prompt
            rp::cpu::matmul_fwd(K, N, T, w.data(), t, w.row_bytes, x.data(), K, scoped.data(), N, false);
        }
        EXPECT_TRUE(bit_equal(scoped, exact)) << name;
        if (rp::cpu::int8_matmul_supports(t, K)) {
            rp::cpu::int8_matmul_fwd(K, N, T, w.data(), t, w.row_bytes, x.data(), K, direct.data(), N, false, true);
            EXPECT_TRUE(bit_equal(on, direct)) << name;
            EXPECT_FALSE(bit_equal(on, exact)) << name << ": the switch changed nothing";
        } else {
            EXPECT_TRUE(bit_equal(on, exact)) << name;
        }
    }
}

} // namespace
