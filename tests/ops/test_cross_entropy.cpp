// Fused LM head + cross-entropy: equals naive logits -> log-softmax -> NLL (double) for chunk sizes 1, 7
// and the whole vocabulary, with masked (-1) labels; dh and dW vs finite differences; determinism.
#include "harness.h"

#include "ggml_rp/cpu/cross_entropy.h"
#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/cross_entropy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

using namespace optest;
using rp::Context;
using rp::Tensor;
using TV = std::vector<Tensor *>;
using R = RefInputs;

namespace {

Case ce(std::string name, int64_t C, int64_t V, std::vector<int32_t> labels, int64_t chunk, rp::DType wtype = rp::DType::F32,
        float softcap = 0.0f, bool train_head = true) {
    int unmasked = 0;
    for (int32_t l : labels) unmasked += l >= 0;
    const float scale = unmasked ? 1.0f / static_cast<float>(unmasked) : 1.0f;
    const int64_t T = static_cast<int64_t>(labels.size());
    Input lab{"labels", {T, 1, 1, 1}, rp::DType::I32, false};
    lab.ints = labels;
    Input h{"h", {C, T, 1, 1}};
    h.lo = -2.0f;
    h.hi = 2.0f;
    Input W{"W", {C, V, 1, 1}, wtype, train_head && wtype == rp::DType::F32};
    return {name, {h, W, lab},
            [=](Context & c, const TV & in) { return rp::lm_head_ce(c, in[0], in[1], in[2], scale, chunk, softcap); },
            [=](const R & x) { return ref::lm_head_ce(x[0], x[1], ints_from(x[2]), scale, softcap); }};
}

} // namespace

TEST(OpCrossEntropy, ChunkSizes) {
    const std::vector<int32_t> labels = {5, -1, 126, 0, 77, -1, 3};
    for (int64_t chunk : {int64_t{1}, int64_t{7}, int64_t{127}, int64_t{1000}})
        check_op(ce(std::string("lm_head_ce C17 V127 chunk ") + std::to_string(chunk), 17, 127, labels, chunk));
}

TEST(OpCrossEntropy, OddSizes) {
    check_op(ce("lm_head_ce C1 V3 T1", 1, 3, {2}, 2));
    check_op(ce("lm_head_ce C3 V1 T2", 3, 1, {0, 0}, 1));
}

TEST(OpCrossEntropy, AllMasked) {
    check_op(ce("lm_head_ce all labels -1", 5, 9, {-1, -1, -1}, 4));
}

TEST(OpCrossEntropy, FrozenQuantizedHead) {
    check_op(ce("lm_head_ce W q8_0 chunk 7", 32, 19, {1, 18, -1, 7}, 7, rp::DType::Q8_0));
}

// Gemma 2's final-logit soft-capping inside the fused head: caps that bend most logits (1) and few (30), over
// chunks, with a frozen quantized head.
TEST(OpCrossEntropy, LogitSoftCapping) {
    const std::vector<int32_t> labels = {5, -1, 126, 0, 77, -1, 3};
    for (float cap : {1.0f, 30.0f})
        for (int64_t chunk : {int64_t{7}, int64_t{1000}})
            check_op(ce("lm_head_ce softcap " + std::to_string(cap) + " chunk " + std::to_string(chunk), 17, 127, labels, chunk, rp::DType::F32, cap));
    check_op(ce("lm_head_ce softcap 2, W q8_0 chunk 7", 32, 19, {1, 18, -1, 7}, 7, rp::DType::Q8_0, 2.0f));
}

// A frozen head (LoRA's): the backward rule has the forward form dh in its one pass over the vocabulary
// (lm_head_forms_grad); dh against the double reference through every chunking, with and without a cap.
TEST(OpCrossEntropy, FrozenHeadFormsItsGradientInTheForward) {
    const std::vector<int32_t> labels = {5, -1, 126, 0, 77, -1, 3};
    for (float cap : {0.0f, 1.0f})
        for (int64_t chunk : {int64_t{1}, int64_t{7}, int64_t{127}, int64_t{1000}})
            check_op(ce("lm_head_ce frozen f32 head, softcap " + std::to_string(cap) + " chunk " + std::to_string(chunk), 17,
                        127, labels, chunk, rp::DType::F32, cap, false));
    check_op(ce("lm_head_ce frozen head, all labels -1", 5, 9, {-1, -1, -1}, 4, rp::DType::F32, 0.0f, false));
}

// Which path the rule takes: a frozen head's forward forms the gradient (its aux grows by [C, T] floats,
// 256-byte aligned after the logsumexps); a trained head's keeps the two passes (its dW needs them anyway).
TEST(OpCrossEntropy, OnlyAFrozenHeadFormsItsGradientInTheForward) {
    for (bool train_head : {false, true}) {
        Context ctx;
        Tensor * h = ctx.new_tensor(rp::DType::F32, 6, 5);
        Tensor * W = ctx.new_tensor(rp::DType::F32, 6, 11);
        Tensor * lab = ctx.new_tensor(rp::DType::I32, 5);
        rp::set_param(ctx, h);
        if (train_head) rp::set_param(ctx, W);
        Tensor * loss = rp::lm_head_ce(ctx, h, W, lab, 0.2f, 4);
        rp::Graph g;
        rp::build_forward(g, loss);
        rp::build_backward(ctx, g, loss, train_head ? TV{h, W} : TV{h});
        EXPECT_EQ(rp::lm_head_forms_grad(loss), !train_head);
        const size_t lse = 2 * 5 * sizeof(float);  // the logsumexps and 1 - p_label
        EXPECT_EQ(loss->aux_bytes, train_head ? lse : rp::lm_head_unit_dh_offset(loss) + 6 * 5 * sizeof(float));
        EXPECT_EQ((loss->nbytes() + rp::lm_head_unit_dh_offset(loss)) % 256, 0u);
        EXPECT_GE(rp::lm_head_unit_dh_offset(loss), lse);
    }
}

TEST(OpCrossEntropy, BadLabelIsAnError) {
    Context ctx;
    Tensor * h = ctx.new_tensor(rp::DType::F32, 4, 2);
    Tensor * W = ctx.new_tensor(rp::DType::F32, 4, 3);
    Tensor * lab = ctx.new_tensor(rp::DType::I32, 2);
    for (Tensor * t : {h, W, lab}) ctx.alloc_data(t);
    rp::tensor_set_i32(lab, {1, 3});
    const std::string error = compute_error(rp::lm_head_ce(ctx, h, W, lab, 1.0f, 2));
    EXPECT_NE(error.find("label 3"), std::string::npos) << error;
    Tensor * lab3 = ctx.new_tensor(rp::DType::I32, 3);
    EXPECT_THROW(rp::lm_head_ce(ctx, h, W, lab3, 1.0f, 2), rp::Error);  // 3 labels for 2 tokens
}

// The backward reads the forward's logsumexps (lse_out -> lse_in) instead of a second pass over the
// vocabulary: the same dh and dW bits as the two-pass call, for several chunkings, and lse_out equals the
// double-precision logsumexp of the logits.
TEST(OpCrossEntropy, BackwardFromTheForwardsLogsumexpIsTheSameBits) {
    const int64_t C = 13, V = 61, T = 5;
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<float> h(size_t(C * T)), W(size_t(C * V));
    for (float & x : h) x = u(rng);
    for (float & x : W) x = u(rng);
    const std::vector<int32_t> labels = {3, -1, 60, 0, 17};
    for (int64_t chunk : {int64_t{1}, int64_t{8}, int64_t{61}}) {
        const rp::cpu::LmHeadCEShape s{C, V, T, chunk};
        std::vector<float> lse(size_t(T), -1.0f), rest(size_t(T), -1.0f);
        const double loss = rp::cpu::lm_head_ce(s, h.data(), W.data(), rp::DType::F32, size_t(C) * 4, labels.data(), 0.25f,
                                                nullptr, nullptr, 0, {.lse_out = lse.data(), .rest_out = rest.data()});
        std::vector<float> dh_two(size_t(C * T)), dW_two(size_t(C * V), 0.5f), dh_one(dh_two.size()), dW_one(dW_two);
        const double loss_two = rp::cpu::lm_head_ce(s, h.data(), W.data(), rp::DType::F32, size_t(C) * 4, labels.data(), 0.25f,
                                                    dh_two.data(), dW_two.data(), C);
        EXPECT_EQ(loss, loss_two);
        EXPECT_EQ(rp::cpu::lm_head_ce(s, h.data(), W.data(), rp::DType::F32, size_t(C) * 4, labels.data(), 0.25f, dh_one.data(),
                                      dW_one.data(), C, {.lse_in = lse.data(), .rest_in = rest.data()}),
                  0.0);  // the loss is the forward's
        EXPECT_EQ(std::memcmp(dh_one.data(), dh_two.data(), dh_two.size() * 4), 0) << "chunk " << chunk;
        EXPECT_EQ(std::memcmp(dW_one.data(), dW_two.data(), dW_two.size() * 4), 0) << "chunk " << chunk;
        for (int64_t t = 0; t < T; ++t) {
            double mx = -1e300, sum = 0;
            for (int64_t v = 0; v < V; ++v) {
                double z = 0;
                for (int64_t c = 0; c < C; ++c) z += double(W[size_t(v * C + c)]) * double(h[size_t(t * C + c)]);
                mx = std::max(mx, z);
            }
            for (int64_t v = 0; v < V; ++v) {
                double z = 0;
                for (int64_t c = 0; c < C; ++c) z += double(W[size_t(v * C + c)]) * double(h[size_t(t * C + c)]);
                sum += std::exp(z - mx);
            }
            EXPECT_NEAR(lse[size_t(t)], mx + std::log(sum), 1e-5 * std::max(1.0, std::fabs(mx))) << "token " << t;
        }
    }
}

// The graph: lm_head_ce_back takes its forward node as a source (so the forward runs first and its
// logsumexps, the node's aux, are what the backward reads).
TEST(OpCrossEntropy, BackwardNodeReadsTheForwardNode) {
    Context ctx;
    Tensor * h = ctx.new_tensor(rp::DType::F32, 4, 2);
    Tensor * W = ctx.new_tensor(rp::DType::F32, 4, 3);
    Tensor * lab = ctx.new_tensor(rp::DType::I32, 2);
    Tensor * loss = rp::lm_head_ce(ctx, h, W, lab, 1.0f, 2);
    EXPECT_EQ(loss->aux_bytes, 4 * sizeof(float));  // 2 logsumexps, 2 x (1 - p_label)
    Tensor * dloss = ctx.new_tensor(rp::DType::F32, 1);
    Tensor * dh = rp::lm_head_ce_back(ctx, loss, dloss, nullptr);
    EXPECT_EQ(dh->src[5], loss);
}
