// Fused LM head + cross-entropy: equals naive logits -> log-softmax -> NLL (double) for chunk sizes 1, 7
// and the whole vocabulary, with masked (-1) labels; dh and dW vs finite differences; determinism.
#include "harness.h"

#include <gtest/gtest.h>

using namespace optest;
using rp::Context;
using rp::Tensor;
using TV = std::vector<Tensor *>;
using R = RefInputs;

namespace {

Case ce(std::string name, int64_t C, int64_t V, std::vector<int32_t> labels, int64_t chunk, rp::DType wtype = rp::DType::F32) {
    int unmasked = 0;
    for (int32_t l : labels) unmasked += l >= 0;
    const float scale = unmasked ? 1.0f / static_cast<float>(unmasked) : 1.0f;
    const int64_t T = static_cast<int64_t>(labels.size());
    Input lab{"labels", {T, 1, 1, 1}, rp::DType::I32, false};
    lab.ints = labels;
    Input h{"h", {C, T, 1, 1}};
    h.lo = -2.0f;
    h.hi = 2.0f;
    Input W{"W", {C, V, 1, 1}, wtype, wtype == rp::DType::F32};
    return {name, {h, W, lab},
            [scale, chunk](Context & c, const TV & in) { return rp::lm_head_ce(c, in[0], in[1], in[2], scale, chunk); },
            [scale](const R & x) { return ref::lm_head_ce(x[0], x[1], ints_from(x[2]), scale); }};
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

TEST(OpCrossEntropy, BadLabelIsAnError) {
    Context ctx;
    Tensor * h = ctx.new_tensor(rp::DType::F32, 4, 2);
    Tensor * W = ctx.new_tensor(rp::DType::F32, 4, 3);
    Tensor * lab = ctx.new_tensor(rp::DType::I32, 2);
    for (Tensor * t : {h, W, lab}) ctx.alloc_data(t);
    rp::tensor_set_i32(lab, {1, 3});
    Tensor * loss = rp::lm_head_ce(ctx, h, W, lab, 1.0f, 2);
    rp::Graph g;
    rp::build_forward(g, loss);
    rp::CpuBackend be;
    be.allocate(g);
    try {
        be.compute(g, 1);
        FAIL() << "no error";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("label 3"), std::string::npos) << e.what();
    }
    Tensor * lab3 = ctx.new_tensor(rp::DType::I32, 3);
    EXPECT_THROW(rp::lm_head_ce(ctx, h, W, lab3, 1.0f, 2), rp::Error);  // 3 labels for 2 tokens
}
