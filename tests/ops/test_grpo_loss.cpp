// GRPO's policy loss (grpo_loss): against TRL's formula written out in long double (tests/common/grpo_reference.h),
// its backward against finite differences of that reference (the harness), off-policy with tokens on both sides
// of the clip range, on-policy, with and without the KL term; the closed forms of each branch; bad arguments.
#include "harness.h"
#include "tests/common/grpo_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

using namespace optest;
using rp::Context;
using rp::GrpoParams;
using rp::Tensor;
using TV = std::vector<Tensor *>;
using R = RefInputs;

namespace {

GrpoParams params(double eps_low, double eps_high, double beta, bool on_policy) {
    GrpoParams p;
    p.epsilon_low = eps_low;
    p.epsilon_high = eps_high;
    p.beta = beta;
    p.on_policy = on_policy;
    return p;
}

// N tokens with log-probabilities drawn in [-2.05, -1.95]; per token: advantage, old log-probability, reference,
// weight. The old log-probabilities put the ratio well inside the clip range (about 1), below it (about 0.6) or
// above it (about 1.65), with advantages of both signs, so that every branch is taken and none is near a kink.
std::vector<float> token_values(int64_t N) {
    std::vector<float> v;
    const float old_offset[] = {0.0f, 0.5f, -0.5f};  // ratio ~ 1, ~ 0.61, ~ 1.65
    for (int64_t t = 0; t < N; ++t) {
        const float A = (t % 2 ? -1.0f : 1.0f) * (0.3f + 0.1f * static_cast<float>(t % 5));
        const float w = t % 7 == 6 ? 0.0f : 0.05f + 0.01f * static_cast<float>(t % 4);  // a few prompt tokens (weight 0)
        v.insert(v.end(), {A, -2.0f + old_offset[t % 3], -2.0f + 0.2f * static_cast<float>(t % 3) - 0.2f, w});
    }
    return v;
}

Case grpo_case(const std::string & name, int64_t N, const GrpoParams & p) {
    const std::vector<float> sv = token_values(N);
    Input lp{"logp", {N, 1, 1, 1}};
    lp.lo = -2.05f;
    lp.hi = -1.95f;
    return {name, {lp},
            [=](Context & c, const TV & in) {
                Tensor * v = c.new_tensor(rp::DType::F32, rp::kTokenValues, N);
                c.alloc_data(v);
                rp::tensor_set_f32(v, sv);
                return rp::grpo_loss(c, in[0], v, p);
            },
            [=](const R & x) {
                ref::DT y({1, 1, 1, 1});
                y.v[0] = static_cast<double>(grpo_ref::loss(p, x[0].v.data(), sv.data(), N));
                return y;
            }};
}

// The loss and d loss / d logp of every token (the loss last).
std::vector<float> loss_and_gradient(const GrpoParams & p, const std::vector<float> & lp, const std::vector<float> & v) {
    const int64_t N = static_cast<int64_t>(lp.size());
    Context ctx;
    Tensor * l = ctx.new_tensor(rp::DType::F32, N);
    Tensor * vt = ctx.new_tensor(rp::DType::F32, rp::kTokenValues, N);
    ctx.alloc_data(l);
    ctx.alloc_data(vt);
    rp::tensor_set_f32(l, lp);
    rp::tensor_set_f32(vt, v);
    ctx.alloc_data(rp::set_param(ctx, l)->grad);
    rp::tensor_set_f32(l->grad, std::vector<float>(size_t(N), 0.0f));
    Tensor * loss = rp::grpo_loss(ctx, l, vt, p);
    rp::Graph g;
    rp::build_forward(g, loss);
    rp::build_backward(ctx, g, loss, {l});
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, 1);
    std::vector<float> out = rp::tensor_get_f32(l->grad);
    out.push_back(rp::tensor_get_f32(loss)[0]);
    return out;
}

// The loss and d loss / d logp of one token.
std::pair<float, float> one_token(const GrpoParams & p, float logp, std::vector<float> v) {
    const std::vector<float> r = loss_and_gradient(p, {logp}, v);
    return {r[1], r[0]};
}

} // namespace

TEST(OpGrpoLoss, AgainstTheDoubleReference) {
    check_op(grpo_case("off-policy, clip 0.2, no KL", 24, params(0.2, 0.2, 0.0, false)));
    check_op(grpo_case("off-policy, clip-higher 0.2 / 0.28, beta 0.04", 24, params(0.2, 0.28, 0.04, false)));
    check_op(grpo_case("off-policy, one token", 1, params(0.2, 0.2, 0.1, false)));
}

// On-policy (one update per rollout batch, TRL's old = logp.detach()) is the off-policy loss with the old
// log-probabilities equal to the policy's: the same loss and gradient to the bit (the ratio is exp(0) = 1).
// (The harness cannot check it: its finite differences would move the old log-probabilities with the policy's.)
TEST(OpGrpoLoss, OnPolicyIsTheRatioAtOne) {
    const int64_t N = 17;
    std::vector<float> lp(N), v = token_values(N);
    for (int64_t t = 0; t < N; ++t) {
        lp[size_t(t)] = -2.0f + 0.01f * static_cast<float>(t);
        v[size_t(rp::kTokenValues * t + rp::kOldLogp)] = lp[size_t(t)];
    }
    const std::vector<float> on = loss_and_gradient(params(0.2, 0.2, 0.1, true), lp, v), off = loss_and_gradient(params(0.2, 0.2, 0.1, false), lp, v);
    EXPECT_EQ(on, off);
    EXPECT_NE(on.back(), 0.0f);
}

// Each branch's closed form: on-policy the ratio is 1 (loss -w A, gradient -w A); above the range with A > 0 the
// clipped term is the smaller (loss -w (1 + eps_high) A, no gradient); above it with A < 0 the ratio's term is
// (loss -w c A, gradient -w c A); the KL term vanishes at the reference and is k3 elsewhere; weight 0 is nothing.
TEST(OpGrpoLoss, ClosedFormsOfEachBranch) {
    const float lp = -1.0f;
    {
        const auto [l, d] = one_token(params(0.2, 0.2, 0.0, true), lp, {0.5f, -7.0f, 0.0f, 0.25f});
        EXPECT_FLOAT_EQ(l, -0.125f);
        EXPECT_FLOAT_EQ(d, -0.125f);
    }
    const float old = lp - std::log(1.5f);  // ratio 1.5, above 1 + 0.28
    {
        const auto [l, d] = one_token(params(0.2, 0.28, 0.0, false), lp, {2.0f, old, 0.0f, 1.0f});
        EXPECT_FLOAT_EQ(l, -1.28f * 2.0f);
        EXPECT_EQ(d, 0.0f);
    }
    {
        const auto [l, d] = one_token(params(0.2, 0.28, 0.0, false), lp, {-2.0f, old, 0.0f, 1.0f});
        EXPECT_NEAR(l, 1.5f * 2.0f, 1e-6);
        EXPECT_NEAR(d, 1.5f * 2.0f, 1e-6);
    }
    {
        const auto [l, d] = one_token(params(0.2, 0.2, 0.5, true), lp, {0.0f, 0.0f, lp, 1.0f});
        EXPECT_EQ(l, 0.0f);
        EXPECT_EQ(d, 0.0f);
        const auto [l2, d2] = one_token(params(0.2, 0.2, 0.5, true), lp, {0.0f, 0.0f, lp + 0.3f, 1.0f});
        EXPECT_NEAR(l2, 0.5 * (std::exp(0.3) - 0.3 - 1), 1e-6);
        EXPECT_NEAR(d2, 0.5 * (1 - std::exp(0.3)), 1e-6);
    }
    {
        const auto [l, d] = one_token(params(0.2, 0.2, 0.5, false), lp, {3.0f, old, lp + 1.0f, 0.0f});
        EXPECT_EQ(l, 0.0f);
        EXPECT_EQ(d, 0.0f);
    }
    // The clip fraction counts the tokens whose clip is active, as TRL's clip_ratio.
    const float v[] = {2.0f, old, 0.0f, 1.0f};
    EXPECT_TRUE(rp::grpo_token_loss(params(0.2, 0.28, 0, false), lp, v).clipped);
    EXPECT_FALSE(rp::grpo_token_loss(params(0.2, 0.6, 0, false), lp, v).clipped);
}

TEST(OpGrpoLoss, BadShapesAndParametersAreErrors) {
    Context ctx;
    Tensor * l = ctx.new_tensor(rp::DType::F32, 4);
    Tensor * v = ctx.new_tensor(rp::DType::F32, rp::kTokenValues, 4);
    EXPECT_THROW(rp::grpo_loss(ctx, l, ctx.new_tensor(rp::DType::F32, 3, 4), params(0.2, 0.2, 0, true)), rp::Error);
    EXPECT_THROW(rp::grpo_loss(ctx, l, ctx.new_tensor(rp::DType::F32, rp::kTokenValues, 5), params(0.2, 0.2, 0, true)), rp::Error);
    EXPECT_THROW(rp::grpo_loss(ctx, l, v, params(1.0, 0.2, 0, true)), rp::Error);
    EXPECT_THROW(rp::grpo_loss(ctx, l, v, params(0.2, -0.1, 0, true)), rp::Error);
    EXPECT_THROW(rp::grpo_loss(ctx, l, v, params(0.2, 0.2, -1, true)), rp::Error);
    EXPECT_THROW(rp::grpo_loss(ctx, l, v, params(0.2, 0.2, std::nan(""), true)), rp::Error);
    EXPECT_THROW(rp::grpo_loss(ctx, ctx.new_tensor(rp::DType::F16, 4), v, params(0.2, 0.2, 0, true)), rp::Error);
}
