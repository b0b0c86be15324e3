#include "ggml_rp/ops/moe.h"

#include "ggml_rp/core/quant.h"
#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/copy.h"
#include "ggml_rp/ops/op_util.h"

#include <cmath>

namespace rp {

namespace {

void check_logits(const char * op, const Tensor * logits) {
    detail::require(logits && logits->type == DType::F32 && logits->is_contiguous() && logits->ne[2] == 1 && logits->ne[3] == 1,
                    op, "router logits " + describe(logits) + " must be contiguous f32 [n_expert, T]");
}

void check_ids(const char * op, const Tensor * ids, int64_t T) {
    detail::require(ids && ids->type == DType::I32 && ids->is_contiguous() && ids->ne[1] == T && ids->ne[2] == 1 && ids->ne[3] == 1,
                    op, "expert ids " + describe(ids) + " must be contiguous i32 [k, T = " + std::to_string(T) + "]");
}

// Activations f32 and contiguous (the kernels gather columns).
Tensor * as_f32_cont(Context & ctx, Tensor * x) {
    if (x->type == DType::F32 && x->is_contiguous()) return x;
    return cast(ctx, x, DType::F32);
}

void check_weight(const char * op, const Tensor * W) {
    detail::require(W && W->ne[3] == 1 && can_dequantize(W->type) && W->is_contiguous(), op,
                    "expert weights " + describe(W) + " must be a contiguous [in, out, n_expert] tensor of a dequantizable type");
}

// X [in, X1, T] against W [in, out, E] and ids [k, T].
void check_x(const char * op, const Tensor * W, const Tensor * X, const Tensor * ids) {
    detail::require(X->ne[0] == W->ne[0] && X->ne[3] == 1 && (X->ne[1] == 1 || X->ne[1] == ids->ne[0]), op,
                    "X " + describe(X) + " must be [in = " + std::to_string(W->ne[0]) + ", 1 or k = " +
                        std::to_string(ids->ne[0]) + ", T] for W " + describe(W) + " and ids " + describe(ids));
    check_ids(op, ids, X->ne[2]);
}

} // namespace

MoeParams moe_params(const Tensor * n) {
    MoeParams p;
    p.k = static_cast<int32_t>(n->src[1]->ne[0]);
    p.normalize = n->param_i32(0) != 0;
    p.scale = n->param_f32(1);
    p.aux = n->param_f32(2);
    return p;
}

Tensor * moe_topk(Context & ctx, Tensor * logits, int32_t k) {
    check_logits("moe_topk", logits);
    detail::require(k >= 1 && k <= logits->ne[0], "moe_topk",
                    "k = " + std::to_string(k) + " experts per token is outside [1, n_expert = " + std::to_string(logits->ne[0]) + "]");
    const int64_t ne[4] = {k, logits->ne[1], 1, 1};
    return detail::new_node(ctx, Op::MOE_TOPK, DType::I32, ne, {logits});
}

Tensor * moe_weights(Context & ctx, Tensor * logits, Tensor * ids, bool normalize, float scale, float aux) {
    check_logits("moe_weights", logits);
    check_ids("moe_weights", ids, logits->ne[1]);
    detail::require(ids->ne[0] <= logits->ne[0], "moe_weights", "more selected experts " + describe(ids) + " than experts " + describe(logits));
    detail::require(std::isfinite(aux), "moe_weights", "the load-balancing scale is not finite");
    Tensor * w = detail::new_node(ctx, Op::MOE_WEIGHTS, DType::F32, ids->ne, {logits, ids});
    w->set_param_i32(0, normalize ? 1 : 0);
    w->set_param_f32(1, scale);
    w->set_param_f32(2, aux);
    return w;
}

Tensor * moe_weights_back(Context & ctx, Tensor * logits, Tensor * ids, Tensor * dw, const MoeParams & p) {
    check_logits("moe_weights_back", logits);
    check_ids("moe_weights_back", ids, logits->ne[1]);
    dw = as_f32_cont(ctx, dw);
    detail::require(same_shape(dw, ids), "moe_weights_back", "dw " + describe(dw) + " is not shaped like ids " + describe(ids));
    Tensor * d = detail::new_node(ctx, Op::MOE_WEIGHTS_BACK, DType::F32, logits->ne, {logits, ids, dw});
    d->set_param_i32(0, p.normalize ? 1 : 0);
    d->set_param_f32(1, p.scale);
    d->set_param_f32(2, p.aux);
    return d;
}

Tensor * mul_mat_id(Context & ctx, Tensor * W, Tensor * X, Tensor * ids) {
    check_weight("mul_mat_id", W);
    detail::require(X != nullptr, "mul_mat_id", "null X");
    X = as_f32_cont(ctx, X);
    check_x("mul_mat_id", W, X, ids);
    const int64_t ne[4] = {W->ne[1], ids->ne[0], ids->ne[1], 1};
    return detail::new_node(ctx, Op::MUL_MAT_ID, DType::F32, ne, {W, X, ids});
}

Tensor * mul_mat_id_back_x(Context & ctx, Tensor * W, Tensor * dY, Tensor * ids, const Tensor * x_like) {
    check_weight("mul_mat_id_back_x", W);
    check_x("mul_mat_id_back_x", W, x_like, ids);
    dY = as_f32_cont(ctx, dY);
    detail::require(dY->ne[0] == W->ne[1] && dY->ne[1] == ids->ne[0] && dY->ne[2] == ids->ne[1] && dY->ne[3] == 1,
                    "mul_mat_id_back_x", "dY " + describe(dY) + " is not [out, k, T] for W " + describe(W) + " and ids " + describe(ids));
    return detail::new_node(ctx, Op::MUL_MAT_ID_BACK_X, DType::F32, x_like->ne, {W, dY, ids});
}

Tensor * out_prod_id(Context & ctx, Tensor * into, Tensor * X, Tensor * dY, Tensor * ids, const Tensor * w_like) {
    X = as_f32_cont(ctx, X);
    dY = as_f32_cont(ctx, dY);
    check_x("out_prod_id", w_like, X, ids);
    detail::require(dY->ne[0] == w_like->ne[1] && dY->ne[1] == ids->ne[0] && dY->ne[2] == ids->ne[1] && dY->ne[3] == 1,
                    "out_prod_id", "dY " + describe(dY) + " is not [out, k, T] for W " + describe(w_like));
    Tensor * t = detail::accumulating_node(ctx, Op::OUT_PROD_ID, into, w_like->ne);
    t->src[0] = X;
    t->src[1] = dY;
    t->src[2] = ids;
    t->src[3] = into;
    return t;
}

namespace rules {

void backward_moe_weights(Backward & b, Tensor * node) {
    Tensor * logits = node->src[0];
    if (!b.needs(logits)) return;
    b.add(logits, moe_weights_back(b.ctx, logits, node->src[1], b.grad(node), moe_params(node)));
}

void backward_mul_mat_id(Backward & b, Tensor * node) {
    Tensor * W = node->src[0];
    Tensor * X = node->src[1];
    Tensor * ids = node->src[2];
    Tensor * dY = b.grad(node);
    if (b.needs(X)) b.add(X, mul_mat_id_back_x(b.ctx, W, dY, ids, X));
    if (b.needs(W)) {
        detail::require(W->type == DType::F32, "mul_mat_id backward",
                        "expert weights " + describe(W) + " need a gradient but are not f32 (only f32 weights can be trained)");
        b.accumulate(W, [&](Tensor * into) { return out_prod_id(b.ctx, into, X, dY, ids, W); });
    }
}

} // namespace rules

} // namespace rp
