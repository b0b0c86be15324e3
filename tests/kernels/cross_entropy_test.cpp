// lm_head_ce against a naive double-precision logits -> log_softmax -> NLL written here, for chunks of 1, 7
// and V rows, ignored labels and several weight types; its gradients against central finite differences of
// that reference and against the closed form (softmax - onehot); bit-identical results on 1 and 2 threads.
#include "ggml_rp/cpu/cross_entropy.h"
#include "base/error.h"
#include "kernels_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using namespace kt;
using rp::cpu::LmHeadCEShape;

// W as doubles [V][C] (row v = the C weights of vocabulary entry v), h [T][C].
struct Problem {
    int64_t C, V, T;
    std::vector<double> W, h;
    std::vector<int32_t> labels;
    double scale;
};

// sum over unmasked t of scale * (logsumexp(logits_t) - logits_t[label]); optional per-token float error bound.
double reference_loss(const Problem & p, double * bound = nullptr) {
    const double u = std::ldexp(1.0, -24);
    double loss = 0.0, err = 0.0;
    std::vector<double> z(size_t(p.V));
    for (int64_t t = 0; t < p.T; ++t) {
        double mx = -INFINITY, abs_dot = 0.0;
        for (int64_t v = 0; v < p.V; ++v) {
            double d = 0.0, a = 0.0;
            for (int64_t c = 0; c < p.C; ++c) {
                d += p.W[size_t(v * p.C + c)] * p.h[size_t(t * p.C + c)];
                a += std::fabs(p.W[size_t(v * p.C + c)] * p.h[size_t(t * p.C + c)]);
            }
            z[size_t(v)] = d;
            mx = std::max(mx, d);
            abs_dot = std::max(abs_dot, a);
        }
        double se = 0.0;
        for (int64_t v = 0; v < p.V; ++v) se += std::exp(z[size_t(v)] - mx);
        const double lse = mx + std::log(se);
        if (p.labels[size_t(t)] < 0) continue;
        loss += p.scale * (lse - z[size_t(p.labels[size_t(t)])]);
        // Two float logits off by (C+2) u sum|w h| each, the float exp (3e-7) and the rounding of lse.
        err += p.scale * (2 * double(p.C + 2) * u * abs_dot + 3e-7 + double(p.V + 4) * u + 2 * u * std::fabs(lse));
    }
    if (bound) *bound = err + 2 * u * std::fabs(loss);
    return loss;
}

// Closed form: G[v, t] = scale * (softmax_t[v] - [v == label_t]), dh = W G, dW = h G^T.
void reference_grads(const Problem & p, std::vector<double> & dh, std::vector<double> & dW) {
    dh.assign(size_t(p.C * p.T), 0.0);
    dW.assign(size_t(p.C * p.V), 0.0);
    std::vector<double> z(size_t(p.V));
    for (int64_t t = 0; t < p.T; ++t) {
        if (p.labels[size_t(t)] < 0) continue;
        double mx = -INFINITY;
        for (int64_t v = 0; v < p.V; ++v) {
            double d = 0.0;
            for (int64_t c = 0; c < p.C; ++c) d += p.W[size_t(v * p.C + c)] * p.h[size_t(t * p.C + c)];
            z[size_t(v)] = d;
            mx = std::max(mx, d);
        }
        double se = 0.0;
        for (int64_t v = 0; v < p.V; ++v) se += std::exp(z[size_t(v)] - mx);
        for (int64_t v = 0; v < p.V; ++v) {
            const double g = p.scale * (std::exp(z[size_t(v)] - mx) / se - (v == p.labels[size_t(t)] ? 1.0 : 0.0));
            for (int64_t c = 0; c < p.C; ++c) {
                dh[size_t(t * p.C + c)] += p.W[size_t(v * p.C + c)] * g;
                dW[size_t(v * p.C + c)] += p.h[size_t(t * p.C + c)] * g;
            }
        }
    }
}

struct Case {
    Problem p;
    Weight w;
    std::vector<float> h;
};

// Random problem with weights of type `type` (the reference uses their dequantized values); every third
// label ignored, labels also at 0 and V-1.
Case make_case(TensorType type, int64_t C, int64_t V, int64_t T, uint64_t seed, float h_amp = 1.0f) {
    Rng rng(seed);
    Case c{{C, V, T, {}, {}, {}, 0.0}, make_weight(type, C, V, rng, 8), random_floats(size_t(C * T), rng, h_amp)};
    c.p.W = c.w.deq;
    c.p.h.assign(c.h.begin(), c.h.end());
    int64_t unmasked = 0;
    for (int64_t t = 0; t < T; ++t) {
        int32_t y = int32_t(rng.below(V));
        if (t == 1) y = 0;
        if (t == 2) y = int32_t(V - 1);
        if (t % 3 == 0) y = -1;
        c.p.labels.push_back(y);
        unmasked += y >= 0;
    }
    c.p.scale = 1.0 / double(std::max<int64_t>(unmasked, 1));
    return c;
}

struct Result {
    double loss;
    std::vector<float> dh, dW;
};
Result run(const Case & c, int64_t chunk, bool grads, float dw_init = 0.0f) {
    const Problem & p = c.p;
    Result r{0.0, std::vector<float>(size_t(p.C * p.T), NAN), std::vector<float>(size_t((p.C + 3) * p.V), dw_init)};
    r.loss = rp::cpu::lm_head_ce({p.C, p.V, p.T, chunk}, c.h.data(), c.w.data(), c.w.type, c.w.row_bytes,
                                 p.labels.data(), float(p.scale), grads ? r.dh.data() : nullptr,
                                 grads ? r.dW.data() : nullptr, p.C + 3);
    return r;
}

TEST(LmHeadCE, LossMatchesNaiveDouble) {
    for (TensorType type : {TensorType::F32, TensorType::F16, TensorType::Q8_0, TensorType::Q4_K}) {
        const int64_t C = type == TensorType::Q4_K ? 256 : 64;
        const Case c = make_case(type, C, 53, 19, 80 + uint64_t(type), 2.0f);
        double bound = 0.0;
        const double want = reference_loss(c.p, &bound);
        for (int64_t chunk : {int64_t(1), int64_t(7), c.p.V, c.p.V + 100}) {
            const double got = run(c, chunk, false).loss;
            EXPECT_LE(std::fabs(got - want), bound) << gguf::type_name(uint32_t(type)) << " chunk " << chunk
                                                    << ": got " << got << " want " << want;
            // With gradients requested the loss is the same number.
            EXPECT_EQ(run(c, chunk, true).loss, got);
        }
        std::printf("  lm_head_ce %s loss %.9f (reference %.9f, bound %.1e)\n", gguf::type_name(uint32_t(type)),
                    run(c, 7, false).loss, want, bound);
    }
}

// dh and dW against central differences of the double reference loss, for each chunking.
TEST(LmHeadCE, GradientsMatchFiniteDifferences) {
    Case c = make_case(TensorType::F32, 32, 37, 7, 90);
    for (int64_t chunk : {int64_t(1), int64_t(7), c.p.V}) {
        const Result r = run(c, chunk, true, 0.0f);
        const double eps = 1e-3;
        auto fd = [&](std::vector<double> & x, size_t i) {
            const double x0 = x[i];
            x[i] = x0 + eps;
            const double lp = reference_loss(c.p);
            x[i] = x0 - eps;
            const double lm = reference_loss(c.p);
            x[i] = x0;
            return (lp - lm) / (2 * eps);
        };
        double eh = 0.0, mh = 0.0, ew = 0.0, mw = 0.0;
        for (int64_t t = 0; t < c.p.T; ++t)
            for (int64_t k = 0; k < c.p.C; ++k) {
                const double g = fd(c.p.h, size_t(t * c.p.C + k));
                eh = std::max(eh, std::fabs(double(r.dh[size_t(t * c.p.C + k)]) - g));
                mh = std::max(mh, std::fabs(g));
            }
        for (int64_t v = 0; v < c.p.V; ++v)
            for (int64_t k = 0; k < c.p.C; ++k) {
                const double g = fd(c.p.W, size_t(v * c.p.C + k));
                ew = std::max(ew, std::fabs(double(r.dW[size_t(v * (c.p.C + 3) + k)]) - g));
                mw = std::max(mw, std::fabs(g));
            }
        std::printf("  lm_head_ce chunk %lld vs finite differences: rel max error dh %.2e dW %.2e\n", (long long)chunk,
                    eh / mh, ew / mw);
        EXPECT_LT(eh / mh, 1e-3) << "chunk " << chunk;
        EXPECT_LT(ew / mw, 1e-3) << "chunk " << chunk;
        // Ignored tokens get exactly zero gradient.
        for (int64_t t = 0; t < c.p.T; t += 3)
            for (int64_t k = 0; k < c.p.C; ++k) EXPECT_EQ(r.dh[size_t(t * c.p.C + k)], 0.0f);
    }
}

// Larger vocabulary, quantized and half weights: gradients against the closed form; dW accumulates.
TEST(LmHeadCE, GradientsMatchClosedFormLarge) {
    for (TensorType type : {TensorType::F32, TensorType::BF16, TensorType::Q4_0, TensorType::Q6_K}) {
        const int64_t C = type == TensorType::Q6_K ? 256 : 96;
        const Case c = make_case(type, C, 1000, 33, 100 + uint64_t(type), 1.5f);
        std::vector<double> rdh, rdW;
        reference_grads(c.p, rdh, rdW);
        for (int64_t chunk : {int64_t(7), int64_t(256), c.p.V}) {
            const Result r = run(c, chunk, true, 0.5f);
            double eh = 0.0, mh = 0.0, ew = 0.0, mw = 0.0;
            for (size_t i = 0; i < rdh.size(); ++i) {
                eh = std::max(eh, std::fabs(double(r.dh[i]) - rdh[i]));
                mh = std::max(mh, std::fabs(rdh[i]));
            }
            for (int64_t v = 0; v < c.p.V; ++v) {
                for (int64_t k = 0; k < C; ++k) {
                    const double want = 0.5 + rdW[size_t(v * C + k)];
                    ew = std::max(ew, std::fabs(double(r.dW[size_t(v * (C + 3) + k)]) - want));
                    mw = std::max(mw, std::fabs(rdW[size_t(v * C + k)]));
                }
                for (int64_t k = C; k < C + 3; ++k) ASSERT_EQ(r.dW[size_t(v * (C + 3) + k)], 0.5f);   // row gap
            }
            std::printf("  lm_head_ce %s V=1000 chunk %lld vs closed form: rel max error dh %.2e dW %.2e\n",
                        gguf::type_name(uint32_t(type)), (long long)chunk, eh / mh, ew / mw);
            EXPECT_LT(eh / mh, 1e-4);
            EXPECT_LT(ew / mw, 1e-4);
        }
    }
}

TEST(LmHeadCE, DeterministicAcrossThreadCounts) {
    const Case c = make_case(TensorType::Q8_0, 128, 3000, 70, 110);
    auto go = [&](int threads) {
        ScopedThreads th(threads);
        return run(c, 512, true, 0.0f);
    };
    const Result a = go(1), b = go(2);
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_TRUE(bit_equal(a.dh, b.dh));
    EXPECT_TRUE(bit_equal(a.dW, b.dW));
}

TEST(LmHeadCE, BadInputsThrow) {
    Case c = make_case(TensorType::F32, 32, 10, 4, 120);
    c.p.labels[2] = 10;   // == V
    EXPECT_THROW(run(c, 4, false), rp::Error);
    c.p.labels[2] = -2;
    EXPECT_THROW(run(c, 4, false), rp::Error);
    c.p.labels[2] = 3;
    EXPECT_THROW(run(c, 0, false), rp::Error);
    EXPECT_NO_THROW(run(c, 4, false));
}

} // namespace
