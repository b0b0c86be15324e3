#include "ggml_rp/ops/copy.h"

#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/op_util.h"

namespace rp {

Tensor * cast(Context & ctx, Tensor * x, DType type) {
    detail::require(dtype_is_float(x->type) && dtype_is_float(type), "cast",
                    "cannot convert " + describe(x) + " to " + dtype_name(type) + " (f32, f16 and bf16 only)");
    return detail::new_node(ctx, Op::CPY, type, x->ne, {x});
}

Tensor * cont(Context & ctx, Tensor * x) { return cast(ctx, x, x->type); }

Tensor * cont_if_needed(Context & ctx, Tensor * x) { return x->is_contiguous() ? x : cont(ctx, x); }

Tensor * copy_into(Context & ctx, Tensor * window, Tensor * src) {
    detail::require(window && window->is_view() && window->op == Op::VIEW, "copy_into", describe(window) + " is not a view of another tensor");
    detail::require(same_shape(window, src), "copy_into", "src " + describe(src) + " and window " + describe(window) + " differ in shape");
    detail::require(dtype_is_float(src->type) && dtype_is_float(window->type), "copy_into",
                    "cannot convert " + describe(src) + " into " + describe(window) + " (f32, f16 and bf16 only)");
    Tensor * w = ctx.new_view(window->view_src, window->type, window->ne, window->nb, window->view_offs);
    w->op = Op::CPY;
    w->src[0] = src;
    return w;
}

Tensor * fill(Context & ctx, const int64_t ne[4], float value) {
    Tensor * t = detail::new_node(ctx, Op::FILL, DType::F32, ne, {});
    t->set_param_f32(0, value);
    return t;
}

Tensor * fill(Context & ctx, const Tensor * like, float value) { return fill(ctx, like->ne, value); }

Tensor * fill_after(Context & ctx, const Tensor * like, float value, Tensor * dep) {
    Tensor * t = fill(ctx, like, value);
    t->src[0] = dep;
    return t;
}

namespace rules {

void backward_copy(Backward & b, Tensor * node) {
    Tensor * x = node->src[0];
    // The gradient of a conversion is the identity (gradients are f32 whatever the forward's storage type).
    if (b.needs(x)) b.add(x, b.grad(node));
}

} // namespace rules

} // namespace rp
