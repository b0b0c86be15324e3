// Checks the finetune tests make of a Trainer: its masters against another's, bit for bit, and its accumulated
// gradients against central differences of an independent loss.
#pragma once

#include "models/train/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace ft_test {

// The first trainable tensor whose masters differ between a and b ("" when every byte is the same).
inline std::string first_different_master(const rp::Trainer & a, const rp::Trainer & b) {
    if (a.params().size() != b.params().size()) return "(the number of trainable tensors)";
    for (size_t i = 0; i < a.params().size(); ++i)
        if (std::memcmp(a.params()[i].t->data, b.params()[i].t->data, static_cast<size_t>(a.params()[i].t->nelements()) * sizeof(float)) != 0)
            return a.params()[i].name;
    return "";
}

// Every trainable value drawn uniformly from [-amplitude, amplitude] (seeded): LoRA's B is then not 0, so that A has a
// gradient too.
inline void randomize_trainables(rp::Trainer & tr, uint32_t seed, float amplitude = 0.2f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-amplitude, amplitude);
    for (const auto & p : tr.params())
        for (int64_t i = 0; i < p.t->nelements(); ++i) p.t->data_as<float>()[i] = u(rng);
}

// Every trainable tensor's accumulated gradient g against central differences of loss_at() (the independent loss
// at the trainer's current weights) along g's own direction, where d loss / d h = |g|: Richardson over h and h / 2,
// h = min(rms_share x the tensor's RMS, loss_share x max(1, |loss|) / |g|) (small enough that the curvature, and any
// kink of the loss, stays out of reach). Each relative error must be below tol; returns the worst.
inline double check_gradients_by_differences(rp::Trainer & tr, const std::function<double()> & loss_at, double loss, double rms_share,
                                             double loss_share, double tol) {
    double worst = 0;
    for (const auto & p : tr.params()) {
        const int64_t n = p.t->nelements();
        float * w = p.t->data_as<float>();
        const float * g = p.t->grad->data_as<float>();
        double gn = 0, wr = 0;
        for (int64_t i = 0; i < n; ++i) gn += double(g[i]) * g[i], wr += double(w[i]) * w[i];
        gn = std::sqrt(gn);
        EXPECT_GT(gn, 0.0) << p.name;
        if (!(gn > 0)) continue;
        const std::vector<float> w0(w, w + n);
        auto fd = [&](double h) {
            for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(w0[size_t(i)] + h * g[i] / gn);
            const double lp = loss_at();
            for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(w0[size_t(i)] - h * g[i] / gn);
            const double lm = loss_at();
            std::copy(w0.begin(), w0.end(), w);
            return (lp - lm) / (2 * h);
        };
        const double h = std::min(rms_share * std::sqrt(wr / static_cast<double>(n)), loss_share * std::max(1.0, std::fabs(loss)) / gn);
        const double est = (4 * fd(h / 2) - fd(h)) / 3;
        const double err = std::fabs(est - gn) / gn;
        worst = std::max(worst, err);
        EXPECT_LT(err, tol) << p.name << ": finite differences " << est << ", backward " << gn;
    }
    return worst;
}

} // namespace ft_test
