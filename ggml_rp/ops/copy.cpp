#include "ggml_rp/ops/copy.h"

#include "ggml_rp/ops/backward_rules.h"
#include "ggml_rp/ops/op_util.h"

namespace rp {

Tensor * cast(Context & ctx, Tensor * x, DType type) {
    detail::require(dtype_is_float(x->type) && dtype_is_float(type), "cast",
                    "cannot convert " + describe(x) + " to " + dtype_name(type) + " (f32, f16 and bf16 only)");
    return detail::new_node(ctx, Op::CPY, type, x->ne, {x});
}

Tensor * cont(Context & ctx, Tensor * x) { return cast(ctx, x, x->type); }

Tensor * cont_if_needed(Context & ctx, Tensor * x) { return x->is_contiguous() ? x : cont(ctx, x); }

Tensor * fill(Context & ctx, const int64_t ne[4], float value) {
    Tensor * t = detail::new_node(ctx, Op::FILL, DType::F32, ne, {});
    t->set_param_f32(0, value);
    return t;
}

Tensor * fill(Context & ctx, const Tensor * like, float value) { return fill(ctx, like->ne, value); }

namespace rules {

void backward_copy(Backward & b, Tensor * node) {
    Tensor * x = node->src[0];
    // The gradient of a conversion is the identity (gradients are f32 whatever the forward's storage type).
    if (b.needs(x)) b.add(x, b.grad(node));
}

} // namespace rules

} // namespace rp
