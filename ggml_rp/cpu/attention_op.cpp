// ATTENTION and ATTENTION_BACK nodes -> the fused kernels of attention.h (the node glue is ops/node_args.h;
// the kernels themselves are in attention.cpp). Inputs are contiguous (the op builder copies them).
#include "ggml_rp/cpu/attention.h"
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/kernel_scratch.h"
#include "ggml_rp/ops/node_args.h"

namespace rp::cpu {

void attention(Tensor * n) {
    attention_fwd(node::attention_shape(n), n->src[0]->data_as<float>(), n->src[1]->data_as<float>(),
                  n->src[2]->data_as<float>(), n->data_as<float>(), node::aux(n, 0), node::attention_key_start_data(n),
                  node::attention_sinks_data(n));
}

void attention_back(Tensor * n) {
    const Tensor * k = n->src[1];
    attention_bwd(node::attention_shape(n), n->src[0]->data_as<float>(), k->data_as<float>(), n->src[2]->data_as<float>(),
                  n->src[3]->data_as<float>(), n->src[4]->data_as<float>(), n->src[5]->data_as<float>(),
                  n->data_as<float>(), node::aux(n, 0), node::aux(n, k->nbytes()), node::attention_key_start_data(n),
                  node::attention_sinks_data(n), node::attention_dsinks(n));
}

namespace {
size_t attention_back_scratch(const Tensor * n) { return attention_bwd_scratch_bytes(node::attention_shape(n)); }
} // namespace

const RegisterKernels kRegister{{Op::ATTENTION, attention}, {Op::ATTENTION_BACK, attention_back}};
const RegisterScratch kRegisterScratch{{Op::ATTENTION_BACK, attention_back_scratch}};

} // namespace rp::cpu
