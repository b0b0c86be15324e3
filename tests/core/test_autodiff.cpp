// build_backward semantics: accumulation across executions, only params are written, unreachable
// subgraphs are skipped, seeded (pipeline-stage) gradients, errors.
#include "ggml_rp/ggml_rp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using rp::Context;
using rp::DType;
using rp::Tensor;

namespace {

Tensor * random_leaf(Context & ctx, std::mt19937 & rng, const char * name, int64_t ne0, int64_t ne1 = 1) {
    Tensor * t = rp::set_name(ctx.new_tensor(DType::F32, ne0, ne1), name);
    ctx.alloc_data(t);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(t->nelements()));
    for (float & x : v) x = u(rng);
    rp::tensor_set_f32(t, v);
    return t;
}

bool graph_has_op(const rp::Graph & g, rp::Op op) {
    for (const Tensor * n : g.nodes)
        if (n->op == op) return true;
    return false;
}

} // namespace

TEST(CoreAutodiff, AccumulatesAcrossExecutions) {
    std::mt19937 rng(3);
    Context ctx;
    Tensor * W = random_leaf(ctx, rng, "W", 8, 4);
    Tensor * b = random_leaf(ctx, rng, "b", 4);
    Tensor * x = random_leaf(ctx, rng, "x", 8, 3);
    Tensor * loss = rp::mean(ctx, rp::silu(ctx, rp::add(ctx, rp::mul_mat(ctx, W, x), b)));
    rp::Graph g;
    rp::build_forward(g, loss);
    rp::set_param(ctx, W);
    rp::set_param(ctx, b);
    ctx.alloc_data(W->grad);
    ctx.alloc_data(b->grad);
    rp::build_backward(ctx, g, loss, {W, b});
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, 2);
    const std::vector<float> gw1 = rp::tensor_get_f32(W->grad), gb1 = rp::tensor_get_f32(b->grad);
    be.compute(g, 1);
    const std::vector<float> gw2 = rp::tensor_get_f32(W->grad), gb2 = rp::tensor_get_f32(b->grad);
    bool nonzero = false;
    for (size_t i = 0; i < gw1.size(); ++i) {
        EXPECT_EQ(gw2[i], 2.0f * gw1[i]) << i;
        nonzero |= gw1[i] != 0.0f;
    }
    for (size_t i = 0; i < gb1.size(); ++i) EXPECT_EQ(gb2[i], 2.0f * gb1[i]) << i;
    EXPECT_TRUE(nonzero);
}

TEST(CoreAutodiff, FrozenWeightsGetNoGradient) {
    std::mt19937 rng(4);
    Context ctx;
    Tensor * W1 = random_leaf(ctx, rng, "W1", 6, 5);  // frozen, but someone gave it a grad buffer
    Tensor * W2 = random_leaf(ctx, rng, "W2", 5, 2);  // trained
    Tensor * x = random_leaf(ctx, rng, "x", 6, 3);
    W1->grad = ctx.new_tensor(DType::F32, 6, 5);
    ctx.alloc_data(W1->grad);
    rp::tensor_set_f32(W1->grad, std::vector<float>(30, 42.0f));
    Tensor * loss = rp::sum(ctx, rp::mul_mat(ctx, W2, rp::silu(ctx, rp::mul_mat(ctx, W1, x))));
    rp::Graph g;
    rp::build_forward(g, loss);
    rp::set_param(ctx, W2);
    ctx.alloc_data(W2->grad);
    rp::build_backward(ctx, g, loss, {W2});
    // Nothing below W2's input needs a gradient: no node reads or writes W1's buffer, and the backward
    // stops at W2 (no mul_mat_back_x, no silu_back).
    for (const Tensor * n : g.nodes) {
        for (const Tensor * s : n->src) EXPECT_NE(s, W1->grad);
        EXPECT_NE(n->view_src, W1->grad);
    }
    EXPECT_FALSE(graph_has_op(g, rp::Op::MUL_MAT_BACK_X));
    EXPECT_FALSE(graph_has_op(g, rp::Op::SILU_BACK));
    EXPECT_TRUE(graph_has_op(g, rp::Op::OUT_PROD));
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, 2);
    for (float v : rp::tensor_get_f32(W1->grad)) EXPECT_EQ(v, 42.0f);
}

TEST(CoreAutodiff, UnreachableBranchesAreSkipped) {
    std::mt19937 rng(5);
    Context ctx;
    Tensor * W = random_leaf(ctx, rng, "W", 4, 4);
    Tensor * x = random_leaf(ctx, rng, "x", 4, 2);
    Tensor * z = random_leaf(ctx, rng, "z", 4, 2);
    Tensor * unused = random_leaf(ctx, rng, "unused", 3);
    // The softmax branch depends on no param.
    Tensor * loss = rp::add(ctx, rp::sum(ctx, rp::mul_mat(ctx, W, x)), rp::sum(ctx, rp::softmax(ctx, z)));
    rp::Graph g;
    rp::build_forward(g, loss);
    for (Tensor * p : {W, unused}) {
        rp::set_param(ctx, p);
        ctx.alloc_data(p->grad);
    }
    rp::tensor_set_f32(unused->grad, {1.0f, 2.0f, 3.0f});
    const size_t before = g.nodes.size();
    rp::build_backward(ctx, g, loss, {W, unused});
    EXPECT_GT(g.nodes.size(), before);
    EXPECT_FALSE(graph_has_op(g, rp::Op::SOFTMAX_BACK));
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, 2);
    EXPECT_EQ(rp::tensor_get_f32(unused->grad), (std::vector<float>{1.0f, 2.0f, 3.0f}));
    // d/dW sum(W x) = sum over t of x[k, t] for every n.
    const std::vector<float> xv = rp::tensor_get_f32(x), gw = rp::tensor_get_f32(W->grad);
    for (int n = 0; n < 4; ++n)
        for (int k = 0; k < 4; ++k) EXPECT_NEAR(gw[static_cast<size_t>(k + 4 * n)], xv[static_cast<size_t>(k)] + xv[static_cast<size_t>(k + 4)], 1e-6);

    // A loss that no param reaches adds nothing.
    rp::Graph g2;
    Tensor * l2 = rp::sum(ctx, rp::softmax(ctx, z));
    rp::build_forward(g2, l2);
    const size_t n2 = g2.nodes.size();
    rp::build_backward(ctx, g2, l2, {W});
    EXPECT_EQ(g2.nodes.size(), n2 + 0);
}

TEST(CoreAutodiff, SeededStageBackward) {
    // A pipeline stage y = W x receives dy from the next stage: dx = W^T dy, dW = x dy^T, by hand.
    std::mt19937 rng(6);
    Context ctx;
    Tensor * W = random_leaf(ctx, rng, "W", 5, 3);
    Tensor * x = random_leaf(ctx, rng, "x", 5, 2);
    Tensor * dy = random_leaf(ctx, rng, "dy", 3, 2);
    Tensor * y = rp::mul_mat(ctx, W, x);
    rp::Graph g;
    rp::build_forward(g, y);
    for (Tensor * p : {W, x}) {
        rp::set_param(ctx, p);
        ctx.alloc_data(p->grad);
    }
    rp::build_backward(ctx, g, y, dy, {W, x});
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, 1);
    const std::vector<float> w = rp::tensor_get_f32(W), xv = rp::tensor_get_f32(x), d = rp::tensor_get_f32(dy);
    const std::vector<float> gx = rp::tensor_get_f32(x->grad), gw = rp::tensor_get_f32(W->grad);
    for (int t = 0; t < 2; ++t)
        for (int k = 0; k < 5; ++k) {
            double s = 0.0;
            for (int n = 0; n < 3; ++n) s += static_cast<double>(w[static_cast<size_t>(k + 5 * n)]) * d[static_cast<size_t>(n + 3 * t)];
            EXPECT_NEAR(gx[static_cast<size_t>(k + 5 * t)], s, 1e-6);
        }
    for (int n = 0; n < 3; ++n)
        for (int k = 0; k < 5; ++k) {
            double s = 0.0;
            for (int t = 0; t < 2; ++t) s += static_cast<double>(xv[static_cast<size_t>(k + 5 * t)]) * d[static_cast<size_t>(n + 3 * t)];
            EXPECT_NEAR(gw[static_cast<size_t>(k + 5 * n)], s, 1e-6);
        }
}

// A stage backward that recomputes its forward: y = x + W2 silu(W1 x), or with a LoRA branch on W2 added into its
// product in place (mul_mat's into). Nothing the backward reads comes from the last product(s) or the residual sum, so
// prune_unused drops them (an output-flagged node stays, with what it reads); the gradients are the same bits as the
// whole graph's.
TEST(CoreAutodiff, PruningTheUnreadForwardKeepsTheGradients) {
    for (bool lora : {false, true})
    for (bool flag_output : {false, true}) {
        SCOPED_TRACE(std::string(lora ? "lora" : "plain") + (flag_output ? ", top flagged" : ""));
        std::vector<std::vector<float>> grads[2];
        size_t nodes[2] = {0, 0};
        for (int pruned = 0; pruned < 2; ++pruned) {
            std::mt19937 rng(7);
            Context ctx;
            Tensor * W1 = random_leaf(ctx, rng, "W1", 6, 4);
            Tensor * W2 = random_leaf(ctx, rng, "W2", 4, 6);
            Tensor * x = random_leaf(ctx, rng, "x", 6, 3);
            Tensor * dy = random_leaf(ctx, rng, "dy", 6, 3);
            Tensor * A = random_leaf(ctx, rng, "A", 4, 2);
            Tensor * B = random_leaf(ctx, rng, "B", 2, 6);
            Tensor * h = rp::silu(ctx, rp::mul_mat(ctx, W1, x));
            Tensor * u = lora ? rp::mul_mat(ctx, A, h) : nullptr;
            Tensor * top = rp::mul_mat(ctx, W2, h);
            Tensor * branch = lora ? rp::mul_mat(ctx, B, u, top) : nullptr;   // into top, in place
            Tensor * y = rp::add(ctx, x, lora ? branch : top);
            if (flag_output) (lora ? branch : top)->flags |= rp::kFlagOutput;
            rp::Graph g;
            rp::build_forward(g, y);
            std::vector<Tensor *> params{W1, W2, x};
            if (lora) params = {W1, A, B, x};
            for (Tensor * p : params) {
                rp::set_param(ctx, p);
                ctx.alloc_data(p->grad);
            }
            rp::build_backward(ctx, g, y, dy, params);
            if (pruned) rp::prune_unused(g);
            nodes[pruned] = g.nodes.size();
            EXPECT_EQ(g.contains(y), !pruned);
            EXPECT_EQ(g.contains(top), !pruned || flag_output);
            if (lora) {
                EXPECT_EQ(g.contains(branch), !pruned || flag_output);
                EXPECT_TRUE(g.contains(u));  // B's gradient reads it
            }
            EXPECT_TRUE(g.contains(h));  // W2's (or A's) gradient reads it
            rp::CpuBackend be;
            be.allocate(g);
            be.compute(g, 1);
            for (Tensor * p : params) grads[pruned].push_back(rp::tensor_get_f32(p->grad));
        }
        EXPECT_EQ(nodes[1], nodes[0] - (flag_output ? 1 : lora ? 3 : 2));
        EXPECT_EQ(grads[0], grads[1]);
    }
}

// An activation read by several products gets one gradient buffer: the first product's input gradient is a fresh
// buffer its tensor owns, and the others' GEMMs add into it (one buffer of x's size less, no add's pass). A gradient
// handed on as it is (an add's dy, its sources' gradient too) is never added into in place.
TEST(CoreAutodiff, SeveralContributionsAddIntoOneOwnedBuffer) {
    std::mt19937 rng(11);
    Context ctx;
    Tensor * W1 = random_leaf(ctx, rng, "W1", 16, 16);
    Tensor * W2 = random_leaf(ctx, rng, "W2", 16, 16);
    Tensor * W3 = random_leaf(ctx, rng, "W3", 16, 16);
    Tensor * x = random_leaf(ctx, rng, "x", 16, 64);
    Tensor * dy = random_leaf(ctx, rng, "dy", 16, 64);
    Tensor * h = rp::silu(ctx, x);
    // h feeds three products; a = silu(h) reaches the output twice through adds that hand dy on unchanged.
    Tensor * a = rp::silu(ctx, h);
    Tensor * y = rp::add(ctx, rp::add(ctx, rp::add(ctx, rp::mul_mat(ctx, W1, h), rp::mul_mat(ctx, W2, h)), rp::mul_mat(ctx, W3, h)),
                         rp::add(ctx, a, rp::scale(ctx, a, 0.5f)));
    rp::Graph g;
    rp::build_forward(g, y);
    const size_t forward_nodes = g.nodes.size();
    rp::set_param(ctx, x);
    ctx.alloc_data(x->grad);
    rp::build_backward(ctx, g, y, dy, {x});
    int in_place = 0, summed = 0, accumulating = 0;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Tensor * n = g.nodes[i];
        accumulating += n->op == rp::Op::MUL_MAT_BACK_X && n->src[2] != nullptr;
        if (n->op != rp::Op::ADD) continue;
        if (n->is_view()) ++in_place;
        else if (i >= forward_nodes) ++summed;
    }
    // h's four terms, in the reverse walk's order: silu(h)'s (a's gradient, handed on: not h's own), W3's (a new sum
    // h owns), then W2's and W1's added into it by their GEMMs (mul_mat_back_x's into); x's gradient into its param
    // buffer in place. a's two terms (dy handed on unchanged, then 0.5 dy) make a new sum: dy is also y's sources'
    // gradient.
    EXPECT_EQ(accumulating, 2);
    EXPECT_EQ(in_place, 1);
    EXPECT_EQ(summed, 2);
    rp::CpuBackend be;
    be.allocate(g);
    rp::tensor_set_f32(x->grad, std::vector<float>(static_cast<size_t>(x->nelements()), 0.0f));
    be.compute(g, 2);
    const std::vector<float> got = rp::tensor_get_f32(x->grad);

    // The double reference: dh = W1^T dy + W2^T dy + W3^T dy + silu'(h) (dy + 0.5 dy), dx = silu'(x) dh.
    const std::vector<float> xv = rp::tensor_get_f32(x), d = rp::tensor_get_f32(dy);
    const std::vector<float> w[3] = {rp::tensor_get_f32(W1), rp::tensor_get_f32(W2), rp::tensor_get_f32(W3)};
    auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
    auto dsilu = [](double v) { const double s = 1.0 / (1.0 + std::exp(-v)); return s * (1.0 + v * (1.0 - s)); };
    for (int64_t t = 0; t < 64; ++t)
        for (int64_t i = 0; i < 16; ++i) {
            const double xi = xv[static_cast<size_t>(t * 16 + i)], hi = silu(xi);
            double dh = dsilu(hi) * 1.5 * d[static_cast<size_t>(t * 16 + i)];
            for (const std::vector<float> & wk : w)
                for (int64_t o = 0; o < 16; ++o) dh += double(wk[static_cast<size_t>(o * 16 + i)]) * d[static_cast<size_t>(t * 16 + o)];
            const double want = dsilu(xi) * dh;
            EXPECT_NEAR(got[static_cast<size_t>(t * 16 + i)], want, 1e-4 * (1.0 + std::fabs(want))) << t << " " << i;
        }
}

TEST(CoreAutodiff, Errors) {
    Context ctx;
    Tensor * W = ctx.new_tensor(DType::F32, 4, 4);
    Tensor * x = ctx.new_tensor(DType::F32, 4, 2);
    Tensor * y = rp::mul_mat(ctx, W, x);
    rp::Graph g;
    rp::build_forward(g, y);
    EXPECT_THROW(rp::build_backward(ctx, g, y, {W}), rp::Error);          // not a scalar
    EXPECT_THROW(rp::set_param(ctx, y), rp::Error);                       // not a leaf
    EXPECT_THROW(rp::set_param(ctx, ctx.new_tensor(DType::F16, 4)), rp::Error);  // not f32
    Tensor * l = rp::sum(ctx, x);
    EXPECT_THROW(rp::build_backward(ctx, g, l, {W}), rp::Error);          // loss not in the graph
    // An op without a backward rule on the path to a param.
    Tensor * sb = rp::sum(ctx, rp::silu_back(ctx, x, x));
    rp::Graph g2;
    rp::build_forward(g2, sb);
    try {
        rp::build_backward(ctx, g2, sb, {x});
        FAIL() << "no error";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("SILU_BACK"), std::string::npos) << e.what();
    }
}
