// Host training that keeps the decoder layers' activations from the forward to the backward
// (FinetuneConfig::activation_memory, models/train/host_step.cpp): each kept layer runs the forward half of the graph
// the recompute path builds in its backward, and the backward half later. Checked here:
//   - the loss and every gradient are the recompute path's bits, for llama, a tied qwen3 and a qwen3moe, LoRA
//     with dropout and full finetuning, several sequences per micro-batch, packed sequences, and budgets that
//     keep every layer, some of them or none;
//   - the kept layers' forward really is not recomputed (MUL_MAT and MUL_MAT_ID nodes counted by the op profile), and a
//     recomputed layer skips the products its backward does not read;
//   - plan_run's host graph bytes equal the trainer's measured peak, with the number of layers it keeps.
#include "small_models.h"

#include "ggml_rp/cpu/op_profile.h"
#include "models/train/run_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Result {
    double loss = 0;
    std::vector<std::vector<float>> grads;
    size_t peak_graph = 0;
    int64_t mul_mats = 0;  // MUL_MAT and MUL_MAT_ID nodes run
};

Result run(const rp::Model & model, rp::FinetuneConfig cfg, size_t activation_memory, int64_t T, int64_t B, bool packed) {
    cfg.activation_memory = activation_memory;
    rp::Trainer tr(model, cfg);
    ft_test::seed_lora_b(tr);
    const ft_test::TokenData data(T * B);
    const std::vector<int32_t> pos = ft_test::packed_positions(T, B);
    tr.zero_grads();
    rp::cpu::reset_op_profile();
    rp::cpu::set_op_profiling(true);
    Result r;
    r.loss = tr.accumulate(data.ids.data(), data.labels.data(), T, B, 1.0f / static_cast<float>(T * B), 2, 3, 2, packed ? pos.data() : nullptr);
    rp::cpu::set_op_profiling(false);
    for (const rp::cpu::OpTime & o : rp::cpu::op_profile())
        if (o.op == rp::Op::MUL_MAT || o.op == rp::Op::MUL_MAT_ID) r.mul_mats += o.calls;
    tr.collect_grads();
    r.grads = ft_test::gradients_of(tr);
    r.peak_graph = tr.peak_graph_bytes();
    return r;
}

rp::RunPlan plan(const rp::Model & model, rp::FinetuneConfig cfg, size_t activation_memory, int64_t T, int64_t B, bool packed) {
    cfg.activation_memory = activation_memory;
    rp::RunPlanOptions o;
    o.session.finetune = cfg;
    o.seq_len = T;
    o.session.batch = B;
    o.session.micro_batches = 1;
    o.packed = packed;
    return rp::plan_run(model, o);
}

} // namespace

TEST(KeptActivations, GradientsAreTheRecomputedOnesBitForBitAndThePlanIsMeasured) {
    ft_test::SmallModels & m = ft_test::SmallModels::get();
    rp::FinetuneConfig lora;
    lora.lora_rank = 4;
    lora.lora_dropout = 0.25f;  // the masks of the kept forward must be the recompute's
    rp::FinetuneConfig full;
    full.full = true;
    rp::FinetuneConfig moe_full = full;
    moe_full.moe_aux_loss = 0.01f;  // the load-balancing term reads the router of the kept forward
    struct Case {
        const rp::Model * model;
        rp::FinetuneConfig cfg;
        std::string name;
    };
    const std::vector<Case> cases = {{m.llama.get(), lora, "llama lora"}, {m.llama.get(), full, "llama full"},
                                     {m.qwen3.get(), lora, "qwen3 lora"}, {m.qwen3.get(), full, "qwen3 full"},
                                     {m.moe.get(), moe_full, "qwen3moe full"}};
    for (const Case & c : cases)
        for (const auto & [T, B, packed] : {std::tuple<int64_t, int64_t, bool>{48, 1, false}, {40, 3, false}, {32, 2, true}}) {
            const std::string what = c.name + " T=" + std::to_string(T) + " B=" + std::to_string(B) + (packed ? " packed" : "");
            const int L = static_cast<int>(c.model->hparams().n_layer);
            const Result recomputed = run(*c.model, c.cfg, 0, T, B, packed);
            const rp::RunPlan none = plan(*c.model, c.cfg, 0, T, B, packed);
            EXPECT_EQ(none.host.kept_layers, 0) << what;
            EXPECT_EQ(none.host.graph, recomputed.peak_graph) << what;

            // Every layer kept, then the first one only (a budget of its graph's bytes).
            const rp::RunPlan all = plan(*c.model, c.cfg, size_t(1) << 30, T, B, packed);
            ASSERT_EQ(all.host.kept_layers, L) << what;
            const size_t one_layer = all.host.kept_activations / static_cast<size_t>(L);
            for (const auto & [budget, layers] : {std::pair<size_t, int>{size_t(1) << 30, L}, {one_layer, 1}}) {
                const std::string w = what + " budget " + std::to_string(budget);
                const rp::RunPlan p = plan(*c.model, c.cfg, budget, T, B, packed);
                EXPECT_EQ(p.host.kept_layers, layers) << w;
                const Result kept = run(*c.model, c.cfg, budget, T, B, packed);
                EXPECT_EQ(kept.loss, recomputed.loss) << w;
                ASSERT_EQ(kept.grads.size(), recomputed.grads.size()) << w;
                for (size_t i = 0; i < kept.grads.size(); ++i) EXPECT_EQ(kept.grads[i], recomputed.grads[i]) << w << " param " << i;
                EXPECT_EQ(p.host.graph, kept.peak_graph) << w;
                EXPECT_GT(kept.peak_graph, recomputed.peak_graph) << w;
                // Each kept layer skips its forward's recompute: fewer products, by the same count per layer.
                EXPECT_LT(kept.mul_mats, recomputed.mul_mats) << w;
                EXPECT_EQ((recomputed.mul_mats - kept.mul_mats) % layers, 0) << w;
                // With every layer kept, the products are the forward's alone: a dense layer's recompute does
                // fewer, since its backward program stops where the backward stops reading (the last projection's
                // output feeds only the residual sum: prune_unused). (A MoE layer's expert outputs are read by
                // the routing weights' gradient.)
                if (layers == L && c.model != m.moe.get()) {
                    EXPECT_LT(recomputed.mul_mats - kept.mul_mats, kept.mul_mats) << w;
                }
            }
        }
}

// The budget counts whole layers, in order, and a token chunk always recomputes.
TEST(KeptActivations, BudgetKeepsTheLongestPrefixThatFits) {
    EXPECT_EQ(rp::kept_activation_layers({10, 10, 10}, 0), 0u);
    EXPECT_EQ(rp::kept_activation_layers({10, 10, 10}, 9), 0u);
    size_t bytes = 0;
    EXPECT_EQ(rp::kept_activation_layers({10, 10, 10}, 25, &bytes), 2u);
    EXPECT_EQ(bytes, 20u);
    EXPECT_EQ(rp::kept_activation_layers({10, 10, 10}, 30, &bytes), 3u);
    EXPECT_EQ(bytes, 30u);
    ft_test::SmallModels & m = ft_test::SmallModels::get();
    rp::FinetuneConfig full;
    full.full = true;
    full.token_chunk = 16;
    EXPECT_EQ(plan(*m.llama, full, size_t(1) << 30, 48, 1, false).host.kept_layers, 0);
}
