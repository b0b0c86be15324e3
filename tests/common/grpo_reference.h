// GRPO's per-token loss as TRL's GRPOTrainer computes it (compute_loss: coef_1 = exp(logp - old), coef_2 =
// clamp(coef_1, 1 - eps_low, 1 + eps_high), per_token_loss = -min(coef_1 A, coef_2 A) + beta (exp(ref - logp) -
// (ref - logp) - 1)), written out in long double independently of ggml_rp/ops/grpo_math.h: the reference the op
// tests compare with.
#pragma once

#include "ggml_rp/ops/grpo_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace grpo_ref {

// sum_t w_t per_token_loss_t over N tokens: logp [N], values [4, N] (advantage, old, reference, weight).
template <class T, class V>
long double loss(const rp::GrpoParams & p, const T * logp, const V * values, int64_t N) {
    long double L = 0;
    for (int64_t t = 0; t < N; ++t) {
        const V * v = values + 4 * t;
        const long double lp = logp[t], A = v[0], w = v[3];
        const long double old = p.on_policy ? lp : static_cast<long double>(v[1]);
        const long double c1 = std::exp(lp - old);
        const long double c2 = std::clamp(c1, 1.0L - static_cast<long double>(p.epsilon_low), 1.0L + static_cast<long double>(p.epsilon_high));
        long double l = -std::min(c1 * A, c2 * A);
        if (p.beta != 0) {
            const long double x = static_cast<long double>(v[2]) - lp;
            l += static_cast<long double>(p.beta) * (std::exp(x) - x - 1);
        }
        L += w * l;
    }
    return L;
}

} // namespace grpo_ref
