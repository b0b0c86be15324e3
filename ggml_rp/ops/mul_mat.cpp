#include "ggml_rp/ops/mul_mat.h"

#include "ggml_rp/core/quant.h"
#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/copy.h"
#include "ggml_rp/ops/op_util.h"

namespace rp {

namespace {

// Activations must be f32 with adjacent elements; anything else is copied first.
Tensor * as_f32_rows(Context & ctx, Tensor * x) {
    if (x->type == DType::F32 && x->rows_contiguous() && x->nb[1] % sizeof(float) == 0 && x->nb[2] % sizeof(float) == 0 &&
        x->nb[3] % sizeof(float) == 0)
        return x;
    return cast(ctx, x, DType::F32);
}

void check_pair(const char * op, const Tensor * W, const Tensor * X, int64_t x_in) {
    detail::require(W && X, op, "null operand");
    detail::require(W->ne[0] == x_in, op,
                    "W " + describe(W) + " has in = ne[0] = " + std::to_string(W->ne[0]) + " but X " + describe(X) +
                        " has " + std::to_string(x_in) + " (W[in, out] x X[in, tokens] -> Y[out, tokens])");
    detail::require(X->ne[2] % W->ne[2] == 0 && X->ne[3] % W->ne[3] == 0, op,
                    "cannot broadcast W " + describe(W) + " over the batches of " + describe(X));
}

void check_weight(const char * op, const Tensor * W) {
    detail::require(can_dequantize(W->type), op, "weight " + describe(W) + " has an unsupported type");
    detail::require(W->rows_contiguous(), op, "weight " + describe(W) + " must have contiguous rows");
}

// A GEMM node of shape ne over sources W and A: a fresh one, or one accumulating in place into `into` (src 2).
Tensor * gemm_node(Context & ctx, Op op, const int64_t ne[4], Tensor * W, Tensor * A, Tensor * into) {
    if (!into) return detail::new_node(ctx, op, DType::F32, ne, {W, A});
    Tensor * t = detail::accumulating_node(ctx, op, into, ne);
    t->src[0] = W;
    t->src[1] = A;
    t->src[2] = into;
    return t;
}

} // namespace

Tensor * mul_mat(Context & ctx, Tensor * W, Tensor * X, Tensor * into) {
    check_pair("mul_mat", W, X, X ? X->ne[0] : 0);
    if (W->type == DType::F32 && !W->rows_contiguous()) W = cont(ctx, W);
    check_weight("mul_mat", W);
    X = as_f32_rows(ctx, X);
    const int64_t ne[4] = {W->ne[1], X->ne[1], X->ne[2], X->ne[3]};
    return gemm_node(ctx, Op::MUL_MAT, ne, W, X, into);
}

Tensor * mul_mat_back_x(Context & ctx, Tensor * W, Tensor * dY, const Tensor * x_like, Tensor * into) {
    check_weight("mul_mat_back_x", W);
    dY = as_f32_rows(ctx, dY);
    detail::require(dY->ne[0] == W->ne[1] && dY->ne[1] == x_like->ne[1] && dY->ne[2] == x_like->ne[2] &&
                    dY->ne[3] == x_like->ne[3] && x_like->ne[0] == W->ne[0], "mul_mat_back_x",
                    "dY " + describe(dY) + " does not match W " + describe(W) + " and X " + describe(x_like));
    check_pair("mul_mat_back_x", W, x_like, x_like->ne[0]);
    return gemm_node(ctx, Op::MUL_MAT_BACK_X, x_like->ne, W, dY, into);
}

Tensor * out_prod(Context & ctx, Tensor * into, Tensor * X, Tensor * dY, const Tensor * w_like) {
    X = as_f32_rows(ctx, X);
    dY = as_f32_rows(ctx, dY);
    check_pair("out_prod", w_like, X, X->ne[0]);
    detail::require(dY->ne[0] == w_like->ne[1] && dY->ne[1] == X->ne[1] && dY->ne[2] == X->ne[2] && dY->ne[3] == X->ne[3],
                    "out_prod", "dY " + describe(dY) + " does not match X " + describe(X) + " and W " + describe(w_like));
    Tensor * t = detail::accumulating_node(ctx, Op::OUT_PROD, into, w_like->ne);
    t->src[0] = X;
    t->src[1] = dY;
    t->src[2] = into;
    return t;
}

namespace rules {

void backward_mul_mat(Backward & b, Tensor * node) {
    Context & ctx = b.ctx;
    Tensor * W = node->src[0];
    Tensor * X = node->src[1];
    Tensor * dY = b.grad(node);
    // An accumulating node's `into` takes dY as it is (into + W X).
    if (Tensor * into = node->src[2]) b.add(into, dY);
    // X's gradient: a fresh buffer, or the GEMM adding into the one X owns (its earlier contributions' sum).
    b.accumulate(X, [&](Tensor * into) { return mul_mat_back_x(ctx, W, dY, X, into); }, true);
    if (b.needs(W)) {
        detail::require(W->type == DType::F32, "mul_mat backward",
                        "weight " + describe(W) + " needs a gradient but is not f32 (only f32 weights can be trained)");
        b.accumulate(W, [&](Tensor * into) { return out_prod(ctx, into, X, dY, W); });
    }
}

} // namespace rules

} // namespace rp
