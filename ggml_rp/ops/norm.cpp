#include "ggml_rp/ops/norm.h"
#include "ggml_rp/ops/test_hooks.h"

#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/binary.h"
#include "ggml_rp/ops/copy.h"
#include "ggml_rp/ops/op_util.h"
#include "ggml_rp/ops/reduce.h"
#include "ggml_rp/ops/unary.h"
#include "ggml_rp/ops/view.h"

namespace rp {

namespace {

void check_weight(const char * op, const Tensor * x, const Tensor * w) {
    if (!w) return;
    detail::require_f32(op, w, "weight");
    detail::require(w->ne[0] == x->ne[0] && w->nelements() == w->ne[0], op,
                    "weight " + describe(w) + " must have shape [" + std::to_string(x->ne[0]) + "] to scale rows of " + describe(x));
}

} // namespace

Tensor * rms_norm(Context & ctx, Tensor * x, Tensor * weight, float eps) {
    detail::require_f32("rms_norm", x, "x");
    check_weight("rms_norm", x, weight);
    detail::require(eps >= 0.0f, "rms_norm", "eps must be >= 0");
    Tensor * t = detail::new_node(ctx, Op::RMS_NORM, DType::F32, x->ne, {x, weight});
    t->set_param_f32(0, eps);
    return t;
}

Tensor * l2_norm(Context & ctx, Tensor * x, float eps) {
    detail::require(eps > 0.0f, "l2_norm", "eps must be > 0");
    Tensor * t = rms_norm(ctx, x, nullptr, eps);
    t->set_param_i32(1, 1);
    t->aux_bytes = static_cast<size_t>(t->nrows()) * sizeof(float);
    return t;
}

Tensor * l2_norm_back(Context & ctx, Tensor * y, Tensor * dy) {
    detail::require(y && y->op == Op::RMS_NORM && y->param_i32(1) != 0 && y->aux_bytes != 0, "l2_norm_back",
                    describe(y) + " is not an l2_norm node");
    detail::require_f32("l2_norm_back", dy, "dy");
    detail::require_same_shape("l2_norm_back", y, dy);
    const int64_t ne[4] = {y->nrows(), 1, 1, 1};
    return detail::new_node(ctx, Op::L2_NORM_BACK, DType::F32, y->ne, {y, aux_view(ctx, y, ne, 0), cont_if_needed(ctx, dy)});
}

Tensor * rms_norm_back(Context & ctx, Tensor * x, Tensor * weight, Tensor * dy, float eps, bool l2) {
    detail::require_f32("rms_norm_back", x, "x");
    detail::require_f32("rms_norm_back", dy, "dy");
    detail::require_same_shape("rms_norm_back", x, dy);
    check_weight("rms_norm_back", x, weight);
    // Sources: x, dy, weight (nullable last, so the slots of present tensors are fixed).
    Tensor * t = detail::new_node(ctx, Op::RMS_NORM_BACK, DType::F32, x->ne, {x, dy, weight});
    t->set_param_f32(0, eps);
    t->set_param_i32(1, l2 ? 1 : 0);
    return t;
}

Tensor * rms_norm_gated(Context & ctx, Tensor * x, Tensor * weight, Tensor * z, float eps) {
    detail::require_f32("rms_norm_gated", x, "x");
    detail::require_f32("rms_norm_gated", z, "z");
    detail::require_same_shape("rms_norm_gated", x, z);
    check_weight("rms_norm_gated", x, weight);
    detail::require(eps >= 0.0f, "rms_norm_gated", "eps must be >= 0");
    // Sources: x, z, weight (nullable last, so the slots of present tensors are fixed).
    Tensor * t = detail::new_node(ctx, Op::RMS_NORM_GATED, DType::F32, x->ne, {x, z, weight});
    t->set_param_f32(0, eps);
    return t;
}

Tensor * rms_norm_gated_back(Context & ctx, Tensor * x, Tensor * weight, Tensor * z, Tensor * dy, float eps, int which) {
    detail::require(which == 0 || which == 1, "rms_norm_gated_back", "which must be 0 (dx) or 1 (dz)");
    detail::require_f32("rms_norm_gated_back", x, "x");
    detail::require_f32("rms_norm_gated_back", z, "z");
    detail::require_f32("rms_norm_gated_back", dy, "dy");
    detail::require_same_shape("rms_norm_gated_back", x, z);
    detail::require_same_shape("rms_norm_gated_back", x, dy);
    check_weight("rms_norm_gated_back", x, weight);
    Tensor * t = detail::new_node(ctx, Op::RMS_NORM_GATED_BACK, DType::F32, x->ne, {x, z, dy, weight});
    t->set_param_f32(0, eps);
    t->set_param_i32(1, which);
    return t;
}

namespace rules {

void backward_norm(Backward & b, Tensor * node) {
    Context & ctx = b.ctx;
    Tensor * x = node->src[0];
    Tensor * w = node->src[1];
    Tensor * dy = b.grad(node);
    const float eps = node->param_f32(0);
    const bool l2 = node->param_i32(1) != 0;
    if (b.needs(x)) b.add(x, l2 ? l2_norm_back(ctx, node, dy) : rms_norm_back(ctx, x, w, dy, eps));
    // dw = sum over rows of dy * (x normalized without the weight).
    if (w && b.needs(w)) {
        Tensor * dw = sum_to(ctx, mul(ctx, dy, rms_norm(ctx, x, nullptr, eps)), w);
        if (const float p = test_hooks::backward_perturbation("rms_norm"); p != 0.0f) dw = scale(ctx, dw, 1.0f + p);
        b.add(w, dw);
    }
}

void backward_norm_gated(Backward & b, Tensor * node) {
    Context & ctx = b.ctx;
    Tensor * x = node->src[0];
    Tensor * z = node->src[1];
    Tensor * w = node->src[2];
    Tensor * dy = b.grad(node);
    const float eps = node->param_f32(0);
    if (b.needs(x)) b.add(x, rms_norm_gated_back(ctx, x, w, z, dy, eps, 0));
    if (b.needs(z)) b.add(z, rms_norm_gated_back(ctx, x, w, z, dy, eps, 1));
    // dw = sum over rows of dy * (the gated norm without the weight).
    if (w && b.needs(w)) {
        b.add(w, sum_to(ctx, mul(ctx, dy, rms_norm_gated(ctx, x, nullptr, z, eps)), w));
    }
}

} // namespace rules

} // namespace rp
