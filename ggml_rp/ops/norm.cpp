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

namespace {
void check_gated_back(const char * op, const Tensor * x, const Tensor * weight, const Tensor * z, const Tensor * dy) {
    detail::require_f32(op, x, "x");
    detail::require_f32(op, z, "z");
    detail::require_f32(op, dy, "dy");
    detail::require_same_shape(op, x, z);
    detail::require_same_shape(op, x, dy);
    check_weight(op, x, weight);
}
} // namespace

Tensor * rms_norm_gated_back(Context & ctx, Tensor * x, Tensor * weight, Tensor * z, Tensor * dy, float eps, int which) {
    detail::require(which == 0 || which == 1, "rms_norm_gated_back", "which must be 0 (dx) or 1 (dz)");
    check_gated_back("rms_norm_gated_back", x, weight, z, dy);
    Tensor * t = detail::new_node(ctx, Op::RMS_NORM_GATED_BACK, DType::F32, x->ne, {x, z, dy, weight});
    t->set_param_f32(0, eps);
    t->set_param_i32(1, which);
    return t;
}

Tensor * rms_norm_gated_back_over_dy(Context & ctx, Tensor * x, Tensor * weight, Tensor * z, Tensor * dy, float eps) {
    const char * op = "rms_norm_gated_back_over_dy";
    check_gated_back(op, x, weight, z, dy);
    detail::require(dy->is_contiguous(), op, "dy " + describe(dy) + " must be contiguous");
    Tensor * t = ctx.new_view(dy, DType::F32, dy->ne, dy->nb, 0);
    t->op = Op::RMS_NORM_GATED_BACK;
    t->src[0] = x, t->src[1] = z, t->src[2] = dy, t->src[3] = weight;
    t->set_param_f32(0, eps);
    t->set_param_i32(1, 1);
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
    Tensor * dx = b.needs(x) ? rms_norm_gated_back(ctx, x, w, z, dy, eps, 0) : nullptr;
    // dw = sum over rows of dy * (the gated norm without the weight).
    Tensor * dy_w = w && b.needs(w) ? mul(ctx, dy, rms_norm_gated(ctx, x, nullptr, z, eps)) : nullptr;
    if (dx) b.add(x, dx);
    if (dy_w) b.add(w, sum_to(ctx, dy_w, w));
    if (!b.needs(z)) return;
    // dz last. When dy is a buffer only this node's gradient uses, dz is written over it (element i reads only
    // dy's element i), after the nodes that read dy: a graph then holds one [n, rows] array fewer at this
    // rule (Qwen3.5's DeltaNet layers peak here).
    if (b.owns_grad(node) && dy->is_contiguous()) {
        Tensor * src = dy;
        if (dx) src = after(ctx, src, dx);
        if (dy_w) src = after(ctx, src, dy_w);
        b.add(z, rms_norm_gated_back_over_dy(ctx, x, w, z, src, eps));
    } else {
        b.add(z, rms_norm_gated_back(ctx, x, w, z, dy, eps, 1));
    }
}

} // namespace rules

} // namespace rp
