// Element-wise ops, reductions, copies and views: forward vs the double reference, backward vs central
// finite differences, determinism across thread counts (see harness.h).
#include "harness.h"

#include <tuple>

#include "ggml_rp/core/fp16.h"

#include <gtest/gtest.h>

#include <cstring>

using namespace optest;
using rp::Context;
using rp::Tensor;
using TV = std::vector<Tensor *>;
using R = RefInputs;
using rp::Graph;

TEST(OpElementwise, AddSameShape) {
    check_op({"add [17,3]", {{"a", {17, 3, 1, 1}}, {"b", {17, 3, 1, 1}}},
              [](Context & c, const TV & in) { return rp::add(c, in[0], in[1]); },
              [](const R & x) { return ref::add(x[0], x[1]); }});
}

TEST(OpElementwise, AddBroadcastBias) {
    check_op({"add bias [17,5,2]+[17]", {{"a", {17, 5, 2, 1}}, {"bias", {17, 1, 1, 1}}},
              [](Context & c, const TV & in) { return rp::add(c, in[0], in[1]); },
              [](const R & x) { return ref::add(x[0], x[1]); }});
    check_op({"add bcast [1,5]+[1,1] size 1", {{"a", {1, 5, 1, 1}}, {"b", {1, 1, 1, 1}}},
              [](Context & c, const TV & in) { return rp::add(c, in[0], in[1]); },
              [](const R & x) { return ref::add(x[0], x[1]); }});
    check_op({"add bcast [3,4,6]+[1,4,3]", {{"a", {3, 4, 6, 1}}, {"b", {1, 4, 3, 1}}},
              [](Context & c, const TV & in) { return rp::add(c, in[0], in[1]); },
              [](const R & x) { return ref::add(x[0], x[1]); }});
}

TEST(OpElementwise, AddTransposedInput) {
    // a is a transposed (non-contiguous) view of a [5, 17] leaf.
    check_op({"add transposed [17,5]", {{"a_t", {5, 17, 1, 1}}, {"bias", {17, 1, 1, 1}}},
              [](Context & c, const TV & in) { return rp::add(c, rp::transpose(c, in[0]), in[1]); },
              [](const R & x) { return ref::add(ref::permute(x[0], 1, 0, 2, 3), x[1]); }});
}

TEST(OpElementwise, Mul) {
    check_op({"mul [127,3]*[127]", {{"a", {127, 3, 1, 1}}, {"b", {127, 1, 1, 1}}},
              [](Context & c, const TV & in) { return rp::mul(c, in[0], in[1]); },
              [](const R & x) { return ref::mul(x[0], x[1]); }});
    check_op({"mul self", {{"a", {17, 2, 1, 1}}},
              [](Context & c, const TV & in) { return rp::mul(c, in[0], in[0]); },
              [](const R & x) { return ref::mul(x[0], x[0]); }});
    check_op({"mul permuted [4,5,3]", {{"a", {5, 3, 4, 1}}, {"b", {4, 5, 3, 1}}},
              [](Context & c, const TV & in) { return rp::mul(c, rp::permute(c, in[0], 1, 2, 0, 3), in[1]); },
              [](const R & x) { return ref::mul(ref::permute(x[0], 1, 2, 0, 3), x[1]); }});
}

TEST(OpElementwise, Scale) {
    check_op({"scale [3,17]", {{"x", {3, 17, 1, 1}}},
              [](Context & c, const TV & in) { return rp::scale(c, in[0], -0.7f); },
              [](const R & x) { return ref::scale(x[0], static_cast<double>(-0.7f)); }});
}

// Gemma 2's final-logit soft-capping, c tanh(x / c): a cap that bends most inputs (1) and one that bends few (30,
// Gemma 2's), on inputs up to 40; its gradient (1 - tanh^2, built from the output) vs finite differences.
TEST(OpElementwise, Softcap) {
    for (const float cap : {1.0f, 30.0f}) {
        Input x{"x", {5, 13, 1, 1}};
        x.lo = -40.0f;
        x.hi = 40.0f;
        check_op({"softcap " + std::to_string(cap) + " [5,13]", {x}, [cap](Context & c, const TV & in) { return rp::softcap(c, in[0], cap); },
                  [cap](const R & in) {
                      ref::DT y = in[0];
                      for (double & v : y.v) v = cap * std::tanh(v / cap);
                      return y;
                  }});
    }
    Context ctx;
    EXPECT_THROW(rp::softcap(ctx, ctx.new_tensor(rp::DType::F32, 4), 0.0f), rp::Error);
}

TEST(OpElementwise, Silu) {
    Input x{"x", {127, 3, 1, 1}};
    x.lo = -6.0f;
    x.hi = 6.0f;
    check_op({"silu [127,3]", {x}, [](Context & c, const TV & in) { return rp::silu(c, in[0]); },
              [](const R & v) { return ref::silu(v[0]); }});
    Input one{"x", {1, 1, 1, 1}};
    check_op({"silu [1]", {one}, [](Context & c, const TV & in) { return rp::silu(c, in[0]); },
              [](const R & v) { return ref::silu(v[0]); }});
}

TEST(OpElementwise, Swiglu) {
    Input g{"gate", {17, 5, 1, 1}}, u{"up", {17, 5, 1, 1}};
    g.lo = -4.0f;
    g.hi = 4.0f;
    check_op({"swiglu [17,5]", {g, u}, [](Context & c, const TV & in) { return rp::swiglu(c, in[0], in[1]); },
              [](const R & v) { return ref::swiglu(v[0], v[1]); }});
    // Rows longer than the kernel's 512-element exp pieces.
    Input gl{"gate", {1100, 2, 1, 1}}, ul{"up", {1100, 2, 1, 1}};
    gl.lo = -10.0f;
    gl.hi = 10.0f;
    check_op({"swiglu [1100,2]", {gl, ul}, [](Context & c, const TV & in) { return rp::swiglu(c, in[0], in[1]); },
              [](const R & v) { return ref::swiglu(v[0], v[1]); }});
    // Transposed gate.
    Input gt{"gate_t", {5, 17, 1, 1}};
    check_op({"swiglu transposed gate", {gt, u},
              [](Context & c, const TV & in) { return rp::swiglu(c, rp::transpose(c, in[0]), in[1]); },
              [](const R & v) { return ref::swiglu(ref::permute(v[0], 1, 0, 2, 3), v[1]); }});
}

// gpt-oss's clamped form: alpha 1.702 and its limit 7, and a limit of 2 that clamps a third of the values.
TEST(OpElementwise, SwigluOai) {
    for (const auto & [alpha, limit, range] : {std::tuple<float, float, float>{1.702f, 7.0f, 10.0f}, {1.702f, 2.0f, 4.0f}, {0.5f, 1.0f, 3.0f}}) {
        Input g{"gate", {33, 4, 1, 1}}, u{"up", {33, 4, 1, 1}};
        g.lo = u.lo = -range;
        g.hi = u.hi = range;
        check_op({"swiglu_oai limit " + std::to_string(limit), {g, u},
                  [alpha, limit](Context & c, const TV & in) { return rp::swiglu_oai(c, in[0], in[1], alpha, limit); },
                  [alpha, limit](const R & v) { return ref::swiglu_oai(v[0], v[1], alpha, limit); }});
    }
    rp::Context ctx;
    rp::Tensor * a = ctx.new_tensor(rp::DType::F32, 4);
    EXPECT_THROW(rp::swiglu_oai(ctx, a, a, 1.0f, 0.0f), rp::Error);
}

// Gemma's GeGLU: over the tanh's saturation on both sides (|x| up to 8), and a transposed gate.
TEST(OpElementwise, Geglu) {
    Input g{"gate", {33, 4, 1, 1}}, u{"up", {33, 4, 1, 1}};
    g.lo = -8.0f;
    g.hi = 8.0f;
    check_op({"geglu [33,4]", {g, u}, [](Context & c, const TV & in) { return rp::geglu(c, in[0], in[1]); },
              [](const R & v) { return ref::geglu(v[0], v[1]); }});
    Input gt{"gate_t", {4, 33, 1, 1}};
    check_op({"geglu transposed gate", {gt, u}, [](Context & c, const TV & in) { return rp::geglu(c, rp::transpose(c, in[0]), in[1]); },
              [](const R & v) { return ref::geglu(ref::permute(v[0], 1, 0, 2, 3), v[1]); }});
}

TEST(OpElementwise, Softmax) {
    Input x{"x", {17, 3, 2, 1}};
    x.lo = -3.0f;
    x.hi = 3.0f;
    check_op({"softmax [17,3,2]", {x}, [](Context & c, const TV & in) { return rp::softmax(c, in[0]); },
              [](const R & v) { return ref::softmax(v[0]); }});
    check_op({"softmax transposed [3,17]^T", {{"x_t", {3, 17, 1, 1}}},
              [](Context & c, const TV & in) { return rp::softmax(c, rp::transpose(c, in[0])); },
              [](const R & v) { return ref::softmax(ref::permute(v[0], 1, 0, 2, 3)); }});
    check_op({"softmax [1,4]", {{"x", {1, 4, 1, 1}}}, [](Context & c, const TV & in) { return rp::softmax(c, in[0]); },
              [](const R & v) { return ref::softmax(v[0]); }});
}

TEST(OpElementwise, SumMean) {
    check_op({"sum [17,3]", {{"x", {17, 3, 1, 1}}}, [](Context & c, const TV & in) { return rp::sum(c, in[0]); },
              [](const R & v) { return ref::sum(v[0]); }});
    check_op({"mean [127,1,3]", {{"x", {127, 1, 3, 1}}}, [](Context & c, const TV & in) { return rp::mean(c, in[0]); },
              [](const R & v) { return ref::mean(v[0]); }});
    check_op({"sum transposed", {{"x", {3, 5, 1, 1}}},
              [](Context & c, const TV & in) { return rp::sum(c, rp::transpose(c, in[0])); },
              [](const R & v) { return ref::sum(v[0]); }});
}

TEST(OpElementwise, RepeatAndSumTo) {
    check_op({"repeat [3,1,2]->[6,4,2]", {{"x", {3, 1, 2, 1}}},
              [](Context & c, const TV & in) {
                  Tensor * like = c.new_tensor(rp::DType::F32, 6, 4, 2);
                  return rp::repeat(c, in[0], like);
              },
              [](const R & v) { return ref::repeat(v[0], {6, 4, 2, 1}); }});
    check_op({"sum_to [6,4,2,3]->[3,1,2,1]", {{"x", {6, 4, 2, 3}}},
              [](Context & c, const TV & in) {
                  Tensor * like = c.new_tensor(rp::DType::F32, 3, 1, 2, 1);
                  return rp::sum_to(c, in[0], like);
              },
              [](const R & v) { return ref::sum_to(v[0], {3, 1, 2, 1}); }});
    // More than one 256-column block per output row.
    check_op({"sum_to [600,3]->[300,1]", {{"x", {600, 3, 1, 1}}},
              [](Context & c, const TV & in) {
                  Tensor * like = c.new_tensor(rp::DType::F32, 300);
                  return rp::sum_to(c, in[0], like);
              },
              [](const R & v) { return ref::sum_to(v[0], {300, 1, 1, 1}); }});
}

TEST(OpElementwise, ContOfPermuted) {
    check_op({"cont permute(2,0,1) [3,4,5]", {{"x", {3, 4, 5, 1}}},
              [](Context & c, const TV & in) { return rp::cont(c, rp::permute(c, in[0], 2, 0, 1, 3)); },
              [](const R & v) { return ref::permute(v[0], 2, 0, 1, 3); }});
}

TEST(OpElementwise, ReshapeAndWindowViews) {
    check_op({"reshape [6,4]->[4,6] * w", {{"x", {6, 4, 1, 1}}, {"w", {4, 1, 1, 1}}},
              [](Context & c, const TV & in) { return rp::mul(c, rp::reshape(c, in[0], 4, 6), in[1]); },
              [](const R & v) {
                  ref::DT r({4, 6, 1, 1}, v[0].v);
                  return ref::mul(r, v[1]);
              }});
    // Rows 1..3 of an [8, 6] tensor: the gradient is zero outside the window.
    check_op({"window rows 1..3 of [8,6]", {{"x", {8, 6, 1, 1}}},
              [](Context & c, const TV & in) {
                  const int64_t ne[4] = {8, 3, 1, 1};
                  const size_t nb[4] = {4, 32, 96, 96};
                  return rp::silu(c, rp::view(c, in[0], ne, nb, 32));
              },
              [](const R & v) {
                  ref::DT w({8, 3, 1, 1});
                  for (int64_t i1 = 0; i1 < 3; ++i1)
                      for (int64_t i0 = 0; i0 < 8; ++i0) w(i0, i1) = v[0](i0, i1 + 1);
                  return ref::silu(w);
              }});
}

TEST(OpElementwise, CastRoundTrip) {
    // f32 -> f16 / bf16 -> f32 keeps exactly the rounded values (round to nearest even).
    Context ctx;
    Tensor * x = ctx.new_tensor(rp::DType::F32, 5, 3);
    ctx.alloc_data(x);
    const std::vector<float> v = {1.0f, -2.5f, 0.1f, 65504.0f, 1e-8f, 3.14159f, -0.0f, 100.0f, 0.33333f, 7.0f,
                                  1.0009765625f, 2049.0f, -1e-3f, 0.5f, 12345.678f};
    rp::tensor_set_f32(x, v);
    Tensor * h = rp::cast(ctx, rp::transpose(ctx, x), rp::DType::F16);
    Tensor * b = rp::cast(ctx, x, rp::DType::BF16);
    h->flags |= rp::kFlagOutput;
    b->flags |= rp::kFlagOutput;
    Tensor * back = rp::cast(ctx, h, rp::DType::F32);
    back->flags |= rp::kFlagOutput;
    rp::Graph g;
    rp::build_forward(g, back);
    rp::build_forward(g, b);
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, 2);
    const std::vector<float> hv = rp::tensor_get_f32(h), bv = rp::tensor_get_f32(b), bk = rp::tensor_get_f32(back);
    for (int64_t i1 = 0; i1 < 5; ++i1)
        for (int64_t i0 = 0; i0 < 3; ++i0) {
            const float src = v[static_cast<size_t>(i1 + 5 * i0)];
            EXPECT_EQ(hv[static_cast<size_t>(i0 + 3 * i1)], rp::fp16_to_fp32(rp::fp32_to_fp16(src)));
            EXPECT_EQ(bk[static_cast<size_t>(i0 + 3 * i1)], hv[static_cast<size_t>(i0 + 3 * i1)]);
        }
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(bv[i], rp::bf16_to_fp32(rp::fp32_to_bf16(v[i])));
}

// copy_into: src lands in a window of another tensor (a KV cache's rows), converted to its type, the rest untouched;
// a shape that differs, or a destination that is not a view, is refused.
TEST(OpElementwise, CopyIntoAWindow) {
    Context ctx;
    Tensor * cache = ctx.new_tensor(rp::DType::F16, 4, 5);
    ctx.alloc_data(cache);
    std::memset(cache->data, 0, cache->nbytes());
    Tensor * src = ctx.new_tensor(rp::DType::F32, 4, 2);
    ctx.alloc_data(src);
    rp::tensor_set_f32(src, {1, 2, 3, 4, 5, 6, 7, 8.5f});
    const int64_t ne[4] = {4, 2, 1, 1};
    const size_t nb[4] = {2, 8, 16, 16};
    Tensor * w = rp::copy_into(ctx, rp::view(ctx, cache, ne, nb, 2 * 8), src);  // rows 2 and 3
    rp::Graph g;
    rp::build_forward(g, w);
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, 1);
    const std::vector<float> got = rp::tensor_get_f32(cache);
    const std::vector<float> want = {0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8.5f, 0, 0, 0, 0};
    EXPECT_EQ(got, want);
    EXPECT_THROW(rp::copy_into(ctx, rp::view(ctx, cache, ne, nb, 0), ctx.new_tensor(rp::DType::F32, 4, 3)), rp::Error);
    EXPECT_THROW(rp::copy_into(ctx, cache, src), rp::Error);  // not a view
}

// move_window: a built graph replayed at another place of its cache: the write moved to rows 0 and 1, a read
// over axis 2 grown to more rows; a window moved past its root's end is refused by name.
TEST(OpElementwise, MoveWindowReplaysAGraphElsewhereInItsRoot) {
    Context ctx;
    Tensor * cache = ctx.new_tensor(rp::DType::F32, 2, 2, 4);  // [D, H, n_ctx]
    ctx.alloc_data(cache);
    std::memset(cache->data, 0, cache->nbytes());
    Tensor * src = ctx.new_tensor(rp::DType::F32, 2, 2, 1);
    ctx.alloc_data(src);
    const int64_t wne[4] = {2, 2, 1, 1};
    const size_t wnb[4] = {4, 8, 16, 16};
    Tensor * w = rp::copy_into(ctx, rp::view(ctx, cache, wne, wnb, 2 * 16), src);  // row 2
    const int64_t rne[4] = {2, 2, 3, 1};
    const size_t rnb[4] = {4, 8, 16, 48};
    Tensor * total = rp::sum(ctx, rp::after(ctx, rp::view(ctx, cache, rne, rnb, 0), w));  // rows [0, 3)
    rp::Graph g;
    rp::build_forward(g, total);
    rp::CpuBackend be;
    auto run = [&](float value) {
        rp::tensor_set_f32(src, {value, value, value, value});
        be.allocate(g);
        be.compute(g, 1);
        return rp::tensor_get_f32(total)[0];
    };
    EXPECT_EQ(run(1), 4.0f);  // row 2 written, rows 0..2 read
    std::vector<Tensor *> reads;
    for (Tensor * n : g.nodes)
        if (n->view_src == cache && n->op != rp::Op::CPY) reads.push_back(n);
    ASSERT_EQ(reads.size(), 2u);  // the window and the after() that orders it
    rp::move_window(w, 3 * 16);  // row 3
    for (Tensor * r : reads) rp::move_window(r, 0, 4);  // rows [0, 4)
    EXPECT_EQ(run(2), 12.0f);  // 4 x 1 in row 2 + 4 x 2 in row 3
    const std::vector<float> c = rp::tensor_get_f32(cache);
    EXPECT_EQ(c[12], 2.0f);
    EXPECT_EQ(c[0], 0.0f);
    try {
        rp::move_window(w, 4 * 16);  // past the last row
        FAIL() << "a window outside its root was moved";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("move_window"), std::string::npos) << e.what();
    }
    EXPECT_THROW(rp::move_window(cache, 0), rp::Error);  // not a view
}

TEST(OpElementwise, ShapeErrorsNameOpAndShapes) {
    Context ctx;
    Tensor * a = ctx.new_tensor(rp::DType::F32, 4, 3);
    Tensor * b = ctx.new_tensor(rp::DType::F32, 3, 3);
    try {
        rp::add(ctx, a, b);
        FAIL() << "no error";
    } catch (const rp::Error & e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("add"), std::string::npos) << m;
        EXPECT_NE(m.find("[4, 3, 1, 1]"), std::string::npos) << m;
        EXPECT_NE(m.find("[3, 3, 1, 1]"), std::string::npos) << m;
    }
    EXPECT_THROW(rp::reshape(ctx, a, 5, 2), rp::Error);
    EXPECT_THROW(rp::reshape(ctx, rp::transpose(ctx, a), 12), rp::Error);  // not contiguous
    EXPECT_THROW(rp::permute(ctx, a, 0, 0, 1, 2), rp::Error);
    EXPECT_THROW(rp::swiglu(ctx, a, b), rp::Error);
    Tensor * i = ctx.new_tensor(rp::DType::I32, 4, 3);
    EXPECT_THROW(rp::silu(ctx, i), rp::Error);
    const int64_t ne[4] = {4, 4, 1, 1};
    const size_t nb[4] = {4, 16, 64, 64};
    EXPECT_THROW(rp::view(ctx, a, ne, nb, 0), rp::Error);  // reaches outside a
}

// The SiLU family's contiguous rows (exp in vector pieces) and strided rows (one element at a time) compute
// the same bits, forward and backward, gate values from underflow to overflow of exp(-x) included.
TEST(OpElementwise, SiluContiguousAndStridedRowsAgreeBitwise) {
    Context ctx;
    const int64_t n = 600, rows = 3;
    auto leaf = [&](int64_t ne0, int64_t ne1, float lo, float hi, uint32_t seed) {
        Tensor * t = ctx.new_tensor(rp::DType::F32, ne0, ne1);
        ctx.alloc_data(t);
        std::vector<float> v(static_cast<size_t>(ne0 * ne1));
        for (size_t i = 0; i < v.size(); ++i) v[i] = lo + (hi - lo) * static_cast<float>((i * 2654435761u + seed) % 10007) / 10006.0f;
        rp::tensor_set_f32(t, v);
        return t;
    };
    Tensor * g = leaf(n, rows, -100.0f, 100.0f, 1);
    Tensor * u = leaf(n, rows, -2.0f, 2.0f, 2);
    Tensor * dy = leaf(n, rows, -1.0f, 1.0f, 3);
    // The same values as g, read through a transposed view of its transposed copy.
    Tensor * gt = rp::transpose(ctx, rp::cont(ctx, rp::transpose(ctx, g)));
    Graph graph;
    std::vector<Tensor *> outs;
    for (Tensor * x : {g, gt}) {
        outs.push_back(rp::silu(ctx, x));
        outs.push_back(rp::swiglu(ctx, x, u));
        outs.push_back(rp::silu_back(ctx, x, dy));
        outs.push_back(rp::swiglu_back(ctx, x, u, dy, 0));
        outs.push_back(rp::swiglu_back(ctx, x, u, dy, 1));
    }
    for (Tensor * o : outs) {
        o->flags |= rp::kFlagOutput;
        rp::build_forward(graph, o);
    }
    rp::CpuBackend be;
    be.allocate(graph);
    be.compute(graph, 2);
    for (size_t i = 0; i < outs.size() / 2; ++i) {
        const std::vector<float> a = rp::tensor_get_f32(outs[i]), b = rp::tensor_get_f32(outs[i + outs.size() / 2]);
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "output " << i;
    }
}
