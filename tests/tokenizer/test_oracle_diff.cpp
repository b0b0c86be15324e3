// Differential test against llama.cpp itself: random strings (letters, digits, every whitespace and
// punctuation class, contractions, non-Latin scripts, marks, emoji, malformed UTF-8, special-token texts)
// tokenized and detokenized by libllama through rp-tokenize-oracle (tests/tokenizer/oracle/) and by us, for
// every vocabulary in shared/models and for variants of them with other tokenizer.ggml.pre values. Needs
// the oracle libraries (scripts/fetch-oracle.sh): skips without them locally, fails in CI.
#include <unistd.h>
#include "tok_test_util.h"

#include "gguf/gguf.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <sys/wait.h>

using namespace tok_test;

namespace {


std::string oracle_bin() {
#ifdef RP_TOK_ORACLE_BIN
    std::error_code ec;
    if (std::filesystem::is_regular_file(RP_TOK_ORACLE_BIN, ec)) {
        return RP_TOK_ORACLE_BIN;
    }
#endif
    return "";
}


void put_u32(std::string & o, uint32_t v) {
    for (int i = 0; i < 4; ++i) {
        o += static_cast<char>((v >> (8 * i)) & 0xFF);
    }
}

uint32_t get_u32(const std::string & s, size_t & at) {
    if (at + 4 > s.size()) {
        ADD_FAILURE() << "oracle output truncated";
        at = s.size();
        return 0;
    }
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
        v |= static_cast<uint32_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
    }
    at += 4;
    return v;
}

struct Case {
    std::string text;
    uint32_t flags;  // bit 0 add_special, 1 parse_special, 2 remove_special, 3 unparse_special
};

void compare_with_llama(const std::string & model, int n_cases, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<Case> cases;
    std::string in;
    for (int i = 0; i < n_cases; ++i) {
        Case c;
        const int n = static_cast<int>(rng() % (i % 10 == 0 ? 200 : 24));
        for (int k = 0; k < n; ++k) {
            c.text += kPieces[rng() % (sizeof(kPieces) / sizeof(kPieces[0]))];
        }
        c.flags = rng() % 16;
        put_u32(in, c.flags);
        put_u32(in, static_cast<uint32_t>(c.text.size()));
        in += c.text;
        cases.push_back(std::move(c));
    }
    const std::string dir = ::testing::TempDir();
    // Unique per process: ctest runs tests in parallel processes.
    const std::string tag = std::to_string(getpid());
    const std::string in_path = dir + "/rp_tok_oracle_in." + tag + ".bin", out_path = dir + "/rp_tok_oracle_out." + tag + ".bin";
    {
        std::ofstream f(in_path, std::ios::binary);
        f.write(in.data(), static_cast<std::streamsize>(in.size()));
    }
#ifdef RP_TOK_ORACLE_BINS
    const std::string bins = RP_TOK_ORACLE_BINS;
#else
    const std::string bins;
#endif
    const std::string cmd = oracle_bin() + " '" + bins + "' '" + model + "' '" + in_path + "' '" + out_path + "'";
    const int st = std::system(cmd.c_str());
    ASSERT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << cmd;
    const std::string out = read_file(out_path);
    std::remove(in_path.c_str());
    std::remove(out_path.c_str());

    const rp::Tokenizer & tok = *load_cached(model).tok;
    size_t at = 0;
    int enc_ok = 0, dec_ok = 0;
    for (const Case & c : cases) {
        std::vector<int32_t> ref(get_u32(out, at));
        for (int32_t & id : ref) {
            id = static_cast<int32_t>(get_u32(out, at));
        }
        const uint32_t m = get_u32(out, at);
        const std::string ref_text = out.substr(at, m);
        at += m;
        const std::vector<int32_t> got = tok.encode(c.text, c.flags & 1, c.flags & 2);
        enc_ok += got == ref;
        EXPECT_EQ(ids_str(got), ids_str(ref)) << model << " flags " << c.flags << " text '" << c.text << "'";
        const std::string dec = tok.decode(ref, c.flags & 4, c.flags & 8);
        dec_ok += dec == ref_text;
        EXPECT_EQ(dec, ref_text) << model << " flags " << c.flags << " ids " << ids_str(ref);
    }
    EXPECT_EQ(at, out.size());
    std::printf("[ oracle  ] %s: encode %d/%d, decode %d/%d identical to llama.cpp\n", model.c_str(), enc_ok, n_cases,
                dec_ok, n_cases);
}


class OracleDiff : public ::testing::Test {
protected:
    void SetUp() override { TOK_NEED(!oracle_bin().empty(), "rp-tokenize-oracle (llama.cpp's tokenizer)"); }
};

TEST_F(OracleDiff, SharedVocabularies) {
    const std::string m = models_dir();
    unsigned seed = 1;
    for (const std::string & path :
         {m + "/stories260K.gguf", m + "/synthetic/tiny-random-qwen2.gguf", m + "/vocab/ggml-vocab-llama-spm.gguf",
          m + "/vocab/ggml-vocab-llama-bpe.gguf", m + "/vocab/ggml-vocab-qwen2.gguf", m + "/vocab/ggml-vocab-gpt-2.gguf"}) {
        compare_with_llama(path, 1500, seed++);
    }
}

TEST_F(OracleDiff, OtherPreTokenizers) {
    const std::string v = models_dir() + "/vocab/ggml-vocab-";
    const std::string files[] = {with_pre(v + "gpt-2.gguf", "default", "gpt2_default"),
                                 with_pre(v + "llama-bpe.gguf", "", "llama_bpe_nopre"),
                                 with_pre(v + "qwen2.gguf", "qwen35", "qwen35"), with_pre(v + "qwen2.gguf", "gpt-4o", "gpt4o"),
                                 with_pre(v + "llama-bpe.gguf", "llama4", "llama4"),
                                 with_pre(v + "llama-bpe.gguf", "tekken", "tekken"), with_pre(v + "llama-bpe.gguf", "dbrx", "dbrx"),
                                 with_pre(v + "llama-bpe.gguf", "smaug-bpe", "smaug")};
    unsigned seed = 100;
    for (const std::string & f : files) {
        compare_with_llama(f, 1500, seed++);
        std::remove(f.c_str());
    }
}

// Gemma's SentencePiece (gemma3 files): no space prefix (tokenizer.ggml.add_space_prefix = false), byte fallback.
TEST_F(OracleDiff, SentencePieceWithoutTheSpacePrefix) {
    const std::string f = with_kvs(models_dir() + "/vocab/ggml-vocab-llama-spm.gguf", "spm_no_prefix", [](gguf::Writer & w) {
        w.set_bool("tokenizer.ggml.add_space_prefix", false);
    });
    compare_with_llama(f, 1500, 200);
    std::remove(f.c_str());
}

// A vocabulary named like Phi-3 (general.name): llama.cpp absorbs the whitespace after its special tokens but
// <unk>, <s> and <|endoftext|> (and after </s>); Phi-3's chat markers replace the SentencePiece vocabulary's last
// five tokens, as control tokens.
TEST_F(OracleDiff, Phi3SpecialTokensAbsorbTheWhitespaceAfterThem) {
    const std::string f = phi3_vocab("phi3");
    const rp::Tokenizer & tok = *load_cached(f).tok;
    EXPECT_EQ(tok.encode("<|user|>\n hi", false, true), tok.encode("<|user|>hi", false, true));
    EXPECT_NE(tok.encode("<|endoftext|> hi", false, true), tok.encode("<|endoftext|>hi", false, true));
    compare_with_llama(f, 1500, 300);
    std::remove(f.c_str());
}

} // namespace
