// ATTENTION and ATTENTION_BACK nodes -> the fused kernels of attention.h (the node glue; the kernels
// themselves are in attention.cpp). Inputs are contiguous (the op builder copies them).
#include "ggml_rp/cpu/attention.h"
#include "ggml_rp/cpu/kernels.h"

namespace rp::cpu {

namespace {

AttentionShape shape_of(const Tensor * q, const Tensor * k, float scale) {
    AttentionShape s;
    s.D = q->ne[0];
    s.Hq = q->ne[1];
    s.Hkv = k->ne[1];
    s.Tq = q->ne[2];
    s.Tk = k->ne[2];
    s.B = q->ne[3];
    s.scale = scale;
    return s;
}

inline float * aux(const Tensor * t, size_t offset) {
    return reinterpret_cast<float *>(static_cast<char *>(t->data) + t->nbytes() + offset);
}

} // namespace

void attention(Tensor * n) {
    const Tensor * q = n->src[0];
    const Tensor * k = n->src[1];
    const Tensor * v = n->src[2];
    attention_fwd(shape_of(q, k, n->param_f32(0)), q->data_as<float>(), k->data_as<float>(), v->data_as<float>(),
                  n->data_as<float>(), aux(n, 0));
}

void attention_back(Tensor * n) {
    const Tensor * q = n->src[0];
    const Tensor * k = n->src[1];
    const Tensor * v = n->src[2];
    const Tensor * o = n->src[3];
    const Tensor * lse = n->src[4];
    const Tensor * dout = n->src[5];
    attention_bwd(shape_of(q, k, n->param_f32(0)), q->data_as<float>(), k->data_as<float>(), v->data_as<float>(),
                  o->data_as<float>(), lse->data_as<float>(), dout->data_as<float>(), n->data_as<float>(), aux(n, 0),
                  aux(n, k->nbytes()));
}

} // namespace rp::cpu
