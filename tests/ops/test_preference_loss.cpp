// Sequence-level losses: the per-token form of the fused LM head (lm_head_token_nll) and the preference losses
// (preference_loss: DPO, IPO, SimPO, ORPO) against naive double references written here from TRL's formulas
// (independent of ops/preference_math.h), their backward against finite differences of those references
// (the harness), and the closed forms at step 0 (reference = policy).
#include "harness.h"
#include "tests/common/preference_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

using namespace optest;
using rp::Context;
using rp::PreferenceMethod;
using rp::PreferenceParams;
using rp::Tensor;
using TV = std::vector<Tensor *>;
using R = RefInputs;

namespace {

// Each token's negative log-likelihood (0 when masked): ref::lm_head_ce of the token alone.
ref::DT token_nll(const ref::DT & h, const ref::DT & W, const std::vector<int32_t> & labels, double softcap = 0) {
    const int64_t C = h.ne[0], T = h.ne[1];
    ref::DT y({T, 1, 1, 1});
    for (int64_t t = 0; t < T; ++t) {
        ref::DT col({C, 1, 1, 1});
        for (int64_t c = 0; c < C; ++c) col(c) = h(c, t);
        y(t) = ref::lm_head_ce(col, W, {labels[size_t(t)]}, 1.0, softcap).v[0];
    }
    return y;
}

// The loss of a micro-batch (tests/common/preference_reference.h) over ref::DT inputs: lp [B], seq [4, B].
double loss_ref(const PreferenceParams & p, const ref::DT & lp, const ref::DT & seq, double scale, double kl_fixed = -1) {
    return static_cast<double>(pref_ref::batch_loss(p, lp.v.data(), seq.v.data(), lp.size(), scale, kl_fixed));
}

ref::DT preference_ref(const ref::DT & lp, const ref::DT & seq, const PreferenceParams & p, double scale) {
    ref::DT y({1, 1, 1, 1});
    y.v[0] = static_cast<double>(pref_ref::batch_loss(p, lp.v.data(), seq.v.data(), lp.size(), scale));
    return y;
}

PreferenceParams params(PreferenceMethod m, double beta, double eps = 0, double gamma = 0.5) {
    PreferenceParams p;
    p.method = m;
    p.beta = beta;
    p.label_smoothing = eps;
    p.gamma = gamma;
    return p;
}

// seq [4, B]: reference log-probabilities, token counts (integers >= 1), NLL weights, kinds, as an i32-free float input
// whose values the test sets (the harness draws floats in [lo, hi]: counts and weights are set by `fix`).
Case preference_case(std::string name, int64_t B, const PreferenceParams & p, float scale) {
    Input lp{"logps", {B, 1, 1, 1}};
    lp.lo = -3.0f;  // answers' log-probabilities are negative (ORPO needs them below 0)
    lp.hi = -0.2f;
    Input seq{"seq", {4, B, 1, 1}, rp::DType::F32, false};
    seq.lo = 1.0f;  // references in [1, 4], counts in [1, 4] (not integers: the math does not care), weights in [1, 4]
    seq.hi = 4.0f;
    return {name, {lp, seq},
            [=](Context & c, const TV & in) { return rp::preference_loss(c, in[0], in[1], p, scale); },
            [=](const R & x) { return preference_ref(x[0], x[1], p, scale); }};
}

} // namespace

TEST(OpTokenNll, PerTokenValuesAndTheirGradients) {
    const int64_t C = 17, V = 127;
    const std::vector<int32_t> labels = {5, -1, 126, 0, 77, -1, 3};
    const int64_t T = static_cast<int64_t>(labels.size());
    // (A frozen head forms each token's gradient in its forward: the per-token dloss scales it in the backward.)
    for (bool train_head : {true, false})
    for (int64_t chunk : {int64_t{7}, int64_t{1000}})
        for (float cap : {0.0f, 2.0f}) {
            Input lab{"labels", {T, 1, 1, 1}, rp::DType::I32, false};
            lab.ints = labels;
            Input h{"h", {C, T, 1, 1}};
            h.lo = -2.0f;
            h.hi = 2.0f;
            Input W{"W", {C, V, 1, 1}, rp::DType::F32, train_head};
            check_op({std::string(train_head ? "" : "frozen head, ") + "lm_head_token_nll chunk " + std::to_string(chunk) +
                          " softcap " + std::to_string(cap), {h, W, lab},
                      [=](Context & c, const TV & in) { return rp::lm_head_token_nll(c, in[0], in[1], in[2], chunk, cap); },
                      [=](const R & x) { return token_nll(x[0], x[1], ints_from(x[2]), cap); }});
        }
}

// The sum of the per-token form is the summed form's loss (loss_scale 1), to the float.
TEST(OpTokenNll, SumsToTheFusedLoss) {
    Context ctx;
    const int64_t C = 9, V = 31, T = 6;
    Tensor * h = ctx.new_tensor(rp::DType::F32, C, T);
    Tensor * W = ctx.new_tensor(rp::DType::F32, C, V);
    Tensor * lab = ctx.new_tensor(rp::DType::I32, T);
    for (Tensor * t : {h, W, lab}) ctx.alloc_data(t);
    for (int64_t i = 0; i < C * T; ++i) h->data_as<float>()[i] = std::sin(0.3f * float(i));
    for (int64_t i = 0; i < C * V; ++i) W->data_as<float>()[i] = std::cos(0.7f * float(i));
    rp::tensor_set_i32(lab, {1, -1, 30, 0, 7, 7});
    Tensor * per = rp::lm_head_token_nll(ctx, h, W, lab, 8);
    Tensor * sum = rp::lm_head_ce(ctx, h, W, lab, 1.0f, 8);
    const std::vector<float> tokens = compute(per);
    ASSERT_EQ(tokens.size(), size_t(T));
    double s = 0;
    for (float v : tokens) s += v;
    EXPECT_EQ(tokens[1], 0.0f);  // masked
    EXPECT_NEAR(s, compute(sum)[0], 1e-6 * std::fabs(s));
    // A per-token backward needs one dloss per token.
    EXPECT_THROW(rp::lm_head_ce_back(ctx, per, rp::fill(ctx, sum, 1.0f), nullptr), rp::Error);
}

TEST(OpPreferenceLoss, EveryMethodAgainstTheDoubleReference) {
    for (float scale : {1.0f, 0.25f}) {
        check_op(preference_case("dpo beta 0.1", 6, params(PreferenceMethod::Dpo, 0.1), scale));
        check_op(preference_case("dpo beta 2, cDPO eps 0.1", 4, params(PreferenceMethod::Dpo, 2.0, 0.1), scale));
        check_op(preference_case("ipo beta 0.5", 6, params(PreferenceMethod::Ipo, 0.5), scale));
        check_op(preference_case("simpo beta 2 gamma 1", 6, params(PreferenceMethod::Simpo, 2.0, 0.0, 1.0), scale));
        check_op(preference_case("simpo beta 2.5 eps 0.2", 2, params(PreferenceMethod::Simpo, 2.5, 0.2, 0.5), scale));
        check_op(preference_case("orpo lambda 0.1", 6, params(PreferenceMethod::Orpo, 0.1), scale));
        check_op(preference_case("orpo lambda 1", 4, params(PreferenceMethod::Orpo, 1.0), scale));
    }
}

// Per-token NLL -> per-sequence sums -> the loss: the gradient reaches every answer token through the head.
TEST(OpPreferenceLoss, ThroughTheHead) {
    const int64_t C = 11, V = 37, T = 5, B = 4;
    std::vector<int32_t> labels = {-1, -1, 4, 9, 36,   -1, 2, 2, 0, -1,   -1, -1, -1, 5, 6,   1, 2, 3, 4, 5};
    Input lab{"labels", {T * B, 1, 1, 1}, rp::DType::I32, false};
    lab.ints = labels;
    Input h{"h", {C, T * B, 1, 1}};
    h.lo = -1.5f;
    h.hi = 1.5f;
    Input W{"W", {C, V, 1, 1}};
    for (PreferenceMethod m : {PreferenceMethod::Dpo, PreferenceMethod::Ipo, PreferenceMethod::Simpo, PreferenceMethod::Orpo}) {
        const PreferenceParams p = params(m, m == PreferenceMethod::Simpo ? 2.0 : 0.5);
        check_op({"preference loss through lm_head_token_nll, method " + std::to_string(int(m)), {h, W, lab},
                  [=](Context & c, const TV & in) {
                      Tensor * nll = rp::lm_head_token_nll(c, in[0], in[1], in[2], 16);
                      Tensor * per_seq = rp::sum_to(c, rp::reshape(c, nll, T, B), c.new_tensor(rp::DType::F32, 1, B));
                      Tensor * lp = rp::scale(c, rp::reshape(c, per_seq, B), -1.0f);
                      // counts: the answers' trained tokens (3, 3, 2, 5); reference 0, no NLL term
                      std::vector<float> sv = {0, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 5, 0, 0};
                      Tensor * s = c.new_tensor(rp::DType::F32, 4, B);
                      c.alloc_data(s);
                      std::copy(sv.begin(), sv.end(), s->data_as<float>());
                      return rp::preference_loss(c, lp, s, p, 0.5f);
                  },
                  [=](const R & x) {
                      const ref::DT nll = token_nll(x[0], x[1], ints_from(x[2]));
                      ref::DT lp({B, 1, 1, 1});
                      for (int64_t b = 0; b < B; ++b)
                          for (int64_t t = 0; t < T; ++t) lp(b) -= nll(b * T + t);
                      ref::DT s({4, B, 1, 1}, {0, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 5, 0, 0});
                      return preference_ref(lp, s, p, 0.5);
                  }});
    }
}

// At step 0 the policy is the reference: DPO's loss is ln 2 per pair whatever beta and the smoothing are, and
// every reward 0; IPO's 1 / (4 beta^2). The op's float is the closed form's rounding.
TEST(OpPreferenceLoss, StepZeroClosedForms) {
    const std::vector<float> lp = {-12.5f, -30.25f, -7.0f, -7.0f, -55.0f, -1.5f};
    const std::vector<float> counts = {5, 12, 3, 3, 20, 1};
    auto run = [&](const PreferenceParams & p, float scale) {
        Context ctx;
        Tensor * l = ctx.new_tensor(rp::DType::F32, 6);
        Tensor * s = ctx.new_tensor(rp::DType::F32, 4, 6);
        ctx.alloc_data(l);
        ctx.alloc_data(s);
        for (int b = 0; b < 6; ++b) {
            l->data_as<float>()[b] = lp[size_t(b)];
            float * v = s->data_as<float>() + 4 * b;
            v[rp::kReference] = lp[size_t(b)];  // reference = policy
            v[rp::kAnswerTokens] = counts[size_t(b)];
            v[rp::kNllWeight] = 0.0f;
            v[rp::kKind] = b % 2 ? 0.0f : b % 4 ? -1.0f : 1.0f;  // KTO: examples 0, 2, 4 desirable, undesirable, desirable
        }
        return compute(rp::preference_loss(ctx, l, s, p, scale))[0];
    };
    for (double beta : {0.01, 0.1, 1.0, 5.0})
        for (double eps : {0.0, 0.1, 0.3}) {
            EXPECT_EQ(run(params(PreferenceMethod::Dpo, beta, eps), 1.0f / 3.0f), static_cast<float>(std::numbers::ln2))
                << "beta " << beta << " eps " << eps;
            for (int b = 0; b < 6; ++b) EXPECT_EQ(rp::preference_reward(params(PreferenceMethod::Dpo, beta), lp[size_t(b)], lp[size_t(b)], counts[size_t(b)]), 0.0);
        }
    for (double beta : {0.1, 0.5, 2.0})
        EXPECT_EQ(run(params(PreferenceMethod::Ipo, beta), 1.0f / 3.0f), static_cast<float>(1.0 / (4.0 * beta * beta))) << beta;
    // KTO: every logratio and the KL 0, each example's loss w (1 - s(0)) = w / 2: (2 w_d + w_u) / 6 over 3 examples.
    PreferenceParams kto = params(PreferenceMethod::Kto, 0.1);
    kto.desirable_weight = 1.0;
    kto.undesirable_weight = 1.5;
    EXPECT_EQ(run(kto, 1.0f / 3.0f), static_cast<float>(double(1.0f / 3.0f) * 0.5 + double(1.0f / 3.0f) * 0.75 + double(1.0f / 3.0f) * 0.5));
}

TEST(OpPreferenceLoss, BadShapesAndParametersAreErrors) {
    Context ctx;
    Tensor * odd = ctx.new_tensor(rp::DType::F32, 3);
    Tensor * l = ctx.new_tensor(rp::DType::F32, 4);
    Tensor * s = ctx.new_tensor(rp::DType::F32, 4, 4);
    Tensor * s2 = ctx.new_tensor(rp::DType::F32, 3, 4);
    EXPECT_THROW(rp::preference_loss(ctx, odd, ctx.new_tensor(rp::DType::F32, 4, 3), params(PreferenceMethod::Dpo, 0.1), 1.0f), rp::Error);
    EXPECT_THROW(rp::preference_loss(ctx, l, s2, params(PreferenceMethod::Dpo, 0.1), 1.0f), rp::Error);
    EXPECT_THROW(rp::preference_loss(ctx, l, s, params(PreferenceMethod::Dpo, 0.0), 1.0f), rp::Error);
    EXPECT_THROW(rp::preference_loss(ctx, l, s, params(PreferenceMethod::Dpo, 0.1, 0.5), 1.0f), rp::Error);
    // An answer without tokens: the kernel names it.
    ctx.alloc_data(l);
    ctx.alloc_data(s);
    for (int i = 0; i < 4; ++i) l->data_as<float>()[i] = -1.0f;
    for (int i = 0; i < 16; ++i) s->data_as<float>()[i] = 1.0f;
    s->data_as<float>()[4 * 3 + rp::kAnswerTokens] = 0.0f;
    const std::string error = compute_error(rp::preference_loss(ctx, l, s, params(PreferenceMethod::Simpo, 2.0), 1.0f));
    EXPECT_NE(error.find("answer 3 (pair 1) has 0.000000 tokens"), std::string::npos) << error;
}

// KTO in the harness: the KL sequences' references are above their policy log-probabilities, so the KL is clamped
// at 0 and locally constant (the harness differentiates the reference in every input).
TEST(OpPreferenceLoss, KtoAgainstTheDoubleReference) {
    const int64_t B = 6;
    // per sequence: reference, tokens, NLL weight, kind; examples desirable, undesirable, desirable
    const std::vector<float> sv = {-1.0f, 4, 0, 1,  5.0f, 3, 0, 0,  -2.5f, 2, 0, -1,  5.0f, 6, 0, 0,  -0.5f, 3, 0.1f, 1,  5.0f, 2, 0, 0};
    for (double wu : {1.0, 1.7}) {
        PreferenceParams p = params(PreferenceMethod::Kto, 0.5);
        p.undesirable_weight = wu;
        Input lp{"logps", {B, 1, 1, 1}};
        lp.lo = -3.0f;
        lp.hi = -0.2f;
        check_op({"kto undesirable weight " + std::to_string(wu), {lp},
                  [=](Context & c, const TV & in) {
                      Tensor * s = c.new_tensor(rp::DType::F32, 4, B);
                      c.alloc_data(s);
                      std::copy(sv.begin(), sv.end(), s->data_as<float>());
                      return rp::preference_loss(c, in[0], s, p, 1.0f / 3.0f);
                  },
                  [=](const R & x) {
                      ref::DT s({4, B, 1, 1});
                      for (size_t i = 0; i < sv.size(); ++i) s.v[i] = sv[i];
                      ref::DT y({1, 1, 1, 1});
                      y.v[0] = loss_ref(p, x[0], s, 1.0 / 3.0);
                      return y;
                  }});
    }
}

// A positive KL is held constant (TRL detaches it): the KL sequences get no gradient, the examples' gradients are
// the derivatives of the loss at that fixed KL (central differences in long double), and the loss is the reference's.
TEST(OpPreferenceLoss, KtoHoldsItsPositiveKlConstant) {
    const int64_t B = 4;
    const std::vector<float> lp = {-3.0f, -2.0f, -4.5f, -1.0f};
    const std::vector<float> sv = {-3.5f, 4, 0, 1, -3.0f, 3, 0, 0, -4.0f, 2, 0, -1, -2.4f, 6, 0, 0};  // KL: mean(1.0, 1.4) = 1.2
    const PreferenceParams p = params(PreferenceMethod::Kto, 0.8);
    Context ctx;
    Tensor * l = ctx.new_tensor(rp::DType::F32, B);
    Tensor * s = ctx.new_tensor(rp::DType::F32, 4, B);
    ctx.alloc_data(l);
    ctx.alloc_data(s);
    std::copy(lp.begin(), lp.end(), l->data_as<float>());
    std::copy(sv.begin(), sv.end(), s->data_as<float>());
    ctx.alloc_data(rp::set_param(ctx, l)->grad);
    std::fill(l->grad->data_as<float>(), l->grad->data_as<float>() + B, 0.0f);
    Tensor * loss = rp::preference_loss(ctx, l, s, p, 0.5f);
    rp::Graph g;
    rp::build_forward(g, loss);
    rp::build_backward(ctx, g, loss, {l});
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, 1);
    ref::DT x({B, 1, 1, 1}), sd({4, B, 1, 1});
    for (int64_t i = 0; i < B; ++i) x.v[size_t(i)] = lp[size_t(i)];
    for (size_t i = 0; i < sv.size(); ++i) sd.v[i] = sv[i];
    EXPECT_NEAR(*loss->data_as<float>(), loss_ref(p, x, sd, 0.5), 1e-7);
    const double kl = 1.2;
    for (int64_t i = 0; i < B; ++i) {
        const float gi = l->grad->data_as<float>()[i];
        if (i % 2) {
            EXPECT_EQ(gi, 0.0f) << "KL sequence " << i;
            continue;
        }
        const double h = 1e-4;
        ref::DT xp = x, xm = x;
        xp.v[size_t(i)] += h;
        xm.v[size_t(i)] -= h;
        const double fd = (loss_ref(p, xp, sd, 0.5, kl) - loss_ref(p, xm, sd, 0.5, kl)) / (2 * h);
        EXPECT_NEAR(gi, fd, 1e-6 * std::max(1.0, std::fabs(fd))) << "example " << i;
        EXPECT_NE(gi, 0.0f);
    }
}

// Packed micro-batches hold answer slots, the unused ones empty (0 tokens in both answers of a pair): they add no
// loss and get no gradient, and KTO's KL averages over the present KL sequences only (the reference skips them too;
// here the empty pair sits between two real ones, with values that would move the loss if they counted).
TEST(OpPreferenceLoss, EmptyAnswerSlotsAreSkipped) {
    const int64_t B = 6;
    for (PreferenceMethod m : {PreferenceMethod::Dpo, PreferenceMethod::Orpo, PreferenceMethod::Kto}) {
        const bool kto = m == PreferenceMethod::Kto;
        // per answer: reference, tokens, NLL weight, kind
        // (KTO: the KL sequences' references above their log-probabilities: the KL clamps at 0, constant for the harness)
        const float kl_ref = kto ? 5.0f : -3.0f;
        const std::vector<float> sv = {-1.0f, 4, m == PreferenceMethod::Orpo ? 0.1f : 0.0f, kto ? 1.0f : 0.0f,  kl_ref, 3, 0, 0,
                                       9.0f, 0, 0, 0,  9.0f, 0, 0, 0,
                                       -2.5f, 2, 0, kto ? -1.0f : 0.0f,  kl_ref, 6, 0, 0};
        const PreferenceParams p = params(m, 0.5);
        Input lp{"logps", {B, 1, 1, 1}};
        lp.lo = -3.0f;
        lp.hi = -0.2f;
        check_op({std::string("empty slot, method ") + std::to_string(static_cast<int>(m)), {lp},
                  [=](Context & c, const TV & in) {
                      Tensor * s = c.new_tensor(rp::DType::F32, 4, B);
                      c.alloc_data(s);
                      std::copy(sv.begin(), sv.end(), s->data_as<float>());
                      return rp::preference_loss(c, in[0], s, p, 0.5f);
                  },
                  [=](const R & x) {
                      ref::DT s({4, B, 1, 1});
                      for (size_t i = 0; i < sv.size(); ++i) s.v[i] = sv[i];
                      ref::DT y({1, 1, 1, 1});
                      y.v[0] = loss_ref(p, x[0], s, 0.5);
                      return y;
                  }});
    }
    // KTO's KL is the mean over the present KL sequences: an empty slot's value does not count.
    const std::vector<float> lp_with = {-1.0f, -2.0f, 7.0f, 7.0f, -1.5f, -1.0f}, lp_without = {-1.0f, -2.0f, -1.5f, -1.0f};
    const std::vector<float> sv_with = {0, 3, 0, 1, -3.0f, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, -1, -3.5f, 2, 0, 0};
    const std::vector<float> sv_without = {0, 3, 0, 1, -3.0f, 3, 0, 0, 0, 2, 0, -1, -3.5f, 2, 0, 0};
    EXPECT_EQ(rp::kto_kl(lp_with.data(), sv_with.data(), 6), rp::kto_kl(lp_without.data(), sv_without.data(), 4));
    EXPECT_DOUBLE_EQ(rp::kto_kl(lp_without.data(), sv_without.data(), 4), 1.75);  // mean(1.0, 2.5)
    // Half a pair empty is the data's error.
    Context ctx;
    Tensor * l = ctx.new_tensor(rp::DType::F32, 2);
    Tensor * s = ctx.new_tensor(rp::DType::F32, 4, 2);
    ctx.alloc_data(l);
    ctx.alloc_data(s);
    rp::tensor_set_f32(l, {-1.0f, -2.0f});
    rp::tensor_set_f32(s, {0, 0, 0, 0, 0, 3, 0, 0});
    const std::string error = compute_error(rp::preference_loss(ctx, l, s, params(PreferenceMethod::Dpo, 0.1), 1.0f));
    EXPECT_NE(error.find("answer 1 (pair 0) has 3.000000 tokens"), std::string::npos) << error;
}
