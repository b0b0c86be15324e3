// The token-chunked training programs (MicroBatchInfo::token_chunk, models/train/layer_programs.cpp): the feed-forward
// halves and the head over token ranges, one graph each, give the loss and every gradient of the one-graph
// programs (<= 1e-6 relative: only the order of the weight-gradient sums over tokens changes), for llama and
// a tied qwen3, LoRA with dropout and full finetuning, ranges that divide the tokens and ones that do not,
// and several sequences per micro-batch; and they take less graph memory.
#include "small_models.h"

#include "models/train/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Result {
    double loss = 0;
    std::vector<std::vector<float>> grads;
    size_t peak_graph = 0;
};

Result run(const rp::Model & model, rp::FinetuneConfig cfg, int64_t chunk, int64_t T, int64_t B) {
    cfg.token_chunk = chunk;
    rp::Trainer tr(model, cfg);
    ft_test::seed_lora_b(tr);
    const ft_test::TokenData data(T * B);
    tr.zero_grads();
    Result r;
    r.loss = tr.accumulate(data.ids.data(), data.labels.data(), T, B, 1.0f / static_cast<float>(T * B), 1, 3, 2);
    tr.collect_grads();
    r.grads = ft_test::gradients_of(tr);
    r.peak_graph = tr.peak_graph_bytes();
    return r;
}

void expect_close(const Result & a, const Result & b, const std::string & what) {
    EXPECT_NEAR(a.loss, b.loss, 1e-6 * std::abs(b.loss)) << what;
    ASSERT_EQ(a.grads.size(), b.grads.size());
    for (size_t i = 0; i < a.grads.size(); ++i) {
        double num = 0, den = 0;
        for (size_t k = 0; k < a.grads[i].size(); ++k) {
            const double d = static_cast<double>(a.grads[i][k]) - b.grads[i][k];
            num += d * d;
            den += static_cast<double>(b.grads[i][k]) * b.grads[i][k];
        }
        ASSERT_GT(den, 0) << what << " param " << i << " has no gradient";
        EXPECT_LE(std::sqrt(num / den), 1e-6) << what << " param " << i;
    }
}

} // namespace

TEST(TokenChunk, ChunkedProgramsEqualTheOneGraphPrograms) {
    ft_test::SmallModels & m = ft_test::SmallModels::get();
    rp::FinetuneConfig lora;
    lora.lora_rank = 4;
    lora.lora_dropout = 0.25f;  // the masks must follow each token into its range
    rp::FinetuneConfig full;
    full.full = true;
    for (const rp::Model * model : {m.llama.get(), m.qwen3.get()})
        for (const auto & [cfg, name] : {std::pair{lora, "lora"}, std::pair{full, "full"}})
            for (const auto & [T, B] : {std::pair<int64_t, int64_t>{48, 1}, std::pair<int64_t, int64_t>{40, 3}}) {
                const Result whole = run(*model, cfg, 0, T, B);
                for (const int64_t chunk : {int64_t(16), int64_t(7), T * B - 1}) {
                    const std::string what = std::string(model == m.llama.get() ? "llama " : "qwen3 ") + name + " T=" +
                                             std::to_string(T) + " B=" + std::to_string(B) + " chunk " + std::to_string(chunk);
                    expect_close(run(*model, cfg, chunk, T, B), whole, what);
                }
                // A chunk of every token (or more) is the one-graph program itself.
                const Result same = run(*model, cfg, T * B, T, B);
                EXPECT_EQ(same.loss, whole.loss);
                EXPECT_EQ(same.grads, whole.grads);
            }
}

TEST(TokenChunk, ChunkedGraphsAreSmaller) {
    ft_test::SmallModels & m = ft_test::SmallModels::get();
    rp::FinetuneConfig lora;
    lora.lora_rank = 4;
    rp::Trainer tr(*m.llama, lora);
    rp::TrainingProgram & prog = tr;
    const auto rules = rp::footprint_rules("cpu");
    rp::MicroBatchInfo mb;
    mb.seq_len = 2048;
    mb.n_seq = 1;
    const size_t whole_bwd = prog.program_footprint(rp::ProgramKind::Backward, 1, mb, *rules);
    const size_t whole_head = prog.program_footprint(rp::ProgramKind::Head, prog.num_layers() - 1, mb, *rules);
    mb.token_chunk = 256;
    const size_t chunk_bwd = prog.program_footprint(rp::ProgramKind::Backward, 1, mb, *rules);
    const size_t chunk_head = prog.program_footprint(rp::ProgramKind::Head, prog.num_layers() - 1, mb, *rules);
    EXPECT_LT(chunk_bwd, whole_bwd);
    EXPECT_LT(chunk_head * 4, whole_head);  // the head is all per-token work
}
