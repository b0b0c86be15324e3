#include "ggml_rp/ops/dropout.h"

#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/dropout_math.h"
#include "ggml_rp/ops/op_util.h"

#include <cstdio>

namespace rp {

namespace {

// op_params layout of DROPOUT.
constexpr int kParamP = 0, kParamKeyLo = 1, kParamKeyHi = 2, kParamOffLo = 3, kParamOffHi = 4;

void set_u64(Tensor * t, int lo, int hi, uint64_t v) {
    t->set_param_i32(lo, static_cast<int32_t>(static_cast<uint32_t>(v)));
    t->set_param_i32(hi, static_cast<int32_t>(static_cast<uint32_t>(v >> 32)));
}

uint64_t get_u64(const Tensor * t, int lo, int hi) {
    return static_cast<uint64_t>(static_cast<uint32_t>(t->param_i32(lo))) |
           static_cast<uint64_t>(static_cast<uint32_t>(t->param_i32(hi))) << 32;
}

} // namespace

Tensor * dropout(Context & ctx, Tensor * x, float p, uint64_t key, uint64_t counter_offset) {
    detail::require_f32("dropout", x, "x");
    // Written as !(p >= 0 && p < 1) so that NaN is rejected too.
    if (!(p >= 0.0f && p < 1.0f)) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(p));
        detail::op_error("dropout", std::string("probability p = ").append(buf).append(" of ").append(describe(x))
                                        .append(" must be in [0, 1)"));
    }
    if (p == 0.0f) return x;
    Tensor * t = detail::new_node(ctx, Op::DROPOUT, DType::F32, x->ne, {x});
    t->set_param_f32(kParamP, p);
    set_u64(t, kParamKeyLo, kParamKeyHi, key);
    set_u64(t, kParamOffLo, kParamOffHi, counter_offset);
    return t;
}

DropoutParams dropout_params(const Tensor * node) {
    if (node->op != Op::DROPOUT) detail::op_error("dropout_params", describe(node) + " is not a DROPOUT node");
    DropoutParams d;
    d.p = node->param_f32(kParamP);
    d.scale = dropout_scale(d.p);
    d.key = get_u64(node, kParamKeyLo, kParamKeyHi);
    d.counter_offset = get_u64(node, kParamOffLo, kParamOffHi);
    return d;
}

namespace rules {

// dx = dy * keep / (1 - p): the same mask, regenerated from the same key and offset (nothing is saved).
void backward_dropout(Backward & b, Tensor * node) {
    Tensor * x = node->src[0];
    if (!b.needs(x)) return;
    const DropoutParams d = dropout_params(node);
    b.add(x, dropout(b.ctx, b.grad(node), d.p, d.key, d.counter_offset));
}

} // namespace rules

} // namespace rp
