// Plain-text datasets: documents, BOS / EOS, windows of seq_len + 1 tokens, padding, and the options'
// errors. Expected tokens come from llama.cpp's tokenization of prompt1.txt (the oracle), positions by hand.
#include "dataset_test_util.h"

#include <cstdio>

using namespace ds_test;

namespace {

rp::DatasetOptions opts(int32_t seq_len, std::string sep = "") {
    rp::DatasetOptions o;
    o.seq_len = seq_len;
    o.n_ctx = 2048;
    o.doc_separator = std::move(sep);
    return o;
}

TEST(TextDataset, WindowsOfOneDocument) {
    const std::string text = read_file(models_dir() + "/reference/prompt1.txt");
    // Stream: the 16 oracle tokens + EOS = 17 tokens; 16 labels in windows of 5 -> 4 sequences.
    const rp::Dataset d = rp::Dataset::from_text("\n" + text + "\n\n", "prompt1", stories(), opts(5));
    ASSERT_EQ(d.size(), 4u);
    EXPECT_EQ(row(d.inputs(0)), (std::vector<int32_t>{1, 403, 407, 261, 378}));
    EXPECT_EQ(row(d.labels(0)), (std::vector<int32_t>{403, 407, 261, 378, 432}));
    EXPECT_EQ(row(d.inputs(1)), (std::vector<int32_t>{432, 383, 286, 261, 376}));
    EXPECT_EQ(row(d.labels(1)), (std::vector<int32_t>{383, 286, 261, 376, 298}));
    EXPECT_EQ(row(d.inputs(2)), (std::vector<int32_t>{298, 315, 421, 395, 317}));
    EXPECT_EQ(row(d.labels(2)), (std::vector<int32_t>{315, 421, 395, 317, 426}));
    // The last window: 426 then EOS, padded with EOS (no pad token); padding labels are masked.
    EXPECT_EQ(row(d.inputs(3)), (std::vector<int32_t>{426, kEos, kEos, kEos, kEos}));
    EXPECT_EQ(row(d.labels(3)), (std::vector<int32_t>{kEos, X, X, X, X}));
    EXPECT_EQ(d.stats().n_examples, 1u);
    EXPECT_EQ(d.stats().n_tokens, 17u);
    EXPECT_EQ(d.stats().n_trained, 16u);
}

TEST(TextDataset, DocumentsGetBosAndEos) {
    // Two documents: 16 tokens + EOS, then BOS " Once upon a time" + EOS: 23 tokens at stream positions
    // 0..15 | 16 EOS | 17 BOS 18 403 19 407 20 261 21 378 | 22 EOS. Windows of 8 start at 0, 8, 16.
    const std::string text = "Once upon a time, there was a little girl named Lily.\n\n\n  \n\nOnce upon a time\n";
    const rp::Dataset d = rp::Dataset::from_text(text, "two docs", stories(), opts(8, "\n\n"));
    EXPECT_EQ(d.stats().n_examples, 2u);  // the whitespace-only piece between separators is skipped
    ASSERT_EQ(d.size(), 3u);
    EXPECT_EQ(row(d.inputs(1)), (std::vector<int32_t>{261, 376, 298, 315, 421, 395, 317, 426}));
    EXPECT_EQ(row(d.labels(1)), (std::vector<int32_t>{376, 298, 315, 421, 395, 317, 426, kEos}));
    EXPECT_EQ(row(d.inputs(2)), (std::vector<int32_t>{kEos, kBos, 403, 407, 261, 378, kEos, kEos}));
    // After EOS the next document's BOS is not a target.
    EXPECT_EQ(row(d.labels(2)), (std::vector<int32_t>{X, 403, 407, 261, 378, kEos, X, X}));

    // Without a separator the same text is one document (the blank lines stay inside it).
    const rp::Dataset one = rp::Dataset::from_text(text, "one doc", stories(), opts(8));
    EXPECT_EQ(one.stats().n_examples, 1u);
    EXPECT_EQ(one.inputs(0)[0], kBos);
}

TEST(TextDataset, EveryTokenPredictedOnce) {
    const std::string text = read_file(models_dir() + "/reference/train.txt");
    std::vector<int32_t> stream = stories().encode(text.substr(0, text.find_last_not_of('\n') + 1), true, false);
    stream.push_back(kEos);
    for (const int32_t L : {1, 7, 64, 1000}) {
        const rp::Dataset d = rp::Dataset::from_text(text, "train.txt", stories(), opts(L));
        ASSERT_EQ(d.size(), (stream.size() - 1 + L - 1) / L) << L;
        std::vector<int32_t> in, lab;
        for (size_t i = 0; i < d.size(); ++i) {
            in.insert(in.end(), d.inputs(i).begin(), d.inputs(i).end());
            lab.insert(lab.end(), d.labels(i).begin(), d.labels(i).end());
        }
        for (size_t i = 0; i + 1 < stream.size(); ++i) {
            ASSERT_EQ(in[i], stream[i]) << L << " @" << i;
            ASSERT_EQ(lab[i], stream[i + 1]) << L << " @" << i;
        }
        for (size_t i = stream.size() - 1; i < lab.size(); ++i) ASSERT_EQ(lab[i], X) << L << " @" << i;
    }
}

TEST(TextDataset, OptionErrors) {
    rp::DatasetOptions o = opts(4096);
    EXPECT_EQ(error_of([&] { rp::Dataset::from_text("Once", "t", stories(), o); }),
              "seq_len 4096 exceeds the model's context 2048");
    o.seq_len = 0;
    EXPECT_NE(error_of([&] { rp::Dataset::from_text("Once", "t", stories(), o); }).find("seq_len 0"), std::string::npos);
    const std::string e = error_of([&] { rp::Dataset::from_text(" \n\n \n", "blank.txt", stories(), opts(8)); });
    EXPECT_NE(e.find("blank.txt"), std::string::npos) << e;
    EXPECT_NE(e.find("no training sequences"), std::string::npos) << e;
}

TEST(TextDataset, LoadPicksFormatByName) {
    const std::string dir = ::testing::TempDir();
    const std::string txt = dir + "/rp_ds_test.txt", jl = dir + "/rp_ds_test.jsonl";
    {
        std::ofstream(txt) << "Once upon a time\n";
        std::ofstream(jl) << "{\"text\": \"Once upon a time\"}\n";
    }
    const rp::Dataset a = rp::Dataset::load(txt, stories(), opts(8));
    const rp::Dataset b = rp::Dataset::load(jl, stories(), opts(8));
    // Both: BOS Once upon a time EOS.
    EXPECT_EQ(row(a.inputs(0)), (std::vector<int32_t>{kBos, 403, 407, 261, 378, kEos, kEos, kEos}));
    EXPECT_EQ(row(a.inputs(0)), row(b.inputs(0)));
    EXPECT_EQ(row(a.labels(0)), row(b.labels(0)));
    EXPECT_EQ(a.fingerprint(), b.fingerprint());
    std::remove(txt.c_str());
    std::remove(jl.c_str());
    const std::string e = error_of([&] { rp::Dataset::load(dir + "/rp_no_such_file.txt", stories(), opts(8)); });
    EXPECT_NE(e.find("rp_no_such_file.txt"), std::string::npos) << e;
    const std::string empty = dir + "/rp_ds_empty.jsonl";
    std::ofstream(empty).close();
    EXPECT_NE(error_of([&] { rp::Dataset::load(empty, stories(), opts(8)); }).find("empty"), std::string::npos);
    std::remove(empty.c_str());
}

} // namespace
