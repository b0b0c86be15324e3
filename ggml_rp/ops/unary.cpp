#include "ggml_rp/ops/unary.h"

#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/binary.h"
#include "ggml_rp/ops/op_util.h"

#include <cmath>
#include <string>

namespace rp {

Tensor * scale(Context & ctx, Tensor * x, float s) {
    detail::require_f32("scale", x, "x");
    Tensor * t = detail::new_node(ctx, Op::SCALE, DType::F32, x->ne, {x});
    t->set_param_f32(0, s);
    return t;
}

Tensor * softcap(Context & ctx, Tensor * x, float cap) {
    detail::require(cap > 0.0f && std::isfinite(cap), "softcap", "the cap must be a finite number > 0, not " + std::to_string(cap));
    Tensor * t = scale(ctx, x, 1.0f);
    t->set_param_f32(1, cap);
    return t;
}

Tensor * silu(Context & ctx, Tensor * x) {
    detail::require_f32("silu", x, "x");
    return detail::new_node(ctx, Op::SILU, DType::F32, x->ne, {x});
}

Tensor * sigmoid(Context & ctx, Tensor * x) {
    detail::require_f32("sigmoid", x, "x");
    return detail::new_node(ctx, Op::SIGMOID, DType::F32, x->ne, {x});
}

Tensor * softplus(Context & ctx, Tensor * x) {
    detail::require_f32("softplus", x, "x");
    return detail::new_node(ctx, Op::SOFTPLUS, DType::F32, x->ne, {x});
}

Tensor * silu_back(Context & ctx, Tensor * x, Tensor * dy) {
    detail::require_f32("silu_back", x, "x");
    detail::require_f32("silu_back", dy, "dy");
    detail::require_same_shape("silu_back", x, dy);
    return detail::new_node(ctx, Op::SILU_BACK, DType::F32, x->ne, {x, dy});
}

Tensor * swiglu(Context & ctx, Tensor * gate, Tensor * up) {
    detail::require_f32("swiglu", gate, "gate");
    detail::require_f32("swiglu", up, "up");
    detail::require_same_shape("swiglu", gate, up);
    return detail::new_node(ctx, Op::SWIGLU, DType::F32, gate->ne, {gate, up});
}

Tensor * swiglu_oai(Context & ctx, Tensor * gate, Tensor * up, float alpha, float limit) {
    detail::require(std::isfinite(alpha) && std::isfinite(limit) && limit > 0.0f, "swiglu_oai", "alpha must be finite and limit > 0");
    Tensor * t = swiglu(ctx, gate, up);
    t->set_param_i32(0, 1);
    t->set_param_f32(1, alpha);
    t->set_param_f32(2, limit);
    return t;
}

Tensor * geglu(Context & ctx, Tensor * gate, Tensor * up, bool fp16_table) {
    Tensor * t = swiglu(ctx, gate, up);
    t->set_param_i32(0, static_cast<int32_t>(fp16_table ? GluKind::GeluTanhFp16 : GluKind::GeluTanh));
    return t;
}

Tensor * swiglu_back(Context & ctx, Tensor * gate, Tensor * up, Tensor * dy, int which, const Tensor * like) {
    detail::require_f32("swiglu_back", dy, "dy");
    detail::require_same_shape("swiglu_back", gate, up);
    detail::require_same_shape("swiglu_back", gate, dy);
    detail::require(which == 0 || which == 1, "swiglu_back", "which must be 0 (gate) or 1 (up)");
    Tensor * t = detail::new_node(ctx, Op::SWIGLU_BACK, DType::F32, gate->ne, {gate, up, dy});
    t->set_param_i32(0, which);
    if (like) t->set_param_i32(1, like->param_i32(0));  // the kind
    if (like && like->param_i32(0) == static_cast<int32_t>(GluKind::SiluOai)) {  // the clamped form: its alpha and limit
        t->set_param_f32(2, like->param_f32(1));
        t->set_param_f32(3, like->param_f32(2));
    }
    return t;
}

namespace rules {

void backward_unary(Backward & b, Tensor * node) {
    Context & ctx = b.ctx;
    Tensor * dy = b.grad(node);
    Tensor * x = node->src[0];
    switch (node->op) {
    case Op::SCALE: {
        if (!b.needs(x)) return;
        const float s = node->param_f32(0), cap = node->param_f32(1);
        if (cap <= 0.0f) return b.add(x, scale(ctx, dy, s));
        // y = c tanh(s x / c): dx = s dy (1 - (y / c)^2) = s dy - (s / c^2) dy y y
        b.add(x, add(ctx, scale(ctx, dy, s), scale(ctx, mul(ctx, mul(ctx, dy, node), node), -s / (cap * cap))));
        return;
    }
    case Op::SILU:
        if (b.needs(x)) b.add(x, silu_back(ctx, x, dy));
        return;
    case Op::SIGMOID: {  // dx = dy y (1 - y) = t - t y, t = dy y
        if (!b.needs(x)) return;
        Tensor * t = mul(ctx, dy, node);
        b.add(x, add(ctx, t, scale(ctx, mul(ctx, t, node), -1.0f)));
        return;
    }
    case Op::SOFTPLUS:
        if (b.needs(x)) b.add(x, mul(ctx, dy, sigmoid(ctx, x)));
        return;
    case Op::SWIGLU: {
        if (node->param_i32(0) == static_cast<int32_t>(GluKind::GeluTanhFp16))
            detail::op_error("geglu", "llama.cpp's fp16 GELU table is an inference form: it has no gradient (use the exact GELU)");
        Tensor * up = node->src[1];
        if (b.needs(x)) b.add(x, swiglu_back(ctx, x, up, dy, 0, node));
        if (b.needs(up)) b.add(up, swiglu_back(ctx, x, up, dy, 1, node));
        return;
    }
    default:
        detail::op_error("unary backward", std::string("unexpected op ") + op_name(node->op));
    }
}

} // namespace rules

} // namespace rp
