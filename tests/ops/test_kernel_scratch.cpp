// The CPU kernels' scratch (cpu/kernel_scratch.h): a graph's plan counts the largest node's scratch after its
// tensors, so the memory plans of the devices and of the host hold it; the kernels of a planned graph take it
// from there (no heap allocation in a step), and a kernel outside a planned graph, or one whose block is taken
// or too small, gets a heap block of its own. (Every op test also asserts that no kernel asked more than its
// node planned: harness.cpp.)
#include "ggml_rp/core/context.h"
#include "ggml_rp/core/graph.h"
#include "ggml_rp/cpu/attention.h"
#include "ggml_rp/cpu/backend.h"
#include "ggml_rp/cpu/cross_entropy.h"
#include "ggml_rp/cpu/gemm.h"
#include "ggml_rp/cpu/kernel_scratch.h"
#include "ggml_rp/ops/attention.h"
#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/cross_entropy.h"
#include "ggml_rp/ops/ops.h"
#include "ggml_rp/ops/view.h"
#include "ggml_rp/runtime/graph_runner.h"
#include "base/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace {

using rp::Tensor;

Tensor * param(rp::Context & ctx, std::mt19937 & rng, int64_t a, int64_t b, int64_t c = 1, int64_t d = 1) {
    Tensor * t = ctx.new_tensor(rp::DType::F32, a, b, c, d);
    ctx.alloc_data(t);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(t->nelements()));
    for (float & x : v) x = u(rng);
    rp::tensor_set_f32(t, v);
    rp::set_param(ctx, t);
    ctx.alloc_data(t->grad);
    return t;
}

// Attention over 70 tokens (two key blocks, kept dS) into an LM head of 300 rows in chunks of 128, trained: the
// graph has an ATTENTION_BACK, an LM_HEAD_CE and an LM_HEAD_CE_BACK node.
struct AttentionIntoHead {
    rp::Context ctx;
    rp::Graph g;
    std::vector<Tensor *> params;
    Tensor * loss = nullptr;
    AttentionIntoHead() {
        std::mt19937 rng(7);
        const int64_t D = 16, H = 2, T = 70, V = 300;
        Tensor * q = param(ctx, rng, D, H, T);
        Tensor * k = param(ctx, rng, D, H, T);
        Tensor * v = param(ctx, rng, D, H, T);
        Tensor * W = param(ctx, rng, D * H, V);
        Tensor * labels = ctx.new_tensor(rp::DType::I32, T);
        ctx.alloc_data(labels);
        std::vector<int32_t> y(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) y[static_cast<size_t>(t)] = t % 5 == 4 ? -1 : static_cast<int32_t>((t * 37) % V);
        rp::tensor_set_i32(labels, y);
        Tensor * o = rp::attention(ctx, q, k, v, 0.25f);
        loss = rp::lm_head_ce(ctx, rp::reshape(ctx, o, D * H, T), W, labels, 1.0f / 56.0f, 128);
        loss->flags |= rp::kFlagOutput;
        rp::build_forward(g, loss);
        params = {q, k, v, W};
        rp::build_backward(ctx, g, loss, params);
    }
};

} // namespace

TEST(KernelScratch, APlanHoldsTheLargestNodesScratchAfterItsTensors) {
    AttentionIntoHead m;
    size_t largest = 0;
    int users = 0;
    for (const Tensor * n : m.g.nodes) {
        const size_t b = rp::cpu::node_scratch_bytes(n);
        largest = std::max(largest, b);
        users += b > 0;
        if (n->op == rp::Op::ATTENTION_BACK || n->op == rp::Op::LM_HEAD_CE) {
            EXPECT_GT(b, 0u) << rp::op_name(n->op);
        }
    }
    EXPECT_GE(users, 2);
    const rp::AllocPlan tensors = rp::plan_graph(m.g, 64), plan = rp::cpu::plan_cpu_graph(m.g);
    EXPECT_EQ(plan.scratch_bytes, largest);
    EXPECT_EQ(plan.scratch_offset, rp::cpu::scratch_round(tensors.size));
    EXPECT_EQ(plan.size, plan.scratch_offset + largest);
    EXPECT_EQ(plan.offsets, tensors.offsets);
    // what a device's memory plan asks the CPU runner
    EXPECT_EQ(rp::CpuGraphRunner().graph_bytes(m.g), plan.size);
}

TEST(KernelScratch, APlannedGraphsKernelsTakeThePlannedBlockAndGiveTheSameBits) {
    AttentionIntoHead planned, unplanned;
    rp::CpuBackend be;
    be.allocate(planned.g);
    const int64_t bound0 = rp::cpu::planned_scratch_calls(), missed0 = rp::cpu::unplanned_scratch_calls();
    be.compute(planned.g, 2);
    int users = 0;
    for (const Tensor * n : planned.g.nodes) users += rp::cpu::node_scratch_bytes(n) > 0;
    EXPECT_EQ(rp::cpu::planned_scratch_calls() - bound0, users);
    EXPECT_EQ(rp::cpu::unplanned_scratch_calls(), missed0);
    // The same graph placed with the tensors' plan only: no scratch bound, every kernel's own heap block.
    rp::CpuBackend heap;
    heap.allocate(unplanned.g, rp::plan_graph(unplanned.g, 64));
    const int64_t bound1 = rp::cpu::planned_scratch_calls();
    heap.compute(unplanned.g, 2);
    EXPECT_EQ(rp::cpu::planned_scratch_calls(), bound1);
    EXPECT_EQ(rp::cpu::unplanned_scratch_calls(), missed0);
    EXPECT_EQ(rp::tensor_get_f32(planned.loss), rp::tensor_get_f32(unplanned.loss));
    for (size_t i = 0; i < planned.params.size(); ++i)
        EXPECT_EQ(rp::tensor_get_f32(planned.params[i]->grad), rp::tensor_get_f32(unplanned.params[i]->grad)) << "param " << i;
}

TEST(KernelScratch, ATakenOrTooSmallBlockGivesAHeapBlockAndIsCounted) {
    alignas(64) static char block[1024];
    const int64_t missed0 = rp::cpu::unplanned_scratch_calls();
    {
        rp::cpu::Scratch none(256);  // nothing bound: a heap block, not a miss
        EXPECT_FALSE(none.planned());
        EXPECT_NE(none.take<float>(64), nullptr);
    }
    EXPECT_EQ(rp::cpu::unplanned_scratch_calls(), missed0);
    {
        const rp::cpu::ScratchBinding bind(block, sizeof block);
        {
            rp::cpu::Scratch outer(512);
            EXPECT_TRUE(outer.planned());
            float * a = outer.take<float>(10);  // 40 bytes, rounded to 64
            float * b = outer.take<float>(100);
            EXPECT_EQ(static_cast<void *>(a), static_cast<void *>(block));
            EXPECT_EQ(reinterpret_cast<char *>(b), block + 64);
            EXPECT_THROW(outer.take<float>(128), rp::Error);  // past the 512 bytes asked
            {
                rp::cpu::Scratch inner(500);  // (a GEMM's pack under its kernel's arrays) on top: 512 bytes
                EXPECT_TRUE(inner.planned());
                EXPECT_EQ(inner.take<char>(500), block + 512);
                rp::cpu::Scratch full(64);  // no room left
                EXPECT_FALSE(full.planned());
            }
            rp::cpu::Scratch given_back(512);  // the inner one's part again
            EXPECT_TRUE(given_back.planned());
            EXPECT_EQ(given_back.take<char>(512), block + 512);
        }
        EXPECT_EQ(rp::cpu::unplanned_scratch_calls(), missed0 + 1);
        rp::cpu::Scratch again(1024);  // all of it free again, and exactly its size
        EXPECT_TRUE(again.planned());
    }
    {
        const rp::cpu::ScratchBinding bind(block, sizeof block);
        rp::cpu::Scratch big(2048);
        EXPECT_FALSE(big.planned());
        EXPECT_NE(big.take<char>(2048), nullptr);
    }
    EXPECT_EQ(rp::cpu::unplanned_scratch_calls(), missed0 + 2);
    rp::cpu::Scratch after(64);  // the binding is gone with its scope
    EXPECT_FALSE(after.planned());
    EXPECT_EQ(rp::cpu::unplanned_scratch_calls(), missed0 + 2);
}

// The sizes follow the kernels: the kept dS blocks only while they fit set_attention_kept_ds_bytes, the LM head's
// tiles only for a pass over the vocabulary (the gradients' only where it forms them), a GEMM's packed operand only
// past the 16 MiB a thread keeps.
TEST(KernelScratch, SizesFollowWhatTheKernelsKeep) {
    rp::AttentionShape s;
    s.B = 1, s.Tq = s.Tk = 200, s.Hq = 4, s.Hkv = 2, s.D = 16, s.scale = 0.25f;
    const size_t kept = rp::cpu::attention_bwd_scratch_bytes(s);
    rp::cpu::set_attention_kept_ds_bytes(0);
    const size_t recomputed = rp::cpu::attention_bwd_scratch_bytes(s);
    rp::cpu::set_attention_kept_ds_bytes(size_t(32) << 20);
    EXPECT_EQ(recomputed, rp::cpu::scratch_round(200 * 4 * sizeof(float)));  // rowsum(dO O) only
    EXPECT_EQ(kept, recomputed + rp::cpu::scratch_round(4 * 4 * 4 * 64 * 64 * sizeof(float)) + rp::cpu::scratch_round(4 * 4 * 4));
    const rp::cpu::LmHeadCEShape h{64, 1000, 30, 256};
    const size_t tile = rp::cpu::scratch_round(256 * 30 * sizeof(float)), per_token = rp::cpu::scratch_round(30 * sizeof(float));
    const size_t without = rp::cpu::lm_head_ce_scratch_bytes(h, false, false);
    EXPECT_EQ(rp::cpu::lm_head_ce_scratch_bytes(h, true, true) - without, 2 * tile + per_token);
    EXPECT_EQ(rp::cpu::lm_head_ce_scratch_bytes(h, true, false) - without, tile + per_token);  // logits only
    EXPECT_EQ(rp::cpu::lm_head_ce_range_scratch_bytes(h, 100, true), rp::cpu::scratch_round(100 * 30 * sizeof(float)) + per_token);
    const rp::cpu::LmHeadCEShape capped{64, 1000, 30, 256, 30.0f};
    EXPECT_EQ(rp::cpu::lm_head_ce_range_scratch_bytes(capped, 100, true), 2 * rp::cpu::scratch_round(100 * 30 * sizeof(float)) + per_token);
    EXPECT_EQ(rp::cpu::lm_head_ce_range_scratch_bytes(capped, 100, false), rp::cpu::scratch_round(100 * 30 * sizeof(float)) + per_token);
    // 4000 x 1024 floats (under 16 MiB with any micro-kernel's row padding) stay in the thread's buffer; 4200
    // columns take the scratch, in 256-deep reduction blocks
    EXPECT_EQ(rp::cpu::matmul_fwd_scratch_bytes(1024, 8, 4000), 0u);
    EXPECT_GE(rp::cpu::matmul_fwd_scratch_bytes(1024, 8, 4200), size_t(4200) * 1024 * sizeof(float));
    EXPECT_LT(rp::cpu::matmul_fwd_scratch_bytes(1024, 8, 4200), size_t(4212) * 1024 * sizeof(float));
    EXPECT_EQ(rp::cpu::matmul_bwd_x_scratch_bytes(8, 1000, 4200), rp::cpu::matmul_fwd_scratch_bytes(1024, 8, 4200));  // dY: 4200 x 1000 -> 1024
    EXPECT_EQ(rp::cpu::matmul_bwd_w_scratch_bytes(8, 4200, 1000), rp::cpu::matmul_fwd_scratch_bytes(1024, 8, 4200));  // dY^T: 4200 x 1000
    const rp::cpu::LmHeadCEShape wide{1024, 8000, 4200, 4096};  // the head's GEMMs on top of its arrays
    EXPECT_EQ(rp::cpu::lm_head_ce_scratch_bytes(wide, true, true) - rp::cpu::lm_head_ce_scratch_bytes(wide, false, false),
              2 * rp::cpu::scratch_round(size_t(4096) * 4200 * sizeof(float)) + rp::cpu::scratch_round(4200 * sizeof(float)) +
                  rp::cpu::matmul_bwd_w_scratch_bytes(1024, 4096, 4200));
}

// A product whose packed operand passes the 16 MiB a thread keeps (4200 tokens of 1024, 64 outputs: more than the
// few-column kernel's 8) takes it from the graph's planned scratch, with the bits of the unplanned run (the pack is
// a copy).
TEST(KernelScratch, AWideProductsPackIsPlanned) {
    std::mt19937 rng(3);
    auto build = [&](rp::Context & ctx, rp::Graph & g, std::vector<Tensor *> & ps) {
        Tensor * W = param(ctx, rng, 1024, 64);
        Tensor * x = param(ctx, rng, 1024, 4200);
        Tensor * y = rp::sum(ctx, rp::mul_mat(ctx, W, x));
        y->flags |= rp::kFlagOutput;
        rp::build_forward(g, y);
        ps = {W, x};
        rp::build_backward(ctx, g, y, ps);
    };
    rp::Context c1, c2;
    rp::Graph g1, g2;
    std::vector<Tensor *> p1, p2;
    build(c1, g1, p1);
    rng.seed(3);
    build(c2, g2, p2);
    size_t packs = 0;
    for (const Tensor * n : g1.nodes)
        if (n->op == rp::Op::MUL_MAT || n->op == rp::Op::MUL_MAT_BACK_X || n->op == rp::Op::OUT_PROD) packs += rp::cpu::node_scratch_bytes(n) > 0;
    EXPECT_EQ(packs, 1u);  // the forward's X, 4200 x 1024 (dY, 4200 x 64, packs into 4200 x 256: the thread's buffer)
    rp::CpuBackend planned, heap;
    planned.allocate(g1);
    heap.allocate(g2, rp::plan_graph(g2, 64));
    const int64_t bound0 = rp::cpu::planned_scratch_calls(), missed0 = rp::cpu::unplanned_scratch_calls();
    planned.compute(g1, 2);
    EXPECT_GE(rp::cpu::planned_scratch_calls() - bound0, 1);
    EXPECT_EQ(rp::cpu::unplanned_scratch_calls(), missed0);
    heap.compute(g2, 2);
    for (size_t i = 0; i < p1.size(); ++i) EXPECT_EQ(rp::tensor_get_f32(p1[i]->grad), rp::tensor_get_f32(p2[i]->grad)) << "param " << i;
}
