// LM_HEAD_CE and LM_HEAD_CE_BACK nodes -> the fused kernel of cross_entropy.h (the node glue; the kernel is
// in cross_entropy.cpp). Labels are checked here so that a bad label is an rp::Error, not a crash.
#include "ggml_rp/cpu/cross_entropy.h"
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/ops/cross_entropy.h"
#include "ggml_rp/ops/node_args.h"
#include "base/error.h"

#include <vector>

namespace rp::cpu {

namespace {

std::vector<int32_t> read_labels(const Tensor * node, const Tensor * labels, int64_t V) {
    std::vector<int32_t> v = tensor_get_i32(labels);
    for (size_t i = 0; i < v.size(); ++i)
        if (v[i] < -1 || v[i] >= V)
            throw Error(std::string(op_name(node->op)) + ": label " + std::to_string(v[i]) + " at position " +
                        std::to_string(i) + " of " + describe(labels) + " is outside [0, " + std::to_string(V) +
                        ") and not -1 (masked)");
    return v;
}

LmHeadCEShape shape_of(const Tensor * node, const Tensor * h, const Tensor * W) {
    LmHeadCEShape s;
    s.C = h->ne[0];
    s.V = W->ne[1];
    s.T = h->ne[1];
    s.chunk = node->param_i32(1);
    s.softcap = node->param_f32(2);
    return s;
}

} // namespace

void lm_head_ce(Tensor * n) {
    const Tensor * h = n->src[0];
    const Tensor * W = n->src[1];
    const std::vector<int32_t> labels = read_labels(n, n->src[2], W->ne[1]);
    const bool per_token = lm_head_per_token(n);
    LmHeadCEAux aux;
    aux.lse_out = node::aux(n, 0);
    aux.rest_out = node::aux(n, lm_head_rest_offset(n));
    aux.token_loss = per_token ? n->data_as<float>() : nullptr;
    aux.unit_dh_out = lm_head_forms_grad(n) ? node::aux(n, lm_head_unit_dh_offset(n)) : nullptr;
    const double loss = rp::cpu::lm_head_ce(shape_of(n, h, W), h->data_as<float>(), W->data, W->type, W->nb[1],
                                            labels.data(), n->param_f32(0), nullptr, nullptr, 0, aux);
    if (!per_token) *n->data_as<float>() = static_cast<float>(loss);
}

void lm_head_ce_back(Tensor * n) {
    const Tensor * h = n->src[0];
    const Tensor * W = n->src[1];
    const Tensor * dloss = n->src[3];
    const Tensor * dW = n->src[4];
    const Tensor * ce = n->src[5];  // the forward node: its logsumexps (aux)
    const std::vector<int32_t> labels = read_labels(n, n->src[2], W->ne[1]);
    // The per-token form weights token t by dloss[t]; the sum by the scalar dloss.
    const bool per_token = lm_head_per_token(n);
    const float scale = per_token ? n->param_f32(0) : n->param_f32(0) * *dloss->data_as<float>();
    LmHeadCEAux aux;
    aux.lse_in = node::aux(ce, 0);
    aux.rest_in = node::aux(ce, lm_head_rest_offset(ce));
    aux.token_scale = per_token ? dloss->data_as<float>() : nullptr;
    aux.unit_dh_in = lm_head_forms_grad(ce) ? node::aux(ce, lm_head_unit_dh_offset(ce)) : nullptr;
    rp::cpu::lm_head_ce(shape_of(n, h, W), h->data_as<float>(), W->data, W->type, W->nb[1], labels.data(), scale,
                        n->data_as<float>(), dW ? dW->data_as<float>() : nullptr,
                        dW ? static_cast<int64_t>(dW->nb[1] / sizeof(float)) : 0, aux);
}

const RegisterKernels kRegister{{Op::LM_HEAD_CE, lm_head_ce}, {Op::LM_HEAD_CE_BACK, lm_head_ce_back}};

} // namespace rp::cpu
