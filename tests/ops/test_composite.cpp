// Whole subgraphs through build_backward: a pre-norm decoder layer (rms_norm, projections, rope, GQA
// attention, residuals, SwiGLU FFN), a tied embedding / LM head whose gradient is the sum of both uses, and a tensor
// split in windows (a fused projection's parts) whose gradient the windows fill.
#include "harness.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

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

namespace {

// Rows [r0, r0 + n) of a [12, 5] tensor as a contiguous copy (models/arch/layer_util.h rows_of: a fused projection
// split in parts).
Tensor * rows_of(Context & c, Tensor * y, int64_t r0, int64_t n) {
    const int64_t ne[4] = {n, y->ne[1], y->ne[2], y->ne[3]};
    return rp::cont(c, rp::view(c, y, ne, y->nb, static_cast<size_t>(r0) * y->nb[0]));
}

// A split's three parts, each through its own function, summed: silu(x[0:4]) + 2 x[4:8] + x[8:12]^2.
Tensor * split_three(Context & c, Tensor * x) {
    Tensor * a = rp::silu(c, rows_of(c, x, 0, 4));
    Tensor * b = rp::scale(c, rows_of(c, x, 4, 4), 2.0f);
    Tensor * d = rows_of(c, x, 8, 4);
    return rp::add(c, rp::add(c, a, b), rp::mul(c, d, d));
}

ref::DT rows(const ref::DT & x, int64_t r0, int64_t n) {
    ref::DT w({n, x.ne[1], 1, 1});
    for (int64_t i1 = 0; i1 < x.ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < n; ++i0) w(i0, i1) = x(r0 + i0, i1);
    return w;
}

} // namespace

// The gradient of a tensor split in windows (each window's gradient zero outside it) against the double
// reference and finite differences, the windows apart and overlapping.
TEST(OpComposite, WindowsOfOneTensor) {
    check_op({"three windows of x",
              {{"x", {12, 5, 1, 1}}},
              [](Context & c, const TV & in) { return split_three(c, in[0]); },
              [](const R & v) {
                  const ref::DT d = rows(v[0], 8, 4);
                  return ref::add(ref::add(ref::silu(rows(v[0], 0, 4)), ref::scale(rows(v[0], 4, 4), 2.0)), ref::mul(d, d));
              }});
    check_op({"overlapping windows of x",
              {{"x", {12, 5, 1, 1}}},
              [](Context & c, const TV & in) { return rp::add(c, rp::silu(c, rows_of(c, in[0], 0, 8)), rows_of(c, in[0], 4, 8)); },
              [](const R & v) { return ref::add(ref::silu(rows(v[0], 0, 8)), rows(v[0], 4, 8)); }});
}

// The windows of one tensor add their gradients into one zero-filled buffer (Backward::add_part), not one each:
// one FILL where there were three, no more graph memory, and the bits of the buffers summed (the split built over
// three copies of x, whose gradients come back one buffer per window, as before). (The memory was less until the
// allocator's third offline order, the longest-lived blocks of the crowded moments first, packed the three buffers
// into the same 832 bytes; with the two earlier orders they took more.)
TEST(OpComposite, WindowsOfOneTensorShareOneGradientBuffer) {
    struct Built {
        std::vector<float> grad;
        int fills = 0;
        size_t bytes = 0;
    };
    auto build = [](bool copies) {
        Context ctx;
        Tensor * x = ctx.new_tensor(rp::DType::F32, 12, 5);
        ctx.alloc_data(x);
        std::vector<float> v(60);
        for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i) + 0.3));
        rp::tensor_set_f32(x, v);
        rp::set_param(ctx, x);
        ctx.alloc_data(x->grad);
        std::memset(x->grad->data, 0, x->grad->nbytes());
        Tensor * y = nullptr;
        if (copies) {  // each window of its own copy of x
            Tensor * a = rp::silu(ctx, rows_of(ctx, rp::cont(ctx, rp::scale(ctx, x, 1.0f)), 0, 4));
            Tensor * b = rp::scale(ctx, rows_of(ctx, rp::cont(ctx, rp::scale(ctx, x, 1.0f)), 4, 4), 2.0f);
            Tensor * d = rows_of(ctx, rp::cont(ctx, rp::scale(ctx, x, 1.0f)), 8, 4);
            y = rp::add(ctx, rp::add(ctx, a, b), rp::mul(ctx, d, d));
        } else {
            y = split_three(ctx, rp::scale(ctx, x, 1.0f));
        }
        Tensor * loss = rp::sum(ctx, rp::mul(ctx, y, y));
        rp::Graph g;
        rp::build_forward(g, loss);
        const size_t n_forward = g.nodes.size();
        rp::build_backward(ctx, g, loss, {x});
        Built r;
        for (size_t i = n_forward; i < g.nodes.size(); ++i)  // (the zero buffers shaped like x; not the loss's seed)
            r.fills += g.nodes[i]->op == rp::Op::FILL && rp::same_shape(g.nodes[i], x);
        r.bytes = rp::plan_graph(g).size;
        rp::CpuBackend be;
        be.allocate(g);
        be.compute(g, 1);
        r.grad = rp::tensor_get_f32(x->grad);
        return r;
    };
    const Built shared = build(false), apart = build(true);
    EXPECT_EQ(shared.fills, 1);
    EXPECT_EQ(apart.fills, 3);
    EXPECT_LE(shared.bytes, apart.bytes);
    ASSERT_EQ(shared.grad.size(), apart.grad.size());
    EXPECT_EQ(std::memcmp(shared.grad.data(), apart.grad.data(), shared.grad.size() * sizeof(float)), 0);
}

// A split's buffer is taken after its last part's gradient, not its first: here the gate's part comes back first
// (the gate is used last, as Qwen3.5's attention output gate is) and the query's after the whole chain on it, which
// the buffer would otherwise span. The same bits as the buffer taken at once (the windows' sums do not change).
TEST(OpComposite, ASplitsGradientBufferIsTakenAfterItsLastPart) {
    Context ctx;
    Tensor * x = ctx.new_tensor(rp::DType::F32, 12, 5);
    ctx.alloc_data(x);
    std::vector<float> v(60);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::cos(0.9 * static_cast<double>(i) - 0.2));
    rp::tensor_set_f32(x, v);
    rp::set_param(ctx, x);
    ctx.alloc_data(x->grad);
    std::memset(x->grad->data, 0, x->grad->nbytes());
    Tensor * xs = rp::scale(ctx, x, 1.0f);   // the split tensor (not a param: its gradient is a graph buffer)
    Tensor * q = rows_of(ctx, xs, 0, 8);
    Tensor * chain = rp::silu(ctx, rp::scale(ctx, rp::silu(ctx, q), 0.5f));
    Tensor * gate = rows_of(ctx, xs, 8, 4);
    Tensor * y = rp::mul(ctx, rows_of(ctx, chain, 0, 4), rp::sigmoid(ctx, gate));
    Tensor * loss = rp::sum(ctx, rp::mul(ctx, y, y));
    rp::Graph g;
    rp::build_forward(g, loss);
    const size_t n_forward = g.nodes.size();
    rp::build_backward(ctx, g, loss, {x});
    // The buffer: the one FILL shaped like x; the query's part: the gradient of its window's copy (the node that
    // reads q's view last), i.e. the last SILU_BACK of the chain.
    size_t fill = 0, fills = 0, last_chain_grad = 0;
    for (size_t i = n_forward; i < g.nodes.size(); ++i) {
        if (g.nodes[i]->op == rp::Op::FILL && rp::same_shape(g.nodes[i], xs)) fill = i, ++fills;
        if (g.nodes[i]->op == rp::Op::SILU_BACK) last_chain_grad = std::max(last_chain_grad, i);
    }
    EXPECT_EQ(fills, 1u);
    EXPECT_GT(last_chain_grad, 0u);
    EXPECT_GT(fill, last_chain_grad) << "the buffer is taken before the query's part came back";
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, 1);
    const std::vector<float> got = rp::tensor_get_f32(x->grad);
    // Double-precision gradient: d/dx of sum(y^2), y = silu(0.5 silu(q))[rows 0..4) * sigmoid(gate).
    for (int64_t c = 0; c < 5; ++c)
        for (int64_t r = 0; r < 12; ++r) {
            double want = 0.0;
            auto silu = [](double t) { return t / (1.0 + std::exp(-t)); };
            auto dsilu = [](double t) { const double s = 1.0 / (1.0 + std::exp(-t)); return s * (1.0 + t * (1.0 - s)); };
            if (r < 4) {
                const double qv = v[size_t(c * 12 + r)], gv = v[size_t(c * 12 + 8 + r)];
                const double sg = 1.0 / (1.0 + std::exp(-gv)), h = silu(0.5 * silu(qv)), yv = h * sg;
                want = 2.0 * yv * sg * dsilu(0.5 * silu(qv)) * 0.5 * dsilu(qv);
            } else if (r >= 8) {
                const double qv = v[size_t(c * 12 + r - 8)], gv = v[size_t(c * 12 + r)];
                const double sg = 1.0 / (1.0 + std::exp(-gv)), h = silu(0.5 * silu(qv)), yv = h * sg;
                want = 2.0 * yv * h * sg * (1.0 - sg);
            }
            EXPECT_NEAR(got[size_t(c * 12 + r)], want, 1e-5) << r << "," << c;
        }
}

// A window of a strided tensor has no buffer its gradient can be added into at the window's strides: building the
// backward is refused, naming the window's source.
TEST(OpComposite, AWindowOfAStridedTensorIsRefusedNamingIt) {
    Context ctx;
    Tensor * x = ctx.new_tensor(rp::DType::F32, 5, 12);
    x->name = "x_strided_source";
    Tensor * xt = rp::transpose(ctx, x);   // [12, 5], not contiguous
    Tensor * y = rp::sum(ctx, rp::silu(ctx, rows_of(ctx, xt, 0, 4)));
    rp::Graph g;
    rp::build_forward(g, y);
    rp::set_param(ctx, x);
    try {
        rp::build_backward(ctx, g, y, {x});
        FAIL() << "no error";
    } catch (const rp::Error & e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("window"), std::string::npos) << m;
        EXPECT_NE(m.find("contiguous"), std::string::npos) << m;
        EXPECT_NE(m.find(rp::describe(xt)), std::string::npos) << m;
        std::printf("  %s\n", m.c_str());
    }
}
