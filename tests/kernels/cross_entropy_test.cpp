// lm_head_ce against a naive double-precision logits -> log_softmax -> NLL written here, for chunks of 1, 7
// and V rows, ignored labels and several weight types; its gradients against central finite differences of
// that reference and against the closed form (softmax - onehot); bit-identical results on 1 and 2 threads.
#include "ggml_rp/cpu/cross_entropy.h"
#include "ggml_rp/ops/lm_head_state.h"
#include "base/error.h"
#include "kernels_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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

// The larger cases: V = 1000, 33 tokens, f32 / bf16 / q4_0 / q6_k heads (C = 256 for q6_k's blocks of 256), each
// with its closed-form gradients: f(type, C, case, dh, dW).
template <class F>
void for_each_large_case(uint64_t seed, F && f) {
    for (TensorType type : {TensorType::F32, TensorType::BF16, TensorType::Q4_0, TensorType::Q6_K}) {
        const int64_t C = type == TensorType::Q6_K ? 256 : 96;
        const Case c = make_case(type, C, 1000, 33, seed + uint64_t(type), 1.5f);
        std::vector<double> rdh, rdW;
        reference_grads(c.p, rdh, rdW);
        f(type, C, c, rdh, rdW);
    }
}

// Larger vocabulary, quantized and half weights: gradients against the closed form; dW accumulates.
TEST(LmHeadCE, GradientsMatchClosedFormLarge) {
    for_each_large_case(100, [](TensorType type, int64_t C, const Case & c, const std::vector<double> & rdh,
                                const std::vector<double> & rdW) {
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
    });
}

// The gradient formed in the forward (aux.unit_dh_out), then scaled by the backward (aux.unit_dh_in), as
// LM_HEAD_CE / LM_HEAD_CE_BACK run it for a frozen head. dW (nullable) is asked of the backward too.
struct UnitResult {
    double loss;
    std::vector<float> lse, unit, dh, dW;
};
UnitResult run_unit(const Case & c, int64_t chunk, bool with_dw = false, float softcap = 0.0f) {
    const Problem & p = c.p;
    const LmHeadCEShape s{p.C, p.V, p.T, chunk, softcap};
    UnitResult r{0.0, std::vector<float>(size_t(p.T), NAN), std::vector<float>(size_t(p.C * p.T), NAN),
                 std::vector<float>(size_t(p.C * p.T), NAN), std::vector<float>(with_dw ? size_t(p.C * p.V) : 0, 0.0f)};
    std::vector<float> rest(size_t(p.T), NAN);
    r.loss = rp::cpu::lm_head_ce(s, c.h.data(), c.w.data(), c.w.type, c.w.row_bytes, p.labels.data(), float(p.scale), nullptr,
                                 nullptr, 0, {.lse_out = r.lse.data(), .rest_out = rest.data(), .unit_dh_out = r.unit.data()});
    EXPECT_EQ(rp::cpu::lm_head_ce(s, c.h.data(), c.w.data(), c.w.type, c.w.row_bytes, p.labels.data(), float(p.scale),
                                  r.dh.data(), with_dw ? r.dW.data() : nullptr, p.C,
                                  {.lse_in = r.lse.data(), .rest_in = rest.data(), .unit_dh_in = r.unit.data()}),
              0.0);
    return r;
}

double max_rel_error(const std::vector<float> & got, const std::vector<double> & want) {
    double e = 0.0, m = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
        e = std::max(e, std::fabs(double(got[i]) - want[i]));
        m = std::max(m, std::fabs(want[i]));
    }
    return e / m;
}

// Formed in the forward: the loss and logsumexps are the same bits as the forward alone; dh against the
// closed form as tightly as the two passes; masked tokens exactly 0; a dW asked of the backward too is the
// two-pass dW, bit for bit (its pass is unchanged).
TEST(LmHeadCE, GradientFormedInTheForward) {
    for_each_large_case(300, [](TensorType type, int64_t C, const Case & c, const std::vector<double> & rdh,
                                const std::vector<double> & rdW) {
        for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(256), c.p.V}) {
            SCOPED_TRACE(std::string(gguf::type_name(uint32_t(type))) + " chunk " + std::to_string(chunk));
            const UnitResult u = run_unit(c, chunk, true);
            const Result plain = run(c, chunk, false);
            std::vector<float> lse(size_t(c.p.T));
            rp::cpu::lm_head_ce({C, c.p.V, c.p.T, chunk}, c.h.data(), c.w.data(), c.w.type, c.w.row_bytes, c.p.labels.data(),
                                float(c.p.scale), nullptr, nullptr, 0, {.lse_out = lse.data()});
            EXPECT_EQ(u.loss, plain.loss);
            EXPECT_TRUE(bit_equal(u.lse, lse));
            const double e = max_rel_error(u.dh, rdh);
            std::printf("  lm_head_ce %s chunk %lld, dh formed in the forward vs closed form: rel max error %.2e\n",
                        gguf::type_name(uint32_t(type)), (long long)chunk, e);
            EXPECT_LT(e, 1e-4);
            for (int64_t t = 0; t < c.p.T; ++t) {
                if (c.p.labels[size_t(t)] >= 0) continue;
                for (int64_t k = 0; k < C; ++k) ASSERT_EQ(u.dh[size_t(t * C + k)], 0.0f);
            }
            const Result two = run(c, chunk, true, 0.0f);
            for (int64_t v = 0; v < c.p.V; ++v)
                for (int64_t k = 0; k < C; ++k) ASSERT_EQ(u.dW[size_t(v * C + k)], two.dW[size_t(v * (C + 3) + k)]);
        }
    });
}

// Gemma 2's soft-cap through the gradient formed in the forward: dh against the two-pass dh (which the op
// tests hold to the double reference through the cap).
TEST(LmHeadCE, GradientFormedInTheForwardThroughTheSoftCap) {
    const Case c = make_case(TensorType::F32, 64, 500, 19, 320, 2.0f);
    for (float cap : {1.0f, 30.0f})
        for (int64_t chunk : {int64_t(7), c.p.V}) {
            const UnitResult u = run_unit(c, chunk, false, cap);
            std::vector<float> dh(size_t(c.p.C * c.p.T));
            rp::cpu::lm_head_ce({c.p.C, c.p.V, c.p.T, chunk, cap}, c.h.data(), c.w.data(), c.w.type, c.w.row_bytes,
                                c.p.labels.data(), float(c.p.scale), dh.data(), nullptr, 0);
            const std::vector<double> want(dh.begin(), dh.end());
            const double e = max_rel_error(u.dh, want);
            std::printf("  lm_head_ce softcap %g chunk %lld, dh formed in the forward vs two passes: rel max error %.2e\n",
                        double(cap), (long long)chunk, e);
            EXPECT_LT(e, 1e-5);
        }
}

// A token the model is sure of (p_label = 1 - 5e-8): its gradient is the other tokens' small probabilities
// times their rows less (1 - p_label) times the label's row. Formed as p_label W_label - W_label in float, or
// with p_label - 1 from a float exp(l - lse), it would have about 100% error; both paths (the gradient formed in
// the forward, and the two passes with dW) keep the label apart and get it to the closed form's accuracy.
TEST(LmHeadCE, ASureTokenKeepsItsGradient) {
    const int64_t C = 16, V = 50, T = 3;
    Rng rng(330);
    Case c{{C, V, T, {}, {}, {7, 31, 0}, 1.0}, make_weight(TensorType::F32, C, V, rng, 8), random_floats(size_t(C * T), rng, 1.0f)};
    std::vector<float> W(size_t(C * V));
    for (float & x : W) x = 0.05f * (2.0f * float(rng.below(1u << 20)) / float(1u << 20) - 1.0f);
    for (int64_t t = 0; t < T; ++t) {  // raise the label's logit by 20 along h_t
        double n2 = 0.0;
        for (int64_t k = 0; k < C; ++k) n2 += double(c.h[size_t(t * C + k)]) * c.h[size_t(t * C + k)];
        const int32_t y = c.p.labels[size_t(t)];
        for (int64_t k = 0; k < C; ++k) W[size_t(y * C + k)] += float(20.0 * c.h[size_t(t * C + k)] / n2);
    }
    for (int64_t v = 0; v < V; ++v) std::memcpy(c.w.bytes.data() + size_t(v) * c.w.row_bytes, W.data() + v * C, size_t(C) * 4);
    c.p.W.assign(W.begin(), W.end());
    c.p.h.assign(c.h.begin(), c.h.end());
    std::vector<double> rdh, rdW;
    reference_grads(c.p, rdh, rdW);
    const UnitResult u = run_unit(c, 16);
    const Result two = run(c, 16, true);
    for (int64_t t = 0; t < T; ++t) {
        double e = 0.0, e2 = 0.0, n = 0.0;
        for (int64_t k = 0; k < C; ++k) {
            e += std::pow(double(u.dh[size_t(t * C + k)]) - rdh[size_t(t * C + k)], 2);
            e2 += std::pow(double(two.dh[size_t(t * C + k)]) - rdh[size_t(t * C + k)], 2);
            n += std::pow(rdh[size_t(t * C + k)], 2);
        }
        std::printf("  sure token %lld: |dh| %.2e, relative error %.2e (two passes: %.2e)\n", (long long)t, std::sqrt(n),
                    std::sqrt(e / n), std::sqrt(e2 / n));
        EXPECT_LT(std::sqrt(n), 1e-5);  // it is sure
        EXPECT_LT(std::sqrt(e / n), 1e-4);
        EXPECT_LT(std::sqrt(e2 / n), 1e-4);
        // The label's row of dW: -(1 - p_label) h_t, plus the other tokens' tiny p of it
        const int32_t y = c.p.labels[size_t(t)];
        double ew = 0.0, nw = 0.0;
        for (int64_t k = 0; k < C; ++k) {
            ew += std::pow(double(two.dW[size_t(y * (C + 3) + k)]) - rdW[size_t(y * C + k)], 2);
            nw += std::pow(rdW[size_t(y * C + k)], 2);
        }
        std::printf("  sure token %lld: the label's dW row |%.2e|, relative error %.2e\n", (long long)t, std::sqrt(nw), std::sqrt(ew / nw));
        EXPECT_LT(std::sqrt(ew / nw), 1e-4);
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
    auto unit = [&](int threads) {
        ScopedThreads th(threads);
        return run_unit(c, 512);
    };
    const UnitResult ua = unit(1), ub = unit(2);
    EXPECT_EQ(ua.loss, ub.loss);
    EXPECT_TRUE(bit_equal(ua.unit, ub.unit));
    EXPECT_TRUE(bit_equal(ua.dh, ub.dh));
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

// A streamed head (rp::cpu::lm_head_ce_range over ranges that are never together, then lm_head_ce_finish) gives
// the unstreamed op's bits: loss, logsumexps, 1 - p_label, token losses and the unit gradients, for ranges of one
// chunk, of several chunks and of a last partial one, with and without the soft-cap and the gradient; each range
// read from its own copy of its rows (as an upload gives it).
TEST(LmHeadCE, StreamedRangesGiveTheUnstreamedBits) {
    for_each_large_case(400, [](TensorType type, int64_t C, const Case & c, const std::vector<double> &, const std::vector<double> &) {
        const Problem & p = c.p;
        for (const int64_t chunk : {int64_t(7), int64_t(256)})
            for (const int64_t per_range : {int64_t(1), int64_t(3)})
                for (const float cap : {0.0f, 30.0f})
                    for (const bool grad : {false, true}) {
                        SCOPED_TRACE(std::string(gguf::type_name(uint32_t(type))) + " chunk " + std::to_string(chunk) + " x " +
                                     std::to_string(per_range) + " cap " + std::to_string(cap) + (grad ? " grad" : ""));
                        const LmHeadCEShape s{C, p.V, p.T, chunk, cap};
                        std::vector<float> lse(size_t(p.T)), rest(size_t(p.T)), tok(size_t(p.T)), unit(grad ? size_t(C * p.T) : 0);
                        const double loss = rp::cpu::lm_head_ce(s, c.h.data(), c.w.data(), c.w.type, c.w.row_bytes, p.labels.data(),
                                                                float(p.scale), nullptr, nullptr, 0,
                                                                {.lse_out = lse.data(), .rest_out = rest.data(), .token_loss = tok.data(),
                                                                 .unit_dh_out = grad ? unit.data() : nullptr});
                        // (NaN: garbage the first range must overwrite)
                        std::vector<double> buf(rp::lm_head_state_layout(C, p.T, grad).bytes / sizeof(double) + 1, std::nan(""));
                        const rp::cpu::LmHeadCEState st = rp::lm_head_state_at(buf.data(), C, p.T, grad);
                        const int64_t R = chunk * per_range;
                        for (int64_t v0 = 0; v0 < p.V; v0 += R) {
                            const int64_t nv = std::min(R, p.V - v0);
                            const char * rows = static_cast<const char *>(c.w.data()) + v0 * c.w.row_bytes;
                            const std::vector<char> copy(rows, rows + nv * c.w.row_bytes);
                            rp::cpu::lm_head_ce_range(s, v0, nv, c.h.data(), copy.data(), c.w.type, c.w.row_bytes, p.labels.data(), st);
                        }
                        std::vector<float> lse2(size_t(p.T)), rest2(size_t(p.T)), tok2(size_t(p.T)), unit2(grad ? size_t(C * p.T) : 0);
                        const double loss2 = rp::cpu::lm_head_ce_finish(s, p.labels.data(), float(p.scale), st,
                                                                        {.lse_out = lse2.data(), .rest_out = rest2.data(),
                                                                         .token_loss = tok2.data(),
                                                                         .unit_dh_out = grad ? unit2.data() : nullptr});
                        EXPECT_EQ(loss, loss2);
                        EXPECT_TRUE(lse == lse2 && rest == rest2 && tok == tok2);
                        EXPECT_TRUE(unit == unit2) << "unit gradients differ";
                    }
        // Ranges that do not start at a multiple of the chunk, or a unit asked of a state without one: refused.
        const LmHeadCEShape s{C, p.V, p.T, 7, 0.0f};
        std::vector<double> buf(rp::lm_head_state_layout(C, p.T, false).bytes / sizeof(double) + 1);
        const rp::cpu::LmHeadCEState st = rp::lm_head_state_at(buf.data(), C, p.T, false);
        EXPECT_THROW(rp::cpu::lm_head_ce_range(s, 3, 7, c.h.data(), c.w.data(), c.w.type, c.w.row_bytes, p.labels.data(), st), rp::Error);
        std::vector<float> unit(size_t(C * p.T));
        EXPECT_THROW(rp::cpu::lm_head_ce_finish(s, p.labels.data(), 1.0f, st, {.unit_dh_out = unit.data()}), rp::Error);
    });
}
