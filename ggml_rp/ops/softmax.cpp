#include "ggml_rp/ops/softmax.h"

#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/op_util.h"

namespace rp {

Tensor * softmax(Context & ctx, Tensor * x) {
    detail::require_f32("softmax", x, "x");
    return detail::new_node(ctx, Op::SOFTMAX, DType::F32, x->ne, {x});
}

Tensor * softmax_back(Context & ctx, Tensor * y, Tensor * dy) {
    detail::require_f32("softmax_back", y, "y");
    detail::require_f32("softmax_back", dy, "dy");
    detail::require_same_shape("softmax_back", y, dy);
    return detail::new_node(ctx, Op::SOFTMAX_BACK, DType::F32, y->ne, {y, dy});
}

namespace rules {

void backward_softmax(Backward & b, Tensor * node) {
    Tensor * x = node->src[0];
    if (b.needs(x)) b.add(x, softmax_back(b.ctx, node, b.grad(node)));
}

} // namespace rules

} // namespace rp
