#include "ggml_rp/ops/cross_entropy.h"

#include "ggml_rp/core/quant.h"
#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/copy.h"
#include "ggml_rp/ops/op_util.h"
#include "ggml_rp/ops/view.h"

#include <cmath>
#include <string>

namespace rp {

namespace {

Tensor * lm_head_node(const char * op, Context & ctx, Tensor * h, Tensor * W, Tensor * labels, float loss_scale, int64_t chunk,
                      float softcap, bool per_token) {
    detail::require_f32(op, h, "h");
    detail::require(W && can_dequantize(W->type) && W->ne[2] == 1 && W->ne[3] == 1, op,
                    "head weight " + describe(W) + " must be 2-D [C, V] of a dequantizable type");
    detail::require(h->ne[0] == W->ne[0] && h->ne[2] == 1 && h->ne[3] == 1, op,
                    "h " + describe(h) + " must be [C, T] with C = ne[0] of W " + describe(W));
    detail::require(labels && labels->type == DType::I32 && labels->nelements() == h->ne[1] && labels->ne[0] == h->ne[1], op,
                    "labels " + describe(labels) + " must be i32 [T] with T = " + std::to_string(h->ne[1]));
    detail::require(chunk >= 1, op, "chunk must be >= 1");
    detail::require(softcap >= 0.0f && std::isfinite(softcap), op, "softcap " + std::to_string(softcap) + " must be a finite number >= 0");
    if (W->type == DType::F32 && !W->rows_contiguous()) W = cont(ctx, W);
    detail::require(W->rows_contiguous(), op, "head weight " + describe(W) + " must have contiguous rows");
    h = cont_if_needed(ctx, h);
    const int64_t ne[4] = {per_token ? h->ne[1] : 1, 1, 1, 1};
    Tensor * t = detail::new_node(ctx, Op::LM_HEAD_CE, DType::F32, ne, {h, W, labels});
    t->aux_bytes = lm_head_aux_floats(h->ne[1]) * sizeof(float);  // each token's logsumexp and 1 - p_label, for the backward
    t->set_param_f32(0, loss_scale);
    t->set_param_i32(1, static_cast<int32_t>(chunk > INT32_MAX ? INT32_MAX : chunk));
    t->set_param_f32(2, softcap);
    t->set_param_i32(3, per_token ? 1 : 0);
    return t;
}

} // namespace

Tensor * lm_head_ce(Context & ctx, Tensor * h, Tensor * W, Tensor * labels, float loss_scale, int64_t chunk, float softcap) {
    return lm_head_node("lm_head_ce", ctx, h, W, labels, loss_scale, chunk, softcap, false);
}

Tensor * lm_head_token_nll(Context & ctx, Tensor * h, Tensor * W, Tensor * labels, int64_t chunk, float softcap) {
    return lm_head_node("lm_head_token_nll", ctx, h, W, labels, 1.0f, chunk, softcap, true);
}

namespace {

void require_state(const char * op, const Tensor * state, int64_t C, int64_t T, bool forms_grad) {
    const size_t need = lm_head_state_layout(C, T, forms_grad).bytes;
    detail::require(state && state->type == DType::F32 && state->is_contiguous() && state->nbytes() >= need, op,
                    "state " + describe(state) + " must be contiguous f32 of at least " + std::to_string(need) + " bytes");
}

} // namespace

Tensor * lm_head_ce_range(Context & ctx, Tensor * h, Tensor * W_range, Tensor * labels, Tensor * state, int64_t v0, int64_t V,
                          int64_t chunk, float softcap, bool forms_grad) {
    const char * op = "lm_head_ce_range";
    detail::require_f32(op, h, "h");
    detail::require(W_range && can_dequantize(W_range->type) && W_range->ne[2] == 1 && W_range->ne[3] == 1 && W_range->rows_contiguous(), op,
                    "head weight range " + describe(W_range) + " must be 2-D [C, n] of a dequantizable type with contiguous rows");
    detail::require(h->ne[0] == W_range->ne[0] && h->ne[2] == 1 && h->ne[3] == 1, op,
                    "h " + describe(h) + " must be [C, T] with C = ne[0] of W " + describe(W_range));
    detail::require(labels && labels->type == DType::I32 && labels->ne[0] == h->ne[1] && labels->nelements() == h->ne[1], op,
                    "labels " + describe(labels) + " must be i32 [T] with T = " + std::to_string(h->ne[1]));
    detail::require(chunk >= 1 && V >= 1 && V <= INT32_MAX && v0 >= 0 && v0 % chunk == 0 && v0 + W_range->ne[1] <= V, op,
                    "range [" + std::to_string(v0) + ", " + std::to_string(v0 + W_range->ne[1]) + ") of a vocabulary of " +
                        std::to_string(V) + " must start at a multiple of the chunk (" + std::to_string(chunk) + ") and lie inside it");
    detail::require(softcap >= 0.0f && std::isfinite(softcap), op, "softcap " + std::to_string(softcap) + " must be a finite number >= 0");
    require_state(op, state, h->ne[0], h->ne[1], forms_grad);
    h = cont_if_needed(ctx, h);
    const int64_t one[4] = {1, 1, 1, 1};
    Tensor * t = detail::new_node(ctx, Op::LM_HEAD_CE_RANGE, DType::F32, one, {h, W_range, labels, state});
    t->set_param_i32(0, static_cast<int32_t>(v0));
    t->set_param_i32(1, static_cast<int32_t>(chunk > INT32_MAX ? INT32_MAX : chunk));
    t->set_param_f32(2, softcap);
    t->set_param_i32(3, static_cast<int32_t>(V));
    t->set_param_i32(4, forms_grad ? 1 : 0);
    return t;
}

Tensor * lm_head_ce_streamed(Context & ctx, Tensor * h, Tensor * state, Tensor * labels, int64_t V, float loss_scale, int64_t chunk,
                             float softcap, bool per_token, bool forms_grad) {
    const char * op = per_token ? "lm_head_token_nll (streamed)" : "lm_head_ce (streamed)";
    detail::require_f32(op, h, "h");
    detail::require(h->ne[2] == 1 && h->ne[3] == 1, op, "h " + describe(h) + " must be [C, T]");
    detail::require(labels && labels->type == DType::I32 && labels->ne[0] == h->ne[1] && labels->nelements() == h->ne[1], op,
                    "labels " + describe(labels) + " must be i32 [T] with T = " + std::to_string(h->ne[1]));
    detail::require(V >= 1 && V <= INT32_MAX && chunk >= 1, op, "vocabulary " + std::to_string(V) + " and chunk must be >= 1");
    require_state(op, state, h->ne[0], h->ne[1], forms_grad);
    h = cont_if_needed(ctx, h);
    const int64_t ne[4] = {per_token ? h->ne[1] : 1, 1, 1, 1};
    Tensor * t = detail::new_node(ctx, Op::LM_HEAD_CE, DType::F32, ne, {h, state, labels});
    t->aux_bytes = lm_head_aux_floats(h->ne[1]) * sizeof(float);
    t->set_param_f32(0, loss_scale);
    t->set_param_i32(1, static_cast<int32_t>(chunk > INT32_MAX ? INT32_MAX : chunk));
    t->set_param_f32(2, softcap);
    t->set_param_i32(3, per_token ? 1 : 0);
    t->set_param_i32(5, static_cast<int32_t>(V));
    if (forms_grad) {
        t->set_param_i32(4, 1);
        t->aux_bytes = lm_head_unit_dh_offset(t) + static_cast<size_t>(h->ne[0] * h->ne[1]) * sizeof(float);
    }
    return t;
}

Tensor * lm_head_ce_back(Context & ctx, Tensor * ce, Tensor * dloss, Tensor * dW_into) {
    detail::require(ce && ce->op == Op::LM_HEAD_CE, "lm_head_ce_back", describe(ce) + " is not an lm_head_ce node");
    const bool per_token = lm_head_per_token(ce);
    const int64_t n_dloss = per_token ? ce->src[0]->ne[1] : 1;
    detail::require(dloss && dloss->type == DType::F32 && dloss->nelements() == n_dloss, "lm_head_ce_back",
                    "dloss " + describe(dloss) + (per_token ? " must be f32 [" + std::to_string(n_dloss) + "] (one per token)"
                                                            : std::string(" must be an f32 scalar")));
    if (!dloss->is_contiguous()) dloss = cont(ctx, dloss);
    Tensor * h = ce->src[0];
    Tensor * W = ce->src[1];
    detail::require(!lm_head_streamed(ce) || (!dW_into && lm_head_forms_grad(ce)), "lm_head_ce_back",
                    "a streamed head has no weight gradient and its backward needs the unit gradients formed in its forward");
    if (dW_into)
        detail::require(dW_into->type == DType::F32 && same_shape(dW_into, W) && dW_into->is_contiguous(), "lm_head_ce_back",
                        "dW " + describe(dW_into) + " must be contiguous f32 shaped like " + describe(W));
    // ce is a source: its logsumexps and 1 - p_label (aux) spare the backward a second pass over the vocabulary.
    Tensor * dh = detail::new_node(ctx, Op::LM_HEAD_CE_BACK, DType::F32, h->ne, {h, W, ce->src[2], dloss, dW_into, ce});
    dh->set_param_f32(0, ce->param_f32(0));
    dh->set_param_i32(1, ce->param_i32(1));
    dh->set_param_f32(2, ce->param_f32(2));
    dh->set_param_i32(3, ce->param_i32(3));
    dh->set_param_i32(5, ce->param_i32(5));
    return dh;
}

size_t lm_head_unit_dh_offset(const Tensor * ce) {
    const size_t end = ce->nbytes() + lm_head_aux_floats(ce->src[0]->ne[1]) * sizeof(float);
    return (end + 255) / 256 * 256 - ce->nbytes();
}

namespace {

// Asks the forward node for its unit gradients (lm_head_forms_grad). A node that already has memory (an eager
// context computed it) keeps the two passes: its aux bytes cannot grow.
void form_gradient_in_forward(Tensor * ce) {
    if (ce->data || lm_head_forms_grad(ce)) return;
    const Tensor * h = ce->src[0];
    ce->set_param_i32(4, 1);
    ce->aux_bytes = lm_head_unit_dh_offset(ce) + static_cast<size_t>(h->ne[0] * h->ne[1]) * sizeof(float);
}

} // namespace

void set_lm_head_ce_loss_scale(const Graph & g, float loss_scale) {
    for (Tensor * n : g.nodes)
        if ((n->op == Op::LM_HEAD_CE || n->op == Op::LM_HEAD_CE_BACK) && !lm_head_per_token(n)) n->set_param_f32(0, loss_scale);
}

namespace rules {

void backward_cross_entropy(Backward & b, Tensor * node) {
    Context & ctx = b.ctx;
    Tensor * h = node->src[0];
    Tensor * W = node->src[1];
    Tensor * dloss = b.grad(node);
    if (!dloss->is_contiguous()) dloss = cont(ctx, dloss);
    if (lm_head_streamed(node)) {  // src[1] is the carried state: h's gradient only, formed in the forward
        detail::require(!b.needs(W) && (!b.needs(h) || lm_head_forms_grad(node)), "lm_head_ce backward",
                        "a streamed head (" + describe(node) + ") gives h's gradient only, from the unit gradients its ranges formed");
        if (b.needs(h)) b.add(h, lm_head_ce_back(ctx, node, dloss, nullptr));
        return;
    }
    if (!b.needs(W)) {
        if (b.needs(h)) {
            form_gradient_in_forward(node);
            b.add(h, lm_head_ce_back(ctx, node, dloss, nullptr));
        }
        return;
    }
    detail::require(W->type == DType::F32, "lm_head_ce backward",
                    "head weight " + describe(W) + " needs a gradient but is not f32 (only f32 weights can be trained)");
    // One kernel call gives dh and accumulates dW into W's gradient (a zero buffer when W is not a param).
    Tensor * dh = nullptr;
    b.accumulate(W, [&](Tensor * into) {
        Tensor * target = into ? into : fill(ctx, W, 0.0f);
        dh = lm_head_ce_back(ctx, node, dloss, target);
        return after(ctx, target, dh);
    });
    if (b.needs(h)) b.add(h, dh);
}

void backward_lm_head_range(Backward & b, Tensor * node) {
    detail::require(!b.needs(node->src[0]) && !b.needs(node->src[1]), "lm_head_ce_range backward",
                    "the gradient of a streamed head flows through its LM_HEAD_CE node (lm_head_ce_streamed), not its ranges");
}

} // namespace rules

} // namespace rp
