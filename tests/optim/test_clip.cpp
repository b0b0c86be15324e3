// Global-norm clipping against a naive long-double computation; thread-count independence of the norm.
#include "optim_test_util.h"

#include "ggml_rp/optim/clip.h"
#include "base/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

using optim_test::random_vector;

namespace {

long double naive_norm(const std::vector<std::vector<float>> & gs) {
    long double s = 0;
    for (const auto & g : gs) {
        for (const float x : g) s += static_cast<long double>(x) * x;
    }
    return std::sqrt(s);
}

std::vector<std::vector<float>> sample_grads() {
    // Sizes around the block size and one large enough for the parallel path; one empty tensor.
    return {random_vector(5, 1), random_vector(4096, 2, 0.1), {}, random_vector(4097, 3, 3.0),
            random_vector(300001, 4, 0.01)};
}

std::vector<std::span<float>> spans(std::vector<std::vector<float>> & gs) {
    return {gs.begin(), gs.end()};
}

TEST(ClipGradNorm, NormMatchesNaive) {
    std::vector<std::vector<float>> gs = sample_grads();
    const std::vector<std::span<const float>> cs(gs.begin(), gs.end());
    const long double ref = naive_norm(gs);
    EXPECT_NEAR(rp::grad_norm(cs), static_cast<double>(ref), 1e-12 * static_cast<double>(ref));
}

TEST(ClipGradNorm, ClipsToMaxNorm) {
    std::vector<std::vector<float>> gs = sample_grads();
    const std::vector<std::vector<float>> orig = gs;
    const long double ref = naive_norm(gs);
    const float max_norm = 1.5f;
    ASSERT_GT(ref, 10 * max_norm);
    const double norm = rp::clip_grad_norm(spans(gs), max_norm);
    EXPECT_NEAR(norm, static_cast<double>(ref), 1e-12 * static_cast<double>(ref));
    const long double coef = max_norm / (ref + 1e-6L);
    for (size_t t = 0; t < gs.size(); ++t) {
        for (size_t i = 0; i < gs[t].size(); ++i) {
            ASSERT_NEAR(gs[t][i], orig[t][i] * coef, 1e-6 * std::fabs(orig[t][i] * coef) + 1e-30) << t << ":" << i;
        }
    }
    EXPECT_NEAR(static_cast<double>(naive_norm(gs)), max_norm, 1e-5);
}

TEST(ClipGradNorm, BelowMaxNormLeavesGradsUntouched) {
    std::vector<std::vector<float>> gs = {{3.0f, 4.0f}, {0.0f}};  // norm 5
    EXPECT_DOUBLE_EQ(rp::clip_grad_norm(spans(gs), 6.0f), 5.0);
    EXPECT_EQ(gs[0], (std::vector<float>{3.0f, 4.0f}));
    // Exactly at the limit: coef = 5 / (5 + 1e-6) < 1 scales by a hair, like PyTorch.
    const double n = rp::clip_grad_norm(spans(gs), 5.0f);
    EXPECT_DOUBLE_EQ(n, 5.0);
    EXPECT_NEAR(gs[0][0], 3.0 * 5.0 / (5.0 + 1e-6), 1e-6);
}

TEST(ClipGradNorm, NonFiniteNormSkipsScaling) {
    std::vector<std::vector<float>> gs = {{1.0f, INFINITY}, {2.0f}};
    EXPECT_TRUE(std::isinf(rp::clip_grad_norm(spans(gs), 1.0f)));
    EXPECT_EQ(gs[1][0], 2.0f);
    std::vector<std::vector<float>> ns = {{NAN}};
    EXPECT_TRUE(std::isnan(rp::clip_grad_norm(spans(ns), 1.0f)));
}

TEST(ClipGradNorm, RejectsBadMaxNorm) {
    std::vector<std::vector<float>> gs = {{1.0f}};
    EXPECT_THROW(rp::clip_grad_norm(spans(gs), 0.0f), rp::Error);
    EXPECT_THROW(rp::clip_grad_norm(spans(gs), -1.0f), rp::Error);
    EXPECT_THROW(rp::clip_grad_norm(spans(gs), NAN), rp::Error);
}

TEST(ClipGradNorm, SameBitsForAnyThreadCount) {
    std::vector<std::vector<float>> gs = sample_grads();
    gs.push_back(random_vector(1 << 20, 9));
    const std::vector<std::span<const float>> cs(gs.begin(), gs.end());
#ifdef _OPENMP
    const int prev = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
    const double one = rp::grad_norm(cs);
#ifdef _OPENMP
    omp_set_num_threads(4);
#endif
    const double four = rp::grad_norm(cs);
#ifdef _OPENMP
    omp_set_num_threads(prev);
#endif
    EXPECT_EQ(one, four);  // bitwise: the reduction order is fixed
    EXPECT_NEAR(one, static_cast<double>(naive_norm(gs)), 1e-12 * one);
}

} // namespace
