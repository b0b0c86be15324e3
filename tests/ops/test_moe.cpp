// Mixture-of-experts ops (ops/moe.h): the router weights and the grouped expert matmul against naive double
// references, their backward against finite differences (harness.h), every weight type, determinism over
// thread counts; the top-k selection and its tie rule; bad expert ids.
#include "harness.h"

#include "ggml_rp/cpu/routing_tape.h"

#include "ggml_rp/ops/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

using namespace optest;
using rp::Context;
using rp::Tensor;
using TV = std::vector<Tensor *>;
using R = RefInputs;

namespace {

// Distinct expert ids per token, [k, T], from a seeded shuffle.
std::vector<int32_t> random_ids(int64_t E, int64_t k, int64_t T, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> out;
    for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> all(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) all[static_cast<size_t>(e)] = static_cast<int32_t>(e);
        std::shuffle(all.begin(), all.end(), rng);
        out.insert(out.end(), all.begin(), all.begin() + k);
    }
    return out;
}

// w[s, t] = p[ids[s, t]] / (normalize ? max(sum_s p[ids[s,t]], 6.1e-5) : 1) * (scale ? scale : 1), p = softmax.
ref::DT ref_weights(const ref::DT & logits, const std::vector<int32_t> & ids, int64_t k, bool normalize, double scale) {
    const int64_t E = logits.ne[0], T = logits.ne[1];
    ref::DT w({k, T, 1, 1});
    for (int64_t t = 0; t < T; ++t) {
        double mx = -INFINITY, z = 0;
        for (int64_t e = 0; e < E; ++e) mx = std::max(mx, logits(e, t));
        for (int64_t e = 0; e < E; ++e) z += std::exp(logits(e, t) - mx);
        double sum = 0;
        for (int64_t s = 0; s < k; ++s) sum += std::exp(logits(ids[static_cast<size_t>(t * k + s)], t) - mx) / z;
        const double div = normalize ? std::max(sum, 6.103515625e-5) : 1.0;
        for (int64_t s = 0; s < k; ++s)
            w(s, t) = std::exp(logits(ids[static_cast<size_t>(t * k + s)], t) - mx) / z / div * (scale != 0 ? scale : 1.0);
    }
    return w;
}

// Y[:, s, t] = W[:, :, ids[s, t]] applied to X[:, X1 == 1 ? 0 : s, t].
ref::DT ref_mul_mat_id(const ref::DT & W, const ref::DT & X, const std::vector<int32_t> & ids, int64_t k) {
    const int64_t K = W.ne[0], N = W.ne[1], T = X.ne[2], X1 = X.ne[1];
    ref::DT y({N, k, T, 1});
    for (int64_t t = 0; t < T; ++t)
        for (int64_t s = 0; s < k; ++s) {
            const int64_t e = ids[static_cast<size_t>(t * k + s)];
            for (int64_t n = 0; n < N; ++n) {
                double acc = 0;
                for (int64_t i = 0; i < K; ++i) acc += W(i, n, e) * X(i, X1 == 1 ? 0 : s, t);
                y(n, s, t) = acc;
            }
        }
    return y;
}

Case weights_case(const std::string & name, int64_t E, int64_t k, int64_t T, bool normalize, float scale, uint32_t seed) {
    Input logits{"logits", {E, T, 1, 1}};
    logits.lo = -3.0f;
    logits.hi = 3.0f;
    Input ids{"ids", {k, T, 1, 1}, rp::DType::I32, false};
    ids.ints = random_ids(E, k, T, seed);
    return {name, {logits, ids},
            [normalize, scale](Context & c, const TV & in) { return rp::moe_weights(c, in[0], in[1], normalize, scale); },
            [k, normalize, scale](const R & v) { return ref_weights(v[0], ints_from(v[1]), k, normalize, scale); }};
}

Case matmul_id_case(const std::string & name, rp::DType wtype, int64_t K, int64_t N, int64_t E, int64_t X1, int64_t k, int64_t T,
                    uint32_t seed) {
    Input W{"W", {K, N, E, 1}, wtype, wtype == rp::DType::F32};
    Input X{"X", {K, X1, T, 1}};
    Input ids{"ids", {k, T, 1, 1}, rp::DType::I32, false};
    ids.ints = random_ids(E, k, T, seed);
    return {name, {W, X, ids}, [](Context & c, const TV & in) { return rp::mul_mat_id(c, in[0], in[1], in[2]); },
            [k](const R & v) { return ref_mul_mat_id(v[0], v[1], ints_from(v[2]), k); }};
}

} // namespace

TEST(OpMoe, RouterWeightsAndTheirGradient) {
    check_op(weights_case("moe_weights E8 k2 normalized (qwen3moe)", 8, 2, 9, true, 0.0f, 1));
    check_op(weights_case("moe_weights E16 k4 normalized", 16, 4, 5, true, 0.0f, 2));
    check_op(weights_case("moe_weights E4 k1 normalized (always 1)", 4, 1, 6, true, 0.0f, 3));
    check_op(weights_case("moe_weights E8 k2 raw, scaled 2.5", 8, 2, 7, false, 2.5f, 4));
    check_op(weights_case("moe_weights E6 k6 normalized (every expert)", 6, 6, 3, true, 0.0f, 5));
}

TEST(OpMoe, GroupedExpertMatmulAndItsGradients) {
    // gate / up: one vector per token shared by its k slots; down: one per slot. Experts used by several
    // tokens, by none, tokens whose slots hit one expert each.
    check_op(matmul_id_case("mul_mat_id E4 k2 X1=1", rp::DType::F32, 6, 5, 4, 1, 2, 7, 11));
    check_op(matmul_id_case("mul_mat_id E8 k3 X1=k", rp::DType::F32, 5, 4, 8, 3, 3, 6, 12));
    check_op(matmul_id_case("mul_mat_id E3 k1 X1=1", rp::DType::F32, 4, 3, 3, 1, 1, 9, 13));
    check_op(matmul_id_case("mul_mat_id E16 k4 T1", rp::DType::F32, 8, 6, 16, 1, 4, 1, 14));
}

TEST(OpMoe, EveryWeightType) {
    // Frozen experts of every type (QLoRA on a K-quant MoE): forward and dX; the reference reads the stored values.
    const rp::DType types[] = {rp::DType::F16, rp::DType::BF16, rp::DType::Q4_0, rp::DType::Q8_0, rp::DType::Q4_K, rp::DType::Q6_K};
    for (rp::DType t : types) check_op(matmul_id_case(std::string("mul_mat_id W ") + rp::dtype_name(t), t, 256, 4, 3, 1, 2, 5, 21));
}

TEST(OpMoe, TopKSelectionAndTies) {
    // Router logits of 3 tokens over 5 experts: distinct values; two equal maxima (experts 1 and 3: the
    // lower index first, as llama.cpp's sort of up to 16 probabilities keeps them); all equal.
    Context ctx;
    Tensor * logits = ctx.new_tensor(rp::DType::F32, 5, 3);
    ctx.alloc_data(logits);
    rp::tensor_set_f32(logits, {0.1f, 2.0f, -1.0f, 0.7f, 1.5f,   // -> 1, 4, 3
                                0.0f, 3.0f, 1.0f, 3.0f, 2.0f,    // -> 1, 3, 4
                                0.5f, 0.5f, 0.5f, 0.5f, 0.5f});  // -> 0, 1, 2
    Tensor * ids = rp::moe_topk(ctx, logits, 3);
    Tensor * w = rp::moe_weights(ctx, logits, ids, true);
    w->flags |= rp::kFlagOutput;
    ids->flags |= rp::kFlagOutput;
    rp::Graph g;
    rp::build_forward(g, w);
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, 2);
    EXPECT_EQ(rp::tensor_get_i32(ids), (std::vector<int32_t>{1, 4, 3, 1, 3, 4, 0, 1, 2}));
    const std::vector<float> wv = rp::tensor_get_f32(w);
    for (int t = 0; t < 3; ++t) EXPECT_NEAR(wv[t * 3] + wv[t * 3 + 1] + wv[t * 3 + 2], 1.0f, 1e-6f) << "token " << t;
    EXPECT_EQ(wv[3], wv[4]);  // the tied pair weighs the same
    EXPECT_FLOAT_EQ(wv[6], 1.0f / 3.0f);
    EXPECT_THROW(rp::moe_topk(ctx, logits, 6), rp::Error);  // k > n_expert
    EXPECT_THROW(rp::moe_topk(ctx, logits, 0), rp::Error);
}

// The routing tape (cpu/routing_tape.h): recorded choices replay over other logits, in node order; a replay
// that meets another node shape is refused; without a tape the choices follow the logits.
TEST(OpMoe, RoutingTapeRecordsAndReplaysTheChoices) {
    Context ctx;
    Tensor * logits = ctx.new_tensor(rp::DType::F32, 4, 2);
    ctx.alloc_data(logits);
    Tensor * ids = rp::moe_topk(ctx, logits, 2);
    ids->flags |= rp::kFlagOutput;
    rp::Graph g;
    rp::build_forward(g, ids);
    rp::CpuBackend be;
    be.allocate(g);
    auto choose = [&](const std::vector<float> & l) {
        rp::tensor_set_f32(logits, l);
        be.compute(g, 1);
        return rp::tensor_get_i32(ids);
    };
    const std::vector<float> a = {3, 2, 1, 0, 0, 1, 2, 3}, b = {0, 1, 2, 3, 3, 2, 1, 0};
    {
        rp::cpu::RoutingTape tape;
        EXPECT_THROW(rp::cpu::RoutingTape(), rp::Error);  // one at a time
        EXPECT_EQ(choose(a), (std::vector<int32_t>{0, 1, 3, 2}));
        EXPECT_EQ(tape.nodes(), 1u);
        tape.replay();
        EXPECT_EQ(choose(b), (std::vector<int32_t>{0, 1, 3, 2}));  // a's choices, not b's
        EXPECT_THROW(choose(b), rp::Error);                        // past the recording
        Context c2;
        Tensor * l3 = c2.new_tensor(rp::DType::F32, 4, 3);
        c2.alloc_data(l3);
        Tensor * i3 = rp::moe_topk(c2, l3, 2);
        rp::Graph g3;
        rp::build_forward(g3, i3);
        rp::CpuBackend be3;
        be3.allocate(g3);
        tape.replay();
        EXPECT_THROW(be3.compute(g3, 1), rp::Error);  // 3 tokens where 2 were recorded
    }
    EXPECT_EQ(choose(b), (std::vector<int32_t>{3, 2, 0, 1}));
}

TEST(OpMoe, AnExpertIdOutsideTheTableIsAnError) {
    Context ctx;
    Tensor * W = ctx.new_tensor(rp::DType::F32, 4, 3, 2);
    Tensor * X = ctx.new_tensor(rp::DType::F32, 4, 1, 2);
    Tensor * ids = ctx.new_tensor(rp::DType::I32, 1, 2);
    for (Tensor * t : {W, X, ids}) ctx.alloc_data(t);
    rp::tensor_set_f32(W, std::vector<float>(24, 0.5f));
    rp::tensor_set_f32(X, std::vector<float>(8, 1.0f));
    rp::tensor_set_i32(ids, {1, 2});  // 2 is not an expert of 2
    const std::string error = compute_error(rp::mul_mat_id(ctx, W, X, ids));
    EXPECT_NE(error.find("expert id 2"), std::string::npos) << error;
    // shapes: X's rows must match W's inputs, ids must be [k, T]
    Tensor * X5 = ctx.new_tensor(rp::DType::F32, 5, 1, 2);
    EXPECT_THROW(rp::mul_mat_id(ctx, W, X5, ids), rp::Error);
    Tensor * ids3 = ctx.new_tensor(rp::DType::I32, 1, 3);
    EXPECT_THROW(rp::mul_mat_id(ctx, W, X, ids3), rp::Error);
}
