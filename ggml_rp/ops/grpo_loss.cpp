#include "ggml_rp/ops/grpo_loss.h"

#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/copy.h"
#include "ggml_rp/ops/op_util.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace rp {

// op_params: epsilon_low, epsilon_high, beta (f32), on_policy (i32)
GrpoParams grpo_params(const Tensor * node) {
    GrpoParams p;
    p.epsilon_low = node->param_f32(0);
    p.epsilon_high = node->param_f32(1);
    p.beta = node->param_f32(2);
    p.on_policy = node->param_i32(3) != 0;
    return p;
}

Tensor * grpo_loss(Context & ctx, Tensor * logp, Tensor * values, const GrpoParams & p) {
    const char * op = "grpo_loss";
    detail::require_f32(op, logp, "logp");
    detail::require_f32(op, values, "values");
    const int64_t N = logp->nelements();
    detail::require(N >= 1 && logp->ne[0] == N, op, "logp " + describe(logp) + " must be [N]");
    detail::require(values->ne[0] == kTokenValues && values->ne[1] == N && values->nelements() == kTokenValues * N, op,
                    "values " + describe(values) + " must be [" + std::to_string(kTokenValues) + ", " + std::to_string(N) +
                        "] (advantage, old log-probability, reference log-probability, weight per token)");
    detail::require(p.epsilon_low >= 0 && p.epsilon_low < 1, op, "epsilon_low " + std::to_string(p.epsilon_low) + " must be in [0, 1)");
    detail::require(p.epsilon_high >= 0 && std::isfinite(p.epsilon_high), op,
                    "epsilon_high " + std::to_string(p.epsilon_high) + " must be finite and >= 0");
    detail::require(p.beta >= 0 && std::isfinite(p.beta), op, "beta " + std::to_string(p.beta) + " must be finite and >= 0");
    const int64_t ne[4] = {1, 1, 1, 1};
    Tensor * t = detail::new_node(ctx, Op::GRPO_LOSS, DType::F32, ne, {cont_if_needed(ctx, logp), cont_if_needed(ctx, values)});
    t->set_param_f32(0, static_cast<float>(p.epsilon_low));
    t->set_param_f32(1, static_cast<float>(p.epsilon_high));
    t->set_param_f32(2, static_cast<float>(p.beta));
    t->set_param_i32(3, p.on_policy ? 1 : 0);
    return t;
}

Tensor * grpo_loss_back(Context & ctx, Tensor * loss, Tensor * dloss) {
    detail::require(loss && loss->op == Op::GRPO_LOSS, "grpo_loss_back", describe(loss) + " is not a grpo_loss node");
    detail::require(dloss && dloss->type == DType::F32 && dloss->nelements() == 1, "grpo_loss_back",
                    "dloss " + describe(dloss) + " must be an f32 scalar");
    Tensor * logp = loss->src[0];
    Tensor * d = detail::new_node(ctx, Op::GRPO_LOSS_BACK, DType::F32, logp->ne, {logp, loss->src[1], cont_if_needed(ctx, dloss)});
    std::copy(loss->op_params, loss->op_params + kMaxOpParams, d->op_params);
    return d;
}

namespace rules {

void backward_grpo_loss(Backward & b, Tensor * node) {
    Tensor * logp = node->src[0];
    if (b.needs(logp)) b.add(logp, grpo_loss_back(b.ctx, node, b.grad(node)));
}

} // namespace rules

} // namespace rp
