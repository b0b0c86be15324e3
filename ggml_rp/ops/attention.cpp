#include "ggml_rp/ops/attention.h"

#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/copy.h"
#include "ggml_rp/ops/op_util.h"
#include "ggml_rp/ops/view.h"

#include <cmath>
#include <string>

namespace rp {

Tensor * attention(Context & ctx, Tensor * q, Tensor * k, Tensor * v, float scale, DType accelerated, Tensor * key_start,
                   Tensor * sinks, int64_t window, float softcap) {
    const char * op = "attention";
    detail::require(accelerated == DType::F32 || accelerated == DType::F16 || accelerated == DType::BF16, op,
                    std::string("the accelerator input type must be f32, f16 or bf16, not ") + dtype_name(accelerated));
    detail::require_f32(op, q, "q");
    detail::require_f32(op, k, "k");
    detail::require_f32(op, v, "v");
    detail::require_same_shape(op, k, v);
    const int64_t D = q->ne[0], Hq = q->ne[1], Tq = q->ne[2], B = q->ne[3];
    const int64_t Hkv = k->ne[1], Tk = k->ne[2];
    detail::require(k->ne[0] == D && k->ne[3] == B, op, "q " + describe(q) + " and k " + describe(k) + " differ in head_dim or batch");
    detail::require(Hq % Hkv == 0, op, "query heads of " + describe(q) + " are not a multiple of the kv heads of " + describe(k));
    detail::require(Tk >= Tq, op, "fewer keys than queries: q " + describe(q) + ", k " + describe(k));
    detail::require(D <= 256, op, "head_dim " + std::to_string(D) + " > 256");
    if (key_start) {
        detail::require(key_start->type == DType::I32, op, "key_start " + describe(key_start) + " must be i32");
        detail::require(key_start->nelements() == Tq * B && key_start->is_contiguous(), op,
                        "key_start " + describe(key_start) + " must be contiguous with Tq * B = " + std::to_string(Tq * B) +
                            " elements");
    }
    if (sinks) {
        detail::require_f32(op, sinks, "sinks");
        detail::require(sinks->nelements() == Hq && sinks->is_contiguous(), op,
                        "sinks " + describe(sinks) + " must be contiguous with one logit per query head (" + std::to_string(Hq) + ")");
    }
    detail::require(window >= 0 && window <= 0x7fffffff, op, "window " + std::to_string(window) + " must be in [0, 2^31)");
    detail::require(softcap >= 0.0f && std::isfinite(softcap), op, "softcap " + std::to_string(softcap) + " must be a finite number >= 0");
    q = cont_if_needed(ctx, q);
    // k and v: read in place when contiguous, or, for the f32 kernels, when each sequence's keys are contiguous and
    // the sequences rows of one cache apart (a KV cache of several sequences); otherwise copied.
    auto cache_window = [&](const Tensor * x) {
        const size_t row = x->nb[2];
        return accelerated == DType::F32 && B > 1 && x->nb[0] == sizeof(float) && x->nb[1] == x->nb[0] * static_cast<size_t>(D) &&
               row == x->nb[1] * static_cast<size_t>(Hkv) && x->nb[3] % row == 0 && x->nb[3] >= row * static_cast<size_t>(Tk) &&
               x->nb[3] == k->nb[3] && x->nb[3] == v->nb[3];
    };
    if (!k->is_contiguous() || !v->is_contiguous()) {
        if (!cache_window(k) || !cache_window(v)) {
            k = cont_if_needed(ctx, k);
            v = cont_if_needed(ctx, v);
        }
    }
    Tensor * o = detail::new_node(ctx, Op::ATTENTION, DType::F32, q->ne, {q, k, v, key_start, sinks});
    o->set_param_f32(0, scale);
    o->set_param_i32(1, static_cast<int32_t>(accelerated));
    o->set_param_i32(2, static_cast<int32_t>(window));
    o->set_param_f32(3, softcap);
    o->aux_bytes = static_cast<size_t>(Hq * Tq * B) * sizeof(float);
    return o;
}

Tensor * attention_lse(Context & ctx, Tensor * o) {
    detail::require(o && o->op == Op::ATTENTION, "attention_lse", describe(o) + " is not an attention node");
    const int64_t ne[4] = {o->ne[1], o->ne[2], o->ne[3], 1};
    Tensor * t = aux_view(ctx, o, ne, 0);
    t->name = display_name(o) + ".lse";
    return t;
}

AttentionGrads attention_back(Context & ctx, Tensor * o, Tensor * dout) {
    detail::require(o && o->op == Op::ATTENTION, "attention_back", describe(o) + " is not an attention node");
    detail::require_f32("attention_back", dout, "dout");
    detail::require_same_shape("attention_back", o, dout);
    dout = cont_if_needed(ctx, dout);
    Tensor * q = o->src[0];
    Tensor * k = o->src[1];
    Tensor * v = o->src[2];
    detail::require(k->is_contiguous() && v->is_contiguous(), "attention_back",
                    "keys " + describe(k) + " are windows of a longer cache: the backward needs them contiguous");
    Tensor * lse = attention_lse(ctx, o);
    Tensor * sinks = o->src[4];
    Tensor * dq = detail::new_node(ctx, Op::ATTENTION_BACK, DType::F32, q->ne, {q, k, v, o, lse, dout, o->src[3], sinks});
    dq->set_param_f32(0, o->param_f32(0));
    dq->set_param_i32(1, o->param_i32(1));  // the same accelerator input type as the forward
    dq->set_param_i32(2, o->param_i32(2));  // and window
    dq->set_param_f32(3, o->param_f32(3));  // and soft-cap
    dq->aux_bytes = 2 * k->nbytes() + (sinks ? sinks->nbytes() : 0);
    Tensor * dk = aux_view(ctx, dq, k->ne, 0);
    Tensor * dv = aux_view(ctx, dq, v->ne, k->nbytes());
    Tensor * dsinks = sinks ? aux_view(ctx, dq, sinks->ne, 2 * k->nbytes()) : nullptr;
    return {dq, dk, dv, dsinks};
}

namespace rules {

void backward_attention(Backward & b, Tensor * node) {
    Tensor * q = node->src[0];
    Tensor * k = node->src[1];
    Tensor * v = node->src[2];
    Tensor * sinks = node->src[4];
    const bool need_sinks = sinks && b.needs(sinks);
    if (!b.needs(q) && !b.needs(k) && !b.needs(v) && !need_sinks) return;
    const AttentionGrads g = attention_back(b.ctx, node, b.grad(node));
    if (b.needs(q)) b.add(q, g.dq);
    if (b.needs(k)) b.add(k, g.dk);
    if (b.needs(v)) b.add(v, g.dv);
    if (need_sinks) b.add(sinks, g.dsinks);
}

} // namespace rules

} // namespace rp
