#include "ggml_rp/ops/preference_loss.h"

#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/copy.h"
#include "ggml_rp/ops/op_util.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace rp {

namespace {

// op_params: method (i32), beta, label smoothing, gamma, loss scale, desirable and undesirable weights (f32)
void set_params(Tensor * t, const PreferenceParams & p, float loss_scale) {
    t->set_param_i32(0, static_cast<int32_t>(p.method));
    t->set_param_f32(1, static_cast<float>(p.beta));
    t->set_param_f32(2, static_cast<float>(p.label_smoothing));
    t->set_param_f32(3, static_cast<float>(p.gamma));
    t->set_param_f32(4, loss_scale);
    t->set_param_f32(5, static_cast<float>(p.desirable_weight));
    t->set_param_f32(6, static_cast<float>(p.undesirable_weight));
}

} // namespace

PreferenceParams preference_params(const Tensor * node) {
    PreferenceParams p;
    p.method = static_cast<PreferenceMethod>(node->param_i32(0));
    p.beta = node->param_f32(1);
    p.label_smoothing = node->param_f32(2);
    p.gamma = node->param_f32(3);
    p.desirable_weight = node->param_f32(5);
    p.undesirable_weight = node->param_f32(6);
    return p;
}

float preference_loss_scale(const Tensor * node) { return node->param_f32(4); }

Tensor * preference_loss(Context & ctx, Tensor * logps, Tensor * seq, const PreferenceParams & p, float loss_scale) {
    const char * op = "preference_loss";
    detail::require_f32(op, logps, "logps");
    detail::require_f32(op, seq, "seq");
    const int64_t B = logps->nelements();
    detail::require(B >= 2 && B % 2 == 0 && logps->ne[0] == B, op,
                    "logps " + describe(logps) + " must be [B] with B even (answers 2k, 2k + 1 are pair k)");
    detail::require(seq->ne[0] == kSequenceValues && seq->ne[1] == B && seq->nelements() == kSequenceValues * B, op,
                    "seq " + describe(seq) + " must be [" + std::to_string(kSequenceValues) + ", " + std::to_string(B) +
                        "] (reference, tokens, NLL weight, kind per answer)");
    const int32_t m = static_cast<int32_t>(p.method);
    detail::require(m >= 0 && m <= static_cast<int32_t>(PreferenceMethod::Kto), op, "unknown method " + std::to_string(m));
    detail::require(p.desirable_weight > 0 && p.undesirable_weight > 0 && std::isfinite(p.desirable_weight) && std::isfinite(p.undesirable_weight),
                    op, "the desirable and undesirable weights must be finite and > 0");
    detail::require(p.beta > 0 && std::isfinite(p.beta), op, "beta " + std::to_string(p.beta) + " must be finite and > 0");
    detail::require(p.label_smoothing >= 0 && p.label_smoothing < 0.5, op,
                    "label smoothing " + std::to_string(p.label_smoothing) + " must be in [0, 0.5)");
    detail::require(std::isfinite(p.gamma), op, "gamma must be finite");
    const int64_t ne[4] = {1, 1, 1, 1};
    Tensor * t = detail::new_node(ctx, Op::PREFERENCE_LOSS, DType::F32, ne, {cont_if_needed(ctx, logps), cont_if_needed(ctx, seq)});
    set_params(t, p, loss_scale);
    return t;
}

Tensor * preference_loss_back(Context & ctx, Tensor * loss, Tensor * dloss) {
    detail::require(loss && loss->op == Op::PREFERENCE_LOSS, "preference_loss_back", describe(loss) + " is not a preference_loss node");
    detail::require(dloss && dloss->type == DType::F32 && dloss->nelements() == 1, "preference_loss_back",
                    "dloss " + describe(dloss) + " must be an f32 scalar");
    Tensor * logps = loss->src[0];
    Tensor * d = detail::new_node(ctx, Op::PREFERENCE_LOSS_BACK, DType::F32, logps->ne, {logps, loss->src[1], cont_if_needed(ctx, dloss)});
    std::copy(loss->op_params, loss->op_params + kMaxOpParams, d->op_params);
    return d;
}

void set_preference_loss_scale(const Graph & g, float loss_scale) {
    for (Tensor * n : g.nodes)
        if (n->op == Op::PREFERENCE_LOSS || n->op == Op::PREFERENCE_LOSS_BACK) n->set_param_f32(4, loss_scale);
}

namespace rules {

void backward_preference_loss(Backward & b, Tensor * node) {
    Tensor * logps = node->src[0];
    if (b.needs(logps)) b.add(logps, preference_loss_back(b.ctx, node, b.grad(node)));
}

} // namespace rules

} // namespace rp
