#include "ggml_rp/ops/binary.h"

#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/op_util.h"
#include "ggml_rp/ops/reduce.h"

namespace rp {

namespace {

void check(const char * op, const Tensor * a, const Tensor * b) {
    detail::require_f32(op, a, "a");
    detail::require_f32(op, b, "b");
    detail::require(can_repeat(b, a), op, "b " + describe(b) + " cannot be broadcast over a " + describe(a));
}

Tensor * binary(Context & ctx, Op op, const char * name, Tensor * a, Tensor * b) {
    check(name, a, b);
    return detail::new_node(ctx, op, DType::F32, a->ne, {a, b});
}

} // namespace

Tensor * add(Context & ctx, Tensor * a, Tensor * b) { return binary(ctx, Op::ADD, "add", a, b); }
Tensor * mul(Context & ctx, Tensor * a, Tensor * b) { return binary(ctx, Op::MUL, "mul", a, b); }

Tensor * add_inplace(Context & ctx, Tensor * a, Tensor * b) {
    check("add_inplace", a, b);
    Tensor * v = ctx.new_view(a, a->type, a->ne, a->nb, 0);
    v->op = Op::ADD;
    v->src[0] = a;
    v->src[1] = b;
    return v;
}

namespace rules {

void backward_binary(Backward & b, Tensor * node) {
    Context & ctx = b.ctx;
    Tensor * x = node->src[0];
    Tensor * y = node->src[1];
    Tensor * dz = b.grad(node);
    // Reduce a gradient with x's shape down to y's broadcast shape.
    auto to_y = [&](Tensor * g) { return same_shape(g, y) ? g : sum_to(ctx, g, y); };
    if (node->op == Op::ADD) {
        if (b.needs(x)) b.add(x, dz);
        if (b.needs(y)) b.add(y, to_y(dz));
    } else {  // MUL
        if (b.needs(x)) b.add(x, mul(ctx, dz, y));
        if (b.needs(y)) b.add(y, to_y(mul(ctx, dz, x)));
    }
}

} // namespace rules

} // namespace rp
