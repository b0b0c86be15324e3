// LM_HEAD_CE, LM_HEAD_CE_BACK and LM_HEAD_CE_RANGE nodes -> the fused kernel of cross_entropy.h (the node glue; the kernel is
// in cross_entropy.cpp). Labels are checked here so that a bad label is an rp::Error, not a crash.
#include "ggml_rp/cpu/cross_entropy.h"
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/kernel_scratch.h"
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

// (V: the whole vocabulary, which a streamed head's node and a range node hold as a parameter)
LmHeadCEShape shape_of(const Tensor * node, const Tensor * h, int64_t V) {
    LmHeadCEShape s;
    s.C = h->ne[0];
    s.V = V;
    s.T = h->ne[1];
    s.chunk = node->param_i32(1);
    s.softcap = node->param_f32(2);
    return s;
}


} // namespace

void lm_head_ce(Tensor * n) {
    const Tensor * h = n->src[0];
    const Tensor * W = n->src[1];  // a streamed head's: its state
    const int64_t V = lm_head_vocab(n);
    const std::vector<int32_t> labels = read_labels(n, n->src[2], V);
    const bool per_token = lm_head_per_token(n);
    LmHeadCEAux aux;
    aux.lse_out = node::aux(n, 0);
    aux.rest_out = node::aux(n, lm_head_rest_offset(n));
    aux.token_loss = per_token ? n->data_as<float>() : nullptr;
    aux.unit_dh_out = lm_head_forms_grad(n) ? node::aux(n, lm_head_unit_dh_offset(n)) : nullptr;
    const LmHeadCEShape s = shape_of(n, h, V);
    const double loss =
        lm_head_streamed(n)
            ? lm_head_ce_finish(s, labels.data(), n->param_f32(0), lm_head_state_at(W->data, s.C, s.T, lm_head_forms_grad(n)), aux)
            : rp::cpu::lm_head_ce(s, h->data_as<float>(), W->data, W->type, W->nb[1], labels.data(), n->param_f32(0), nullptr, nullptr,
                                  0, aux);
    if (!per_token) *n->data_as<float>() = static_cast<float>(loss);
}

void lm_head_ce_range(Tensor * n) {
    const Tensor * h = n->src[0];
    const Tensor * W = n->src[1];
    const int64_t V = n->param_i32(3);
    const std::vector<int32_t> labels = read_labels(n, n->src[2], V);
    rp::cpu::lm_head_ce_range(shape_of(n, h, V), n->param_i32(0), W->ne[1], h->data_as<float>(), W->data, W->type, W->nb[1], labels.data(),
                              lm_head_state_at(n->src[3]->data, h->ne[0], h->ne[1], n->param_i32(4) != 0));
    *n->data_as<float>() = 0.0f;
}

void lm_head_ce_back(Tensor * n) {
    const Tensor * h = n->src[0];
    const Tensor * W = n->src[1];
    const Tensor * dloss = n->src[3];
    const Tensor * dW = n->src[4];
    const Tensor * ce = n->src[5];  // the forward node: its logsumexps (aux)
    const int64_t V = lm_head_vocab(n);
    const std::vector<int32_t> labels = read_labels(n, n->src[2], V);
    // The per-token form weights token t by dloss[t]; the sum by the scalar dloss.
    const bool per_token = lm_head_per_token(n);
    const float scale = per_token ? n->param_f32(0) : n->param_f32(0) * *dloss->data_as<float>();
    LmHeadCEAux aux;
    aux.lse_in = node::aux(ce, 0);
    aux.rest_in = node::aux(ce, lm_head_rest_offset(ce));
    aux.token_scale = per_token ? dloss->data_as<float>() : nullptr;
    aux.unit_dh_in = lm_head_forms_grad(ce) ? node::aux(ce, lm_head_unit_dh_offset(ce)) : nullptr;
    // (a streamed head: W is its state, never read: the unit gradients are scaled, and there is no dW)
    rp::cpu::lm_head_ce(shape_of(n, h, V), h->data_as<float>(), W->data, W->type, W->nb[1], labels.data(), scale,
                        n->data_as<float>(), dW ? dW->data_as<float>() : nullptr,
                        dW ? static_cast<int64_t>(dW->nb[1] / sizeof(float)) : 0, aux);
}

namespace {

// The kernels' scratch, for the calls the kernels above make: a streamed head's forward only finishes its state.
size_t lm_head_ce_scratch(const Tensor * n) {  // pass 1, the gradients' tile when it forms them through a soft-cap
    if (lm_head_streamed(n)) return 0;
    const LmHeadCEShape s = shape_of(n, n->src[0], lm_head_vocab(n));
    return lm_head_ce_scratch_bytes(s, true, lm_head_forms_grad(n) && s.softcap > 0.0f);
}
size_t lm_head_ce_back_scratch(const Tensor * n) {  // pass 2 unless the forward's unit gradients are only scaled
    const bool pass2 = n->src[4] != nullptr || !lm_head_forms_grad(n->src[5]);
    return lm_head_ce_scratch_bytes(shape_of(n, n->src[0], lm_head_vocab(n)), pass2, pass2);
}
size_t lm_head_ce_range_scratch(const Tensor * n) {
    return lm_head_ce_range_scratch_bytes(shape_of(n, n->src[0], n->param_i32(3)), n->src[1]->ne[1], n->param_i32(4) != 0);
}

} // namespace

const RegisterKernels kRegister{{Op::LM_HEAD_CE, lm_head_ce}, {Op::LM_HEAD_CE_BACK, lm_head_ce_back}, {Op::LM_HEAD_CE_RANGE, lm_head_ce_range}};
const RegisterScratch kRegisterScratch{
    {Op::LM_HEAD_CE, lm_head_ce_scratch}, {Op::LM_HEAD_CE_BACK, lm_head_ce_back_scratch}, {Op::LM_HEAD_CE_RANGE, lm_head_ce_range_scratch}};

} // namespace rp::cpu
