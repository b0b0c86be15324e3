#include "ggml_rp/ops/delta_net.h"

#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/copy.h"
#include "ggml_rp/ops/op_util.h"
#include "ggml_rp/ops/view.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace rp {

namespace {

void check_seg_start(const char * op, const Tensor * seg, int64_t T, int64_t B) {
    if (!seg) return;
    detail::require(seg->type == DType::I32 && seg->is_contiguous() && seg->nelements() == T * B, op,
                    "seg_start " + describe(seg) + " must be contiguous i32 with T * B = " + std::to_string(T * B) + " elements");
}

// f32, contiguous (copied when strided), with exactly n elements, reshaped to [a, b, c].
Tensor * packed3(Context & ctx, const char * op, Tensor * t, const char * role, int64_t a, int64_t b, int64_t c) {
    detail::require_f32(op, t, role);
    detail::require(t->nelements() == a * b * c, op,
                    std::string(role) + " " + describe(t) + " must have [" + std::to_string(a) + ", " + std::to_string(b) + ", " +
                        std::to_string(c) + "] elements");
    return reshape(ctx, cont_if_needed(ctx, t), a, b, c);
}

} // namespace

Tensor * ssm_conv(Context & ctx, Tensor * x, Tensor * w, Tensor * prefix, Tensor * seg_start) {
    const char * op = "ssm_conv";
    detail::require_f32(op, x, "x");
    detail::require_f32(op, w, "w");
    const int64_t C = x->ne[0], T = x->ne[1], B = x->ne[2], K = w->ne[0];
    detail::require(x->ne[3] == 1, op, "x " + describe(x) + " must be [C, T, B]");
    detail::require(K >= 1 && w->ne[1] == C && w->ne[2] == 1 && w->ne[3] == 1, op,
                    "w " + describe(w) + " must be [K, C] with C = " + std::to_string(C) + " (x " + describe(x) + ")");
    check_seg_start(op, seg_start, T, B);
    detail::require(!(prefix && seg_start), op, "a conv state (prefix) serves one unpacked sequence (no seg_start)");
    if (prefix) {
        detail::require_f32(op, prefix, "prefix");
        detail::require(prefix->ne[0] == C && prefix->ne[1] == K - 1 && prefix->ne[2] == B && prefix->ne[3] == 1, op,
                        "prefix " + describe(prefix) + " must be [C, K-1, B] = [" + std::to_string(C) + ", " + std::to_string(K - 1) +
                            ", " + std::to_string(B) + "]");
        prefix = cont_if_needed(ctx, prefix);
    }
    x = cont_if_needed(ctx, x);
    w = cont_if_needed(ctx, w);
    Tensor * y = detail::new_node(ctx, Op::SSM_CONV, DType::F32, x->ne, {x, w, prefix, seg_start});
    y->aux_bytes = static_cast<size_t>(C * (K - 1) * B) * sizeof(float);
    return y;
}

Tensor * ssm_conv_state(Context & ctx, Tensor * y) {
    detail::require(y && y->op == Op::SSM_CONV, "ssm_conv_state", describe(y) + " is not an ssm_conv node");
    const int64_t ne[4] = {y->ne[0], y->src[1]->ne[0] - 1, y->ne[2], 1};
    Tensor * t = aux_view(ctx, y, ne, 0);
    t->name = display_name(y) + ".state";
    return t;
}

Tensor * ssm_conv_back(Context & ctx, Tensor * y, Tensor * dy, int which) {
    detail::require(y && y->op == Op::SSM_CONV, "ssm_conv_back", describe(y) + " is not an ssm_conv node");
    detail::require_f32("ssm_conv_back", dy, "dy");
    detail::require_same_shape("ssm_conv_back", y, dy);
    detail::require(which == 0 || which == 1, "ssm_conv_back", "which must be 0 (dx) or 1 (dw)");
    Tensor * x = y->src[0];
    Tensor * w = y->src[1];
    Tensor * t = detail::new_node(ctx, Op::SSM_CONV_BACK, DType::F32, which == 0 ? x->ne : w->ne,
                                  {which == 0 ? nullptr : x, w, cont_if_needed(ctx, dy), which == 0 ? nullptr : y->src[2], y->src[3]});
    t->set_param_i32(0, which);
    return t;
}

int64_t delta_net_chunk(int64_t T, int64_t Dv) {
    const double best = std::sqrt(static_cast<double>(std::max<int64_t>(T, 1)) * static_cast<double>(std::max<int64_t>(Dv, 1)) / 12.0);
    int64_t c = 64;
    while (static_cast<double>(2 * c) <= best * std::sqrt(2.0)) c *= 2;  // the nearest power of two (geometrically)
    return c;
}

Tensor * delta_net(Context & ctx, Tensor * q, Tensor * k, Tensor * v, Tensor * g, Tensor * beta, float scale, Tensor * state0,
                   Tensor * seg_start, int64_t chunk) {
    const char * op = "delta_net";
    detail::require_f32(op, q, "q");
    detail::require_f32(op, k, "k");
    detail::require_f32(op, v, "v");
    detail::require_same_shape(op, q, k);
    const int64_t Dk = q->ne[0], Hk = q->ne[1], T = q->ne[2], B = q->ne[3];
    const int64_t Dv = v->ne[0], Hv = v->ne[1];
    detail::require(v->ne[2] == T && v->ne[3] == B, op, "v " + describe(v) + " and q " + describe(q) + " differ in tokens or batch");
    detail::require(Hv % Hk == 0, op, "value heads of " + describe(v) + " are not a multiple of the key heads of " + describe(q));
    detail::require(chunk >= 0, op, "chunk must be >= 1 (0: chosen by the sequence length)");
    if (chunk == 0) chunk = delta_net_chunk(T, Dv);
    g = packed3(ctx, op, g, "g", Hv, T, B);
    beta = packed3(ctx, op, beta, "beta", Hv, T, B);
    check_seg_start(op, seg_start, T, B);
    if (state0) {
        detail::require(!seg_start, op, "an initial state serves one unpacked sequence (no seg_start)");
        detail::require_f32(op, state0, "state0");
        detail::require(state0->ne[0] == Dk && state0->ne[1] == Dv && state0->ne[2] == Hv && state0->ne[3] == B, op,
                        "state0 " + describe(state0) + " must be [Dk, Dv, Hv, B] = [" + std::to_string(Dk) + ", " + std::to_string(Dv) +
                            ", " + std::to_string(Hv) + ", " + std::to_string(B) + "]");
        state0 = cont_if_needed(ctx, state0);
    }
    q = cont_if_needed(ctx, q);
    k = cont_if_needed(ctx, k);
    v = cont_if_needed(ctx, v);
    Tensor * o = detail::new_node(ctx, Op::DELTA_NET, DType::F32, v->ne, {q, k, v, g, beta, state0, seg_start});
    o->set_param_f32(0, scale);
    o->set_param_i32(1, static_cast<int32_t>(chunk));
    const int64_t n_chunks = (T + chunk - 1) / chunk;
    o->aux_bytes = static_cast<size_t>((n_chunks + 1) * Dk * Dv * Hv * B) * sizeof(float);
    return o;
}

Tensor * delta_net_state(Context & ctx, Tensor * o) {
    detail::require(o && o->op == Op::DELTA_NET, "delta_net_state", describe(o) + " is not a delta_net node");
    const Tensor * q = o->src[0];
    const int64_t Dk = q->ne[0], T = q->ne[2], Dv = o->ne[0], Hv = o->ne[1], B = o->ne[3], chunk = o->param_i32(1);
    const int64_t n_chunks = (T + chunk - 1) / chunk;
    const int64_t ne[4] = {Dk, Dv, Hv, B};
    Tensor * t = aux_view(ctx, o, ne, static_cast<size_t>(n_chunks * Dk * Dv * Hv * B) * sizeof(float));
    t->name = display_name(o) + ".state";
    return t;
}

DeltaNetGrads delta_net_back(Context & ctx, Tensor * o, Tensor * dout) {
    detail::require(o && o->op == Op::DELTA_NET, "delta_net_back", describe(o) + " is not a delta_net node");
    detail::require_f32("delta_net_back", dout, "dout");
    detail::require_same_shape("delta_net_back", o, dout);
    Tensor * q = o->src[0];
    Tensor * k = o->src[1];
    Tensor * v = o->src[2];
    Tensor * g = o->src[3];
    Tensor * beta = o->src[4];
    Tensor * state0 = o->src[5];
    // The saved chunk states, copied out of o's aux bytes: the backward reads only these of o, and o (T x Dv x Hv
    // floats) is then free once the layer's last forward reader's gradient is built, not held through this node's
    // peak. (The final state, generation's, is not read.)
    const int64_t T = q->ne[2], chunk = o->param_i32(1);
    const int64_t states_ne[4] = {q->ne[0], v->ne[0], v->ne[1] * v->ne[3], (T + chunk - 1) / chunk};
    Tensor * states = cont(ctx, aux_view(ctx, o, states_ne, 0));
    states->name = display_name(o) + ".chunk_states";
    Tensor * dq = detail::new_node(ctx, Op::DELTA_NET_BACK, DType::F32, q->ne,
                                   {q, k, v, g, beta, state0, o->src[6], states, cont_if_needed(ctx, dout)});
    dq->set_param_f32(0, o->param_f32(0));
    dq->set_param_i32(1, o->param_i32(1));
    size_t off = 0;
    auto next = [&](const Tensor * like) {
        Tensor * t = aux_view(ctx, dq, like->ne, off);
        off += like->nbytes();
        return t;
    };
    dq->aux_bytes = k->nbytes() + v->nbytes() + g->nbytes() + beta->nbytes() + (state0 ? state0->nbytes() : 0);
    DeltaNetGrads r{dq, nullptr, nullptr, nullptr, nullptr, nullptr};
    r.dk = next(k);
    r.dv = next(v);
    r.dg = next(g);
    r.dbeta = next(beta);
    r.dstate0 = state0 ? next(state0) : nullptr;
    return r;
}

namespace rules {

void backward_ssm_conv(Backward & b, Tensor * node) {
    Tensor * x = node->src[0];
    Tensor * w = node->src[1];
    detail::require(!node->src[2] || !b.needs(node->src[2]), "ssm_conv",
                    "no gradient reaches the conv state (prefix): it is generation's input, not a parameter");
    Tensor * dy = b.grad(node);
    if (b.needs(x)) b.add(x, ssm_conv_back(b.ctx, node, dy, 0));
    if (b.needs(w)) b.add(w, ssm_conv_back(b.ctx, node, dy, 1));
}

void backward_delta_net(Backward & b, Tensor * node) {
    bool any = false;
    for (int i = 0; i < 6; ++i) any = any || (node->src[i] && b.needs(node->src[i]));
    if (!any) return;
    const DeltaNetGrads g = delta_net_back(b.ctx, node, b.grad(node));
    Tensor * grads[6] = {g.dq, g.dk, g.dv, g.dg, g.dbeta, g.dstate0};
    for (int i = 0; i < 6; ++i)
        if (node->src[i] && b.needs(node->src[i])) b.add(node->src[i], grads[i]);
}

} // namespace rules

} // namespace rp
