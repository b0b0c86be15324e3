// Fused causal GQA attention: forward vs naive double softmax attention, backward vs finite differences,
// determinism; and at sequence length 4096 the graph's memory stays O(s*d).
#include "harness.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace optest;
using rp::Context;
using rp::Tensor;
using TV = std::vector<Tensor *>;
using R = RefInputs;

namespace {

Case attn(std::string name, int64_t D, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t B) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    Input q{"q", {D, Hq, Tq, B}}, k{"k", {D, Hkv, Tk, B}}, v{"v", {D, Hkv, Tk, B}};
    q.lo = k.lo = -2.0f;
    q.hi = k.hi = 2.0f;
    return {name, {q, k, v}, [scale](Context & c, const TV & in) { return rp::attention(c, in[0], in[1], in[2], scale); },
            [scale](const R & x) { return ref::attention(x[0], x[1], x[2], scale); }};
}

} // namespace

TEST(OpAttention, GroupsOneTwoFour) {
    check_op(attn("attention D8 Hq4 Hkv4 (G1) T7", 8, 4, 4, 7, 7, 1));
    check_op(attn("attention D8 Hq4 Hkv2 (G2) T5 B2", 8, 4, 2, 5, 5, 2));
    check_op(attn("attention D3 Hq4 Hkv1 (G4) T17", 3, 4, 1, 17, 17, 1));
}

TEST(OpAttention, SizeOneAndKvCache) {
    check_op(attn("attention D1 H1 T1", 1, 1, 1, 1, 1, 1));
    // 3 new queries over 7 keys (4 from a cache): query t sees keys j <= t + 4.
    check_op(attn("attention Tq3 Tk7 G2", 4, 2, 1, 3, 7, 1));
}

TEST(OpAttention, PermutedInputs) {
    // q from a [D, T, H] leaf permuted to [D, H, T] (as after a reshape of a per-head projection).
    const float scale = 0.4f;
    check_op({"attention permuted q", {{"q_dth", {4, 5, 2, 1}}, {"k", {4, 1, 5, 1}}, {"v", {4, 1, 5, 1}}},
              [scale](Context & c, const TV & in) {
                  return rp::attention(c, rp::permute(c, in[0], 0, 2, 1, 3), in[1], in[2], scale);
              },
              [scale](const R & x) { return ref::attention(ref::permute(x[0], 0, 2, 1, 3), x[1], x[2], scale); }});
}

TEST(OpAttention, ShapeErrors) {
    Context ctx;
    Tensor * q = ctx.new_tensor(rp::DType::F32, 8, 3, 5);
    Tensor * k = ctx.new_tensor(rp::DType::F32, 8, 2, 5);
    EXPECT_THROW(rp::attention(ctx, q, k, k, 1.0f), rp::Error);  // 3 query heads over 2 kv heads
    Tensor * k2 = ctx.new_tensor(rp::DType::F32, 8, 1, 4);
    EXPECT_THROW(rp::attention(ctx, q, k2, k2, 1.0f), rp::Error);  // fewer keys than queries
}

TEST(OpAttention, Sequence4096MemoryIsLinear) {
    const int64_t D = 8, Hq = 2, Hkv = 1, S = 4096;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    Context ctx;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    auto leaf = [&](int64_t h, const char * name) {
        Tensor * t = ctx.new_tensor(rp::DType::F32, D, h, S);
        t->name = name;
        ctx.alloc_data(t);
        std::vector<float> v(static_cast<size_t>(t->nelements()));
        for (float & x : v) x = u(rng);
        rp::tensor_set_f32(t, v);
        return t;
    };
    Tensor * q = leaf(Hq, "q");
    Tensor * k = leaf(Hkv, "k");
    Tensor * v = leaf(Hkv, "v");
    Tensor * Rw = leaf(Hq, "R");
    Tensor * o = rp::attention(ctx, q, k, v, scale);
    o->flags |= rp::kFlagOutput;
    Tensor * loss = rp::sum(ctx, rp::mul(ctx, o, Rw));
    rp::Graph g;
    rp::build_forward(g, loss);
    for (Tensor * p : {q, k, v}) {
        rp::set_param(ctx, p);
        ctx.alloc_data(p->grad);
    }
    rp::build_backward(ctx, g, loss, {q, k, v});
    rp::CpuBackend be;
    const size_t peak = be.allocate(g);
    const size_t sd = static_cast<size_t>(S * Hq * D) * sizeof(float);  // one [D, Hq, S] f32 activation
    std::printf("[ op ] attention S=4096 D=8 Hq=2: graph peak %zu bytes = %.2f x s*d*4 (s*s*4 = %zu)\n", peak,
                static_cast<double>(peak) / static_cast<double>(sd), static_cast<size_t>(S * S) * 4);
    EXPECT_LT(peak, 16 * sd + 65536);
    EXPECT_LT(peak * 16, static_cast<size_t>(S * S) * 4);  // far below one s x s f32 matrix
    be.compute(g, 2);

    const ref::DT want = ref::attention(ref::DT({D, Hq, S, 1}, [&] {
                                            std::vector<double> d;
                                            for (float x : rp::tensor_get_f32(q)) d.push_back(x);
                                            return d;
                                        }()),
                                        ref::DT({D, Hkv, S, 1}, [&] {
                                            std::vector<double> d;
                                            for (float x : rp::tensor_get_f32(k)) d.push_back(x);
                                            return d;
                                        }()),
                                        ref::DT({D, Hkv, S, 1}, [&] {
                                            std::vector<double> d;
                                            for (float x : rp::tensor_get_f32(v)) d.push_back(x);
                                            return d;
                                        }()),
                                        scale);
    const double err = rel_err(rp::tensor_get_f32(o), want.v);
    std::printf("[ op ] attention S=4096 forward vs naive softmax attention: %.3g\n", err);
    EXPECT_LT(err, 1e-5);
}
