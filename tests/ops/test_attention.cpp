// Fused causal GQA attention: forward vs naive double softmax attention, backward vs finite differences,
// determinism; and at sequence length 4096 the graph's memory stays O(s*d).
#include "harness.h"

#include "ggml_rp/cpu/attention.h"
#include "tests/common/cpu_forward.h"

#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

using namespace optest;
using rp::Context;
using rp::Tensor;
using TV = std::vector<Tensor *>;
using R = RefInputs;

namespace {

// A window of 70 keys over the kernels' 64-key blocks: 150 tokens (three blocks); under the sanitizers 80 (two blocks,
// the window still reaching across their boundary): the finite differences over every input grow with T^3, and the
// two T150 cases took two of the instrumented build's minutes.
#ifdef RP_SANITIZED
constexpr int64_t kBlockCrossingT = 80;
#else
constexpr int64_t kBlockCrossingT = 150;
#endif

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

// Packed sequences: each query sees keys from the start of its document (key_start) to itself. Documents
// that cross the kernels' 64-key blocks, one-token documents, a query block whose rows start in different
// blocks, and out-of-range starts (clamped: a start past the query means only its own key, a negative one 0).
Case packed(std::string name, int64_t D, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t B,
            const std::vector<std::vector<int>> & docs, std::vector<int32_t> extra = {}) {
    std::vector<int32_t> ks;
    for (const auto & lens : docs) {
        int32_t start = 0;
        for (const int len : lens) {
            for (int i = 0; i < len; ++i) ks.push_back(start + static_cast<int32_t>(Tk - Tq));
            start += len;
        }
    }
    for (size_t i = 0; i < extra.size() && i < ks.size(); ++i)
        if (extra[i] != 0) ks[i] = extra[i];
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    Input q{"q", {D, Hq, Tq, B}}, k{"k", {D, Hkv, Tk, B}}, v{"v", {D, Hkv, Tk, B}};
    Input first{"key_start", {Tq * B, 1, 1, 1}, rp::DType::I32, false};
    first.ints = ks;
    q.lo = k.lo = -2.0f;
    q.hi = k.hi = 2.0f;
    return {name, {q, k, v, first},
            [scale](Context & c, const TV & in) { return rp::attention(c, in[0], in[1], in[2], scale, rp::DType::F32, in[3]); },
            [scale, ks](const R & x) { return ref::attention(x[0], x[1], x[2], scale, ks); }};
}

TEST(OpAttention, PackedDocumentsBlockDiagonal) {
    // 70 tokens: documents of 3, 62 (crossing key 64) and 5 tokens; then 1, 1 and 68.
    check_op(packed("attention packed T70 B2 G2", 4, 2, 1, 70, 70, 2, {{3, 62, 5}, {1, 1, 68}}));
    // every token its own document (only the diagonal), and starts outside [0, t]: -5 -> 0, 9 at t = 2 -> 2
    check_op(packed("attention packed diagonal T6", 3, 2, 2, 6, 6, 1, {{1, 1, 1, 1, 1, 1}}));
    check_op(packed("attention packed clamped T6", 3, 2, 2, 6, 6, 1, {{6}}, {0, -5, 9, 0, 0, 0}));
    // with earlier keys (Tq < Tk, a cache): starts count in key indices
    check_op(packed("attention packed Tq3 Tk7", 4, 2, 1, 3, 7, 1, {{1, 2}}));
}

TEST(OpAttention, PackedEqualsSeparateSequences) {
    // A packed sequence of documents [5, 80, 43] against each document run alone: every output row and every
    // gradient agree to float rounding (the online softmax visits the same keys, grouped in other blocks).
    const int64_t D = 16, Hq = 4, Hkv = 2, T = 128;
    const std::vector<int> lens = {5, 80, 43};
    const float scale = 0.25f;
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    auto randv = [&](int64_t n) {
        std::vector<float> v(static_cast<size_t>(n));
        for (float & x : v) x = u(rng);
        return v;
    };
    const std::vector<float> q = randv(D * Hq * T), k = randv(D * Hkv * T), v = randv(D * Hkv * T), dout = randv(D * Hq * T);
    std::vector<int32_t> ks;
    for (int s = 0, at = 0; s < 3; at += lens[static_cast<size_t>(s)], ++s)
        for (int i = 0; i < lens[static_cast<size_t>(s)]; ++i) ks.push_back(at);
    auto run = [&](int64_t t0, int64_t n, const int32_t * first, std::vector<float> * out) {
        const rp::AttentionShape sh{D, Hq, Hkv, n, n, 1, scale};
        auto slice = [&](const std::vector<float> & x, int64_t H) {
            return std::vector<float>(x.begin() + t0 * H * D, x.begin() + (t0 + n) * H * D);
        };
        const auto qs = slice(q, Hq), kk = slice(k, Hkv), vv = slice(v, Hkv), ds = slice(dout, Hq);
        std::vector<float> o(qs.size()), lse(static_cast<size_t>(Hq * n)), dq(qs.size()), dk(kk.size()), dv(vv.size());
        rp::cpu::attention_fwd(sh, qs.data(), kk.data(), vv.data(), o.data(), lse.data(), first);
        rp::cpu::attention_bwd(sh, qs.data(), kk.data(), vv.data(), o.data(), lse.data(), ds.data(), dq.data(), dk.data(),
                               dv.data(), first);
        out[0] = o, out[1] = dq, out[2] = dk, out[3] = dv;
    };
    std::vector<float> whole[4];
    run(0, T, ks.data(), whole);
    double worst = 0;
    for (int s = 0, at = 0; s < 3; at += lens[static_cast<size_t>(s)], ++s) {
        std::vector<float> alone[4];
        run(at, lens[static_cast<size_t>(s)], nullptr, alone);
        for (int w = 0; w < 4; ++w) {
            const int64_t H = w >= 2 ? Hkv : Hq;
            const std::vector<float> part(whole[w].begin() + at * H * D, whole[w].begin() + (at + lens[static_cast<size_t>(s)]) * H * D);
            std::vector<double> want(alone[w].begin(), alone[w].end());
            worst = std::max(worst, rel_err(part, want));
        }
    }
    std::printf("[ op ] attention packed [5, 80, 43] vs each document alone: max rel err %.3g\n", worst);
    EXPECT_LT(worst, 1e-6);
}

// gpt-oss's attention: per-head sink logits in the softmax denominator (with their gradient) and sliding
// windows of several sizes, alone, together, over the 64-key blocks of the kernels, with a KV cache's earlier
// keys and with packed documents. Sinks large enough to take most of the probability, and small ones.
Case windowed(std::string name, int64_t D, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t window, bool sinks,
              float sink_lo = -3.0f, float sink_hi = 3.0f, std::vector<int32_t> ks = {}) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    Input q{"q", {D, Hq, Tq, 1}}, k{"k", {D, Hkv, Tk, 1}}, v{"v", {D, Hkv, Tk, 1}};
    q.lo = k.lo = -2.0f;
    q.hi = k.hi = 2.0f;
    std::vector<Input> in = {q, k, v};
    Input sk{"sinks", {Hq, 1, 1, 1}};
    sk.lo = sink_lo;
    sk.hi = sink_hi;
    if (sinks) in.push_back(sk);
    Input first{"key_start", {Tq, 1, 1, 1}, rp::DType::I32, false};
    first.ints = ks;
    if (!ks.empty()) in.push_back(first);
    return {name, in,
            [=](Context & c, const TV & x) {
                return rp::attention(c, x[0], x[1], x[2], scale, rp::DType::F32, ks.empty() ? nullptr : x.back(), sinks ? x[3] : nullptr,
                                     window);
            },
            [=](const R & x) { return ref::attention(x[0], x[1], x[2], scale, ks, sinks ? &x[3] : nullptr, window); }};
}

TEST(OpAttention, SinksAndSlidingWindow) {
    check_op(windowed("attention sinks T9 G2", 4, 4, 2, 9, 9, 0, true));
    check_op(windowed("attention large sinks T6", 3, 2, 1, 6, 6, 0, true, 4.0f, 8.0f));
    check_op(windowed("attention window 1 (the diagonal) T5", 3, 2, 2, 5, 5, 1, false));
    check_op(windowed("attention window 3 T11 G2", 4, 4, 2, 11, 11, 3, false));
    check_op(windowed("attention window 3 + sinks T11", 4, 2, 1, 11, 11, 3, true));
    check_op(windowed("attention window 70 over 64-key blocks T" + std::to_string(kBlockCrossingT), 4, 2, 1, kBlockCrossingT, kBlockCrossingT, 70, true));
    check_op(windowed("attention window 5 + sinks, cache Tq4 Tk13", 4, 2, 2, 4, 13, 5, true));
    // a window inside packed documents: each query sees max(its document's start, t - window + 1) on
    check_op(windowed("attention window 4 + packed documents T12", 3, 2, 1, 12, 12, 4, true, -3.0f, 3.0f,
                      {0, 0, 0, 0, 0, 0, 0, 7, 7, 7, 7, 7}));
}

// Gemma 2's logit soft-capping: cap tanh(s / cap) of each scaled logit, with caps that bend most logits (1) and
// few (50, Gemma 2's own), alone, with a window over the 64-key blocks, and with a KV cache's keys.
Case softcapped(std::string name, int64_t D, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t window, float cap, float qk = 2.0f) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    Input q{"q", {D, Hq, Tq, 1}}, k{"k", {D, Hkv, Tk, 1}}, v{"v", {D, Hkv, Tk, 1}};
    q.lo = k.lo = -qk;
    q.hi = k.hi = qk;
    return {name, {q, k, v},
            [=](Context & c, const TV & x) { return rp::attention(c, x[0], x[1], x[2], scale, rp::DType::F32, nullptr, nullptr, window, cap); },
            [=](const R & x) { return ref::attention(x[0], x[1], x[2], scale, {}, nullptr, window, cap); }};
}

TEST(OpAttention, LogitSoftCapping) {
    check_op(softcapped("attention softcap 1 T9 G2", 4, 4, 2, 9, 9, 0, 1.0f));
    check_op(softcapped("attention softcap 0.5, large logits T7", 8, 2, 1, 7, 7, 0, 0.5f, 3.0f));
    check_op(softcapped("attention softcap 50 T6", 4, 2, 2, 6, 6, 0, 50.0f, 4.0f));
    check_op(softcapped("attention softcap 2 + window 70 over 64-key blocks T" + std::to_string(kBlockCrossingT), 4, 2, 1, kBlockCrossingT,
                        kBlockCrossingT, 70, 2.0f));
    check_op(softcapped("attention softcap 1, cache Tq4 Tk13", 4, 2, 2, 4, 13, 0, 1.0f));
}

TEST(OpAttention, SlidingWindowAndSinkErrors) {
    Context ctx;
    Tensor * q = ctx.new_tensor(rp::DType::F32, 8, 4, 5);
    Tensor * k = ctx.new_tensor(rp::DType::F32, 8, 2, 5);
    Tensor * wrong = ctx.new_tensor(rp::DType::F32, 2);
    EXPECT_THROW(rp::attention(ctx, q, k, k, 1.0f, rp::DType::F32, nullptr, wrong), rp::Error);  // one sink per query head
    Tensor * sinks = ctx.new_tensor(rp::DType::F32, 4);
    EXPECT_NO_THROW(rp::attention(ctx, q, k, k, 1.0f, rp::DType::F32, nullptr, sinks, 3));
    EXPECT_THROW(rp::attention(ctx, q, k, k, 1.0f, rp::DType::F32, nullptr, nullptr, -1), rp::Error);
    EXPECT_THROW(rp::attention(ctx, q, k, k, 1.0f, rp::DType::F32, nullptr, nullptr, 0, -1.0f), rp::Error);  // a negative soft-cap
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

// Windows of a KV cache of several sequences ([D, Hkv, N, B], each sequence's first Tk rows: batched decoding) are
// read in place by the f32 kernels, with the bits of contiguous copies; the backward refuses them.
TEST(OpAttention, CacheWindowsOfSeveralSequencesReadInPlace) {
    const int64_t D = 8, Hq = 4, Hkv = 2, N = 11, Tk = 6, Tq = 2, B = 3;
    Context ctx;
    Tensor * q = ctx.new_tensor(rp::DType::F32, D, Hq, Tq, B);
    Tensor * kc = ctx.new_tensor(rp::DType::F32, D, Hkv, N, B);
    Tensor * vc = ctx.new_tensor(rp::DType::F32, D, Hkv, N, B);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (Tensor * t : {q, kc, vc}) {
        ctx.alloc_data(t);
        for (int64_t i = 0; i < t->nelements(); ++i) t->data_as<float>()[i] = u(rng);
    }
    const int64_t ne[4] = {D, Hkv, Tk, B};
    const size_t nb[4] = {kc->nb[0], kc->nb[1], kc->nb[2], kc->nb[3]};
    Tensor * kw = rp::view(ctx, kc, ne, nb, 0);
    Tensor * vw = rp::view(ctx, vc, ne, nb, 0);
    Tensor * o = rp::attention(ctx, q, kw, vw, 0.3f);
    EXPECT_EQ(o->src[1], kw);  // no copy
    EXPECT_EQ(o->src[2], vw);
    Tensor * o_copied = rp::attention(ctx, q, rp::cont(ctx, kw), rp::cont(ctx, vw), 0.3f);
    const std::vector<float> got = rp_test::forward_on_cpu(o), want = rp_test::forward_on_cpu(o_copied);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    // against the double reference, sequence by sequence
    for (int64_t b = 0; b < B; ++b) {
        ref::DT rq({D, Hq, Tq, 1}), rk({D, Hkv, Tk, 1}), rv({D, Hkv, Tk, 1});
        for (int64_t i = 0; i < D * Hq * Tq; ++i) rq.v[size_t(i)] = q->data_as<float>()[b * D * Hq * Tq + i];
        for (int64_t i = 0; i < D * Hkv * Tk; ++i) {
            rk.v[size_t(i)] = kc->data_as<float>()[b * D * Hkv * N + i];
            rv.v[size_t(i)] = vc->data_as<float>()[b * D * Hkv * N + i];
        }
        const ref::DT r = ref::attention(rq, rk, rv, 0.3);
        for (int64_t i = 0; i < D * Hq * Tq; ++i) EXPECT_NEAR(got[size_t(b * D * Hq * Tq + i)], r.v[size_t(i)], 1e-5) << "sequence " << b;
    }
    // The accelerated (rounded) inputs are contiguous copies; the backward needs contiguous keys.
    Tensor * o_bf16 = rp::attention(ctx, q, kw, vw, 0.3f, rp::DType::BF16);
    EXPECT_NE(o_bf16->src[1], kw);
    EXPECT_TRUE(o_bf16->src[1]->is_contiguous());
    EXPECT_THROW(rp::attention_back(ctx, o, o), rp::Error);
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
