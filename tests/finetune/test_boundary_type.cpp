// FinetuneConfig::boundary_type = BF16 (rp-finetune --boundary-dtype bf16): every layer program writes its output
// rounded to bf16 (to nearest even) and reads its input as bf16; gradients pass through the rounding and stay f32.
// On the host programs: a layer's bf16 output is exactly the f32 program's output rounded (from the same input),
// its input and parameter gradients are the f32 program's bits (the rounding's gradient is the identity), the
// token-chunked forward packs the same bytes, and host training keeps its bits whether its layers are kept or
// recomputed. (The pipeline's bits against the host, and its halved checkpoints: tests/roundpipe/test_pipeline.cpp.)
#include "small_models.h"

#include "ggml_rp/core/fp16.h"
#include "models/train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace {

constexpr int64_t kT = 12, kB = 2;

rp::FinetuneConfig config(bool full, rp::DType boundary) {
    rp::FinetuneConfig c;
    c.full = full;
    c.lora_rank = 4;
    c.boundary_type = boundary;
    return c;
}

rp::MicroBatchInfo micro_batch() {
    rp::MicroBatchInfo mb;
    mb.seq_len = kT;
    mb.n_seq = kB;
    mb.loss_scale = 1.0f / static_cast<float>(kT * kB);
    return mb;
}

// A hidden state whose values bf16 holds exactly: the f32 and the bf16 programs read the same input.
struct Hidden {
    std::vector<float> f32;
    std::vector<uint16_t> bf16;
    explicit Hidden(int64_t n, double phase) {
        for (int64_t i = 0; i < n; ++i) {
            const uint16_t h = rp::fp32_to_bf16(static_cast<float>(std::sin(0.37 * static_cast<double>(i) + phase)));
            bf16.push_back(h);
            f32.push_back(rp::bf16_to_fp32(h));
        }
    }
};

std::vector<float> gradients(rp::Trainer & tr) {
    tr.collect_grads();
    std::vector<float> all;
    for (const auto & g : ft_test::gradients_of(tr)) all.insert(all.end(), g.begin(), g.end());
    return all;
}

} // namespace

TEST(BoundaryType, Bf16ProgramsRoundTheOutputsAndPassTheGradientsThrough) {
    ft_test::SmallModels & m = ft_test::SmallModels::get();
    for (const rp::Model * model : {m.llama.get(), m.qwen3.get(), m.moe.get()})
        for (const bool full : {false, true}) {
            rp::Trainer a(*model, config(full, rp::DType::F32)), b(*model, config(full, rp::DType::BF16));
            ft_test::seed_lora_b(a);
            ft_test::seed_lora_b(b);
            const rp::MicroBatchInfo mb = micro_batch();
            const int64_t E = model->hparams().n_embd, n = E * kT * kB;
            ASSERT_EQ(b.boundary_bytes(mb), a.boundary_bytes(mb) / 2);
            ASSERT_EQ(b.hidden_bytes(mb), a.hidden_bytes(mb));
            const int L = a.num_layers();
            const ft_test::TokenData data(kT * kB);
            rp::ProgramContext pc;
            pc.n_threads = 2;
            for (int l = 0; l < L; ++l) {
                const std::string what = model->path() + (full ? " full" : " lora") + " layer " + std::to_string(l);
                const Hidden x(n, 0.1 * l);
                const void * in32 = l == 0 ? static_cast<const void *>(data.ids.data()) : x.f32.data();
                const void * in16 = l == 0 ? static_cast<const void *>(data.ids.data()) : x.bf16.data();
                a.zero_grads();
                b.zero_grads();
                std::vector<float> din32(static_cast<size_t>(n), -1.0f), din16(static_cast<size_t>(n), -2.0f);
                if (l < L - 1) {
                    // Forward: the bf16 program's output is the f32 one's rounded, whole or in token ranges.
                    std::vector<float> out32(static_cast<size_t>(n));
                    std::vector<uint16_t> out16(static_cast<size_t>(n));
                    a.forward(l, a.host_memory(l), in32, out32.data(), mb, pc);
                    b.forward(l, b.host_memory(l), in16, out16.data(), mb, pc);
                    int wrong = 0;
                    for (int64_t i = 0; i < n; ++i) wrong += out16[static_cast<size_t>(i)] != rp::fp32_to_bf16(out32[static_cast<size_t>(i)]);
                    EXPECT_EQ(wrong, 0) << what;
                    if (l > 0) {
                        rp::MicroBatchInfo chunked = mb;
                        chunked.token_chunk = 5;  // ranges of 5, 5, ..., 4 tokens over the 24
                        std::vector<uint16_t> packed(static_cast<size_t>(2 * n));  // (the chunked forward's f32 room)
                        b.forward(l, b.host_memory(l), in16, packed.data(), chunked, pc);
                        EXPECT_TRUE(std::equal(out16.begin(), out16.end(), packed.begin())) << what << " token-chunked";
                    }
                    // Backward: the same gradients, bit for bit.
                    Hidden dout(n, 1.0 + l);
                    a.backward(l, a.host_memory(l), in32, dout.f32.data(), l == 0 ? nullptr : din32.data(), mb, pc);
                    b.backward(l, b.host_memory(l), in16, dout.f32.data(), l == 0 ? nullptr : din16.data(), mb, pc);
                } else {
                    float loss32 = 0, loss16 = 1;
                    a.head(a.host_memory(l), in32, data.labels.data(), &loss32, din32.data(), mb, pc);
                    b.head(b.host_memory(l), in16, data.labels.data(), &loss16, din16.data(), mb, pc);
                    EXPECT_EQ(loss16, loss32) << what;
                }
                if (l > 0) {
                    EXPECT_EQ(din16, din32) << what;
                }
                const std::vector<float> ga = gradients(a), gb = gradients(b);
                EXPECT_EQ(ga, gb) << what;
                double norm = 0;
                for (float g : ga) norm += static_cast<double>(g) * g;
                if ((l > 0 && l < L - 1) || full) {  // (a LoRA run's head has nothing trainable)
                    EXPECT_GT(norm, 0) << what << ": no gradient reached the parameters";
                }
            }
        }
}

// Host training with bf16 boundaries: the kept layers' graphs and the recomputed ones give the same loss and
// gradients, bit for bit, and the whole-model graph the same loss; the loss is f32's within the rounding, not equal
// to it (the outputs were rounded).
TEST(BoundaryType, HostTrainingKeepsItsBitsKeptOrRecomputed) {
    ft_test::SmallModels & m = ft_test::SmallModels::get();
    for (const rp::Model * model : {m.llama.get(), m.moe.get()})
        for (const bool full : {false, true}) {
            auto run = [&](rp::DType boundary, size_t activation_memory, double & loss) {
                rp::FinetuneConfig c = config(full, boundary);
                c.activation_memory = activation_memory;
                rp::Trainer tr(*model, c);
                ft_test::seed_lora_b(tr);
                const ft_test::TokenData data(kT * kB);
                tr.zero_grads();
                loss = tr.accumulate(data.ids.data(), data.labels.data(), kT, kB, 1.0f / static_cast<float>(kT * kB), 2, 0, 0);
                // The whole-model graph (evaluation, a DPO reference, GRPO's log-probabilities) rounds the same outputs.
                EXPECT_EQ(tr.loss(data.ids.data(), data.labels.data(), kT, kB, 1.0f / static_cast<float>(kT * kB), 2), loss)
                    << model->path() << " whole-model loss, boundaries " << rp::dtype_name(boundary);
                return gradients(tr);
            };
            const std::string what = model->path() + (full ? " full" : " lora");
            double kept = 0, recomputed = 0, f32 = 0;
            const std::vector<float> g_kept = run(rp::DType::BF16, size_t(1) << 30, kept);
            const std::vector<float> g_recomputed = run(rp::DType::BF16, 0, recomputed);
            run(rp::DType::F32, size_t(1) << 30, f32);
            EXPECT_EQ(kept, recomputed) << what;
            EXPECT_EQ(g_kept, g_recomputed) << what;
            EXPECT_NE(kept, f32) << what;
            EXPECT_NEAR(kept, f32, 1e-2 * std::abs(f32)) << what;
        }
}

TEST(BoundaryType, OnlyF32OrBf16) {
    rp::FinetuneConfig c;
    c.boundary_type = rp::DType::F16;
    try {
        rp::Trainer tr(*ft_test::SmallModels::get().llama, c);
        FAIL() << "f16 boundaries were accepted";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("boundary_type f16"), std::string::npos) << e.what();
    }
}
