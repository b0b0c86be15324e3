#include "ggml_rp/ops/flops.h"

#include "ggml_rp/ops/cross_entropy.h"

#include <algorithm>
#include <cstdint>

namespace rp {

namespace {

double cols(const Tensor * x) { return static_cast<double>(x->nelements()) / static_cast<double>(x->ne[0]); }

// Visible (query, key) pairs of one sequence and head: query t sees keys up to t + (Tk - Tq), from
// (that - window + 1) on with a window.
double attention_pairs(int64_t Tq, int64_t Tk, int64_t window) {
    double pairs = 0.0;
    for (int64_t t = 0; t < Tq; ++t) {
        const int64_t hi = t + (Tk - Tq);
        if (hi < 0) continue;
        const int64_t lo = window > 0 ? std::max<int64_t>(0, hi - window + 1) : 0;
        pairs += static_cast<double>(hi - lo + 1);
    }
    return pairs;
}

double attention_flops(const Tensor * q, const Tensor * k, int64_t window) {
    // q [D, Hq, Tq, B], k [D, Hkv, Tk, B]
    return 4.0 * static_cast<double>(q->ne[0] * q->ne[1] * q->ne[3]) * attention_pairs(q->ne[2], k->ne[2], window);
}

double head_pass(const Tensor * h, const Tensor * W) { return 2.0 * static_cast<double>(W->ne[0]) * static_cast<double>(W->ne[1]) * cols(h); }

double delta_net_flops(const Tensor * q, const Tensor * v) {
    // q [Dk, Hk, T, B], v [Dv, Hv, T, B]
    return 6.0 * static_cast<double>(q->ne[0]) * static_cast<double>(v->nelements());
}

} // namespace

double node_model_flops(const Tensor * n) {
    switch (n->op) {
    case Op::MUL_MAT: return 2.0 * static_cast<double>(n->src[0]->ne[0]) * static_cast<double>(n->nelements());
    case Op::MUL_MAT_BACK_X: return 2.0 * static_cast<double>(n->src[0]->ne[1]) * static_cast<double>(n->nelements());
    case Op::OUT_PROD: return 2.0 * static_cast<double>(n->ne[0]) * static_cast<double>(n->ne[1]) * cols(n->src[0]);
    case Op::MUL_MAT_ID: case Op::MUL_MAT_ID_BACK_X:
        return 2.0 * static_cast<double>(n->src[0]->ne[0]) * static_cast<double>(n->src[0]->ne[1]) * static_cast<double>(n->src[2]->nelements());
    case Op::OUT_PROD_ID:
        return 2.0 * static_cast<double>(n->ne[0]) * static_cast<double>(n->ne[1]) * static_cast<double>(n->src[2]->nelements());
    case Op::ATTENTION: return attention_flops(n->src[0], n->src[1], n->param_i32(2));
    case Op::ATTENTION_BACK: return 2.0 * attention_flops(n->src[0], n->src[1], n->param_i32(2));
    case Op::LM_HEAD_CE:  // a streamed head's passes are its ranges'
        return lm_head_streamed(n) ? 0.0 : head_pass(n->src[0], n->src[1]) * (lm_head_forms_grad(n) ? 2.0 : 1.0);
    case Op::LM_HEAD_CE_RANGE: return head_pass(n->src[0], n->src[1]) * (n->param_i32(4) != 0 ? 2.0 : 1.0);
    case Op::LM_HEAD_CE_BACK: {
        const Tensor * ce = n->src[5];
        if (lm_head_streamed(ce)) return 0.0;  // scales the unit gradients its ranges formed
        const double pass = head_pass(n->src[0], n->src[1]);
        return (lm_head_forms_grad(ce) ? 0.0 : pass) + (n->src[4] ? pass : 0.0);
    }
    case Op::DELTA_NET: return delta_net_flops(n->src[0], n->src[2]);
    case Op::DELTA_NET_BACK: return 2.0 * delta_net_flops(n->src[0], n->src[2]);
    default: return 0.0;
    }
}

bool is_backward_op(Op op) {
    switch (op) {
    case Op::MUL_MAT_BACK_X: case Op::OUT_PROD: case Op::MUL_MAT_ID_BACK_X: case Op::OUT_PROD_ID: case Op::ATTENTION_BACK:
    case Op::LM_HEAD_CE_BACK: case Op::DELTA_NET_BACK: case Op::SILU_BACK: case Op::SWIGLU_BACK: case Op::SOFTMAX_BACK:
    case Op::RMS_NORM_BACK: case Op::L2_NORM_BACK: case Op::RMS_NORM_GATED_BACK: case Op::ROPE_BACK: case Op::GET_ROWS_BACK:
    case Op::SSM_CONV_BACK: case Op::MOE_WEIGHTS_BACK: case Op::PREFERENCE_LOSS_BACK: case Op::GRPO_LOSS_BACK:
        return true;
    default:
        return false;
    }
}

} // namespace rp
