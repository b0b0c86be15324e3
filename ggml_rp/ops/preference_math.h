// The preference losses of one (chosen, rejected) pair, as TRL defines them, shared by the CPU kernel
// (ggml_rp/cpu/preference_loss.cpp), the CUDA kernel (ggml_rp/cuda/preference_loss.cu) and the trainer's
// metrics. Everything in double: the inputs are summed log-probabilities of whole answers (hundreds of tokens)
// whose differences are what matters.
//
// For a pair, p_c, p_r are the policy's summed log-probabilities of the chosen and rejected answer, r_c, r_r
// the reference model's, n_c, n_r the answers' token counts; s = sigmoid, eps = label smoothing:
//   DPO    z = beta ((p_c - r_c) - (p_r - r_r))           loss = -(1 - eps) log s(z) - eps log s(-z)
//   IPO    h = (p_c - r_c) / n_c - (p_r - r_r) / n_r       loss = (h - 1 / (2 beta))^2
//   SimPO  z = beta (p_c / n_c - p_r / n_r) - gamma        loss = -(1 - eps) log s(z) - eps log s(-z)
//   ORPO   a = p / n (the mean log-probability per token), log_odds = (a_c - a_r) - (log(1 - e^a_c) - log(1 - e^a_r)),
//          loss = -beta log s(log_odds)   (ORPO's lambda is beta here; its NLL term is the op's per-answer weight)
//   KTO    unpaired: "pair" k is an example (prompt + completion, desirable or not) and its KL sequence (the prompt
//          with another example's completion). kl = max(0, mean over the micro-batch's KL sequences of p - r),
//          held constant (TRL detaches it); z = beta (p - r - kl) for a desirable example, beta (kl - (p - r)) for an
//          undesirable one; loss = w s(-z) = w (1 - s(z)), w = desirable_weight or undesirable_weight. The KL
//          sequences get no gradient.
// eps = 0 is DPO/SimPO as published; eps > 0 is cDPO (conservative DPO) / robust label smoothing as in TRL's
// "sigmoid" loss. IPO and SimPO use the length-normalised log-probabilities their papers use (TRL: "ipo" divides
// the log-probabilities by the answer length; CPO's "simpo" too). SimPO here is the paper's (TRL's CPO with
// cpo_alpha = 0: no NLL term). The rewards TRL logs: DPO beta (p - r), IPO beta (p - r) / n, SimPO and ORPO
// beta p / n; KTO beta (p - r) of each example.
#pragma once

#include "ggml_rp/core/host_device.h"

#include <cmath>
#include <cstdint>

namespace rp {

enum class PreferenceMethod : int32_t { Dpo = 0, Ipo = 1, Simpo = 2, Orpo = 3, Kto = 4 };

struct PreferenceParams {
    PreferenceMethod method = PreferenceMethod::Dpo;
    double beta = 0.1;
    double label_smoothing = 0.0;  // DPO, SimPO
    double gamma = 0.5;            // SimPO's target reward margin
    double desirable_weight = 1.0;    // KTO: the weight of desirable examples' losses
    double undesirable_weight = 1.0;  // and of undesirable ones'
};

// What the loss reads per sequence (ops/preference_loss.h's seq [kSequenceValues, B]).
enum SequenceValue : int { kReference = 0, kAnswerTokens = 1, kNllWeight = 2, kKind = 3, kSequenceValues = 4 };
// kKind: KTO's example sequences are +1 (desirable) or -1 (undesirable), its KL sequences 0; pairs 0.
// kAnswerTokens 0: an empty answer slot of a packed sequence (and its partner): no pair, no loss, no gradient.

// One pair's loss and its derivatives by the policy's summed log-probabilities of the two answers.
struct PairLoss {
    double loss = 0, d_chosen = 0, d_rejected = 0;
};

// log(sigmoid(x)) and sigmoid(x) without overflow for any finite x.
RP_HD inline double log_sigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }
RP_HD inline double sigmoid(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    const double e = exp(x);
    return e / (1.0 + e);
}

// loss = -(1 - eps) log s(z) - eps log s(-z); returns it, *dz its derivative.
RP_HD inline double smoothed_logistic(double z, double eps, double * dz) {
    *dz = -(1.0 - eps) * sigmoid(-z) + eps * sigmoid(z);
    return -(1.0 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z);
}

RP_HD inline PairLoss pair_loss(const PreferenceParams & p, double p_c, double p_r, double r_c, double r_r, double n_c, double n_r) {
    PairLoss o;
    double g = 0;
    switch (p.method) {
    case PreferenceMethod::Dpo:
        o.loss = smoothed_logistic(p.beta * ((p_c - r_c) - (p_r - r_r)), p.label_smoothing, &g);
        o.d_chosen = g * p.beta;
        o.d_rejected = -g * p.beta;
        break;
    case PreferenceMethod::Ipo: {
        const double d = (p_c - r_c) / n_c - (p_r - r_r) / n_r - 1.0 / (2.0 * p.beta);
        o.loss = d * d;
        o.d_chosen = 2.0 * d / n_c;
        o.d_rejected = -2.0 * d / n_r;
        break;
    }
    case PreferenceMethod::Simpo:
        o.loss = smoothed_logistic(p.beta * (p_c / n_c - p_r / n_r) - p.gamma, p.label_smoothing, &g);
        o.d_chosen = g * p.beta / n_c;
        o.d_rejected = -g * p.beta / n_r;
        break;
    case PreferenceMethod::Kto: break;  // not pairs: preference_batch_loss
    case PreferenceMethod::Orpo: {
        const double a_c = p_c / n_c, a_r = p_r / n_r;
        // log(1 - e^a) = log(-expm1(a)): exact for a near 0 (a sure answer), where 1 - e^a cancels.
        const double one_c = -expm1(a_c), one_r = -expm1(a_r);
        const double log_odds = (a_c - a_r) - (log(one_c) - log(one_r));
        o.loss = -p.beta * log_sigmoid(log_odds);
        const double dl = -p.beta * sigmoid(-log_odds);  // d loss / d log_odds
        // d log_odds / d a = 1 + e^a / (1 - e^a) = 1 / (1 - e^a)
        o.d_chosen = dl / one_c / n_c;
        o.d_rejected = -dl / one_r / n_r;
        break;
    }
    }
    return o;
}

// The implicit reward TRL logs for an answer (rewards/chosen, rewards/rejected; accuracy: chosen > rejected).
RP_HD inline double preference_reward(const PreferenceParams & p, double policy, double reference, double n) {
    switch (p.method) {
    case PreferenceMethod::Dpo:
    case PreferenceMethod::Kto: return p.beta * (policy - reference);
    case PreferenceMethod::Ipo: return p.beta * (policy - reference) / n;
    case PreferenceMethod::Simpo:
    case PreferenceMethod::Orpo: return p.beta * policy / n;
    }
    return 0;
}

// Whether the method compares against a reference model (DPO, IPO, KTO); SimPO and ORPO need none.
RP_HD inline bool preference_needs_reference(PreferenceMethod m) {
    return m == PreferenceMethod::Dpo || m == PreferenceMethod::Ipo || m == PreferenceMethod::Kto;
}

// Whether entries c, c + 1 hold a pair (or a KTO example and its KL sequence), not empty answer slots.
RP_HD inline bool preference_pair_present(const float * seq, int64_t c) { return seq[kSequenceValues * c + kAnswerTokens] > 0; }

// KTO's reference point: max(0, mean over the KL sequences (2k + 1) of policy - reference).
RP_HD inline double kto_kl(const float * logps, const float * seq, int64_t B) {
    double s = 0;
    int64_t n = 0;
    for (int64_t k = 1; k < B; k += 2) {
        if (!preference_pair_present(seq, k - 1)) continue;
        s += static_cast<double>(logps[k]) - seq[kSequenceValues * k + kReference];
        ++n;
    }
    const double kl = n > 0 ? s / static_cast<double>(n) : 0.0;
    return kl > 0 ? kl : 0.0;
}

// One KTO example's loss and its derivative by the example's log-probability (kl held constant).
RP_HD inline double kto_loss(const PreferenceParams & p, double logratio, double kl, bool desirable, double * d) {
    const double z = desirable ? p.beta * (logratio - kl) : p.beta * (kl - logratio);
    const double w = desirable ? p.desirable_weight : p.undesirable_weight;
    const double s = sigmoid(z), sm = sigmoid(-z);
    *d = (desirable ? -1.0 : 1.0) * w * p.beta * s * sm;
    return w * sm;
}

// The loss of a micro-batch of B sequences (B / 2 pairs, or KTO examples with their KL sequences; packed: answer
// slots, the empty ones skipped) from each sequence's policy log-probability and its values (seq: kSequenceValues
// floats per sequence):
//   loss = scale * sum_k loss_k - sum_b nll_weight_b logps_b,
// summed in double in this order. With d != nullptr, also d[b] = dloss * d loss / d logps_b (rounded to float).
// The CPU and the CUDA kernels both run this.
RP_HD inline double preference_batch_loss(const PreferenceParams & p, const float * lp, const float * seq, int64_t B, double scale,
                                          double dloss, float * d) {
    constexpr int S = kSequenceValues;
    const double kl = p.method == PreferenceMethod::Kto ? kto_kl(lp, seq, B) : 0.0;
    double acc = 0;
    for (int64_t c = 0; c + 1 < B; c += 2) {
        const int64_t r = c + 1;
        const float * vc = seq + S * c;
        const float * vr = seq + S * r;
        if (!preference_pair_present(seq, c)) {
            if (d) d[c] = d[r] = 0.0f;
            continue;
        }
        PairLoss pl;
        if (p.method == PreferenceMethod::Kto) {
            pl.loss = kto_loss(p, static_cast<double>(lp[c]) - vc[kReference], kl, vc[kKind] > 0, &pl.d_chosen);
        } else {
            pl = pair_loss(p, lp[c], lp[r], vc[kReference], vr[kReference], vc[kAnswerTokens], vr[kAnswerTokens]);
        }
        acc += scale * pl.loss;
        acc -= static_cast<double>(vc[kNllWeight]) * lp[c];
        acc -= static_cast<double>(vr[kNllWeight]) * lp[r];
        if (d) {
            d[c] = static_cast<float>(dloss * (scale * pl.d_chosen - static_cast<double>(vc[kNllWeight])));
            d[r] = static_cast<float>(dloss * (scale * pl.d_rejected - static_cast<double>(vr[kNllWeight])));
        }
    }
    return acc;
}

} // namespace rp
