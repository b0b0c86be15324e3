// Packed sequences (DatasetOptions::pack, models/dataset.h): several JSONL examples share a sequence, each
// attending only to itself with positions restarting at 0. Checked here:
//   - the packer: every example exactly once, its tokens, labels and positions those of its unpacked
//     sequence; best-fit decreasing fills; padding fractions; deterministic; truncation counted;
//   - exactness: the loss and every gradient of packed sequences equal those of their examples run one by
//     one (<= 1e-6 relative: only float summation order changes), llama and a tied qwen3, LoRA and full;
//   - the RoundPipe runtime on 2 CPU devices trains packed data to the host session's bytes.
#include "base/error.h"
#include "ggml_rp/ggml_rp.h"
#include "models/data/dataset.h"
#include "models/train/trainer.h"
#include "models/arch/lora.h"
#include "models/train/session.h"
#include "models/convert/synth_model.h"
#include "models/text/tokenizer.h"
#include "tests/common/shared_paths.h"
#include "tests/common/temp_dir.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

struct Models {
    rp_test::TempDir dir;
    std::unique_ptr<rp::Model> llama, qwen3, qwen35;
    std::unique_ptr<rp::Tokenizer> llama_tok, qwen3_tok, qwen35_tok;
    Models() {
        rp::SynthSpec s;
        s.vocab_from = rp_test::shared_dir() + "/models/stories260K.gguf";
        s.n_embd = 64, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 16, s.n_ff = 160, s.n_layer = 2, s.seed = 9;
        rp::write_synth_model(s, dir.file("llama.gguf"));
        llama = rp::Model::load(dir.file("llama.gguf"));
        s.arch = "qwen3";
        s.vocab_from = rp_test::shared_dir() + "/models/synthetic/tiny-random-qwen2.gguf";
        s.tied = true, s.n_embd = 32, s.head_dim = 8, s.n_ff = 96;
        rp::write_synth_model(s, dir.file("qwen3.gguf"));
        qwen3 = rp::Model::load(dir.file("qwen3.gguf"));
        // qwen35: the convolution and the delta rule's state restart at each packed example (and the attention layer's
        // keys stay within it).
        s.arch = "qwen35";
        s.tied = false, s.n_rot = 8, s.ssm_k_heads = 2, s.ssm_v_heads = 4, s.ssm_head_dim = 8, s.full_attn_interval = 2;
        rp::write_synth_model(s, dir.file("qwen35.gguf"));
        qwen35 = rp::Model::load(dir.file("qwen35.gguf"));
        llama_tok = std::make_unique<rp::Tokenizer>(llama->file());
        qwen3_tok = std::make_unique<rp::Tokenizer>(qwen3->file());
        qwen35_tok = std::make_unique<rp::Tokenizer>(qwen35->file());
    }
    static Models & get() {
        static Models m;
        return m;
    }
};

// A JSONL of n examples whose lengths spread from a few tokens to past seq_len (some get truncated), the
// three kinds of line mixed.
std::string examples_jsonl(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    const char * words[] = {"once", "upon", "a", "time", "there", "was", "little", "girl", "named", "Lily", "she", "liked",
                            "to", "play", "in", "the", "park", "with", "her", "dog", "sun", "tree", "happy", "big"};
    auto text = [&](int nw) {
        std::string s;
        for (int i = 0; i < nw; ++i) s += std::string(i ? " " : "") + words[rng() % 24];
        return s;
    };
    std::string out;
    for (int i = 0; i < n; ++i) {
        const int len = i % 7 == 3 ? 60 + static_cast<int>(rng() % 40) : 1 + static_cast<int>(rng() % 25);
        if (i % 3 == 1) out += "{\"prompt\": \"" + text(1 + len / 3) + " \", \"completion\": \"" + text(len) + "\"}\n";
        else out += "{\"text\": \"" + text(len) + "\"}\n";
    }
    return out;
}

rp::Dataset load(const rp::Tokenizer & tok, const std::string & jsonl, int32_t seq_len, bool pack) {
    rp::DatasetOptions o;
    o.seq_len = seq_len;
    o.pack = pack;
    return rp::Dataset::from_jsonl(jsonl, "examples.jsonl", tok, o);
}

// The examples of a packed sequence: [start, end) runs of positions restarting at 0, up to the padding.
std::vector<std::pair<int, int>> runs(std::span<const int32_t> pos, std::span<const int32_t> labels) {
    std::vector<std::pair<int, int>> r;
    const int T = static_cast<int>(pos.size());
    for (int t = 0; t < T; ++t) {
        if (pos[static_cast<size_t>(t)] == 0) r.push_back({t, t + 1});
        else r.back().second = t + 1;
    }
    // the last run is padding when it trains nothing and reaches the end
    if (!r.empty() && r.back().second == T &&
        std::all_of(labels.begin() + r.back().first, labels.end(), [](int32_t l) { return l == rp::kIgnoreLabel; }))
        r.pop_back();
    return r;
}

} // namespace

TEST(Packing, EveryExampleOnceWithItsTokensLabelsAndPositions) {
    const rp::Tokenizer & tok = *Models::get().llama_tok;
    const std::string jsonl = examples_jsonl(60, 1);
    const int32_t L = 64;
    const rp::Dataset plain = load(tok, jsonl, L, false), packed = load(tok, jsonl, L, true);
    ASSERT_FALSE(plain.packed());
    ASSERT_TRUE(packed.packed());
    EXPECT_LT(packed.size(), plain.size());
    // Each unpacked sequence (one example) as its (inputs, labels) up to its last non-padding position.
    std::multimap<std::vector<int32_t>, std::vector<int32_t>> want;
    const rp::DatasetStats & ps = packed.stats();
    for (size_t i = 0; i < plain.size(); ++i) {
        const auto in = plain.inputs(i), lab = plain.labels(i);
        size_t n = static_cast<size_t>(L);
        // the example's length: its tokens are followed by padding with masked labels
        while (n > 1 && lab[n - 1] == rp::kIgnoreLabel && lab[n - 2] == rp::kIgnoreLabel) --n;
        want.emplace(std::vector<int32_t>(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n)),
                     std::vector<int32_t>(lab.begin(), lab.begin() + static_cast<std::ptrdiff_t>(n)));
    }
    size_t found = 0;
    for (size_t i = 0; i < packed.size(); ++i) {
        const auto in = packed.inputs(i), lab = packed.labels(i), pos = packed.positions(i);
        ASSERT_EQ(pos.size(), static_cast<size_t>(L));
        for (const auto & [a, b] : runs(pos, lab)) {
            std::vector<int32_t> ein(in.begin() + a, in.begin() + b), elab(lab.begin() + a, lab.begin() + b);
            for (int t = a; t < b; ++t) EXPECT_EQ(pos[static_cast<size_t>(t)], t - a);
            // An unpacked example may end in a masked label (its last token predicts nothing): match on the
            // packed run, trimmed the same way.
            size_t n = ein.size();
            while (n > 1 && elab[n - 1] == rp::kIgnoreLabel && elab[n - 2] == rp::kIgnoreLabel) --n;
            ein.resize(n), elab.resize(n);
            auto it = want.find(ein);
            ASSERT_NE(it, want.end()) << "sequence " << i << " run [" << a << ", " << b << ") is no example";
            EXPECT_EQ(it->second, elab);
            want.erase(it);
            ++found;
        }
    }
    EXPECT_EQ(found, plain.size());
    EXPECT_TRUE(want.empty());
    // The same tokens and trained labels in fewer, fuller sequences.
    EXPECT_EQ(ps.n_tokens, plain.stats().n_tokens);
    EXPECT_EQ(ps.n_trained, plain.stats().n_trained);
    EXPECT_EQ(ps.n_unpacked, plain.size());
    EXPECT_GT(ps.n_truncated, 0u);  // the long examples
    EXPECT_EQ(ps.n_truncated, plain.stats().n_truncated);
    EXPECT_NEAR(plain.stats().padding_fraction(), ps.unpacked_padding_fraction(), 1e-12);
    std::printf("[ pack ] %zu examples in %zu sequences of %d: padding %.1f%% -> %.1f%%\n", ps.n_examples, packed.size(), L,
                100.0 * ps.unpacked_padding_fraction(), 100.0 * ps.padding_fraction());
    EXPECT_LT(ps.padding_fraction(), 0.15);
    EXPECT_GT(ps.unpacked_padding_fraction(), 0.4);
    // Deterministic: the same file gives the same sequences (and fingerprint).
    EXPECT_EQ(load(tok, jsonl, L, true).fingerprint(), packed.fingerprint());
    EXPECT_NE(plain.fingerprint(), packed.fingerprint());
}

TEST(Packing, BestFitDecreasing) {
    // Lengths (in tokens with BOS/EOS) that fill sequences exactly when placed best-fit decreasing.
    const rp::Tokenizer & tok = *Models::get().llama_tok;
    const rp::Dataset one = load(tok, "{\"text\": \"a\"}\n", 64, true);
    ASSERT_EQ(one.size(), 1u);
    const size_t unit = one.stats().n_tokens;  // positions of the shortest example
    std::string jsonl;
    for (int i = 0; i < 8; ++i) jsonl += "{\"text\": \"a\"}\n";
    const int32_t L = static_cast<int32_t>(unit * 3);
    const rp::Dataset d = load(tok, jsonl, L, true);
    EXPECT_EQ(d.size(), 3u);  // 8 examples of a third of a sequence: 3 + 3 + 2
    EXPECT_EQ(d.stats().n_sequences, 3u);
    EXPECT_NEAR(d.stats().padding_fraction(), 1.0 / 9.0, 1e-12);
}

TEST(Packing, ExampleLongerThanTheSequenceIsTruncatedAndCounted) {
    const rp::Tokenizer & tok = *Models::get().llama_tok;
    std::string big = "{\"text\": \"";
    for (int i = 0; i < 200; ++i) big += "once upon a time ";
    big += "\"}\n{\"text\": \"the end\"}\n";
    const rp::Dataset d = load(tok, big, 32, true);
    EXPECT_EQ(d.stats().n_truncated, 1u);
    EXPECT_EQ(d.stats().n_examples, 2u);
    EXPECT_EQ(d.size(), 2u);  // the truncated example fills a sequence alone
}

namespace {

struct Grads {
    double loss = 0;
    std::vector<std::vector<float>> g;
};

void nonzero_b(rp::Trainer & tr) {
    if (tr.adapter())  // B = 0 at init would leave every A without a gradient
        for (const rp::LoraTensor & t : tr.adapter()->tensors()) {
            std::vector<float> b(static_cast<size_t>(t.b->nelements()));
            for (size_t i = 0; i < b.size(); ++i) b[i] = 0.05f * static_cast<float>(std::sin(0.7 * static_cast<double>(i) + 1.0));
            rp::tensor_set_f32(t.b, b);
        }
}

Grads collect(rp::Trainer & tr, double loss) {
    tr.collect_grads();
    Grads r;
    r.loss = loss;
    for (const auto & p : tr.params()) {
        const float * g = p.t->grad->data_as<float>();
        r.g.emplace_back(g, g + p.t->nelements());
    }
    return r;
}

void check_exact(const rp::Model & model, const rp::Tokenizer & tok, bool full) {
    SCOPED_TRACE(std::string(model.file().get_string_or("general.architecture", "?")) + (full ? " full" : " lora"));
    const int32_t L = 48;
    const std::string jsonl = examples_jsonl(24, 4);
    const rp::Dataset packed = load(tok, jsonl, L, true);
    rp::FinetuneConfig cfg;
    cfg.full = full;
    cfg.lora_rank = 4;
    rp::Trainer tr(model, cfg);
    nonzero_b(tr);
    // Packed: 3 sequences that hold several examples each (best-fit decreasing puts the long ones first,
    // alone) as one micro-batch.
    std::vector<uint32_t> idx;
    for (uint32_t i = 0; i < packed.size() && idx.size() < 3; ++i)
        if (runs(packed.positions(i), packed.labels(i)).size() >= 2) idx.push_back(i);
    const size_t B = idx.size();
    ASSERT_EQ(B, 3u);
    const rp::Batch bt = rp::make_batch(packed, idx);
    tr.zero_grads();
    const Grads a = collect(tr, tr.accumulate(bt.inputs.data(), bt.labels.data(), L, static_cast<int64_t>(B), 1.0f, 2, 0, 0,
                                              bt.positions.data()));
    // One by one: each example of those sequences alone (positions 0..n-1, no key_start), same loss scale.
    tr.zero_grads();
    double loss = 0;
    int n_examples = 0;
    for (const uint32_t s : idx) {
        const auto in = packed.inputs(s), lab = packed.labels(s), pos = packed.positions(s);
        for (const auto & [x, y] : runs(pos, lab)) {
            loss += tr.accumulate(in.data() + x, lab.data() + x, y - x, 1, 1.0f, 2);
            ++n_examples;
        }
    }
    const Grads b = collect(tr, loss);
    ASSERT_GE(n_examples, 2 * static_cast<int>(B));  // the sequences really are packed
    const double loss_err = std::fabs(a.loss - b.loss) / std::fabs(b.loss);
    double worst = 0;
    for (size_t i = 0; i < a.g.size(); ++i) {
        double diff = 0, scale = 0;
        for (size_t j = 0; j < a.g[i].size(); ++j) {
            diff = std::max(diff, static_cast<double>(std::fabs(a.g[i][j] - b.g[i][j])));
            scale = std::max(scale, static_cast<double>(std::fabs(b.g[i][j])));
        }
        ASSERT_GT(scale, 0) << tr.params()[i].name << " has no gradient";
        const double e = diff / scale;
        EXPECT_LE(e, 1e-6) << tr.params()[i].name;
        worst = std::max(worst, e);
    }
    std::printf("[ pack ] %d examples in %zu packed sequences vs one by one: loss %.3g, worst gradient %.3g (max-norm relative, %zu tensors)\n",
                n_examples, B, loss_err, worst, a.g.size());
    EXPECT_LE(loss_err, 1e-6);
}

} // namespace

TEST(Packing, LossAndGradientsEqualExamplesOneByOneLlama) {
    check_exact(*Models::get().llama, *Models::get().llama_tok, false);
    check_exact(*Models::get().llama, *Models::get().llama_tok, true);
}

TEST(Packing, LossAndGradientsEqualExamplesOneByOneQwen3Tied) {
    check_exact(*Models::get().qwen3, *Models::get().qwen3_tok, false);
    check_exact(*Models::get().qwen3, *Models::get().qwen3_tok, true);
}

TEST(Packing, LossAndGradientsEqualExamplesOneByOneQwen35) {
    check_exact(*Models::get().qwen35, *Models::get().qwen35_tok, false);
    check_exact(*Models::get().qwen35, *Models::get().qwen35_tok, true);
}

TEST(Packing, PipelineTrainsPackedDataToTheHostBytes) {
    const rp::Model & model = *Models::get().llama;
    const rp::Dataset data = load(*Models::get().llama_tok, examples_jsonl(40, 7), 48, true);
    ASSERT_TRUE(data.packed());
    for (bool full : {false, true}) {
        SCOPED_TRACE(full ? "full" : "lora");
        rp::SessionOptions o;
        o.finetune.full = full;
        o.finetune.lora_rank = 4;
        o.batch = 4;
        o.micro_batches = 2;
        o.steps = 2;
        o.threads = 1;
        o.lr.lr_max = 2e-3;
        rp::TrainingSession host(model, data, o);
        o.pipelined = true;
        o.devices.count = 2;
        o.devices.memory_each = size_t(64) << 20;
        rp::TrainingSession pipe(model, data, o);
        for (int s = 0; s < 2; ++s) EXPECT_EQ(host.step().loss, pipe.step().loss) << "step " << s + 1;
        host.synchronize();
        pipe.synchronize();
        for (size_t i = 0; i < host.trainer().params().size(); ++i) {
            const rp::Tensor * a = host.trainer().params()[i].t;
            const rp::Tensor * b = pipe.trainer().params()[i].t;
            EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes()), 0) << host.trainer().params()[i].name;
        }
    }
}
