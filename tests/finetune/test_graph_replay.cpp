// The per-layer training graphs are built once per shape and replayed (FinetuneConfig::replay_graphs,
// models/train/layer_programs.cpp): a replay gives the bits of building the graphs anew, over a run of micro-batches whose
// data, loss scale, step, sequence offset and packing change between calls, for llama (LoRA with and without
// dropout, full), a tied qwen3 and a qwen3moe with the load-balancing loss; with every layer's activations
// kept, all recomputed, and token-chunked. Programs are built once per shape (the cache stops growing when shapes repeat), and the
// RoundPipe runtime on 2 CPU virtual devices replays its programs to the host's bytes.
#include "small_models.h"

#include "models/train/session.h"
#include "models/text/tokenizer.h"
#include "tests/finetune/ft_test_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

struct Call {
    int64_t T, B;
    bool packed;
    int64_t step, seq_offset;
    int data_shift;  // different tokens per call
};

struct Trace {
    std::vector<double> losses;
    std::vector<std::vector<std::vector<float>>> grads;  // after each call
    std::vector<size_t> cached;                          // cached_programs() after each call
};

Trace run(const rp::Model & model, rp::FinetuneConfig cfg, bool replay, const std::vector<Call> & calls) {
    cfg.replay_graphs = replay;
    rp::Trainer tr(model, cfg);
    ft_test::seed_lora_b(tr);
    Trace r;
    for (const Call & c : calls) {
        ft_test::TokenData data(c.T * c.B + c.data_shift);
        data.ids.erase(data.ids.begin(), data.ids.begin() + c.data_shift);
        data.labels.erase(data.labels.begin(), data.labels.begin() + c.data_shift);
        int64_t trained = 0;
        for (int32_t l : data.labels) trained += l >= 0;
        const std::vector<int32_t> pos = ft_test::packed_positions(c.T, c.B, c.data_shift);
        tr.zero_grads();
        r.losses.push_back(tr.accumulate(data.ids.data(), data.labels.data(), c.T, c.B, 1.0f / static_cast<float>(trained), 2, c.step,
                                         c.seq_offset, c.packed ? pos.data() : nullptr));
        tr.collect_grads();
        r.grads.push_back(ft_test::gradients_of(tr));
        r.cached.push_back(tr.cached_programs());
    }
    return r;
}

} // namespace

TEST(GraphReplay, ReplayedProgramsGiveTheRebuiltBits) {
    ft_test::SmallModels & m = ft_test::SmallModels::get();
    rp::FinetuneConfig lora;
    lora.lora_rank = 4;
    lora.lora_dropout = 0.25f;
    rp::FinetuneConfig lora_plain;
    lora_plain.lora_rank = 4;
    rp::FinetuneConfig full;
    full.full = true;
    rp::FinetuneConfig moe_full = full;
    moe_full.moe_aux_loss = 0.01f;
    struct Case {
        const rp::Model * model;
        rp::FinetuneConfig cfg;
        std::string name;
    };
    std::vector<Case> cases = {{m.llama.get(), lora, "llama lora dropout"}, {m.llama.get(), lora_plain, "llama lora"},
                               {m.llama.get(), full, "llama full"}, {m.qwen3.get(), full, "qwen3 full tied"},
                               {m.moe.get(), moe_full, "qwen3moe full aux"}};
    // The same shape again with other data (so another loss scale) and another step, a packed shape, the first
    // shape once more at another sequence offset, the packed one with other example boundaries.
    const std::vector<Call> calls = {{40, 2, false, 0, 0, 0}, {40, 2, false, 1, 0, 3}, {32, 3, true, 1, 2, 1}, {40, 2, false, 2, 2, 5},
                                     {32, 3, true, 2, 0, 2}};
    for (const Case & c : cases)
        for (const auto & [memory, chunk, mode] : {std::tuple<size_t, int64_t, const char *>{size_t(1) << 30, 0, "kept"},
                                                   {0, 0, "recomputed"},
                                                   {0, 24, "token-chunked"}}) {
            const std::string what = c.name + ", " + mode;
            rp::FinetuneConfig cfg = c.cfg;
            cfg.activation_memory = memory;
            cfg.token_chunk = chunk;
            const Trace rebuilt = run(*c.model, cfg, false, calls);
            const Trace replayed = run(*c.model, cfg, true, calls);
            for (size_t i = 0; i < calls.size(); ++i) {
                EXPECT_EQ(std::memcmp(&replayed.losses[i], &rebuilt.losses[i], sizeof(double)), 0) << what << " call " << i;
                ASSERT_EQ(replayed.grads[i].size(), rebuilt.grads[i].size()) << what;
                for (size_t p = 0; p < rebuilt.grads[i].size(); ++p)
                    ASSERT_EQ(replayed.grads[i][p], rebuilt.grads[i][p]) << what << " call " << i << " param " << p;
                EXPECT_EQ(rebuilt.cached[i], 0u) << what;
            }
            // Built once per shape: a repeated shape adds nothing, unless the graphs' parameters hold the loss
            // scale (the MoE load-balancing scale of backward graphs). With LoRA dropout (the step and sequence
            // offset in every graph) nothing is kept.
            if (c.cfg.lora_dropout > 0.0f) {
                for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(replayed.cached[i], 0u) << what;
                continue;
            }
            EXPECT_GT(replayed.cached[0], 0u) << what;
            if (c.cfg.moe_aux_loss == 0.0f) {
                EXPECT_EQ(replayed.cached[1], replayed.cached[0]) << what;
                EXPECT_GT(replayed.cached[2], replayed.cached[1]) << what;   // a new shape
                EXPECT_EQ(replayed.cached[4], replayed.cached[2]) << what;
            } else {
                EXPECT_GT(replayed.cached[1], replayed.cached[0]) << what;
            }
        }
}

// The RoundPipe runtime's programs (2 CPU virtual devices, two micro-batches a step, so both devices may run the
// same layer's program at once) replay to the bytes of a host run that builds every graph anew.
TEST(GraphReplay, PipelineReplaysToTheRebuiltHostBytes) {
    const std::unique_ptr<rp::Model> model = rp::Model::load(ft_test::stories());
    const rp::Tokenizer tok{model->file()};
    rp::DatasetOptions dopt;
    dopt.seq_len = 32;
    dopt.n_ctx = model->hparams().n_ctx_train;
    const rp::Dataset data = rp::Dataset::load(ft_test::shared_dir() + "/models/reference/train.txt", tok, dopt);
    for (bool full : {false, true}) {
        rp::SessionOptions o;
        o.finetune.full = full;
        o.finetune.lora_rank = 4;
        o.batch = 4;
        o.micro_batches = 2;
        o.steps = 3;
        o.threads = 1;
        o.lr.lr_max = 2e-3;
        rp::SessionOptions rebuilt = o;
        rebuilt.finetune.replay_graphs = false;
        rp::SessionOptions piped = o;
        piped.pipelined = true;
        piped.devices.count = 2;
        piped.devices.memory_each = size_t(64) << 20;
        rp::TrainingSession host(*model, data, rebuilt);
        rp::TrainingSession pipe(*model, data, piped);
        for (int i = 0; i < 3; ++i) EXPECT_EQ(host.step().loss, pipe.step().loss) << (full ? "full" : "lora") << " step " << i + 1;
        host.synchronize();
        pipe.synchronize();
        const auto & hp = host.trainer().params();
        const auto & pp = pipe.trainer().params();
        ASSERT_EQ(hp.size(), pp.size());
        for (size_t i = 0; i < hp.size(); ++i)
            EXPECT_EQ(std::memcmp(hp[i].t->data, pp[i].t->data, hp[i].t->nbytes()), 0) << (full ? "full " : "lora ") << hp[i].name;
        EXPECT_EQ(host.trainer().cached_programs(), 0u);
        EXPECT_GT(pipe.trainer().cached_programs(), 0u);
    }
}
