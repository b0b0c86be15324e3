#include "ggml_rp/ops/rope.h"

#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/op_util.h"

#include <cmath>

namespace rp {

namespace {

Tensor * rope_impl(Context & ctx, Op op, const char * name, Tensor * x, Tensor * pos, const RopeParams & p, Tensor * ff) {
    detail::require_f32(name, x, "x");
    detail::require(pos && pos->type == DType::I32 && pos->nelements() == pos->ne[0], name,
                    "positions " + describe(pos) + " must be a 1-D i32 tensor");
    detail::require(pos->ne[0] == x->ne[2] || pos->ne[0] == x->ne[2] * x->ne[3], name,
                    "positions " + describe(pos) + " must have n_tokens or n_tokens*n_seqs elements for x " + describe(x));
    detail::require(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= x->ne[0], name,
                    "n_rot " + std::to_string(p.n_rot) + " must be even, > 0 and <= head_dim of " + describe(x));
    detail::require(p.mode == RopeMode::Normal || p.mode == RopeMode::Neox, name, "mode must be normal (0) or neox (2)");
    detail::require(p.freq_base > 0.0f && p.freq_scale > 0.0f, name, "freq_base and freq_scale must be > 0");
    detail::require(std::isfinite(p.ext_factor) && p.ext_factor >= 0.0f && std::isfinite(p.attn_factor) && p.attn_factor > 0.0f, name,
                    "ext_factor must be >= 0 and attn_factor > 0");
    detail::require(p.ext_factor == 0.0f || (p.n_ctx_orig > 0 && p.beta_fast > 0.0f && p.beta_slow > 0.0f), name,
                    "YaRN (ext_factor > 0) needs n_ctx_orig > 0 and beta_fast, beta_slow > 0");
    detail::require(p.temp_scale == 0.0f || (std::isfinite(p.temp_scale) && p.temp_floor > 0 && std::isfinite(p.temp_offset)), name,
                    "attention temperature (temp_scale != 0) needs temp_floor > 0");
    if (ff)
        detail::require(ff->type == DType::F32 && ff->is_contiguous() && ff->nelements() == ff->ne[0] && ff->ne[0] >= p.n_rot / 2, name,
                        "freq factors " + describe(ff) + " must be a contiguous 1-D f32 tensor of at least n_rot / 2 = " +
                            std::to_string(p.n_rot / 2) + " values");
    Tensor * t = ff ? detail::new_node(ctx, op, DType::F32, x->ne, {x, pos, ff}) : detail::new_node(ctx, op, DType::F32, x->ne, {x, pos});
    t->set_param_i32(0, p.n_rot);
    t->set_param_i32(1, static_cast<int32_t>(p.mode));
    t->set_param_f32(2, p.freq_base);
    t->set_param_f32(3, p.freq_scale);
    t->set_param_f32(4, p.ext_factor);
    t->set_param_f32(5, p.attn_factor);
    t->set_param_f32(6, p.beta_fast);
    t->set_param_f32(7, p.beta_slow);
    t->set_param_i32(8, p.n_ctx_orig);
    t->set_param_f32(9, p.temp_scale);
    t->set_param_i32(10, p.temp_floor);
    t->set_param_f32(11, p.temp_offset);
    return t;
}

RopeParams params_of(const Tensor * t) {
    RopeParams p;
    p.n_rot = t->param_i32(0);
    p.mode = static_cast<RopeMode>(t->param_i32(1));
    p.freq_base = t->param_f32(2);
    p.freq_scale = t->param_f32(3);
    p.ext_factor = t->param_f32(4);
    p.attn_factor = t->param_f32(5);
    p.beta_fast = t->param_f32(6);
    p.beta_slow = t->param_f32(7);
    p.n_ctx_orig = t->param_i32(8);
    p.temp_scale = t->param_f32(9);
    p.temp_floor = t->param_i32(10);
    p.temp_offset = t->param_f32(11);
    return p;
}

} // namespace

Tensor * rope(Context & ctx, Tensor * x, Tensor * pos, const RopeParams & p, Tensor * freq_factors) {
    return rope_impl(ctx, Op::ROPE, "rope", x, pos, p, freq_factors);
}

Tensor * rope_back(Context & ctx, Tensor * dy, Tensor * pos, const RopeParams & p, Tensor * freq_factors) {
    return rope_impl(ctx, Op::ROPE_BACK, "rope_back", dy, pos, p, freq_factors);
}

namespace rules {

void backward_rope(Backward & b, Tensor * node) {
    Tensor * x = node->src[0];
    if (!b.needs(x)) return;
    const RopeParams p = params_of(node);
    Tensor * dy = b.grad(node);
    // A rotation's transpose is the rotation by -theta (and vice versa), scaled alike. Positions get no gradient.
    b.add(x, node->op == Op::ROPE ? rope_back(b.ctx, dy, node->src[1], p, node->src[2]) : rope(b.ctx, dy, node->src[1], p, node->src[2]));
}

} // namespace rules

} // namespace rp
