// The llama.cpp tokenizer fixtures (shared/models/vocab, MANIFEST.md): every case of every .inp must give
// exactly the ids of its .out line (add_special = false, parse_special = false), and decoding gives the
// text back wherever llama.cpp's decoder does. Also the stories260K vocabulary on the same inputs against
// ids produced by llama.cpp (reference/stories260K.vocab-llama-spm-cases.out).
#include "tok_test_util.h"

#include <gtest/gtest.h>

using namespace tok_test;

namespace {

class VocabFixture : public ::testing::TestWithParam<const char *> {};

TEST_P(VocabFixture, AllCasesMatchLlamaCpp) {
    const std::string name = GetParam();
    const std::string base = models_dir() + "/vocab/ggml-vocab-" + name + ".gguf";
    const rp::Tokenizer & tok = vocab(name);
    const auto cases = read_inp(base + ".inp");
    const auto expected = read_out(base + ".out");
    ASSERT_EQ(cases.size(), 46u);
    ASSERT_EQ(expected.size(), cases.size());
    int pass = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        const std::vector<int32_t> got = tok.encode(cases[i], false, false);
        if (got == expected[i]) {
            ++pass;
        }
        EXPECT_EQ(ids_str(got), ids_str(expected[i])) << name << " case " << i << ": '" << cases[i] << "'";
    }
    std::printf("[ cases   ] %s: %d/%zu exact\n", name.c_str(), pass, cases.size());
}

// llama.cpp's decoder undoes its own tokenization except for the clean-up passes of BPE vocabularies
// other than Qwen (" ?" -> "?", " ' " -> "'", " 's" -> "'s", ...). Those inputs are checked separately.
bool cleanup_changes(const std::string & s) {
    for (const char * p : {" ?", " !", " .", " ,", " ' ", " 's", " 'm", " 're", " 've"}) {
        if (s.find(p) != std::string::npos) {
            return true;
        }
    }
    return false;
}

TEST_P(VocabFixture, DecodeRoundTrips) {
    const std::string name = GetParam();
    const std::string base = models_dir() + "/vocab/ggml-vocab-" + name + ".gguf";
    const rp::Tokenizer & tok = vocab(name);
    const bool cleans = name == "gpt-2" || name == "llama-bpe";
    int checked = 0;
    for (const std::string & s : read_inp(base + ".inp")) {
        if (cleans && cleanup_changes(s)) {
            continue;
        }
        ++checked;
        EXPECT_EQ(tok.decode(tok.encode(s, false, false)), s) << name;
    }
    EXPECT_GE(checked, cleans ? 40 : 46);
}

INSTANTIATE_TEST_SUITE_P(Vocabs, VocabFixture, ::testing::Values("llama-spm", "llama-bpe", "qwen2", "gpt-2"),
                         [](const auto & param_info) {
                             std::string n = param_info.param;
                             for (char & c : n) {
                                 if (c == '-') {
                                     c = '_';
                                 }
                             }
                             return n;
                         });

// The clean-up passes on hand-made text: expectations written from llama.cpp's rules.
TEST(VocabDecode, BpeCleanupPasses) {
    const rp::Tokenizer & gpt2 = vocab("gpt-2");
    EXPECT_EQ(gpt2.decode(gpt2.encode("Hello , world ! Yes . Or ?", false)), "Hello, world! Yes. Or?");
    EXPECT_EQ(gpt2.decode(gpt2.encode("it ' s", false)), "it's");
    EXPECT_EQ(gpt2.decode(gpt2.encode("he 's here , I 'm sure we 're ok we 've", false)), "he's here, I'm sure we're ok we've");
    EXPECT_EQ(gpt2.decode(gpt2.encode("don 't you 'd we 'll", false)), "don 't you 'd we 'll");
    // Qwen keeps the spaces
    const rp::Tokenizer & qwen = vocab("qwen2");
    EXPECT_EQ(qwen.decode(qwen.encode("Hello , world ! he 's", false)), "Hello , world ! he 's");
}

TEST(VocabStories260K, LlamaSpmInputsMatchLlamaCpp) {
    const Loaded & l = load_cached(models_dir() + "/stories260K.gguf");
    const rp::Tokenizer & tok = *l.tok;
    EXPECT_EQ(tok.n_vocab(), 512);
    EXPECT_EQ(tok.model(), rp::TokenizerModel::Spm);
    const auto cases = read_inp(models_dir() + "/vocab/ggml-vocab-llama-spm.gguf.inp");
    const auto expected = read_out(models_dir() + "/reference/stories260K.vocab-llama-spm-cases.out");
    ASSERT_EQ(expected.size(), cases.size());
    int pass = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        const std::vector<int32_t> got = tok.encode(cases[i], false, false);
        pass += got == expected[i];
        EXPECT_EQ(ids_str(got), ids_str(expected[i])) << "case " << i << ": '" << cases[i] << "'";
        // the tiny vocabulary spells most of these with byte tokens; decoding restores them
        EXPECT_EQ(tok.decode(got), cases[i]) << "case " << i;
    }
    std::printf("[ cases   ] stories260K: %d/%zu exact\n", pass, cases.size());
}

} // namespace
