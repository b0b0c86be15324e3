// The preference losses as TRL defines them, written out in long double from their formulas, independent of
// ggml_rp/ops/preference_math.h: the reference the op tests (tests/ops/test_preference_loss.cpp) and the training
// tests (tests/finetune/test_preference.cpp) compare with.
#pragma once

#include "ggml_rp/ops/preference_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace pref_ref {

inline long double logsig(long double x) { return -std::log1p(std::exp(-x)); }

// One pair's loss from the summed log-probabilities: policy pc / pr, reference rc / rr, tokens nc / nr of the chosen
// and the rejected answer.
inline long double pair_loss(const rp::PreferenceParams & p, long double pc, long double pr, long double rc, long double rr, long double nc,
                             long double nr) {
    const long double beta = p.beta, eps = p.label_smoothing;
    switch (p.method) {
    case rp::PreferenceMethod::Dpo: {
        const long double z = beta * ((pc - rc) - (pr - rr));
        return -(1 - eps) * logsig(z) - eps * logsig(-z);
    }
    case rp::PreferenceMethod::Ipo: {
        const long double h = (pc - rc) / nc - (pr - rr) / nr;
        return (h - 1 / (2 * beta)) * (h - 1 / (2 * beta));
    }
    case rp::PreferenceMethod::Simpo: {
        const long double z = beta * (pc / nc - pr / nr) - p.gamma;
        return -(1 - eps) * logsig(z) - eps * logsig(-z);
    }
    case rp::PreferenceMethod::Orpo: {
        const long double ac = pc / nc, ar = pr / nr;
        return -beta * logsig((ac - ar) - (std::log(1 - std::exp(ac)) - std::log(1 - std::exp(ar))));
    }
    case rp::PreferenceMethod::Kto: break;  // not pairs: batch_loss
    }
    return 0;
}

// A micro-batch's loss, scale * sum_k loss_k - sum_b w_b logps_b, from B sequences' log-probabilities lp and their
// values seq (4 per sequence: reference, tokens, NLL weight, kind; ops/preference_loss.h; 0 tokens in both answers
// of a pair: an empty slot, skipped). KTO: kl = max(0, mean of
// the KL sequences' lp - reference), or kl_fixed when >= 0 (the KL held where TRL detaches it); each example's
// w (1 - s(beta (logratio - kl))) when desirable, w (1 - s(beta (kl - logratio))) when not.
template <class T, class S>
long double batch_loss(const rp::PreferenceParams & p, const T * lp, const S * seq, int64_t B, long double scale, long double kl_fixed = -1) {
    auto v = [&](int64_t b, int k) { return static_cast<long double>(seq[4 * b + k]); };
    auto empty = [&](int64_t c) { return v(c, 1) == 0; };  // an empty answer slot pair of a packed micro-batch
    long double kl = 0;
    if (p.method == rp::PreferenceMethod::Kto) {
        int64_t n = 0;
        for (int64_t k = 1; k < B; k += 2)
            if (!empty(k - 1)) kl += static_cast<long double>(lp[k]) - v(k, 0), ++n;
        kl = kl_fixed >= 0 ? kl_fixed : std::max(0.0L, n ? kl / static_cast<long double>(n) : 0.0L);
    }
    long double L = 0;
    for (int64_t c = 0; c + 1 < B; c += 2) {
        const int64_t r = c + 1;
        if (empty(c)) continue;
        const long double pc = lp[c], pr = lp[r];
        if (p.method == rp::PreferenceMethod::Kto) {
            const bool desirable = v(c, 3) > 0;
            const long double z = desirable ? p.beta * (pc - v(c, 0) - kl) : p.beta * (kl - (pc - v(c, 0)));
            L += scale * (desirable ? p.desirable_weight : p.undesirable_weight) * (1 - 1 / (1 + std::exp(-z)));
        } else {
            L += scale * pair_loss(p, pc, pr, v(c, 0), v(r, 0), v(c, 1), v(r, 1));
        }
        L -= v(c, 2) * pc + v(r, 2) * pr;
    }
    return L;
}

} // namespace pref_ref
