// The vocabulary matrices on the host (MicroBatchInfo::vocab_on_host, models/train/layer_programs.cpp): the embedding's
// rows of the micro-batch's tokens gathered on the host, the LM head folded range by range into state held across
// its graphs. The programs give the bits of the unstreamed ones: layer 0's output, the head's loss, its input
// gradient and every parameter gradient, the evaluation head's results, and the per-token heads of GRPO; for an
// untied llama (with a LoRA pair on the embedding) and a tied qwen3, f32 and bf16 boundaries, whole and token-chunked
// heads (each token range after the other, or each row range into every token range: vocab_pass_once), ranges that
// divide the vocabulary and a last partial one. Only frozen matrices stay on the host; a trained
// one does not. And the footprint:
// a streamed head's graphs hold its state and one range, not the matrix.
#include "small_models.h"

#include "models/train/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Outputs {
    std::vector<char> embedded;                 // layer 0's output (the boundary type)
    std::vector<float> loss, din, results;      // the head's loss (and results), its input gradient; head_forward's
    std::vector<std::vector<float>> grads;      // every parameter gradient after the head
};

// The programs on the host (no runner: the Trainer's own CPU runner), their memory the host's.
Outputs run(rp::Trainer & tr, rp::MicroBatchInfo mb, bool stream, const ft_test::TokenData & data, const std::vector<float> & values,
            bool pass_once = false) {
    mb.vocab_on_host = stream;
    mb.vocab_pass_once = pass_once;
    mb.token_ids = data.ids.data();
    mb.sequence_values = values.empty() ? nullptr : values.data();
    rp::TrainingProgram & prog = tr;
    rp::ProgramContext pc;
    pc.n_threads = 2;
    const int L = prog.num_layers();
    Outputs o;
    o.embedded.resize(prog.hidden_bytes(mb));  // (a token-chunked forward writes its f32 attention half there first)
    prog.forward(0, tr.host_memory(0), data.ids.data(), o.embedded.data(), mb, pc);
    std::vector<char> x = o.embedded, y(x.size());
    for (int l = 1; l < L - 1; ++l) {
        prog.forward(l, tr.host_memory(l), x.data(), y.data(), mb, pc);
        std::swap(x, y);
    }
    tr.zero_grads();
    o.loss.assign(prog.head_results(mb), NAN);
    o.din.assign(prog.hidden_bytes(mb) / sizeof(float), NAN);
    prog.head(tr.host_memory(L - 1), x.data(), data.labels.data(), o.loss.data(), o.din.data(), mb, pc);
    tr.collect_grads();
    o.grads = ft_test::gradients_of(tr);
    o.results.assign(prog.head_results(mb), NAN);
    prog.head_forward(tr.host_memory(L - 1), x.data(), data.labels.data(), o.results.data(), mb, pc);
    return o;
}

void expect_same(const Outputs & a, const Outputs & b, const std::string & what) {
    EXPECT_TRUE(a.embedded == b.embedded) << what << ": layer 0's output";
    ASSERT_EQ(a.loss.size(), b.loss.size()) << what;
    for (size_t i = 0; i < a.loss.size(); ++i) EXPECT_EQ(a.loss[i], b.loss[i]) << what << ": head result " << i;
    EXPECT_TRUE(std::isfinite(a.loss[0]) && a.loss[0] != 0.0f) << what;
    EXPECT_TRUE(a.din == b.din) << what << ": the head's input gradient";
    EXPECT_TRUE(a.grads == b.grads) << what << ": the parameter gradients";
    ASSERT_EQ(a.results.size(), b.results.size()) << what;
    for (size_t i = 0; i < a.results.size(); ++i) EXPECT_EQ(a.results[i], b.results[i]) << what << ": evaluation result " << i;
    double din = 0;
    for (float v : a.din) din += std::fabs(v);
    EXPECT_GT(din, 0) << what << ": the head's input gradient is zero";
}

int64_t streamed_tensors(rp::Trainer & tr) {
    int64_t n = 0;
    for (int l = 0; l < tr.num_layers(); ++l)
        for (const auto & ti : tr.layer_tensors(l)) n += ti.vocab_rows > 0;
    return n;
}

} // namespace

TEST(VocabOnHost, StreamedProgramsGiveTheUnstreamedBits) {
    ft_test::SmallModels & m = ft_test::SmallModels::get();
    for (const rp::Model * model : {m.llama.get(), m.qwen3.get()})
        for (const rp::DType boundary : {rp::DType::F32, rp::DType::BF16})
            for (const int64_t ce_chunk : {int64_t(100), int64_t(64)})
                for (const int64_t token_chunk : {int64_t(0), int64_t(7)}) {
                    rp::FinetuneConfig cfg;
                    cfg.lora_rank = 4;
                    if (model == m.llama.get())  // the embedding's pair, looked up by the real ids (a tied model cannot have one)
                        cfg.lora_targets = {"attn_q", "attn_v", "ffn_down", "token_embd"};
                    cfg.boundary_type = boundary;
                    cfg.ce_chunk = ce_chunk;  // 6 ranges of 100 (the last partial) or 8 of 64 over llama's 512 rows
                    rp::Trainer tr(*model, cfg);
                    ft_test::seed_lora_b(tr);
                    EXPECT_EQ(streamed_tensors(tr), 2) << "the embedding (layer 0) and the head";
                    rp::MicroBatchInfo mb;
                    mb.seq_len = 12;
                    mb.n_seq = 2;
                    mb.token_chunk = token_chunk;
                    mb.loss_scale = 1.0f / 24;
                    const ft_test::TokenData data(24);
                    const std::string what = std::string(model == m.llama.get() ? "llama" : "qwen3 tied") + " " +
                                             rp::dtype_name(boundary) + " ce_chunk " + std::to_string(ce_chunk) + " token chunk " +
                                             std::to_string(token_chunk);
                    const Outputs plain = run(tr, mb, false, data, {});
                    expect_same(run(tr, mb, true, data, {}), plain, what);
                    // Each row range into every token range's state before the next: the same bits.
                    if (token_chunk > 0) expect_same(run(tr, mb, true, data, {}, true), plain, what + ", rows once");
                }
}

// QLoRA: quantized embedding and head (q8_0, q4_0 llamas on stories260K's vocabulary): the gathered rows and the
// uploaded head ranges in the file's type, the same bits.
TEST(VocabOnHost, QuantizedMatricesGiveTheUnstreamedBits) {
    rp_test::TempDir dir;
    for (const gguf::TensorType type : {gguf::TensorType::Q8_0, gguf::TensorType::Q4_0}) {
        rp::SynthSpec s;
        s.vocab_from = rp_test::shared_dir() + "/models/stories260K.gguf";
        s.n_embd = 64, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 16, s.n_ff = 160, s.n_layer = 2, s.seed = 23;
        s.wtype = type;
        const std::string path = dir.file(std::string(gguf::type_name(uint32_t(type))) + ".gguf");
        rp::write_synth_model(s, path);
        const std::unique_ptr<rp::Model> model = rp::Model::load(path);
        rp::FinetuneConfig cfg;
        cfg.lora_rank = 4;
        cfg.ce_chunk = 100;
        rp::Trainer tr(*model, cfg);
        ft_test::seed_lora_b(tr);
        for (int l : {0, tr.num_layers() - 1})
            for (const auto & ti : tr.layer_tensors(l)) {
                if (ti.vocab_rows > 0) {
                    EXPECT_EQ(ti.bytes, static_cast<size_t>(ti.vocab_rows) * gguf::row_bytes(type, 64)) << ti.name;
                }
            }
        rp::MicroBatchInfo mb;
        mb.seq_len = 12;
        mb.n_seq = 2;
        mb.token_chunk = 7;
        mb.loss_scale = 1.0f / 24;
        const ft_test::TokenData data(24);
        const Outputs plain = run(tr, mb, false, data, {});
        const std::string what = gguf::type_name(uint32_t(type));
        expect_same(run(tr, mb, true, data, {}), plain, what);
        expect_same(run(tr, mb, true, data, {}, true), plain, what + ", rows once");
    }
}

// GRPO's head: per-token NLL with a gradient per token, through the streamed state.
TEST(VocabOnHost, PerTokenHeadsStreamToo) {
    ft_test::SmallModels & m = ft_test::SmallModels::get();
    rp::FinetuneConfig cfg;
    cfg.lora_rank = 4;
    cfg.ce_chunk = 100;
    cfg.grpo = rp::GrpoParams{};
    rp::Trainer tr(*m.llama, cfg);
    ft_test::seed_lora_b(tr);
    rp::MicroBatchInfo mb;
    mb.seq_len = 12;
    mb.n_seq = 2;
    mb.loss_scale = 1.0f / 24;
    const ft_test::TokenData data(24);
    std::vector<float> values(static_cast<size_t>(rp::kTokenValues * 24));
    for (size_t t = 0; t < 24; ++t) {
        values[t * rp::kTokenValues + rp::kAdvantage] = static_cast<float>(std::sin(0.9 * static_cast<double>(t)));
        values[t * rp::kTokenValues + rp::kOldLogp] = -3.0f;
        values[t * rp::kTokenValues + rp::kRefLogp] = -3.0f;
        values[t * rp::kTokenValues + rp::kTokenWeight] = 1.0f / 24;
    }
    expect_same(run(tr, mb, true, data, values), run(tr, mb, false, data, values), "grpo");
}

// A full finetune trains the head and the embedding: nothing streams (a trained matrix has its gradient slot on
// the device), and a call that asks for streaming runs the unstreamed programs.
TEST(VocabOnHost, TrainedMatricesDoNotStream) {
    ft_test::SmallModels & m = ft_test::SmallModels::get();
    rp::FinetuneConfig cfg;
    cfg.full = true;
    cfg.ce_chunk = 100;
    rp::Trainer tr(*m.qwen3, cfg);
    EXPECT_EQ(streamed_tensors(tr), 0);
    rp::MicroBatchInfo mb;
    mb.seq_len = 12;
    mb.n_seq = 2;
    mb.loss_scale = 1.0f / 24;
    const ft_test::TokenData data(24);
    expect_same(run(tr, mb, true, data, {}), run(tr, mb, false, data, {}), "qwen3 tied full");
}

// The streamed head's graphs hold its state and one range of rows; the unstreamed head's footprint does not hold
// the matrix either (it is in the weight slot), so the streamed footprint is compared with the state: larger than
// it, smaller than the state plus the matrix. Layer 0's streamed forward holds the gathered rows.
TEST(VocabOnHost, FootprintsCountTheStateAndTheRanges) {
    ft_test::SmallModels & m = ft_test::SmallModels::get();
    rp::FinetuneConfig cfg;
    cfg.lora_rank = 4;
    cfg.ce_chunk = 64;
    rp::Trainer tr(*m.llama, cfg);
    rp::TrainingProgram & prog = tr;
    const int L = prog.num_layers();
    for (const char * backend : {"cpu", "cuda"}) {
        const auto rules = rp::footprint_rules(backend);
        rp::MicroBatchInfo mb;
        mb.seq_len = 256;
        mb.n_seq = 2;
        const size_t plain = prog.program_footprint(rp::ProgramKind::Head, L - 1, mb, *rules);
        mb.vocab_on_host = true;
        const size_t streamed = prog.program_footprint(rp::ProgramKind::Head, L - 1, mb, *rules);
        const size_t state = rp::lm_head_state_layout(64, 512, true).bytes;
        size_t head = 0;
        for (const auto & ti : prog.layer_tensors(L - 1))
            if (ti.vocab_rows > 0) head = ti.bytes;
        ASSERT_GT(head, 0u);
        EXPECT_GT(streamed, state) << backend;
        EXPECT_LT(streamed, plain + state + head) << backend;
        std::printf("  %s head footprint: %zu bytes, streamed %zu (state %zu, the matrix %zu)\n", backend, plain, streamed, state, head);
    }
}

// A token id outside the vocabulary, gathered on the host: an rp::Error naming the id and its position (the device
// lookup would read past the table), before anything is written to the layer's output.
TEST(VocabOnHost, ABadTokenIdIsAnErrorNamingIt) {
    ft_test::SmallModels & m = ft_test::SmallModels::get();
    rp::FinetuneConfig cfg;
    cfg.lora_rank = 4;
    rp::Trainer tr(*m.llama, cfg);
    rp::TrainingProgram & prog = tr;
    rp::MicroBatchInfo mb;
    mb.seq_len = 12;
    mb.n_seq = 1;
    mb.vocab_on_host = true;
    ft_test::TokenData data(12);
    data.ids[5] = 100000;
    mb.token_ids = data.ids.data();
    rp::ProgramContext pc;
    std::vector<char> out(prog.hidden_bytes(mb), 0x5a);
    try {
        prog.forward(0, tr.host_memory(0), data.ids.data(), out.data(), mb, pc);
        FAIL() << "a token id past the vocabulary was gathered";
    } catch (const rp::Error & e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("token id 100000 at position 5"), std::string::npos) << msg;
    }
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](char c) { return c == 0x5a; })) << "the output was written";
}
