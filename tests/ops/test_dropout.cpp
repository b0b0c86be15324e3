// DROPOUT (ggml_rp/ops/dropout.h): backward vs central finite differences (harness.h), the mask against its
// definition in counter_rng.h, bit-identical results for any thread count and for a strided input vs its
// contiguous copy, keep rate and kept values, independence of masks across keys and offsets, the exact shift
// by counter_offset (how a batch is split into micro-batches must not change a sequence's mask), and errors.
#include "harness.h"

#include "ggml_rp/core/counter_rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

using namespace optest;
using rp::Context;
using rp::DType;
using rp::Tensor;
using TV = std::vector<Tensor *>;
using R = RefInputs;

namespace {

// The definition, in double: y_i = x_i * (rng_uniform(key, offset + i) >= p ? float(1 / (1 - p)) : 0).
ref::DT ref_dropout(const ref::DT & x, float p, uint64_t key, uint64_t offset) {
    const double scale = static_cast<double>(1.0f / (1.0f - p));
    ref::DT y(x.ne);
    for (size_t i = 0; i < x.v.size(); ++i)
        y.v[i] = rp::rng_uniform(key, offset + i) >= p ? x.v[i] * scale : 0.0;
    return y;
}

Tensor * leaf(Context & ctx, std::array<int64_t, 4> ne, const std::vector<float> & v) {
    Tensor * t = ctx.new_tensor(DType::F32, ne[0], ne[1], ne[2], ne[3]);
    ctx.alloc_data(t);
    rp::tensor_set_f32(t, v);
    return t;
}

std::vector<float> random_values(size_t n, float lo, float hi, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float & x : v) x = u(rng);
    return v;
}

// Computes the forward graph of `outs` on the CPU with n_threads; each output's values in logical order.
std::vector<std::vector<float>> run(const TV & outs, int n_threads) {
    rp::Graph g;
    for (Tensor * o : outs) {
        o->flags |= rp::kFlagOutput;
        rp::build_forward(g, o);
    }
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, n_threads);
    std::vector<std::vector<float>> r;
    for (Tensor * o : outs) r.push_back(rp::tensor_get_f32(o));
    return r;
}

bool same_bits(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every kernel takes its parallel path, however small the tensor.
struct ParallelAlways {
    ParallelAlways() { rp::cpu::set_min_parallel_elements(0); }
    ~ParallelAlways() { rp::cpu::set_min_parallel_elements(16384); }
};

constexpr uint64_t kKey = 0x5eed0000cafef00dull;

} // namespace

TEST(OpDropout, GradientMatchesFiniteDifferences) {
    check_op({"dropout p=0.3 [17,5,2]", {{"x", {17, 5, 2, 1}}},
              [](Context & c, const TV & in) { return rp::dropout(c, in[0], 0.3f, kKey); },
              [](const R & x) { return ref_dropout(x[0], 0.3f, kKey, 0); }});
    // Strided input, an offset that is not a multiple of a Philox block (4 values).
    check_op({"dropout p=0.5 transposed [5,13]^T offset 7", {{"x_t", {5, 13, 1, 1}}},
              [](Context & c, const TV & in) { return rp::dropout(c, rp::transpose(c, in[0]), 0.5f, kKey, 7); },
              [](const R & x) { return ref_dropout(ref::permute(x[0], 1, 0, 2, 3), 0.5f, kKey, 7); }});
    // Inside a non-linear chain, with a second parameter after it (LoRA: A applied to dropout(x)).
    Input x{"x", {6, 9, 1, 1}};
    x.lo = -3.0f;
    x.hi = 3.0f;
    check_op({"silu(dropout p=0.25 [6,9]) * w", {x, {"w", {6, 9, 1, 1}}},
              [](Context & c, const TV & in) { return rp::mul(c, rp::silu(c, rp::dropout(c, in[0], 0.25f, kKey, 3)), in[1]); },
              [](const R & v) { return ref::mul(ref::silu(ref_dropout(v[0], 0.25f, kKey, 3)), v[1]); }});
}

TEST(OpDropout, MatchesTheCounterRngDefinitionExactly) {
    // Short rows (the CPU kernel's one-block path) and long rows (its 128-value runs, entered at every word
    // of a block and crossing run boundaries), with offsets that wrap around 2^64 inside the tensor.
    ParallelAlways parallel;
    struct Shape {
        std::array<int64_t, 4> ne;
        uint64_t offset;
    };
    const Shape shapes[] = {{{33, 7, 3, 2}, 0xfffffffffffffff0ull}, {{301, 5, 2, 1}, 0xfffffffffffffe01ull},
                            {{1000, 3, 1, 1}, 2}, {{1, 50, 1, 1}, 0}};
    for (const Shape & sh : shapes) {
        Context ctx;
        const size_t n = static_cast<size_t>(sh.ne[0] * sh.ne[1] * sh.ne[2] * sh.ne[3]);
        std::vector<float> v = random_values(n, -2.0f, 2.0f, 11);
        v[0] = std::numeric_limits<float>::quiet_NaN();
        v[n - 1] = -std::numeric_limits<float>::infinity();
        Tensor * x = leaf(ctx, sh.ne, v);
        const float p = 0.37f;
        const std::vector<float> y = run({rp::dropout(ctx, x, p, kKey, sh.offset)}, 2)[0];
        const float scale = 1.0f / (1.0f - p);
        int64_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
            if (!std::isfinite(v[i])) {
                EXPECT_FALSE(std::isfinite(y[i])) << "a non-finite input must stay non-finite, element " << i;
                continue;
            }
            const bool keep = rp::rng_uniform(kKey, sh.offset + i) >= p;
            bad += y[i] != (keep ? v[i] * scale : 0.0f);
        }
        EXPECT_EQ(bad, 0) << "shape [" << sh.ne[0] << ", " << sh.ne[1] << ", " << sh.ne[2] << ", " << sh.ne[3] << "]";
    }
}

TEST(OpDropout, SameBitsForOneAndTwoThreads) {
    // 1e6 elements: well above the serial cut-off, so the OpenMP partition is the real one.
    Context ctx;
    const std::vector<float> v = random_values(1000 * 1000, -1.0f, 1.0f, 3);
    Tensor * x = leaf(ctx, {1000, 1000, 1, 1}, v);
    const std::vector<float> a = run({rp::dropout(ctx, x, 0.1f, kKey, 12345)}, 1)[0];
    const std::vector<float> b = run({rp::dropout(ctx, x, 0.1f, kKey, 12345)}, 2)[0];
    EXPECT_TRUE(same_bits(a, b));
    // And a small tensor through the parallel path with odd rows.
    ParallelAlways parallel;
    Tensor * s = leaf(ctx, {13, 11, 3, 1}, random_values(13 * 11 * 3, -1.0f, 1.0f, 4));
    EXPECT_TRUE(same_bits(run({rp::dropout(ctx, s, 0.5f, kKey, 1)}, 1)[0], run({rp::dropout(ctx, s, 0.5f, kKey, 1)}, 2)[0]));
}

TEST(OpDropout, StridedInputGivesTheMaskOfItsContiguousCopy) {
    ParallelAlways parallel;
    Context ctx;
    Tensor * x = leaf(ctx, {6, 5, 4, 3}, random_values(6 * 5 * 4 * 3, 0.5f, 1.5f, 5));
    Tensor * perm = rp::permute(ctx, x, 2, 0, 3, 1);
    Tensor * tr = rp::transpose(ctx, x);
    const auto r = run({rp::dropout(ctx, perm, 0.5f, kKey, 9), rp::dropout(ctx, rp::cont(ctx, perm), 0.5f, kKey, 9),
                        rp::dropout(ctx, tr, 0.5f, kKey, 9), rp::dropout(ctx, rp::cont(ctx, tr), 0.5f, kKey, 9)},
                       2);
    EXPECT_TRUE(same_bits(r[0], r[1])) << "permuted";
    EXPECT_TRUE(same_bits(r[2], r[3])) << "transposed";
    EXPECT_FALSE(same_bits(r[0], r[2]));  // different logical orders of the same values: different masks
}

TEST(OpDropout, KeepRateAndKeptValues) {
    const int64_t n = 1000 * 1000;
    const std::vector<float> v = random_values(static_cast<size_t>(n), 0.5f, 1.5f, 6);  // never 0
    for (float p : {0.05f, 0.1f, 0.5f, 0.9f}) {
        Context ctx;
        Tensor * x = leaf(ctx, {1000, 1000, 1, 1}, v);
        const std::vector<float> y = run({rp::dropout(ctx, x, p, rp::rng_key(1, 2, 3))}, 2)[0];
        const float scale = 1.0f / (1.0f - p);
        int64_t kept = 0, bad = 0;
        for (size_t i = 0; i < y.size(); ++i) {
            if (y[i] == 0.0f) continue;
            ++kept;
            if (y[i] != v[i] * scale) ++bad;
        }
        EXPECT_EQ(bad, 0) << "p " << p << ": kept values must be exactly x * float(1 / (1 - p))";
        // Binomial(n, 1 - p): within 5 standard deviations.
        const double sd = std::sqrt(n * static_cast<double>(p) * (1.0 - p));
        EXPECT_NEAR(static_cast<double>(kept), n * (1.0 - p), 5.0 * sd) << "p " << p;
        std::printf("[ op ] dropout p=%.2f: kept %lld of %lld (expected %.0f, sd %.0f)\n", static_cast<double>(p),
                    static_cast<long long>(kept), static_cast<long long>(n), n * (1.0 - p), sd);
    }
}

TEST(OpDropout, DifferentKeysAndOffsetsGiveIndependentMasks) {
    // With p = 1/2, two independent masks agree on each element with probability 1/2.
    const int64_t n = 200000;
    Context ctx;
    Tensor * x = leaf(ctx, {n, 1, 1, 1}, std::vector<float>(static_cast<size_t>(n), 1.0f));
    const auto r = run({rp::dropout(ctx, x, 0.5f, rp::rng_key(7, 1, 2)), rp::dropout(ctx, x, 0.5f, rp::rng_key(7, 2, 1)),
                        rp::dropout(ctx, x, 0.5f, rp::rng_key(7, 1, 3)), rp::dropout(ctx, x, 0.5f, rp::rng_key(7, 1, 2), 1),
                        rp::dropout(ctx, x, 0.5f, rp::rng_key(7, 1, 2), 4)},
                       2);
    for (size_t k = 1; k < r.size(); ++k) {
        int64_t agree = 0;
        for (size_t i = 0; i < static_cast<size_t>(n); ++i) agree += (r[0][i] != 0.0f) == (r[k][i] != 0.0f);
        EXPECT_NEAR(static_cast<double>(agree), n / 2.0, 5.0 * std::sqrt(n / 4.0)) << "variant " << k;
    }
}

TEST(OpDropout, CounterOffsetShiftsTheMaskExactly) {
    // A batch of T tokens of width E under one key with offset o0, vs the micro-batch of its tokens t0..T-1
    // alone (a separate contiguous tensor, as a split would make) with offset o0 + t0 * E: the same mask.
    ParallelAlways parallel;
    const int64_t E = 7, T = 50, t0 = 21;  // E odd: the micro-batch starts in the middle of a Philox block
    const uint64_t o0 = 3;
    const std::vector<float> v = random_values(static_cast<size_t>(E * T), 0.5f, 1.5f, 8);
    Context ctx;
    Tensor * full = leaf(ctx, {E, T, 1, 1}, v);
    Tensor * part = leaf(ctx, {E, T - t0, 1, 1}, std::vector<float>(v.begin() + t0 * E, v.end()));
    // The same micro-batch as a window of the full tensor.
    const int64_t wne[4] = {E, T - t0, 1, 1};
    const size_t wnb[4] = {4, 4 * E, 4 * E * (T - t0), 4 * E * (T - t0)};
    Tensor * window = rp::view(ctx, full, wne, wnb, static_cast<size_t>(4 * E * t0));
    const auto r = run({rp::dropout(ctx, full, 0.4f, kKey, o0), rp::dropout(ctx, part, 0.4f, kKey, o0 + t0 * E),
                        rp::dropout(ctx, window, 0.4f, kKey, o0 + t0 * E), rp::dropout(ctx, part, 0.4f, kKey, o0)},
                       2);
    const std::vector<float> expect(r[0].begin() + t0 * E, r[0].end());
    EXPECT_TRUE(same_bits(r[1], expect)) << "separate micro-batch tensor";
    EXPECT_TRUE(same_bits(r[2], expect)) << "window view";
    EXPECT_FALSE(same_bits(r[3], expect)) << "without the offset the micro-batch gets another mask";
    // Shifts by 1..5 elements of a 1-D tensor: dropout(x[k:], offset k) == dropout(x)[k:].
    Tensor * line = leaf(ctx, {40, 1, 1, 1}, random_values(40, 0.5f, 1.5f, 9));
    const std::vector<float> whole = run({rp::dropout(ctx, line, 0.5f, kKey)}, 1)[0];
    for (int64_t k = 1; k <= 5; ++k) {
        const int64_t ne[4] = {40 - k, 1, 1, 1};
        const size_t nb[4] = {4, static_cast<size_t>(4 * (40 - k)), static_cast<size_t>(4 * (40 - k)), static_cast<size_t>(4 * (40 - k))};
        Tensor * tail = rp::view(ctx, line, ne, nb, static_cast<size_t>(4 * k));
        const std::vector<float> got = run({rp::dropout(ctx, tail, 0.5f, kKey, static_cast<uint64_t>(k))}, 2)[0];
        EXPECT_TRUE(same_bits(got, std::vector<float>(whole.begin() + k, whole.end()))) << "shift " << k;
    }
}

TEST(OpDropout, BackwardRegeneratesTheForwardMask) {
    // loss = sum(w * dropout(x)): dx = w * keep * scale with the forward's keep, regenerated (nothing saved).
    Context ctx;
    const int64_t n0 = 37, n1 = 9;
    const std::vector<float> xv = random_values(static_cast<size_t>(n0 * n1), 0.5f, 1.5f, 10);
    const std::vector<float> wv = random_values(static_cast<size_t>(n0 * n1), 0.5f, 1.5f, 12);
    Tensor * x = leaf(ctx, {n0, n1, 1, 1}, xv);
    Tensor * w = leaf(ctx, {n0, n1, 1, 1}, wv);
    rp::set_param(ctx, x);
    ctx.alloc_data(x->grad);
    rp::tensor_set_f32(x->grad, std::vector<float>(xv.size(), 0.0f));
    const float p = 0.3f;
    Tensor * y = rp::dropout(ctx, x, p, kKey, 17);
    y->flags |= rp::kFlagOutput;
    Tensor * loss = rp::sum(ctx, rp::mul(ctx, y, w));
    rp::Graph g;
    rp::build_forward(g, loss);
    rp::build_backward(ctx, g, loss, {x});
    int dropout_nodes = 0;
    for (const Tensor * t : g.nodes) dropout_nodes += t->op == rp::Op::DROPOUT;
    EXPECT_EQ(dropout_nodes, 2);  // the forward and its backward
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, 2);
    const std::vector<float> yv = rp::tensor_get_f32(y), dx = rp::tensor_get_f32(x->grad);
    const float scale = 1.0f / (1.0f - p);
    for (size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(dx[i], yv[i] != 0.0f ? wv[i] * scale : 0.0f) << "element " << i;
}

TEST(OpDropout, ZeroProbabilityIsTheIdentity) {
    Context ctx;
    Tensor * x = ctx.new_tensor(DType::F32, 4, 3);
    EXPECT_EQ(rp::dropout(ctx, x, 0.0f, kKey), x);
    EXPECT_EQ(rp::dropout(ctx, x, -0.0f, kKey, 5), x);
}

TEST(OpDropout, InvalidProbabilityOrTypeThrows) {
    Context ctx;
    Tensor * x = ctx.new_tensor(DType::F32, 4, 3);
    x->name = "lora_in";
    auto message = [&](float p) {
        try {
            rp::dropout(ctx, x, p, kKey);
        } catch (const rp::Error & e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    const std::string m1 = message(1.0f);
    EXPECT_NE(m1.find("dropout"), std::string::npos) << m1;
    EXPECT_NE(m1.find("p = 1 "), std::string::npos) << m1;
    EXPECT_NE(m1.find("lora_in"), std::string::npos) << m1;
    const std::string m2 = message(-0.1f);
    EXPECT_NE(m2.find("p = -0.1"), std::string::npos) << m2;
    EXPECT_NE(message(1.5f).find("p = 1.5"), std::string::npos);
    EXPECT_NE(message(std::numeric_limits<float>::quiet_NaN()).find("p = nan"), std::string::npos);
    EXPECT_NE(message(std::numeric_limits<float>::infinity()).find("p = inf"), std::string::npos);
    Tensor * h = ctx.new_tensor(DType::F16, 4, 3);
    EXPECT_THROW(rp::dropout(ctx, h, 0.1f, kKey), rp::Error);
    EXPECT_STREQ(rp::op_name(rp::Op::DROPOUT), "DROPOUT");
}
