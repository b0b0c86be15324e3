// mul_mat with every weight dtype, broadcast batches and strided operands; out_prod / mul_mat_back_x through
// the backward; lora_linear.
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

Case mm(std::string name, std::array<int64_t, 4> w, std::array<int64_t, 4> x) {
    return {name, {{"W", w}, {"X", x}}, [](Context & c, const TV & in) { return rp::mul_mat(c, in[0], in[1]); },
            [](const R & v) { return ref::mul_mat(v[0], v[1]); }};
}

} // namespace

TEST(OpMulMat, F32Shapes) {
    check_op(mm("mul_mat W[17,3] X[17,5]", {17, 3, 1, 1}, {17, 5, 1, 1}));
    check_op(mm("mul_mat W[127,17] X[127,3]", {127, 17, 1, 1}, {127, 3, 1, 1}));
    check_op(mm("mul_mat W[1,3] X[1,1]", {1, 3, 1, 1}, {1, 1, 1, 1}));
    check_op(mm("mul_mat W[33,1] X[33,7]", {33, 1, 1, 1}, {33, 7, 1, 1}));
}

TEST(OpMulMat, BroadcastBatches) {
    // W batch 2 serves X batches {0,1} and {2,3}; dim 3 broadcast 1 -> 3. dW sums over the batches it served.
    check_op(mm("mul_mat W[8,4,2,1] X[8,3,4,3]", {8, 4, 2, 1}, {8, 3, 4, 3}));
    check_op(mm("mul_mat W[5,2,3,2] X[5,4,3,2]", {5, 2, 3, 2}, {5, 4, 3, 2}));
}

TEST(OpMulMat, StridedOperands) {
    check_op({"mul_mat X transposed", {{"W", {17, 3, 1, 1}}, {"X_t", {5, 17, 1, 1}}},
              [](Context & c, const TV & in) { return rp::mul_mat(c, in[0], rp::transpose(c, in[1])); },
              [](const R & v) { return ref::mul_mat(v[0], ref::permute(v[1], 1, 0, 2, 3)); }});
    check_op({"mul_mat W transposed", {{"W_t", {3, 17, 1, 1}}, {"X", {17, 5, 1, 1}}},
              [](Context & c, const TV & in) { return rp::mul_mat(c, rp::transpose(c, in[0]), in[1]); },
              [](const R & v) { return ref::mul_mat(ref::permute(v[0], 1, 0, 2, 3), v[1]); }});
    // Heads as batches: X [D, T, H] from a permuted [D, H, T] leaf (rows contiguous, batches strided).
    check_op({"mul_mat X permuted batches", {{"W", {4, 6, 1, 1}}, {"X", {4, 3, 5, 1}}},
              [](Context & c, const TV & in) { return rp::mul_mat(c, in[0], rp::permute(c, in[1], 0, 2, 1, 3)); },
              [](const R & v) { return ref::mul_mat(v[0], ref::permute(v[1], 0, 2, 1, 3)); }});
}

TEST(OpMulMat, EveryWeightType) {
    // Frozen weights of every type: forward and dX (dW would be an error). The reference uses the stored
    // (rounded / dequantized) weight values.
    const rp::DType types[] = {rp::DType::F16, rp::DType::BF16, rp::DType::Q4_0, rp::DType::Q4_1, rp::DType::Q5_0,
                               rp::DType::Q5_1, rp::DType::Q8_0, rp::DType::Q2_K, rp::DType::Q3_K, rp::DType::Q4_K,
                               rp::DType::Q5_K, rp::DType::Q6_K};
    for (rp::DType t : types) {
        Input w{"W", {256, 5, 1, 1}, t, false};
        Input x{"X", {256, 3, 1, 1}};
        check_op({std::string("mul_mat W ") + rp::dtype_name(t), {w, x},
                  [](Context & c, const TV & in) { return rp::mul_mat(c, in[0], in[1]); },
                  [](const R & v) { return ref::mul_mat(v[0], v[1]); }});
    }
    Input w{"W", {64, 7, 2, 1}, rp::DType::Q8_0, false};
    check_op({"mul_mat W q8_0 batched broadcast", {w, {"X", {64, 2, 4, 1}}},
              [](Context & c, const TV & in) { return rp::mul_mat(c, in[0], in[1]); },
              [](const R & v) { return ref::mul_mat(v[0], v[1]); }});
}

TEST(OpMulMat, FewTokensAndOddSizes) {
    // Generation's shapes (one to five tokens) with odd K and N, f32 and stored types, against the double
    // reference, 1 and 2 threads bit-identical (the harness).
    for (int64_t T = 1; T <= 5; ++T)
        check_op({"mul_mat f32 K19 N37 T" + std::to_string(T), {{"W", {19, 37, 1, 1}}, {"X", {19, T, 1, 1}}},
                  [](Context & c, const TV & in) { return rp::mul_mat(c, in[0], in[1]); },
                  [](const R & v) { return ref::mul_mat(v[0], v[1]); }});
    const std::pair<rp::DType, int64_t> typed[] = {{rp::DType::BF16, 48}, {rp::DType::F16, 40}, {rp::DType::Q8_0, 96},
                                                   {rp::DType::Q4_0, 64}, {rp::DType::Q5_K, 256}};
    for (const auto & [t, K] : typed) {
        Input w{"W", {K, 33, 1, 1}, t, false};
        check_op({std::string("mul_mat few tokens W ") + rp::dtype_name(t) + " N33 T1", {w, {"X", {K, 1, 1, 1}}},
                  [](Context & c, const TV & in) { return rp::mul_mat(c, in[0], in[1]); },
                  [](const R & v) { return ref::mul_mat(v[0], v[1]); }});
    }
}

TEST(OpMulMat, QuantizedParamIsAnError) {
    Context ctx;
    Tensor * W = ctx.new_tensor(rp::DType::Q8_0, 32, 4);
    EXPECT_THROW(rp::set_param(ctx, W), rp::Error);
    Tensor * x = ctx.new_tensor(rp::DType::F32, 16, 2);
    try {
        rp::mul_mat(ctx, W, x);
        FAIL() << "no error";
    } catch (const rp::Error & e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("mul_mat"), std::string::npos) << m;
        EXPECT_NE(m.find("[32, 4, 1, 1]"), std::string::npos) << m;
        EXPECT_NE(m.find("[16, 2, 1, 1]"), std::string::npos) << m;
    }
}

TEST(OpLora, LinearOverFrozenQuantizedBase) {
    // y = W x + s B (A x): gradients for A, B and x; W (q8_0) frozen.
    Input W{"W", {32, 12, 1, 1}, rp::DType::Q8_0, false};
    const float s = 0.75f;
    check_op({"lora_linear W q8_0 r=4", {W, {"A", {32, 4, 1, 1}}, {"B", {4, 12, 1, 1}}, {"x", {32, 5, 1, 1}}},
              [s](Context & c, const TV & in) { return rp::lora_linear(c, in[0], in[1], in[2], in[3], s); },
              [s](const R & v) {
                  return ref::add(ref::mul_mat(v[0], v[3]), ref::scale(ref::mul_mat(v[2], ref::mul_mat(v[1], v[3])), s));
              }});
    Context ctx;
    Tensor * w = ctx.new_tensor(rp::DType::F32, 32, 12);
    Tensor * a = ctx.new_tensor(rp::DType::F32, 32, 4);
    Tensor * b = ctx.new_tensor(rp::DType::F32, 5, 12);  // rank mismatch
    Tensor * x = ctx.new_tensor(rp::DType::F32, 32, 2);
    EXPECT_THROW(rp::lora_linear(ctx, w, a, b, x, 1.0f), rp::Error);
}

// The accumulating forms: mul_mat(W, X, into) = into + W X and mul_mat_back_x(W, dY, x, into) = into + W^T dY, in
// place (the node is a view of into); gradients of W, X and into's source against finite differences.
TEST(OpMulMat, AccumulatingIntoATensor) {
    check_op({"mul_mat W[17,3] X[17,5] into Y0[3,5]", {{"W", {17, 3, 1, 1}}, {"X", {17, 5, 1, 1}}, {"Y0", {3, 5, 1, 1}}},
              [](Context & c, const TV & in) { return rp::mul_mat(c, in[0], in[1], rp::scale(c, in[2], 1.0f)); },
              [](const R & v) { return ref::add(ref::mul_mat(v[0], v[1]), v[2]); }});
    Input W{"W", {64, 6, 1, 1}, rp::DType::BF16, false};
    check_op({"mul_mat W bf16 [64,6] into, batches", {W, {"X", {64, 3, 2, 1}}, {"Y0", {6, 3, 2, 1}}},
              [](Context & c, const TV & in) { return rp::mul_mat(c, in[0], in[1], rp::scale(c, in[2], 1.0f)); },
              [](const R & v) { return ref::add(ref::mul_mat(v[0], v[1]), v[2]); }});
    // dX = D0 + W^T dY, forward only (its own gradient is not needed: it is a backward op).
    Context ctx;
    Tensor * w = ctx.new_tensor(rp::DType::F32, 9, 4);
    Tensor * dy = ctx.new_tensor(rp::DType::F32, 4, 3);
    Tensor * d0 = ctx.new_tensor(rp::DType::F32, 9, 3);
    std::vector<float> wv(36), dv(12), d0v(27);
    for (size_t i = 0; i < wv.size(); ++i) wv[i] = 0.1f * float(int(i % 7) - 3);
    for (size_t i = 0; i < dv.size(); ++i) dv[i] = 0.25f * float(int(i % 5) - 2);
    for (size_t i = 0; i < d0v.size(); ++i) d0v[i] = 0.5f * float(int(i % 3) - 1);
    for (auto [t, v] : {std::pair{w, &wv}, std::pair{dy, &dv}, std::pair{d0, &d0v}}) {
        ctx.alloc_data(t);
        rp::tensor_set_f32(t, *v);
    }
    const std::vector<float> got = compute(rp::mul_mat_back_x(ctx, w, dy, d0, rp::scale(ctx, d0, 1.0f)));
    for (int64_t t = 0; t < 3; ++t)
        for (int64_t k = 0; k < 9; ++k) {
            double want = d0v[size_t(k + 9 * t)];
            for (int64_t n = 0; n < 4; ++n) want += double(wv[size_t(k + 9 * n)]) * double(dv[size_t(n + 4 * t)]);
            EXPECT_NEAR(got[size_t(k + 9 * t)], want, 1e-6) << k << "," << t;
        }
    // into must be contiguous f32 of the product's shape.
    EXPECT_THROW(rp::mul_mat(ctx, w, ctx.new_tensor(rp::DType::F32, 9, 3), ctx.new_tensor(rp::DType::F32, 4, 2)), rp::Error);
}

// A LoRA linear adds its branch into W x by the GEMM (no ADD node, no buffer for B (s A x)), with the bits of the
// sum by an add: the branch's product is one partial sum (rank <= the GEMM's 256-step blocks) added to W x either way.
// Its backward sums x's gradient the same way: W^T dY first, then the branch's A^T (...) added in by its GEMM.
TEST(OpLora, TheBranchIsAddedByTheGemmWithTheBitsOfAnAdd) {
    Context ctx;
    auto filled = [&](rp::DType t, int64_t a, int64_t b, float f) {
        Tensor * x = ctx.new_tensor(rp::DType::F32, a, b);
        ctx.alloc_data(x);
        std::vector<float> v(static_cast<size_t>(a * b));
        for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(f * float(i) + 0.1f);
        rp::tensor_set_f32(x, v);
        return t == rp::DType::F32 ? x : rp::cast(ctx, x, t);
    };
    Tensor * w = filled(rp::DType::F32, 96, 40, 0.37f);
    Tensor * a = filled(rp::DType::F32, 96, 8, 0.21f);
    Tensor * b = filled(rp::DType::F32, 8, 40, 0.53f);
    Tensor * x0 = filled(rp::DType::F32, 96, 33, 0.11f);
    Tensor * x = rp::scale(ctx, x0, 1.0f);   // (an activation, not a param: its gradient is a graph buffer)
    const float s = 0.3f;
    Tensor * fused = rp::lora_linear(ctx, w, a, b, x, s);
    Tensor * added = rp::add(ctx, rp::mul_mat(ctx, w, x), rp::mul_mat(ctx, b, rp::scale(ctx, rp::mul_mat(ctx, a, x), s)));
    const std::vector<float> f = compute(fused), d = compute(added);
    ASSERT_EQ(f.size(), d.size());
    EXPECT_EQ(std::memcmp(f.data(), d.data(), f.size() * sizeof(float)), 0);
    rp::Graph g;
    rp::build_forward(g, fused);
    for (const Tensor * n : g.nodes) EXPECT_NE(n->op, rp::Op::ADD) << rp::describe(n);
    // The backward: x's gradient in one buffer, the second product accumulating into the first (no ADD either).
    Tensor * dy = filled(rp::DType::F32, 40, 33, 0.71f);
    rp::set_param(ctx, x0);
    ctx.alloc_data(x0->grad);
    std::memset(x0->grad->data, 0, x0->grad->nbytes());
    const size_t n_forward = g.nodes.size();
    rp::build_backward(ctx, g, fused, dy, {x0});
    int accumulating = 0;
    for (size_t i = n_forward; i < g.nodes.size(); ++i) {
        const Tensor * n = g.nodes[i];
        // (the one add: x0's gradient into its parameter buffer, through the scale)
        if (n->op == rp::Op::ADD) {
            EXPECT_TRUE(n->view_src == x0->grad) << rp::describe(n);
        }
        accumulating += n->op == rp::Op::MUL_MAT_BACK_X && n->src[2] != nullptr;
    }
    EXPECT_EQ(accumulating, 1);
    // x's gradient has the bits of W^T dY + A^T (s B^T dY) summed by an add.
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, 2);
    const std::vector<float> got = rp::tensor_get_f32(x0->grad);
    Tensor * db = rp::mul_mat_back_x(ctx, b, dy, rp::scale(ctx, rp::mul_mat(ctx, a, x), s));
    const std::vector<float> want =
        compute(rp::add(ctx, rp::mul_mat_back_x(ctx, w, dy, x), rp::mul_mat_back_x(ctx, a, rp::scale(ctx, db, s), x)));
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}
