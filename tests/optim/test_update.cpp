// AdamW and SGD against independent double-precision implementations of PyTorch's formulas
// (roundpipe.md §12.2), over several steps with weight decay, bias correction and a changing learning rate.
#include "optim_test_util.h"

#include "ggml_rp/optim/update.h"
#include "base/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

using optim_test::random_vector;

namespace {

// PyTorch AdamW (decoupled weight decay), written from the paper / docs formulas in double.
struct RefAdamW {
    double beta1, beta2, eps, wd;
    std::vector<double> p, m, v;
    std::vector<double> m_mag;  // the same average of |g|: the scale of m's rounding error when m cancels
    void step(int t, double lr, const std::vector<float> & g) {
        m_mag.resize(p.size(), 0.0);
        for (size_t i = 0; i < p.size(); ++i) {
            m_mag[i] = beta1 * m_mag[i] + (1.0 - beta1) * std::fabs(g[i]);
            p[i] *= 1.0 - lr * wd;
            m[i] = beta1 * m[i] + (1.0 - beta1) * g[i];
            v[i] = beta2 * v[i] + (1.0 - beta2) * double(g[i]) * double(g[i]);
            const double mhat_scale = lr / (1.0 - std::pow(beta1, t));
            const double denom = std::sqrt(v[i]) / std::sqrt(1.0 - std::pow(beta2, t)) + eps;
            p[i] -= mhat_scale * m[i] / denom;
        }
    }
};

// Gradients of very different scales in one tensor, plus zeros, so eps and decay both matter somewhere.
std::vector<float> mixed_grad(size_t n, uint64_t seed) {
    std::vector<float> g = random_vector(n, seed);
    for (size_t i = 0; i < n; ++i) {
        if (i % 7 == 0) g[i] *= 1e-6f;
        if (i % 11 == 0) g[i] *= 1e3f;
        if (i % 13 == 0) g[i] = 0.0f;
    }
    return g;
}

void run_adamw(size_t n, const rp::AdamWConfig & cfg) {
    std::vector<float> p = random_vector(n, 1), m(n, 0.0), v(n, 0.0);
    RefAdamW ref;
    ref.beta1 = cfg.beta1;
    ref.beta2 = cfg.beta2;
    ref.eps = cfg.eps;
    ref.wd = cfg.weight_decay;
    ref.p.assign(p.begin(), p.end());
    ref.m.assign(n, 0.0);
    ref.v.assign(n, 0.0);
    const double lrs[] = {1e-2, 3e-2, 2e-2, 1e-2, 5e-3, 1e-3, 1e-2, 2e-2, 4e-2, 1e-2};
    for (int t = 1; t <= 10; ++t) {
        const std::vector<float> g = mixed_grad(n, 100 + t);
        rp::adamw_update(cfg, t, lrs[t - 1], p, g, m, v);
        ref.step(t, lrs[t - 1], g);
    }
    for (size_t i = 0; i < n; ++i) {
        // fp32 against double after 10 steps of size ~lr: a few ulps of |p| ~ 1.
        ASSERT_NEAR(p[i], ref.p[i], 2e-6) << "param " << i;
        ASSERT_NEAR(m[i], ref.m[i], 1e-6 * ref.m_mag[i]) << "m " << i;
        ASSERT_NEAR(v[i], ref.v[i], 1e-6 * ref.v[i]) << "v " << i;
    }
}

TEST(AdamW, MatchesPyTorchFormulasSmall) {
    rp::AdamWConfig cfg;
    cfg.weight_decay = 0.1;
    run_adamw(37, cfg);
}

TEST(AdamW, MatchesPyTorchFormulasLargeParallel) {
    rp::AdamWConfig cfg;  // PyTorch defaults: 0.9, 0.999, 1e-8, 0.01
    run_adamw(100003, cfg);
}

TEST(AdamW, OtherBetasNoDecay) {
    rp::AdamWConfig cfg;
    cfg.beta1 = 0.3;  // lerp weight 0.7 >= 0.5: the other lerp branch
    cfg.beta2 = 0.95;
    cfg.eps = 1e-6;
    cfg.weight_decay = 0.0;
    run_adamw(1000, cfg);
}

TEST(AdamW, FirstStepIsSignTimesLr) {
    // Hand-computed: after one step from m = v = 0, m_hat / sqrt(v_hat) = g / |g|, so p moves by -lr*sign(g)
    // (up to eps), after decay p *= 1 - lr*wd.
    rp::AdamWConfig cfg;
    cfg.weight_decay = 0.5;
    cfg.eps = 0.0;
    std::vector<float> p = {1.0f, -2.0f, 0.5f}, g = {0.25f, -4.0f, 0.0f}, m(3, 0.0), v(3, 0.0);
    rp::adamw_update(cfg, 1, 0.1, p, g, m, v);
    EXPECT_NEAR(p[0], 1.0 * 0.95 - 0.1, 1e-7);
    EXPECT_NEAR(p[1], -2.0 * 0.95 + 0.1, 1e-7);
    EXPECT_TRUE(std::isnan(p[2]));  // 0/0 with eps = 0, as in PyTorch
}

TEST(AdamW, RejectsBadConfig) {
    rp::AdamWConfig c;
    c.beta1 = 1.0;
    EXPECT_THROW(rp::validate(c), rp::Error);
    c = {};
    c.beta2 = -0.1;
    EXPECT_THROW(rp::validate(c), rp::Error);
    c = {};
    c.eps = NAN;
    EXPECT_THROW(rp::validate(c), rp::Error);
    c = {};
    c.weight_decay = -1.0;
    try {
        rp::validate(c);
        FAIL();
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("weight_decay"), std::string::npos) << e.what();
    }
    EXPECT_NO_THROW(rp::validate(rp::AdamWConfig{}));
}

// SGD with momentum (PyTorch's buffer rule, dampening 0) and decoupled weight decay, in double.
void run_sgd(size_t n, const rp::SgdConfig & cfg) {
    std::vector<float> p = random_vector(n, 2), buf(cfg.momentum != 0.0f ? n : 0);
    std::vector<double> rp_(p.begin(), p.end()), rbuf(n, 0.0);
    // Magnitudes of the same sums taken over |terms|: the scale of fp32 rounding when the sums cancel.
    std::vector<double> pmag(rp_.size()), bmag(n, 0.0);
    for (size_t i = 0; i < n; ++i) pmag[i] = std::fabs(rp_[i]);
    for (int t = 1; t <= 8; ++t) {
        const std::vector<float> g = mixed_grad(n, 200 + t);
        const double lr = 0.05 / t;
        rp::sgd_update(cfg, t, lr, p, g, buf);
        const double lrf = lr;
        for (size_t i = 0; i < n; ++i) {
            rp_[i] *= 1.0 - lrf * double(cfg.weight_decay);
            double d = g[i];
            if (cfg.momentum != 0.0) {
                rbuf[i] = t == 1 ? double(g[i]) : double(cfg.momentum) * rbuf[i] + g[i];
                bmag[i] = t == 1 ? std::fabs(g[i]) : double(cfg.momentum) * bmag[i] + std::fabs(g[i]);
                d = rbuf[i];
            }
            rp_[i] -= lrf * d;
            pmag[i] += lrf * (cfg.momentum != 0.0f ? bmag[i] : std::fabs(g[i]));
        }
    }
    for (size_t i = 0; i < n; ++i) {
        ASSERT_NEAR(p[i], rp_[i], 1e-6 * pmag[i]) << "param " << i;
        if (cfg.momentum != 0.0) {
            ASSERT_NEAR(buf[i], rbuf[i], 1e-6 * bmag[i]) << "buf " << i;
        }
    }
}

TEST(Sgd, PlainMatchesFormula) { run_sgd(1000, rp::SgdConfig{}); }

TEST(Sgd, MomentumAndDecoupledDecay) {
    rp::SgdConfig cfg;
    cfg.momentum = 0.9;
    cfg.weight_decay = 0.1;
    run_sgd(70001, cfg);
}

TEST(Sgd, HandComputedSteps) {
    // p = 1, g = 2 each step, lr = 0.1, momentum 0.5, wd 0: buf 2, 3, 3.5 -> p = 1 - 0.2 - 0.3 - 0.35 = 0.15.
    rp::SgdConfig cfg;
    cfg.momentum = 0.5;
    std::vector<float> p = {1.0f}, g = {2.0f}, buf = {123.0f};  // the first update overwrites the buffer
    for (int t = 1; t <= 3; ++t) rp::sgd_update(cfg, t, 0.1, p, g, buf);
    EXPECT_NEAR(p[0], 0.15, 1e-6);
    EXPECT_FLOAT_EQ(buf[0], 3.5f);
    rp::SgdConfig bad;
    bad.momentum = 1.5;
    EXPECT_THROW(rp::validate(bad), rp::Error);
}

} // namespace
