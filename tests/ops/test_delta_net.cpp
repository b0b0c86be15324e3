// Gated DeltaNet's ops (ops/delta_net.h) and the small ones its layer needs (sigmoid, softplus, L2 norm): forward vs
// the double reference (the delta rule as a plain matrix recurrence), backward vs finite differences, determinism;
// the chunked checkpoints give the same bits whatever the chunk; a sequence run in two calls (the state and the
// conv state carried over, as generation does) equals one call bit for bit.
#include "harness.h"

#include "ggml_rp/ops/delta_net.h"

#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <bit>
#include <cstring>
#include <random>
#include <string>

using namespace optest;
using rp::Context;
using rp::Tensor;
using TV = std::vector<Tensor *>;
using R = RefInputs;

namespace {

Input ranged(std::string name, std::array<int64_t, 4> ne, float lo, float hi, bool diff = true) {
    Input in{std::move(name), ne, rp::DType::F32, diff};
    in.lo = lo;
    in.hi = hi;
    return in;
}

Input ints(std::string name, std::vector<int32_t> v) {
    Input in{std::move(name), {static_cast<int64_t>(v.size()), 1, 1, 1}, rp::DType::I32, false};
    in.ints = std::move(v);
    return in;
}

// Packed examples: each token's first token of its example, from the examples' lengths per sequence.
std::vector<int32_t> seg_starts(const std::vector<std::vector<int>> & lengths) {
    std::vector<int32_t> s;
    for (const auto & seq : lengths) {
        int t = 0;
        for (int len : seq) {
            for (int i = 0; i < len; ++i) s.push_back(t);
            t += len;
        }
    }
    return s;
}

} // namespace

TEST(OpGates, SigmoidSoftplus) {
    check_op({"sigmoid [37,3]", {ranged("x", {37, 3, 1, 1}, -6.0f, 6.0f)}, [](Context & c, const TV & in) { return rp::sigmoid(c, in[0]); },
              [](const R & v) { return ref::sigmoid(v[0]); }});
    check_op({"softplus [37,3]", {ranged("x", {37, 3, 1, 1}, -6.0f, 6.0f)}, [](Context & c, const TV & in) { return rp::softplus(c, in[0]); },
              [](const R & v) { return ref::softplus(v[0]); }});
    // Above 20, softplus is x itself (ggml's cut-off; log1p(exp(x)) - x < 2.1e-9 there).
    check_op({"softplus large", {ranged("x", {9, 1, 1, 1}, 18.0f, 30.0f)}, [](Context & c, const TV & in) { return rp::softplus(c, in[0]); },
              [](const R & v) { return ref::softplus(v[0]); }});
}

TEST(OpNorm, L2Norm) {
    check_op({"l2_norm [17,3,2]", {{"x", {17, 3, 2, 1}}}, [](Context & c, const TV & in) { return rp::l2_norm(c, in[0], 1e-6f); },
              [](const R & v) { return ref::l2_norm(v[0], 1e-6); }});
    check_op({"l2_norm [128,2] transposed", {{"x", {2, 128, 1, 1}}},
              [](Context & c, const TV & in) { return rp::l2_norm(c, rp::transpose(c, in[0]), 1e-6f); },
              [](const R & v) { return ref::l2_norm(ref::permute(v[0], 1, 0, 2, 3), 1e-6); }});
    // Rows whose norm is below eps are divided by eps (a constant there: dx = dy / eps).
    check_op({"l2_norm clamped", {ranged("x", {4, 3, 1, 1}, -0.01f, 0.01f)}, [](Context & c, const TV & in) { return rp::l2_norm(c, in[0], 0.5f); },
              [](const R & v) { return ref::l2_norm(v[0], 0.5); }});
    Context ctx;
    EXPECT_THROW(rp::l2_norm(ctx, ctx.new_tensor(rp::DType::F32, 4), 0.0f), rp::Error);
}

// The gated output norm, rms_norm(x, w) * silu(z) as one op: rows of 17, Qwen3.5's 128 (no weight), 600 (past the
// kernel's 512-element pieces), strided rows; gradients of x, z and w against finite differences.
TEST(OpNorm, RmsNormGated) {
    const double eps = static_cast<double>(1e-6f);
    auto gated_ref = [eps](const R & v) { return ref::mul(ref::rms_norm(v[0], v.size() > 2 ? &v[2] : nullptr, eps), ref::silu(v[1])); };
    check_op({"rms_norm_gated [17,3] w", {{"x", {17, 3, 1, 1}}, ranged("z", {17, 3, 1, 1}, -4.0f, 4.0f), {"w", {17, 1, 1, 1}}},
              [](Context & c, const TV & in) { return rp::rms_norm_gated(c, in[0], in[2], in[1], 1e-6f); }, gated_ref});
    check_op({"rms_norm_gated [128,4,3]", {{"x", {128, 4, 3, 1}}, ranged("z", {128, 4, 3, 1}, -4.0f, 4.0f)},
              [](Context & c, const TV & in) { return rp::rms_norm_gated(c, in[0], nullptr, in[1], 1e-6f); }, gated_ref});
    check_op({"rms_norm_gated [600,2] w", {{"x", {600, 2, 1, 1}}, ranged("z", {600, 2, 1, 1}, -4.0f, 4.0f), {"w", {600, 1, 1, 1}}},
              [](Context & c, const TV & in) { return rp::rms_norm_gated(c, in[0], in[2], in[1], 1e-6f); }, gated_ref});
    check_op({"rms_norm_gated transposed [3,9]^T w",
              {{"x_t", {3, 9, 1, 1}}, ranged("z_t", {3, 9, 1, 1}, -4.0f, 4.0f), {"w", {9, 1, 1, 1}}},
              [](Context & c, const TV & in) {
                  return rp::rms_norm_gated(c, rp::transpose(c, in[0]), in[2], rp::transpose(c, in[1]), 1e-6f);
              },
              [eps](const R & v) {
                  return ref::mul(ref::rms_norm(ref::permute(v[0], 1, 0, 2, 3), &v[2], eps), ref::silu(ref::permute(v[1], 1, 0, 2, 3)));
              }});
    // Into a product through a reshape to [Dv Hv, T], as Qwen3.5's out projection reads it: the product's input
    // gradient is then the norm's own buffer, and dz is written over it (RmsNormGatedWritesDzOverAnOutputGradientItOwns).
    check_op({"rms_norm_gated [8,3,5] w, reshaped into a product (dz over dy)",
              {{"x", {8, 3, 5, 1}}, ranged("z", {8, 3, 5, 1}, -4.0f, 4.0f), {"w", {8, 1, 1, 1}}, {"W", {24, 7, 1, 1}}},
              [](Context & c, const TV & in) {
                  return rp::mul_mat(c, in[3], rp::reshape(c, rp::rms_norm_gated(c, in[0], in[2], in[1], 1e-6f), 24, 5));
              },
              [gated_ref](const R & v) {
                  ref::DT y = gated_ref({v[0], v[1], v[2]});
                  y.ne = {24, 5, 1, 1};
                  return ref::mul_mat(v[3], y);
              }});
    Context ctx;
    Tensor * x = ctx.new_tensor(rp::DType::F32, 8, 2);
    EXPECT_THROW(rp::rms_norm_gated(ctx, x, nullptr, ctx.new_tensor(rp::DType::F32, 8, 3), 1e-6f), rp::Error);   // z's shape
    EXPECT_THROW(rp::rms_norm_gated(ctx, x, ctx.new_tensor(rp::DType::F32, 4), x, 1e-6f), rp::Error);             // w's length
    EXPECT_THROW(rp::rms_norm_gated_back(ctx, x, nullptr, x, x, 1e-6f, 2), rp::Error);                           // which
}

// The one op gives the bits of the three it replaces (rms_norm with its weight, silu, mul), on contiguous and on
// strided rows, so models that switched to it compute the same logits.
TEST(OpNorm, RmsNormGatedEqualsItsThreeOpsBitForBit) {
    for (const bool strided : {false, true}) {
        SCOPED_TRACE(strided ? "strided" : "contiguous");
        Context ctx;
        const int64_t n = 600, rows = 5;
        Tensor * xs = ctx.new_tensor(rp::DType::F32, strided ? rows : n, strided ? n : rows);
        Tensor * zs = ctx.new_tensor(rp::DType::F32, strided ? rows : n, strided ? n : rows);
        Tensor * w = ctx.new_tensor(rp::DType::F32, n);
        std::mt19937 rng(11);
        std::uniform_real_distribution<float> u(-3.0f, 3.0f);
        for (Tensor * t : {xs, zs, w}) {
            ctx.alloc_data(t);
            std::vector<float> v(static_cast<size_t>(t->nelements()));
            for (float & f : v) f = u(rng);
            rp::tensor_set_f32(t, v);
        }
        Tensor * x = strided ? rp::transpose(ctx, xs) : xs;
        Tensor * z = strided ? rp::transpose(ctx, zs) : zs;
        const std::vector<float> fused = compute(rp::rms_norm_gated(ctx, x, w, z, 1e-6f));
        const std::vector<float> three = compute(rp::mul(ctx, rp::rms_norm(ctx, x, w, 1e-6f), rp::silu(ctx, z)));
        ASSERT_EQ(fused.size(), three.size());
        for (size_t i = 0; i < fused.size(); ++i) ASSERT_EQ(std::bit_cast<uint32_t>(fused[i]), std::bit_cast<uint32_t>(three[i])) << i;
    }
}

// Its backward reads x, z and the weight, nothing the forward computed: a graph keeps neither the normed rows nor
// silu(z) for it (as Qwen3.5's DeltaNet layers did, two [Dv, Hv, T] arrays a layer).
TEST(OpNorm, RmsNormGatedBackwardReadsOnlyItsInputs) {
    Context ctx;
    Tensor * x = ctx.new_tensor(rp::DType::F32, 16, 4);
    Tensor * z = ctx.new_tensor(rp::DType::F32, 16, 4);
    Tensor * w = ctx.new_tensor(rp::DType::F32, 16);
    Tensor * dy = ctx.new_tensor(rp::DType::F32, 16, 4);
    Tensor * y = rp::rms_norm_gated(ctx, x, w, z, 1e-6f);
    rp::Graph g;
    rp::build_forward(g, y);
    ASSERT_EQ(g.nodes.size(), 1u);
    rp::set_param(ctx, x);
    rp::set_param(ctx, z);
    rp::build_backward(ctx, g, y, dy, {x, z});
    int backs = 0;
    for (size_t i = 1; i < g.nodes.size(); ++i) {
        for (const Tensor * s : g.nodes[i]->src) EXPECT_NE(s, y) << rp::describe(g.nodes[i]) << " reads the forward's output";
        backs += g.nodes[i]->op == rp::Op::RMS_NORM_GATED_BACK;
        EXPECT_NE(g.nodes[i]->op, rp::Op::SILU);
        EXPECT_NE(g.nodes[i]->op, rp::Op::RMS_NORM);
    }
    EXPECT_EQ(backs, 2);   // dx and dz
}

// When the gated norm's output gradient is a buffer only it uses (the out projection's input gradient, handed on
// through the reshape to the heads' layout, as Qwen3.5's DeltaNet block has it), dz is written over it after dx and
// dw have read it: one [n, rows] array fewer at that rule. The gradients of x, z and w are the bits of the same
// graph with an identity view between the norm and the reshape (`after`), which hands the gradient on unowned, so
// dz gets a buffer of its own there.
TEST(OpNorm, RmsNormGatedWritesDzOverAnOutputGradientItOwns) {
    struct Built {
        std::vector<std::vector<float>> grads;
        bool dz_over_dy = false, dz_last = false;
        size_t bytes = 0;
    };
    auto build = [](bool owned, bool train_w) {
        Context ctx;
        const int64_t Dv = 8, Hv = 3, T = 5, N = 7;
        std::mt19937 rng(3);
        std::uniform_real_distribution<float> u(-2.0f, 2.0f);
        auto leaf = [&](std::initializer_list<int64_t> ne) {
            std::vector<int64_t> d(ne);
            d.resize(4, 1);
            Tensor * t = ctx.new_tensor(rp::DType::F32, d[0], d[1], d[2], d[3]);
            ctx.alloc_data(t);
            std::vector<float> v(static_cast<size_t>(t->nelements()));
            for (float & f : v) f = u(rng);
            rp::tensor_set_f32(t, v);
            return t;
        };
        Tensor * x = leaf({Dv, Hv, T}), * z = leaf({Dv, Hv, T}), * w = leaf({Dv}), * W = leaf({Dv * Hv, N}), * dep = leaf({1});
        Tensor * y = rp::rms_norm_gated(ctx, x, w, z, 1e-6f);
        if (!owned) y = rp::after(ctx, y, dep);
        Tensor * loss = rp::sum(ctx, rp::mul_mat(ctx, W, rp::reshape(ctx, y, Dv * Hv, T)));
        rp::Graph g;
        rp::build_forward(g, loss);
        std::vector<Tensor *> params{x, z};
        if (train_w) params.push_back(w);
        for (Tensor * p : params) {
            rp::set_param(ctx, p);
            ctx.alloc_data(p->grad);
            std::memset(p->grad->data, 0, p->grad->nbytes());
        }
        rp::build_backward(ctx, g, loss, params);
        Built r;
        size_t dz_at = 0, last_reader = 0;
        for (size_t i = 0; i < g.nodes.size(); ++i) {
            const Tensor * n = g.nodes[i];
            if (n->op == rp::Op::RMS_NORM_GATED_BACK && n->param_i32(1) == 1) {
                dz_at = i;
                r.dz_over_dy = n->is_view() && n->view_src == (n->src[2]->view_src ? n->src[2]->view_src : n->src[2]);
            }
            if ((n->op == rp::Op::RMS_NORM_GATED_BACK && n->param_i32(1) == 0) || n->op == rp::Op::MUL) last_reader = i;
        }
        r.dz_last = dz_at > last_reader;
        r.bytes = rp::plan_graph(g).size;
        rp::CpuBackend be;
        be.allocate(g);
        be.compute(g, 2);
        for (Tensor * p : params) r.grads.push_back(rp::tensor_get_f32(p->grad));
        return r;
    };
    for (const bool train_w : {true, false}) {
        SCOPED_TRACE(train_w ? "x, z and w trained (dw reads dy too)" : "x and z trained");
        const Built over = build(true, train_w), apart = build(false, train_w);
        EXPECT_TRUE(over.dz_over_dy);
        EXPECT_TRUE(over.dz_last) << "dz ran before a node that reads dy";
        EXPECT_FALSE(apart.dz_over_dy);
        EXPECT_LE(over.bytes, apart.bytes);  // (a view has no block; the peak of a graph this small is elsewhere)
        ASSERT_EQ(over.grads.size(), apart.grads.size());
        for (size_t k = 0; k < over.grads.size(); ++k) {
            ASSERT_EQ(over.grads[k].size(), apart.grads[k].size());
            for (size_t i = 0; i < over.grads[k].size(); ++i)
                ASSERT_EQ(std::bit_cast<uint32_t>(over.grads[k][i]), std::bit_cast<uint32_t>(apart.grads[k][i])) << "param " << k << " element " << i;
        }
    }
}

// The L2 norm's gradient reads its output and the per-row scale the forward saved, not its input: the input (here a
// SiLU's output, as Gated DeltaNet's q and k are) is read by nothing after the forward. Rows far below and far above
// eps, side by side, against the double-precision gradient.
TEST(OpNorm, L2NormBackwardReadsItsOutputNotItsInput) {
    const int64_t n = 16, rows = 6;
    const float eps = 0.5f;
    Context ctx;
    Tensor * x = ctx.new_tensor(rp::DType::F32, n, rows);
    Tensor * dy = ctx.new_tensor(rp::DType::F32, n, rows);
    ctx.alloc_data(x);
    ctx.alloc_data(dy);
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> xv(static_cast<size_t>(n * rows)), dv(xv.size());
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < n; ++i) {
            xv[static_cast<size_t>(r * n + i)] = (r % 2 ? 2.0f : 0.004f) + (r % 2 ? 1.0f : 0.002f) * u(rng);   // row norms ~0.008 and ~7
            dv[static_cast<size_t>(r * n + i)] = u(rng);
        }
    rp::tensor_set_f32(x, xv);
    rp::tensor_set_f32(dy, dv);
    Tensor * h = rp::silu(ctx, x);
    Tensor * y = rp::l2_norm(ctx, h, eps);
    rp::Graph g;
    rp::build_forward(g, y);
    const size_t forward_nodes = g.nodes.size();
    rp::set_param(ctx, x);
    ctx.alloc_data(x->grad);
    rp::build_backward(ctx, g, y, dy, {x});
    bool saw_back = false;
    for (size_t i = forward_nodes; i < g.nodes.size(); ++i) {
        for (const Tensor * s : g.nodes[i]->src) EXPECT_NE(s, h) << rp::describe(g.nodes[i]) << " reads the norm's input";
        if (g.nodes[i]->op == rp::Op::L2_NORM_BACK) {
            saw_back = true;
            EXPECT_EQ(g.nodes[i]->src[0], y);
        }
    }
    EXPECT_TRUE(saw_back);
    rp::CpuBackend be;
    be.allocate(g);
    rp::tensor_set_f32(x->grad, std::vector<float>(xv.size(), 0.0f));
    be.compute(g, 2);
    const std::vector<float> got = rp::tensor_get_f32(x->grad);
    int clamped = 0;
    for (int64_t r = 0; r < rows; ++r) {
        double hv[16], ss = 0.0, yg = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            const double xi = xv[static_cast<size_t>(r * n + i)];
            hv[i] = xi / (1.0 + std::exp(-xi));
            ss += hv[i] * hv[i];
        }
        const double norm = std::sqrt(ss), m = std::max(norm, double(eps));
        clamped += norm <= eps;
        for (int64_t i = 0; i < n; ++i) yg += hv[i] / m * dv[static_cast<size_t>(r * n + i)];
        for (int64_t i = 0; i < n; ++i) {
            const double xi = xv[static_cast<size_t>(r * n + i)], sg = 1.0 / (1.0 + std::exp(-xi));
            const double gi = dv[static_cast<size_t>(r * n + i)];
            const double dh = norm > eps ? (gi - hv[i] / m * yg) / m : gi / m;
            const double want = dh * sg * (1.0 + xi * (1.0 - sg));
            EXPECT_NEAR(got[static_cast<size_t>(r * n + i)], want, 1e-5 * (1.0 + std::fabs(want))) << "row " << r << " element " << i;
        }
    }
    EXPECT_EQ(clamped, 3);
}

TEST(OpSsmConv, ForwardBackward) {
    check_op({"ssm_conv [5,7,2] K 4", {{"x", {5, 7, 2, 1}}, {"w", {4, 5, 1, 1}}},
              [](Context & c, const TV & in) { return rp::ssm_conv(c, in[0], in[1]); },
              [](const R & v) { return ref::ssm_conv(v[0], v[1]); }});
    // The conv state of earlier tokens (generation): read, not differentiated.
    check_op({"ssm_conv [6,3,2] K 4 with prefix", {{"x", {6, 3, 2, 1}}, {"w", {4, 6, 1, 1}}, ranged("prefix", {6, 3, 2, 1}, -1.0f, 1.0f, false)},
              [](Context & c, const TV & in) { return rp::ssm_conv(c, in[0], in[1], in[2]); },
              [](const R & v) { return ref::ssm_conv(v[0], v[1], &v[2]); }});
    // Packed examples: no token reads the inputs of an earlier example.
    const std::vector<int32_t> seg = seg_starts({{2, 5}, {1, 1, 5}});
    check_op({"ssm_conv packed", {{"x", {5, 7, 2, 1}}, {"w", {4, 5, 1, 1}}, ints("seg", seg)},
              [](Context & c, const TV & in) { return rp::ssm_conv(c, in[0], in[1], nullptr, in[2]); },
              [seg](const R & v) { return ref::ssm_conv(v[0], v[1], nullptr, seg); }});
    // K = 1: no state at all.
    check_op({"ssm_conv K 1", {{"x", {3, 4, 1, 1}}, {"w", {1, 3, 1, 1}}}, [](Context & c, const TV & in) { return rp::ssm_conv(c, in[0], in[1]); },
              [](const R & v) { return ref::ssm_conv(v[0], v[1]); }});
}

// The input gradient reads neither the input nor the conv state (only w and dy): its node holds neither, so a
// backward graph frees the convolution's input (a [channels, T] tensor) once the weight's gradient, if any, is made.
TEST(OpSsmConv, InputGradientHoldsNoInput) {
    Context ctx;
    Tensor * x = ctx.new_tensor(rp::DType::F32, 5, 7, 2);
    Tensor * w = ctx.new_tensor(rp::DType::F32, 4, 5);
    Tensor * y = rp::ssm_conv(ctx, x, w);
    Tensor * dy = ctx.new_tensor(rp::DType::F32, 5, 7, 2);
    Tensor * dx = rp::ssm_conv_back(ctx, y, dy, 0);
    Tensor * dw = rp::ssm_conv_back(ctx, y, dy, 1);
    EXPECT_EQ(dx->src[0], nullptr);
    EXPECT_EQ(dx->src[3], nullptr);
    EXPECT_EQ(dw->src[0], x);
    EXPECT_TRUE(rp::same_shape(dx, x));
}

namespace {

// q, k [Dk, Hk, T, B], v [Dv, Hv, T, B], g in [-1.5, -0.02] (decays), beta in [0.05, 0.95] (sigmoids).
std::vector<Input> net_inputs(int64_t Dk, int64_t Hk, int64_t Dv, int64_t Hv, int64_t T, int64_t B) {
    return {{"q", {Dk, Hk, T, B}},
            {"k", {Dk, Hk, T, B}},
            {"v", {Dv, Hv, T, B}},
            ranged("g", {Hv, T, B, 1}, -1.5f, -0.02f),
            ranged("beta", {Hv, T, B, 1}, 0.05f, 0.95f)};
}

} // namespace

TEST(OpDeltaNet, ForwardBackward) {
    // Dk 9 (one 8-lane block and a tail), two value heads per key head, 11 tokens in chunks of 4 (the last partial).
    check_op({"delta_net Dk 9 Hk 2 Dv 5 Hv 4 T 11 B 2 chunk 4", net_inputs(9, 2, 5, 4, 11, 2),
              [](Context & c, const TV & in) { return rp::delta_net(c, in[0], in[1], in[2], in[3], in[4], 0.3f, nullptr, nullptr, 4); },
              [](const R & v) { return ref::delta_net(v[0], v[1], v[2], v[3], v[4], 0.3); }});
    // With an initial state (its gradient too), one chunk larger than the sequence.
    std::vector<Input> in = net_inputs(4, 1, 3, 2, 5, 1);
    in.push_back({"state0", {4, 3, 2, 1}});
    check_op({"delta_net with state0", in,
              [](Context & c, const TV & x) { return rp::delta_net(c, x[0], x[1], x[2], x[3], x[4], 0.5f, x[5]); },
              [](const R & v) { return ref::delta_net(v[0], v[1], v[2], v[3], v[4], 0.5, &v[5]); }});
    // One token (generation's step) from a state.
    std::vector<Input> one = net_inputs(8, 2, 8, 2, 1, 2);
    one.push_back({"state0", {8, 8, 2, 2}});
    check_op({"delta_net one token", one,
              [](Context & c, const TV & x) { return rp::delta_net(c, x[0], x[1], x[2], x[3], x[4], 0.25f, x[5]); },
              [](const R & v) { return ref::delta_net(v[0], v[1], v[2], v[3], v[4], 0.25, &v[5]); }});
    // Packed examples: the state starts over at each example's first token, also in the middle of a chunk.
    const std::vector<int32_t> seg = seg_starts({{3, 6, 4}, {7, 6}});
    std::vector<Input> packed = net_inputs(6, 1, 4, 3, 13, 2);
    packed.push_back(ints("seg", seg));
    check_op({"delta_net packed", packed,
              [](Context & c, const TV & x) { return rp::delta_net(c, x[0], x[1], x[2], x[3], x[4], 0.4f, nullptr, x[5], 4); },
              [seg](const R & v) { return ref::delta_net(v[0], v[1], v[2], v[3], v[4], 0.4, nullptr, seg); }});
}

namespace {

struct NetRun {
    std::vector<float> o, state;
    std::vector<std::vector<float>> grads;  // q, k, v, g, beta, state0
};

std::vector<float> random_values(int64_t n, float lo, float hi, std::mt19937 & rng) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float & x : v) x = u(rng);
    return v;
}

struct NetData {
    int64_t Dk, Hk, Dv, Hv, T, B;
    std::vector<float> q, k, v, g, beta, state0, r;
    NetData(int64_t dk, int64_t hk, int64_t dv, int64_t hv, int64_t t, int64_t b) : Dk(dk), Hk(hk), Dv(dv), Hv(hv), T(t), B(b) {
        std::mt19937 rng(7);
        q = random_values(Dk * Hk * T * B, -1, 1, rng);
        k = random_values(Dk * Hk * T * B, -1, 1, rng);
        v = random_values(Dv * Hv * T * B, -1, 1, rng);
        g = random_values(Hv * T * B, -1.5f, -0.02f, rng);
        beta = random_values(Hv * T * B, 0.05f, 0.95f, rng);
        state0 = random_values(Dk * Dv * Hv * B, -1, 1, rng);
        r = random_values(Dv * Hv * T * B, -1, 1, rng);
    }
};

// Tokens [t0, t0 + n) of the data, from `state` (the state before t0); forward, and with grads the backward of
// sum(r * o) to every input.
NetRun run_net(const NetData & d, int64_t t0, int64_t n, const std::vector<float> & state, int64_t chunk, bool grads, int threads) {
    Context ctx;
    auto leaf = [&](const std::vector<float> & all, int64_t per_token, int64_t heads_ne0, int64_t heads_ne1, bool param = true) {
        // [heads_ne0, heads_ne1, n, B] cut from the token range of [.., T, B]
        Tensor * t = ctx.new_tensor(rp::DType::F32, heads_ne0, heads_ne1, n, d.B);
        ctx.alloc_data(t);
        std::vector<float> part;
        for (int64_t b = 0; b < d.B; ++b)
            part.insert(part.end(), all.begin() + (b * d.T + t0) * per_token, all.begin() + (b * d.T + t0 + n) * per_token);
        rp::tensor_set_f32(t, part);
        if (grads && param) {
            rp::set_param(ctx, t);
            ctx.alloc_data(t->grad);
        }
        return t;
    };
    Tensor * q = leaf(d.q, d.Dk * d.Hk, d.Dk, d.Hk);
    Tensor * k = leaf(d.k, d.Dk * d.Hk, d.Dk, d.Hk);
    Tensor * v = leaf(d.v, d.Dv * d.Hv, d.Dv, d.Hv);
    Tensor * g = leaf(d.g, d.Hv, d.Hv, 1);
    Tensor * beta = leaf(d.beta, d.Hv, d.Hv, 1);
    Tensor * r = leaf(d.r, d.Dv * d.Hv, d.Dv, d.Hv, false);
    Tensor * s0 = ctx.new_tensor(rp::DType::F32, d.Dk, d.Dv, d.Hv, d.B);
    ctx.alloc_data(s0);
    rp::tensor_set_f32(s0, state);
    if (grads) {
        rp::set_param(ctx, s0);
        ctx.alloc_data(s0->grad);
    }
    Tensor * o = rp::delta_net(ctx, q, k, v, g, beta, 0.35f, s0, nullptr, chunk);
    o->flags |= rp::kFlagOutput;
    Tensor * st = rp::delta_net_state(ctx, o);
    st->flags |= rp::kFlagOutput;
    Tensor * loss = rp::sum(ctx, rp::mul(ctx, o, r));
    rp::Graph gr;
    rp::build_forward(gr, loss);
    rp::build_forward(gr, st);
    if (grads) rp::build_backward(ctx, gr, loss, {q, k, v, g, beta, s0});
    rp::CpuBackend be;
    be.allocate(gr);
    be.compute(gr, threads);
    NetRun out{rp::tensor_get_f32(o), rp::tensor_get_f32(st), {}};
    if (grads)
        for (Tensor * t : {q, k, v, g, beta, s0}) out.grads.push_back(rp::tensor_get_f32(t->grad));
    return out;
}

bool same_bits(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

} // namespace

// The backward reads the forward's saved chunk states through a copy of them, never o itself: o (T x Dv x Hv floats,
// the layer's largest activation at long sequences) is then free before the backward's peak. The copy holds the
// states before tokens 0, chunk, 2 chunk, ... as o's aux bytes do.
TEST(OpDeltaNet, TheBackwardHoldsACopyOfTheChunkStatesNotTheOutput) {
    Context ctx;
    const int64_t Dk = 4, Hk = 1, Dv = 3, Hv = 2, T = 11, B = 2, chunk = 4, n_chunks = 3;
    std::mt19937 rng(5);
    auto leaf = [&](int64_t a, int64_t b, int64_t c, int64_t d, float lo, float hi) {
        Tensor * t = ctx.new_tensor(rp::DType::F32, a, b, c, d);
        ctx.alloc_data(t);
        rp::tensor_set_f32(t, random_values(t->nelements(), lo, hi, rng));
        rp::set_param(ctx, t);
        ctx.alloc_data(t->grad);
        return t;
    };
    Tensor * q = leaf(Dk, Hk, T, B, -1, 1);
    Tensor * k = leaf(Dk, Hk, T, B, -1, 1);
    Tensor * v = leaf(Dv, Hv, T, B, -1, 1);
    Tensor * g = leaf(Hv, T, B, 1, -1.5f, -0.02f);
    Tensor * beta = leaf(Hv, T, B, 1, 0.05f, 0.95f);
    Tensor * o = rp::delta_net(ctx, q, k, v, g, beta, 0.5f, nullptr, nullptr, chunk);
    o->flags |= rp::kFlagOutput;  // (kept, to read its saved states after the run)
    Tensor * loss = rp::sum(ctx, rp::mul(ctx, o, o));
    rp::Graph gr;
    rp::build_forward(gr, loss);
    rp::build_backward(ctx, gr, loss, {q, k, v, g, beta});
    const Tensor * back = nullptr;
    for (const Tensor * n : gr.nodes)
        if (n->op == rp::Op::DELTA_NET_BACK) back = n;
    ASSERT_NE(back, nullptr);
    for (const Tensor * s : back->src) EXPECT_TRUE(s == nullptr || (s != o && s->view_src != o)) << rp::describe(s);
    const Tensor * states = back->src[7];
    ASSERT_NE(states, nullptr);
    EXPECT_EQ(states->nelements(), n_chunks * Dk * Dv * Hv * B);
    rp::CpuBackend be;
    be.allocate(gr);
    be.compute(gr, 2);
    std::vector<float> saved(static_cast<size_t>(states->nelements()));
    std::memcpy(saved.data(), static_cast<const char *>(o->data) + o->nbytes(), saved.size() * sizeof(float));
    EXPECT_TRUE(same_bits(rp::tensor_get_f32(states), saved));
}

// The saved states only serve the backward's recompute: the output, the final state and every gradient have the
// same bits for any chunk (1, a divisor, a non-divisor, longer than the sequence) and thread count.
TEST(OpDeltaNet, ChunkSizeChangesNoBits) {
    const NetData d(16, 2, 8, 4, 23, 2);
    const NetRun base = run_net(d, 0, d.T, d.state0, 64, true, 1);
    ASSERT_EQ(base.grads.size(), 6u);
    for (const int64_t chunk : {1, 4, 5, 23}) {
        for (const int threads : {1, 2}) {
            const NetRun r = run_net(d, 0, d.T, d.state0, chunk, true, threads);
            EXPECT_TRUE(same_bits(r.o, base.o)) << "chunk " << chunk;
            EXPECT_TRUE(same_bits(r.state, base.state)) << "chunk " << chunk;
            for (size_t i = 0; i < r.grads.size(); ++i) EXPECT_TRUE(same_bits(r.grads[i], base.grads[i])) << "chunk " << chunk << " grad " << i;
        }
    }
}

// The default checkpoint interval (chunk 0): the power of two nearest sqrt(T Dv / 12), at least llama.cpp's 64, so a
// long sequence saves far fewer states (Qwen3.5's Dv 128 at 80k tokens: one every 1024 tokens, 16x fewer than
// every 64) while the backward's per-chunk recompute stays about as large; the node takes it, and its aux bytes
// hold that many states.
TEST(OpDeltaNet, TheDefaultChunkBalancesSavedStatesAndRecompute) {
    EXPECT_EQ(rp::delta_net_chunk(1, 128), 64);
    EXPECT_EQ(rp::delta_net_chunk(256, 128), 64);     // sqrt = 52
    EXPECT_EQ(rp::delta_net_chunk(2048, 64), 128);    // 105
    EXPECT_EQ(rp::delta_net_chunk(4096, 128), 256);   // 209
    EXPECT_EQ(rp::delta_net_chunk(81920, 128), 1024); // 935
    EXPECT_EQ(rp::delta_net_chunk(1 << 20, 128), 4096);
    for (int64_t T = 1; T <= (1 << 22); T *= 3) EXPECT_LE(rp::delta_net_chunk(T, 128), rp::delta_net_chunk(3 * T, 128)) << T;
    Context ctx;
    const int64_t Dk = 8, Hk = 1, Dv = 128, Hv = 2, T = 4096, B = 1;
    auto f32 = [&](int64_t a, int64_t b, int64_t c, int64_t d) { return ctx.new_tensor(rp::DType::F32, a, b, c, d); };
    Tensor * o = rp::delta_net(ctx, f32(Dk, Hk, T, B), f32(Dk, Hk, T, B), f32(Dv, Hv, T, B), f32(Hv, T, B, 1), f32(Hv, T, B, 1), 0.5f);
    EXPECT_EQ(o->param_i32(1), 256);
    EXPECT_EQ(o->aux_bytes, size_t(4096 / 256 + 1) * Dk * Dv * Hv * B * sizeof(float));
}

// The kernels run the value columns in groups side by side (cpu/delta_net.cpp): a column's bits are its own, whatever
// its group. Column 8 of 9 (the second group, alone) and columns 0 and 5 of 9 (in the first group of 8) against the
// same columns run as the only column of a problem: the output, the final state, and the gradients that stay
// within a column (v's and the initial state's) are the same bits, forward and backward, over a chunk boundary.
TEST(OpDeltaNet, AColumnsBitsDoNotDependOnItsGroup) {
    const NetData nine(16, 1, 9, 1, 13, 1);
    const NetRun all = run_net(nine, 0, nine.T, nine.state0, 4, true, 1);
    for (const int64_t j : {int64_t(0), int64_t(5), int64_t(8)}) {
        NetData one(16, 1, 1, 1, 13, 1);
        one.q = nine.q, one.k = nine.k, one.g = nine.g, one.beta = nine.beta;
        for (int64_t t = 0; t < nine.T; ++t) {
            one.v[size_t(t)] = nine.v[size_t(j + 9 * t)];
            one.r[size_t(t)] = nine.r[size_t(j + 9 * t)];
        }
        one.state0.assign(nine.state0.begin() + j * 16, nine.state0.begin() + (j + 1) * 16);
        const NetRun alone = run_net(one, 0, one.T, one.state0, 4, true, 1);
        for (int64_t t = 0; t < nine.T; ++t) {
            EXPECT_EQ(std::bit_cast<uint32_t>(alone.o[size_t(t)]), std::bit_cast<uint32_t>(all.o[size_t(j + 9 * t)])) << "o, column " << j << " token " << t;
            EXPECT_EQ(std::bit_cast<uint32_t>(alone.grads[2][size_t(t)]), std::bit_cast<uint32_t>(all.grads[2][size_t(j + 9 * t)]))
                << "dv, column " << j << " token " << t;
        }
        const std::vector<float> state(all.state.begin() + j * 16, all.state.begin() + (j + 1) * 16);
        const std::vector<float> dstate0(all.grads[5].begin() + j * 16, all.grads[5].begin() + (j + 1) * 16);
        EXPECT_TRUE(same_bits(alone.state, state)) << "column " << j;
        EXPECT_TRUE(same_bits(alone.grads[5], dstate0)) << "column " << j;
    }
}

// Generation: a sequence run as a prompt and then one token at a time, each call starting from the last one's final
// state, gives the outputs and final state of one call over the whole sequence, bit for bit.
TEST(OpDeltaNet, SplitRunsEqualOneRun) {
    const NetData d(8, 1, 8, 2, 9, 2);
    const NetRun whole = run_net(d, 0, d.T, d.state0, 4, false, 1);
    std::vector<float> state = d.state0, o;
    std::vector<std::vector<float>> parts;
    int64_t t = 0;
    for (const int64_t n : {5, 1, 1, 2}) {
        const NetRun r = run_net(d, t, n, state, 64, false, 1);
        state = r.state;
        parts.push_back(r.o);
        t += n;
    }
    ASSERT_EQ(t, d.T);
    // Reassemble [Dv, Hv, T, B] from the parts (each [Dv, Hv, n, B]).
    const int64_t row = d.Dv * d.Hv;
    std::vector<float> joined(whole.o.size());
    int64_t t0 = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
        const int64_t n = static_cast<int64_t>(parts[p].size()) / (row * d.B);
        for (int64_t b = 0; b < d.B; ++b)
            std::memcpy(&joined[static_cast<size_t>((b * d.T + t0) * row)], &parts[p][static_cast<size_t>(b * n * row)],
                        sizeof(float) * static_cast<size_t>(n * row));
        t0 += n;
    }
    EXPECT_TRUE(same_bits(joined, whole.o));
    EXPECT_TRUE(same_bits(state, whole.state));
    // And the final state is the reference's.
    ref::DT q({d.Dk, d.Hk, d.T, d.B}), k({d.Dk, d.Hk, d.T, d.B}), v({d.Dv, d.Hv, d.T, d.B}), g({d.Hv, d.T, d.B, 1}), beta({d.Hv, d.T, d.B, 1}),
        s0({d.Dk, d.Dv, d.Hv, d.B}), want_state;
    auto fill = [](ref::DT & dst, const std::vector<float> & x) { dst.v.assign(x.begin(), x.end()); };
    fill(q, d.q), fill(k, d.k), fill(v, d.v), fill(g, d.g), fill(beta, d.beta), fill(s0, d.state0);
    ref::delta_net(q, k, v, g, beta, 0.35, &s0, {}, &want_state);
    EXPECT_LT(rel_err(state, want_state.v), 1e-5);
}

// The conv state an ssm_conv leaves (the last K-1 inputs) continues a sequence as if it had run in one call.
TEST(OpSsmConv, StateCarriesOver) {
    std::mt19937 rng(3);
    const int64_t C = 5, T = 6, B = 2, K = 4;
    const std::vector<float> x = random_values(C * T * B, -1, 1, rng), w = random_values(K * C, -1, 1, rng);
    auto run = [&](int64_t t0, int64_t n, const std::vector<float> * prefix, std::vector<float> * state) {
        Context ctx;
        Tensor * xt = ctx.new_tensor(rp::DType::F32, C, n, B);
        Tensor * wt = ctx.new_tensor(rp::DType::F32, K, C);
        ctx.alloc_data(xt);
        ctx.alloc_data(wt);
        std::vector<float> part;
        for (int64_t b = 0; b < B; ++b) part.insert(part.end(), x.begin() + (b * T + t0) * C, x.begin() + (b * T + t0 + n) * C);
        rp::tensor_set_f32(xt, part);
        rp::tensor_set_f32(wt, w);
        Tensor * pt = nullptr;
        if (prefix) {
            pt = ctx.new_tensor(rp::DType::F32, C, K - 1, B);
            ctx.alloc_data(pt);
            rp::tensor_set_f32(pt, *prefix);
        }
        Tensor * y = rp::ssm_conv(ctx, xt, wt, pt);
        Tensor * st = rp::ssm_conv_state(ctx, y);
        y->flags |= rp::kFlagOutput;
        st->flags |= rp::kFlagOutput;
        rp::Graph g;
        rp::build_forward(g, y);
        rp::build_forward(g, st);
        rp::CpuBackend be;
        be.allocate(g);
        be.compute(g, 1);
        *state = rp::tensor_get_f32(st);
        return rp::tensor_get_f32(y);
    };
    std::vector<float> s_whole, s1, s2, s3;
    const std::vector<float> whole = run(0, T, nullptr, &s_whole);
    const std::vector<float> a = run(0, 4, nullptr, &s1);  // then 1 token (fewer than K-1), then 1 more
    const std::vector<float> b = run(4, 1, &s1, &s2);
    const std::vector<float> c = run(5, 1, &s2, &s3);
    EXPECT_TRUE(same_bits(s3, s_whole));
    for (int64_t bb = 0; bb < B; ++bb)
        for (int64_t ch = 0; ch < C; ++ch) {
            EXPECT_EQ(a[static_cast<size_t>(ch + C * (3 + 4 * bb))], whole[static_cast<size_t>(ch + C * (3 + T * bb))]);
            EXPECT_EQ(b[static_cast<size_t>(ch + C * bb)], whole[static_cast<size_t>(ch + C * (4 + T * bb))]);
            EXPECT_EQ(c[static_cast<size_t>(ch + C * bb)], whole[static_cast<size_t>(ch + C * (5 + T * bb))]);
        }
}

TEST(OpDeltaNet, Errors) {
    Context ctx;
    Tensor * q = ctx.new_tensor(rp::DType::F32, 4, 2, 3, 1);
    Tensor * v = ctx.new_tensor(rp::DType::F32, 4, 3, 3, 1);  // 3 value heads over 2 key heads
    Tensor * g = ctx.new_tensor(rp::DType::F32, 3, 3);
    EXPECT_THROW(rp::delta_net(ctx, q, q, v, g, g, 1.0f), rp::Error);
    Tensor * v4 = ctx.new_tensor(rp::DType::F32, 4, 4, 3, 1);
    Tensor * g4 = ctx.new_tensor(rp::DType::F32, 4, 3);
    EXPECT_THROW(rp::delta_net(ctx, q, q, v4, g, g4, 1.0f), rp::Error);  // g for 3 heads
    Tensor * seg = ctx.new_tensor(rp::DType::I32, 3);
    Tensor * s0 = ctx.new_tensor(rp::DType::F32, 4, 4, 4, 1);
    EXPECT_THROW(rp::delta_net(ctx, q, q, v4, g4, g4, 1.0f, s0, seg), rp::Error);  // a state for packed sequences
    EXPECT_THROW(rp::delta_net(ctx, q, q, v4, g4, g4, 1.0f, ctx.new_tensor(rp::DType::F32, 4, 4, 2, 1)), rp::Error);
    EXPECT_NO_THROW(rp::delta_net(ctx, q, q, v4, g4, g4, 1.0f, s0));
    try {
        rp::delta_net(ctx, q, q, v4, g4, g4, 1.0f, nullptr, nullptr, -1);
        ADD_FAILURE() << "a negative chunk was taken";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("chunk"), std::string::npos) << e.what();
    }
    Tensor * x = ctx.new_tensor(rp::DType::F32, 6, 5, 1);
    EXPECT_THROW(rp::ssm_conv(ctx, x, ctx.new_tensor(rp::DType::F32, 4, 5)), rp::Error);  // 5 channels of w, 6 of x
    EXPECT_THROW(rp::ssm_conv(ctx, x, ctx.new_tensor(rp::DType::F32, 4, 6), ctx.new_tensor(rp::DType::F32, 6, 2, 1)), rp::Error);
    EXPECT_THROW(rp::ssm_conv_state(ctx, x), rp::Error);
    EXPECT_THROW(rp::delta_net_state(ctx, x), rp::Error);
}
