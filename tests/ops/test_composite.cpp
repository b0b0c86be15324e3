// Whole subgraphs through build_backward: a pre-norm decoder layer (rms_norm, projections, rope, GQA
// attention, residuals, SwiGLU FFN) and a tied embedding / LM head whose gradient is the sum of both uses.
#include "harness.h"

#include <gtest/gtest.h>

using namespace optest;
using rp::Context;
using rp::Tensor;
using TV = std::vector<Tensor *>;
using R = RefInputs;

namespace {

ref::DT reshaped(const ref::DT & x, std::array<int64_t, 4> ne) { return ref::DT(ne, x.v); }

} // namespace

TEST(OpComposite, DecoderLayer) {
    const int64_t E = 8, D = 4, Hq = 2, Hkv = 1, T = 5, F = 12;
    Input pos{"pos", {T, 1, 1, 1}, rp::DType::I32, false};
    pos.ints = {0, 1, 2, 3, 4};
    rp::RopeParams rp_;
    rp_.n_rot = D;
    rp_.mode = rp::RopeMode::Neox;
    const float eps = 1e-5f, scale = 0.5f;
    check_op({"decoder layer E8 Hq2 Hkv1 T5 F12",
              {{"x", {E, T, 1, 1}}, {"attn_norm", {E, 1, 1, 1}}, {"wq", {E, Hq * D, 1, 1}}, {"wk", {E, Hkv * D, 1, 1}},
               {"wv", {E, Hkv * D, 1, 1}}, {"wo", {Hq * D, E, 1, 1}}, {"ffn_norm", {E, 1, 1, 1}}, {"wg", {E, F, 1, 1}},
               {"wu", {E, F, 1, 1}}, {"wd", {F, E, 1, 1}}, pos},
              [=](Context & c, const TV & in) {
                  Tensor * n1 = rp::rms_norm(c, in[0], in[1], eps);
                  Tensor * q = rp::rope(c, rp::reshape(c, rp::mul_mat(c, in[2], n1), D, Hq, T), in[10], rp_);
                  Tensor * k = rp::rope(c, rp::reshape(c, rp::mul_mat(c, in[3], n1), D, Hkv, T), in[10], rp_);
                  Tensor * v = rp::reshape(c, rp::mul_mat(c, in[4], n1), D, Hkv, T);
                  Tensor * o = rp::attention(c, q, k, v, scale);
                  Tensor * h = rp::add(c, in[0], rp::mul_mat(c, in[5], rp::reshape(c, o, Hq * D, T)));
                  Tensor * n2 = rp::rms_norm(c, h, in[6], eps);
                  Tensor * ff = rp::swiglu(c, rp::mul_mat(c, in[7], n2), rp::mul_mat(c, in[8], n2));
                  return rp::add(c, h, rp::mul_mat(c, in[9], ff));
              },
              [=](const R & x) {
                  const std::vector<int32_t> p = ints_from(x[10]);
                  const ref::DT n1 = ref::rms_norm(x[0], &x[1], eps);
                  const ref::DT q = ref::rope(reshaped(ref::mul_mat(x[2], n1), {D, Hq, T, 1}), p, D, 2, 10000.0, 1.0);
                  const ref::DT k = ref::rope(reshaped(ref::mul_mat(x[3], n1), {D, Hkv, T, 1}), p, D, 2, 10000.0, 1.0);
                  const ref::DT v = reshaped(ref::mul_mat(x[4], n1), {D, Hkv, T, 1});
                  const ref::DT o = ref::attention(q, k, v, scale);
                  const ref::DT h = ref::add(x[0], ref::mul_mat(x[5], reshaped(o, {Hq * D, T, 1, 1})));
                  const ref::DT n2 = ref::rms_norm(h, &x[6], eps);
                  const ref::DT ff = ref::swiglu(ref::mul_mat(x[7], n2), ref::mul_mat(x[8], n2));
                  return ref::add(h, ref::mul_mat(x[9], ff));
              }});
}

TEST(OpComposite, TiedEmbeddingAndHead) {
    // One parameter, two uses (formats.md §3.3): embedding lookup and LM head.
    const int64_t C = 6, V = 11, T = 4;
    Input ids{"ids", {T, 1, 1, 1}, rp::DType::I32, false};
    ids.ints = {3, 10, 3, 0};
    Input labels{"labels", {T, 1, 1, 1}, rp::DType::I32, false};
    labels.ints = {10, 3, -1, 7};
    Input emb{"token_embd", {C, V, 1, 1}};
    emb.lo = -2.0f;
    emb.hi = 2.0f;
    const float scale = 1.0f / 3.0f;
    check_op({"tied embedding + lm head", {emb, {"norm", {C, 1, 1, 1}}, ids, labels},
              [=](Context & c, const TV & in) {
                  Tensor * h = rp::rms_norm(c, rp::get_rows(c, in[0], in[2]), in[1], 1e-5f);
                  return rp::lm_head_ce(c, h, in[0], in[3], scale, 4);
              },
              [=](const R & x) {
                  const ref::DT h = ref::rms_norm(ref::get_rows(x[0], ints_from(x[2]), T, 1), &x[1], 1e-5f);
                  return ref::lm_head_ce(h, x[0], ints_from(x[3]), scale);
              }});
}
