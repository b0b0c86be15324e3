// An update's GradientUse (update.h): clipping's factor applied as the gradient is read and the gradient zeroed
// after, in the update's one pass, must give the bits of the separate passes it replaces: clip_grad_norm scaling
// the gradients in place, the update reading them, and a memset. AdamW and SGD (with and without momentum),
// fp32 and bf16 optimizer state, serial and parallel lengths, over several steps.
#include "optim_test_util.h"

#include "ggml_rp/optim/clip.h"
#include "ggml_rp/optim/optimizer.h"
#include "ggml_rp/optim/update.h"
#include "ggml_rp/optim/update_math.h"
#include "base/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

using optim_test::random_vector;
using optim_test::same_bits;

namespace {

// Three tensors (one past the update's parallel threshold) through `steps` steps of optimizer `cfg`, the
// gradients clipped to `max_norm` (0: none). fused: clip_scale + GradientUse{scale, zero}; else clip_grad_norm,
// the read-only update, then memset. Returns the parameters, the state arrays and the gradients after each run.
struct Outcome {
    std::vector<std::vector<float>> params, state, grads;
    std::vector<float> scales;
};

Outcome run(const rp::OptimizerConfig & cfg, double max_norm, bool fused, bool zero) {
    rp::Optimizer opt(cfg);
    const size_t sizes[] = {37, 40000, 4096};
    Outcome o;
    std::vector<std::vector<float>> grads;
    for (size_t i = 0; i < 3; ++i) {
        opt.add_param(std::string("tensor.") + std::to_string(i), sizes[i]);
        o.params.push_back(random_vector(sizes[i], 10 + i));
        grads.emplace_back(sizes[i]);
    }
    for (int64_t t = 1; t <= 4; ++t) {
        // Gradients of growing size: step 1 is below the clip norm, the others above it.
        for (size_t i = 0; i < 3; ++i) {
            const std::vector<float> g = random_vector(sizes[i], 1000 * t + i, 1e-4 * std::pow(100.0, double(t - 1)));
            for (size_t e = 0; e < g.size(); ++e) grads[i][e] = zero && fused && t > 1 ? grads[i][e] + g[e] : g[e];
        }
        std::vector<std::span<float>> spans(grads.begin(), grads.end());
        const std::vector<std::span<const float>> cspans(grads.begin(), grads.end());
        float scale = 1.0f;
        if (fused) {
            scale = max_norm > 0 ? rp::clip_scale(rp::grad_norm(cspans), max_norm) : 1.0f;
            for (size_t i = 0; i < 3; ++i) opt.update(i, o.params[i], spans[i], 1e-2, rp::GradientUse{scale, zero});
        } else {
            if (max_norm > 0) rp::clip_grad_norm(spans, max_norm);
            for (size_t i = 0; i < 3; ++i) opt.update(i, o.params[i], cspans[i], 1e-2);
            if (zero)
                for (auto & g : grads) std::memset(g.data(), 0, g.size() * sizeof(float));
        }
        opt.end_step();
        o.scales.push_back(scale);
    }
    for (const rp::StateArray & a : opt.state_arrays()) {
        if (!a.data.empty()) o.state.emplace_back(a.data.begin(), a.data.end());
        else o.state.emplace_back(a.bf16.begin(), a.bf16.end());  // (bf16 state: its bit patterns as values)
    }
    o.grads = grads;
    return o;
}

void expect_fused_is_separate(const rp::OptimizerConfig & cfg, const std::string & what) {
    for (const double max_norm : {0.0, 1.0}) {
        for (const bool zero : {false, true}) {
            const Outcome sep = run(cfg, max_norm, false, zero), fused = run(cfg, max_norm, true, zero);
            const std::string where = what + ", clip " + std::to_string(max_norm) + (zero ? ", zeroed" : ", kept");
            for (size_t i = 0; i < sep.params.size(); ++i) EXPECT_TRUE(same_bits(sep.params[i], fused.params[i])) << where << ": param " << i;
            ASSERT_EQ(sep.state.size(), fused.state.size()) << where;
            for (size_t i = 0; i < sep.state.size(); ++i) EXPECT_TRUE(same_bits(sep.state[i], fused.state[i])) << where << ": state " << i;
            for (size_t i = 0; i < fused.grads.size(); ++i) {
                if (zero) {
                    EXPECT_TRUE(same_bits(fused.grads[i], std::vector<float>(fused.grads[i].size(), 0.0f))) << where << ": gradient " << i << " not zeroed";
                } else {
                    // Kept: the gradient as the step computed it, not scaled (the scale is applied as it is read).
                    EXPECT_TRUE(same_bits(fused.grads[i], random_vector(fused.grads[i].size(), 1000 * 4 + i, 1e-4 * std::pow(100.0, 3.0))))
                        << where << ": gradient " << i << " written";
                }
            }
            if (max_norm > 0) {
                // The case is real: step 1 within the norm (factor exactly 1), the later ones clipped.
                EXPECT_EQ(fused.scales[0], 1.0f) << where;
                for (size_t t = 1; t < fused.scales.size(); ++t) EXPECT_LT(fused.scales[t], 1.0f) << where << ": step " << t + 1;
            }
        }
    }
}

} // namespace

TEST(GradientUse, AdamWIsTheBitsOfClippingThenTheUpdateThenZeroing) {
    rp::OptimizerConfig cfg;
    cfg.kind = rp::OptimizerKind::AdamW;
    expect_fused_is_separate(cfg, "adamw");
    cfg.bf16_state = true;
    expect_fused_is_separate(cfg, "adamw, bf16 state");
}

TEST(GradientUse, SgdIsTheBitsOfClippingThenTheUpdateThenZeroing) {
    rp::OptimizerConfig cfg;
    cfg.kind = rp::OptimizerKind::Sgd;
    expect_fused_is_separate(cfg, "sgd");
    cfg.sgd.momentum = 0.9;
    expect_fused_is_separate(cfg, "sgd, momentum");
    cfg.bf16_state = true;
    expect_fused_is_separate(cfg, "sgd, momentum, bf16 state");
}

// clip_scale is the factor clip_grad_norm multiplies by: exactly 1 within the norm or for a non-finite one.
TEST(GradientUse, ClipScaleIsClipGradNormsFactor) {
    std::vector<std::vector<float>> gs = {random_vector(1000, 3, 2.0), random_vector(70000, 4, 0.5)};
    const std::vector<std::vector<float>> orig = gs;
    const std::vector<std::span<const float>> cs(orig.begin(), orig.end());
    const double norm = rp::grad_norm(cs);
    const float c = rp::clip_scale(norm, 1.0);
    ASSERT_LT(c, 1.0f);
    std::vector<std::span<float>> spans(gs.begin(), gs.end());
    EXPECT_EQ(rp::clip_grad_norm(spans, 1.0), norm);
    for (size_t t = 0; t < gs.size(); ++t)
        for (size_t i = 0; i < gs[t].size(); ++i) ASSERT_EQ(gs[t][i], orig[t][i] * c) << t << ":" << i;
    EXPECT_EQ(rp::clip_scale(norm, norm * 2), 1.0f);
    EXPECT_EQ(rp::clip_scale(INFINITY, 1.0), 1.0f);
    EXPECT_EQ(rp::clip_scale(NAN, 1.0), 1.0f);
    EXPECT_THROW(rp::clip_scale(1.0, 0.0), rp::Error);
    EXPECT_THROW(rp::clip_scale(1.0, NAN), rp::Error);
}

namespace {

// x * y and x + y each rounded on their own: the volatile store keeps the compiler from fusing them into an fma
// (this test file is compiled as the project is: contraction allowed).
float mul1(float x, float y) {
    volatile float r = x * y;
    return r;
}
float add1(float x, float y) {
    volatile float r = x + y;
    return r;
}
float sub1(float x, float y) {
    volatile float r = x - y;
    return r;
}

} // namespace

// The updates are the stated plain fp32 arithmetic (optim/update_math.h, PyTorch's order), every product and sum
// rounded on its own: optim/update.cpp is compiled without fused multiply-adds, so the bits are the same on every
// target. Elements from a parallel-sized tensor, several steps, with weight decay, the lerp's both branches (beta1
// 0.9 and 0.3) and a clip scale.
TEST(GradientUse, UpdatesArePlainFp32ArithmeticWithoutFusedMultiplyAdds) {
    const size_t n = 40000;
    for (const double beta1 : {0.9, 0.3}) {
        rp::AdamWConfig cfg;
        cfg.beta1 = beta1;
        cfg.weight_decay = 0.1;
        std::vector<float> p = random_vector(n, 5), m(n, 0.0f), v(n, 0.0f);
        std::vector<float> pr = p, mr = m, vr = v;
        for (int64_t t = 1; t <= 3; ++t) {
            std::vector<float> g = random_vector(n, 50 + t, 0.1);
            const std::vector<float> g0 = g;
            const double lr = 1e-2 * double(t);
            const float scale = 0.75f;
            rp::adamw_update(cfg, t, lr, p, std::span<float>(g), m, v, rp::GradientUse{scale, true});
            const rp::AdamWScalars s = rp::adamw_scalars(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, t);
            for (size_t i = 0; i < n; ++i) {
                const float gi = mul1(g0[i], scale);
                pr[i] = mul1(pr[i], s.decay);
                const float w = s.one_minus_beta1;
                mr[i] = w < 0.5f ? add1(mr[i], mul1(w, sub1(gi, mr[i]))) : sub1(gi, mul1(sub1(gi, mr[i]), sub1(1.0f, w)));
                vr[i] = add1(mul1(vr[i], s.beta2), mul1(mul1(s.one_minus_beta2, gi), gi));
                const float denom = add1(std::sqrt(vr[i]) / s.bc2_sqrt, s.eps);
                pr[i] = add1(pr[i], mul1(s.neg_step_size, mr[i] / denom));
            }
            EXPECT_TRUE(same_bits(p, pr)) << "beta1 " << beta1 << ", step " << t << ": params";
            EXPECT_TRUE(same_bits(m, mr)) << "beta1 " << beta1 << ", step " << t << ": m";
            EXPECT_TRUE(same_bits(v, vr)) << "beta1 " << beta1 << ", step " << t << ": v";
        }
    }
    rp::SgdConfig sgd;
    sgd.momentum = 0.9;
    sgd.weight_decay = 0.1;
    std::vector<float> p = random_vector(n, 6), buf(n, 0.0f);
    std::vector<float> pr = p, br = buf;
    for (int64_t t = 1; t <= 3; ++t) {
        const std::vector<float> g = random_vector(n, 70 + t, 0.1);
        rp::sgd_update(sgd, t, 1e-2, p, g, buf);
        const rp::SgdScalars s = rp::sgd_scalars(1e-2, sgd.momentum, sgd.weight_decay, t);
        for (size_t i = 0; i < n; ++i) {
            pr[i] = mul1(pr[i], s.decay);
            br[i] = s.first != 0.0f ? g[i] : add1(mul1(br[i], s.momentum), g[i]);
            pr[i] = add1(pr[i], mul1(s.neg_lr, br[i]));
        }
        EXPECT_TRUE(same_bits(p, pr)) << "sgd step " << t;
    }
}
