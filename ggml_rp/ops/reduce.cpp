#include "ggml_rp/ops/reduce.h"

#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/op_util.h"
#include "ggml_rp/ops/unary.h"

namespace rp {

Tensor * sum(Context & ctx, Tensor * x) {
    detail::require_f32("sum", x, "x");
    const int64_t ne[4] = {1, 1, 1, 1};
    return detail::new_node(ctx, Op::SUM, DType::F32, ne, {x});
}

Tensor * mean(Context & ctx, Tensor * x) {
    detail::require_f32("mean", x, "x");
    const int64_t ne[4] = {1, 1, 1, 1};
    return detail::new_node(ctx, Op::MEAN, DType::F32, ne, {x});
}

Tensor * repeat(Context & ctx, Tensor * x, const Tensor * like) {
    detail::require_f32("repeat", x, "x");
    detail::require(can_repeat(x, like), "repeat", describe(x) + " cannot be repeated to " + shape_str(like));
    return detail::new_node(ctx, Op::REPEAT, DType::F32, like->ne, {x});
}

Tensor * sum_to(Context & ctx, Tensor * x, const Tensor * like) {
    detail::require_f32("sum_to", x, "x");
    detail::require(can_repeat(like, x), "sum_to", describe(x) + " cannot be summed down to " + shape_str(like));
    return detail::new_node(ctx, Op::SUM_TO, DType::F32, like->ne, {x});
}

namespace rules {

void backward_reduce(Backward & b, Tensor * node) {
    Context & ctx = b.ctx;
    Tensor * x = node->src[0];
    if (!b.needs(x)) return;
    Tensor * dy = b.grad(node);
    switch (node->op) {
    case Op::SUM: b.add(x, repeat(ctx, dy, x)); return;
    case Op::MEAN: b.add(x, repeat(ctx, scale(ctx, dy, 1.0f / static_cast<float>(x->nelements())), x)); return;
    case Op::REPEAT: b.add(x, sum_to(ctx, dy, x)); return;
    case Op::SUM_TO: b.add(x, repeat(ctx, dy, x)); return;
    default: detail::op_error("reduce backward", std::string("unexpected op ") + op_name(node->op));
    }
}

} // namespace rules

} // namespace rp
