// mul_mat with every weight dtype, broadcast batches and strided operands; out_prod / mul_mat_back_x through
// the backward; lora_linear.
#include "harness.h"

#include <gtest/gtest.h>

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
