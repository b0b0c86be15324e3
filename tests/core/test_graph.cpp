// Lazy graphs: topological order, sharing, dumps.
#include "ggml_rp/ggml_rp.h"

#include <gtest/gtest.h>

#include <algorithm>

using rp::Context;
using rp::DType;
using rp::Tensor;

TEST(CoreGraph, TopologicalOrder) {
    Context ctx;
    Tensor * x = rp::set_name(ctx.new_tensor(DType::F32, 8, 2), "x");
    Tensor * w = rp::set_name(ctx.new_tensor(DType::F32, 8, 4), "w");
    Tensor * y = rp::mul_mat(ctx, w, x);
    Tensor * z = rp::add(ctx, rp::silu(ctx, y), rp::scale(ctx, y, 2.0f));
    Tensor * l = rp::sum(ctx, z);
    rp::Graph g;
    rp::build_forward(g, l);
    EXPECT_EQ(g.leafs.size(), 2u);
    EXPECT_EQ(g.nodes.size(), 5u);  // mul_mat, silu, scale, add, sum (y appears once)
    EXPECT_EQ(g.nodes.back(), l);
    auto pos = [&](const Tensor * t) { return std::find(g.nodes.begin(), g.nodes.end(), t) - g.nodes.begin(); };
    for (size_t i = 0; i < g.nodes.size(); ++i)
        for (const Tensor * s : g.nodes[i]->src)
            if (s && !s->is_leaf()) {
                EXPECT_LT(pos(s), static_cast<ptrdiff_t>(i));
            }
    // Expanding with a tensor already in the graph adds nothing; a new one appends.
    rp::build_forward(g, z);
    EXPECT_EQ(g.nodes.size(), 5u);
    Tensor * extra = rp::scale(ctx, z, 3.0f);
    rp::build_forward(g, extra);
    EXPECT_EQ(g.nodes.size(), 6u);
    EXPECT_EQ(g.nodes.back(), extra);
}

TEST(CoreGraph, DeepChainDoesNotRecurse) {
    Context ctx;
    Tensor * t = ctx.new_tensor(DType::F32, 4);
    for (int i = 0; i < 100000; ++i) t = rp::scale(ctx, t, 1.0f);
    rp::Graph g;
    rp::build_forward(g, t);
    EXPECT_EQ(g.nodes.size(), 100000u);
}

TEST(CoreGraph, Dumps) {
    Context ctx;
    Tensor * x = rp::set_name(ctx.new_tensor(DType::F32, 8, 2), "x");
    Tensor * w = rp::set_name(ctx.new_tensor(DType::Q8_0, 32, 4), "w\"quoted\"");
    Tensor * y = rp::set_name(rp::silu(ctx, rp::transpose(ctx, x)), "y");
    (void) w;
    rp::Graph g;
    rp::build_forward(g, y);
    rp::build_forward(g, w);
    const std::string text = rp::graph_dump_text(g);
    EXPECT_NE(text.find("SILU"), std::string::npos) << text;
    EXPECT_NE(text.find("VIEW"), std::string::npos) << text;
    EXPECT_NE(text.find("[2, 8, 1, 1]"), std::string::npos) << text;
    EXPECT_NE(text.find("q8_0"), std::string::npos) << text;
    const std::string dot = rp::graph_dump_dot(g);
    EXPECT_EQ(dot.rfind("digraph G {", 0), 0u);
    std::string edge(1, 't');
    edge += std::to_string(x->id);
    edge += " -> t";
    EXPECT_NE(dot.find(edge), std::string::npos) << dot;
    EXPECT_NE(dot.find("w\\\"quoted\\\""), std::string::npos) << dot;
    EXPECT_EQ(dot.substr(dot.size() - 2), "}\n");
}

// build_backward's order: the tensors in the order they were created where their sources allow it, each source
// before its consumers (also one assigned after its consumer was created), nothing already in the graph twice.
TEST(CoreGraph, CreationOrderWhereTheSourcesAllowIt) {
    Context ctx;
    Tensor * x = rp::set_name(ctx.new_tensor(DType::F32, 8, 2), "x");
    Tensor * a = rp::silu(ctx, x);           // in the graph before
    Tensor * b = rp::scale(ctx, x, 2.0f);    // created before c, d, e; read only by the last
    Tensor * c = rp::scale(ctx, a, 3.0f);
    Tensor * d = rp::scale(ctx, c, 4.0f);
    Tensor * e = rp::fill(ctx, x, 0.0f);     // created before f, f made its source below
    Tensor * f = rp::scale(ctx, a, 5.0f);
    e->src[0] = f;                           // (as fill_after orders a buffer after what it waits for)
    Tensor * last = rp::add(ctx, rp::add(ctx, d, b), e);
    rp::Graph g;
    rp::build_forward(g, a);
    ASSERT_EQ(g.nodes.size(), 1u);
    // A depth-first walk from `last` would take d's chain, then b, then f, e; from `e` first: f before everything.
    rp::build_forward_in_creation_order(g, {e, last, d});
    std::vector<const Tensor *> got(g.nodes.begin(), g.nodes.end());
    const std::vector<const Tensor *> want = {a, b, c, d, f, e, last->src[0], last};
    EXPECT_EQ(got, want);
    EXPECT_EQ(g.leafs.size(), 1u);
    EXPECT_TRUE(g.contains(x) && g.contains(f) && g.contains(last));
    // Roots and sources already in the graph add nothing.
    rp::build_forward_in_creation_order(g, {last, a, nullptr});
    EXPECT_EQ(g.nodes.size(), want.size());
}
