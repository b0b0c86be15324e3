// GRPO's per-token policy loss, as TRL's GRPOTrainer defines it, shared by the CPU kernel (ggml_rp/cpu/grpo_loss.cpp),
// the CUDA kernel (ggml_rp/cuda/grpo_loss.cu) and the trainer's metrics. In double: a token's terms are small
// differences of log-probabilities.
//
// For a completion token with the policy's log-probability p, the rollout policy's ("old") o, the reference model's
// r and its sequence's advantage A (group-normalised reward):
//   ratio  c = exp(p - o)                      (on-policy, one update per rollout batch: o is p held constant, c = 1)
//   policy pg = -min(c A, clip(c, 1 - eps_low, 1 + eps_high) A)     (eps_high > eps_low: DAPO's clip-higher)
//   KL     k = exp(r - p) - (r - p) - 1        (the k3 estimator of KL(policy || reference); beta 0: none)
//   loss_t = w_t (pg + beta k)
// w_t is the token's share of the batch's normalisation (TRL's loss_type: "grpo" 1 / (the sequence's completion
// tokens x sequences), "bnpo" 1 / (the batch's completion tokens), "dr_grpo" 1 / (sequences x max completion
// length)), 0 for prompt and padding tokens. d loss_t / d p = w_t (d pg + beta (1 - exp(r - p))), where d pg = -A c
// when the unclipped term is the smaller (or they are equal), else 0 (the clipped term is constant in p).
#pragma once

#include "ggml_rp/core/host_device.h"

#include <cmath>
#include <cstdint>

namespace rp {

struct GrpoParams {
    double epsilon_low = 0.2;   // the ratio's clip range [1 - epsilon_low, 1 + epsilon_high]
    double epsilon_high = 0.2;
    double beta = 0.0;          // the KL term's weight (0: no reference model)
    bool on_policy = true;      // one update per rollout batch: the old log-probabilities are the policy's own (ratio 1)
};

// What the loss reads per token (ops/grpo_loss.h's values [kTokenValues, N]).
enum TokenValue : int { kAdvantage = 0, kOldLogp = 1, kRefLogp = 2, kTokenWeight = 3, kTokenValues = 4 };

struct GrpoTokenLoss {
    double loss = 0;      // w (pg + beta k)
    double d = 0;         // d loss / d p
    double kl = 0;        // k (unweighted)
    bool clipped = false; // the clip is active: c below 1 - eps_low with A < 0, or above 1 + eps_high with A > 0
};

RP_HD inline GrpoTokenLoss grpo_token_loss(const GrpoParams & p, double logp, const float * v) {
    GrpoTokenLoss o;
    const double w = v[kTokenWeight];
    if (w == 0) return o;
    const double A = v[kAdvantage];
    const double c = p.on_policy ? 1.0 : exp(logp - static_cast<double>(v[kOldLogp]));
    const double lo = 1.0 - p.epsilon_low, hi = 1.0 + p.epsilon_high;
    const double cc = c < lo ? lo : c > hi ? hi : c;
    const double unclipped = c * A, clipped = cc * A;
    double pg, dpg;
    if (unclipped <= clipped) {
        pg = -unclipped;
        dpg = -A * c;
    } else {
        pg = -clipped;
        dpg = 0;
    }
    o.clipped = (c < lo && A < 0) || (c > hi && A > 0);
    double dk = 0;
    if (p.beta != 0) {
        const double x = static_cast<double>(v[kRefLogp]) - logp;
        const double e = exp(x);
        o.kl = e - x - 1.0;
        dk = 1.0 - e;
    }
    o.loss = w * (pg + p.beta * o.kl);
    o.d = w * (dpg + p.beta * dk);
    return o;
}

} // namespace rp
