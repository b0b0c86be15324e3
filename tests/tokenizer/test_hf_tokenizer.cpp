// The tokenizer files we export (convert/hf_tokenizer.h) read by Hugging Face's own JavaScript tokenizers
// (tokenizers.js, run by Node.js through hf/hf_tokenize.mjs; scripts/fetch-oracle.sh fetches it):
//   - every case of the llama.cpp fixtures (byte-level BPE and SentencePiece) gives the fixture's ids, which Hugging
//     Face's tokenizers wrote;
//   - random strings (tok_test_util.h's pieces, special-token texts among them) give our ids, with and without the
//     special tokens the model adds, for every pre-tokenizer we export, and decode to our text;
//   - what cannot be written exactly is refused by name.
// Without Node.js or tokenizers.js the peer tests skip locally and fail in CI.
#include "tok_test_util.h"

#include "base/error.h"
#include "ggml_rp/core/json.h"
#include "models/convert/hf_tokenizer.h"
#include "models/text/unicode.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <sys/wait.h>

using namespace tok_test;

namespace {

#if defined(RP_NODE_BIN) && defined(RP_HF_TOKENIZERS_MJS) && defined(RP_HF_TOKENIZE_SCRIPT)
constexpr bool kPeer = true;
constexpr const char * kNode = RP_NODE_BIN, * kLib = RP_HF_TOKENIZERS_MJS, * kScript = RP_HF_TOKENIZE_SCRIPT;
#else
constexpr bool kPeer = false;
constexpr const char * kNode = "", * kLib = "", * kScript = "";
#endif

// A scratch directory of this process (ctest runs test programs in parallel), removed at the end.
struct TempDir {
    std::string path;
    explicit TempDir(const std::string & name) : path(::testing::TempDir() + "/rp_hftok_" + name + "." + std::to_string(getpid())) {
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
};

void write_file(const std::string & path, const std::string & text) {
    std::ofstream f(path, std::ios::binary);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    ASSERT_TRUE(f.good()) << path;
}

// The exported files of a vocabulary in `dir`.
void export_to(const std::string & gguf_path, const std::string & dir) {
    const rp::HfTokenizerFiles files = rp::hf_tokenizer_files(*gguf::Reader::open(gguf_path), 4096);
    write_file(dir + "/tokenizer.json", files.tokenizer_json);
    write_file(dir + "/tokenizer_config.json", files.tokenizer_config_json);
}

struct PeerResult {
    std::vector<int32_t> plain, special;
    std::string decoded;
};

std::vector<int32_t> ids_of(const rp::json::Value & v) {
    std::vector<int32_t> ids;
    for (const rp::json::Value & x : v.array) ids.push_back(static_cast<int32_t>(x.number));
    return ids;
}

// tokenizers.js on `texts` with the files in `dir`.
std::vector<PeerResult> run_peer(const std::string & dir, const std::vector<std::string> & texts) {
    std::string cases = "[";
    for (size_t i = 0; i < texts.size(); ++i) cases += (i ? ", " : "") + rp::json::quoted(texts[i]);
    write_file(dir + "/cases.json", cases + "]");
    const std::string out_path = dir + "/peer.json";
    const std::string cmd = std::string("'") + kNode + "' '" + kScript + "' '" + kLib + "' '" + dir + "' '" + dir + "/cases.json' > '" + out_path + "'";
    const int st = std::system(cmd.c_str());
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        ADD_FAILURE() << cmd;
        return {};
    }
    const rp::json::Value out = rp::json::parse(read_file(out_path), out_path);
    std::vector<PeerResult> r;
    for (const rp::json::Value & c : out.array) r.push_back({ids_of(*c.find("plain")), ids_of(*c.find("special")), c.find("decoded")->string});
    EXPECT_EQ(r.size(), texts.size());
    return r;
}

class HfTokenizerFixture : public ::testing::TestWithParam<const char *> {};

// The fixtures' ids came from Hugging Face's tokenizers on the original tokenizer.json.
TEST_P(HfTokenizerFixture, ExportedFilesTokenizeAsTheFixtures) {
    TOK_NEED(kPeer, "tokenizers.js (or Node.js)");
    const std::string name = GetParam();
    const std::string base = models_dir() + "/vocab/ggml-vocab-" + name + ".gguf";
    TempDir dir(name);
    export_to(base, dir.path);
    std::vector<std::string> cases;
    std::vector<std::vector<int32_t>> expected;
    const auto inp = read_inp(base + ".inp");
    const auto out = read_out(base + ".out");
    ASSERT_EQ(inp.size(), out.size());
    for (size_t i = 0; i < inp.size(); ++i) {
        if (rp::first_invalid_utf8(inp[i]) != std::string::npos) continue;  // a JavaScript string cannot hold it
        cases.push_back(inp[i]);
        expected.push_back(out[i]);
    }
    EXPECT_GE(cases.size(), 44u);
    const std::vector<PeerResult> peer = run_peer(dir.path, cases);
    ASSERT_EQ(peer.size(), cases.size());
    const rp::Tokenizer & tok = vocab(name);
    for (size_t i = 0; i < cases.size(); ++i) {
        EXPECT_EQ(ids_str(peer[i].plain), ids_str(expected[i])) << name << " case " << i << ": '" << cases[i] << "'";
        EXPECT_EQ(ids_str(tok.encode(cases[i], false, true)), ids_str(expected[i])) << name << " case " << i;
    }
}

std::string fixture_name(const ::testing::TestParamInfo<const char *> & p) {
    std::string s = p.param;
    for (char & ch : s)
        if (ch == '-') ch = '_';
    return s;
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, HfTokenizerFixture, ::testing::Values("gpt-2", "llama-bpe", "qwen2", "llama-spm"), fixture_name);

// A failure's detail: the text with its bytes outside printable ASCII escaped, and the tokens of both sides.
std::string detail(const rp::Tokenizer & tok, const std::string & text, const std::vector<int32_t> & peer, const std::vector<int32_t> & ours) {
    std::string s = "text \"";
    for (const char ch : text) {
        const auto c = static_cast<unsigned char>(ch);
        char b[8];
        std::snprintf(b, sizeof b, "\\x%02x", c);
        s += c >= 0x20 && c < 0x7f ? std::string(1, ch) : std::string(b);
    }
    s += "\"\n  tokenizers.js:";
    for (int32_t id : peer) s += " [" + std::string(tok.token_text(id)) + "]";
    s += "\n  ours:         ";
    for (int32_t id : ours) s += " [" + std::string(tok.token_text(id)) + "]";
    return s;
}

// Pieces the random strings leave out, and why (both are differences between the two engines, not between the files
// and the GGUF):
//   - U+0085 (NEL): tokenizers.js's \s is JavaScript's, which lacks it; Oniguruma's (Rust tokenizers') and
//     llama.cpp's have it (the fixtures' ids, from the Rust tokenizers, agree with ours);
//   - with o200k's and tekken's pre-tokenizers, marks (U+0301, U+FE0F, U+17B6): their original regexes count \p{M}
//     among the letters, so a mark joins a word ("\xef\xb8\x8f'RE" is one); llama.cpp's matchers do not, and ours
//     reproduce llama.cpp's. The exported regex is the original one.
//   - with rstrip tokens (Phi-3's), the Unicode spaces after them (U+00A0, U+3000, U+2028): Hugging Face's rstrip
//     absorbs any White_Space, llama.cpp's only ASCII (C isspace).
bool left_out(const std::string & piece, bool marks, bool unicode_spaces) {
    if (piece == "\xc2\x85") return true;
    if (unicode_spaces && (piece == "\xc2\xa0" || piece == "\xe3\x80\x80" || piece == "\xe2\x80\xa8")) return true;
    return marks && (piece == "\xcc\x81" || piece == "\xef\xb8\x8f" || piece == "\xe1\x9e\xb6");
}

// Random valid-UTF-8 strings of the pieces (without marks when `no_marks`, without Unicode spaces when `no_unicode_spaces`).
std::vector<std::string> random_texts(int n, unsigned seed, bool no_marks, bool no_unicode_spaces) {
    std::vector<std::string> pieces;
    for (const char * p : kPieces)
        if (rp::first_invalid_utf8(p) == std::string::npos && !left_out(p, no_marks, no_unicode_spaces)) pieces.push_back(p);
    std::mt19937 rng(seed);
    std::vector<std::string> texts;
    while (static_cast<int>(texts.size()) < n) {
        std::string t;
        const int len = static_cast<int>(rng() % (texts.size() % 10 == 0 ? 120 : 20));
        for (int k = 0; k < len; ++k) t += pieces[rng() % pieces.size()];
        texts.push_back(t);
    }
    return texts;
}

// Every pre-tokenizer we export, on the fixtures' vocabularies (a pre-tokenizer of another model on a vocabulary
// still tokenizes the same way in both engines), and SentencePiece with and without the space prefix (Gemma's) and
// with Phi-3's rstrip special tokens.
TEST(HfTokenizer, RandomStringsEveryPreTokenizer) {
    TOK_NEED(kPeer, "tokenizers.js (or Node.js)");
    struct Variant {
        std::string path, what;
        bool no_marks = false, no_unicode_spaces = false, temporary = true;
    };
    const std::string v = models_dir() + "/vocab/ggml-vocab-";
    std::vector<Variant> variants = {{v + "gpt-2.gguf", "gpt-2", false, false, false},
                                     {v + "llama-bpe.gguf", "llama-bpe", false, false, false},
                                     {v + "qwen2.gguf", "qwen2", false, false, false},
                                     {v + "llama-spm.gguf", "llama-spm", false, false, false},
                                     {models_dir() + "/stories260K.gguf", "stories260K", false, false, false},
                                     {with_pre(v + "qwen2.gguf", "qwen35", "hftok_qwen35"), "qwen2 with pre qwen35"},
                                     {with_pre(v + "llama-bpe.gguf", "gpt-4o", "hftok_gpt4o"), "llama-bpe with pre gpt-4o", true},
                                     {with_pre(v + "llama-bpe.gguf", "tekken", "hftok_tekken"), "llama-bpe with pre tekken", true},
                                     {with_pre(v + "llama-bpe.gguf", "dbrx", "hftok_dbrx"), "llama-bpe with pre dbrx"},
                                     {with_kvs(v + "llama-spm.gguf", "hftok_no_prefix", [](gguf::Writer & w) { w.set_bool("tokenizer.ggml.add_space_prefix", false); }),
                                      "llama-spm without the space prefix"},
                                     {phi3_vocab("hftok_phi3"), "llama-spm named Phi-3 (rstrip special tokens)", false, true}};
    unsigned seed = 7;
    for (const Variant & x : variants) {
        TempDir dir("v" + std::to_string(seed));
        export_to(x.path, dir.path);
        const std::vector<std::string> texts = random_texts(150, seed++, x.no_marks, x.no_unicode_spaces);
        const std::vector<PeerResult> peer = run_peer(dir.path, texts);
        ASSERT_EQ(peer.size(), texts.size()) << x.what;
        const auto tok = rp::Tokenizer::load(x.path);
        int same = 0;
        for (size_t i = 0; i < texts.size(); ++i) {
            const std::vector<int32_t> plain = tok->encode(texts[i], false, true), special = tok->encode(texts[i], true, true);
            EXPECT_EQ(ids_str(peer[i].plain), ids_str(plain)) << x.what << ": " << detail(*tok, texts[i], peer[i].plain, plain);
            EXPECT_EQ(ids_str(peer[i].special), ids_str(special)) << x.what << ": " << detail(*tok, texts[i], peer[i].special, special);
            EXPECT_EQ(peer[i].decoded, tok->decode(plain)) << x.what << ": '" << texts[i] << "'";
            same += peer[i].plain == plain && peer[i].special == special && peer[i].decoded == tok->decode(plain);
        }
        std::printf("[ hf-tok  ] %s: %d/%zu identical\n", x.what.c_str(), same, texts.size());
        if (x.temporary) std::remove(x.path.c_str());
    }
}

// What the files cannot state exactly is refused, naming the file and the reason.
TEST(HfTokenizer, RefusesWhatItCannotWriteExactly) {
    const std::string v = models_dir() + "/vocab/ggml-vocab-";
    auto refusal = [](const std::string & path) {
        try {
            rp::hf_tokenizer_files(*gguf::Reader::open(path));
        } catch (const rp::Error & e) {
            return std::string(e.what());
        }
        return std::string("(not refused)");
    };
    const std::string fallback = with_pre(v + "gpt-2.gguf", "default", "hftok_default");
    EXPECT_NE(refusal(fallback).find("llama.cpp's fallback"), std::string::npos) << refusal(fallback);
    std::remove(fallback.c_str());
    const std::string repeated = with_kvs(v + "gpt-2.gguf", "hftok_repeated", [](gguf::Writer & w) {
        std::vector<std::string> tokens = gguf::Reader::open(models_dir() + "/vocab/ggml-vocab-gpt-2.gguf")->get_string_array("tokenizer.ggml.tokens");
        tokens[300] = tokens[200];
        w.set_string_array("tokenizer.ggml.tokens", tokens);
    });
    EXPECT_NE(refusal(repeated).find("token 300 repeats the text of token 200"), std::string::npos) << refusal(repeated);
    std::remove(repeated.c_str());
}

// The files of a Llama 3 vocabulary: BOS added by the post-processor, merges ignored for whole-word tokens, the
// special tokens added as special, the chat template and the context in tokenizer_config.json.
TEST(HfTokenizer, Llama3FilesStateTheSettings) {
    const std::string path = models_dir() + "/vocab/ggml-vocab-llama-bpe.gguf";
    const rp::HfTokenizerFiles f = rp::hf_tokenizer_files(*gguf::Reader::open(path), 8192);
    const rp::json::Value j = rp::json::parse(f.tokenizer_json, "tokenizer.json");
    const rp::json::Value c = rp::json::parse(f.tokenizer_config_json, "tokenizer_config.json");
    EXPECT_EQ(j.find("model")->find("type")->string, "BPE");
    EXPECT_TRUE(j.find("model")->find("ignore_merges")->boolean);
    EXPECT_EQ(j.find("model")->find("vocab")->object.size(), 128256u);
    EXPECT_EQ(j.find("model")->find("merges")->array.size(), 280147u);
    EXPECT_EQ(j.find("post_processor")->find("type")->string, "TemplateProcessing");
    EXPECT_EQ(j.find("post_processor")->find("special_tokens")->find("<|begin_of_text|>")->find("ids")->array.at(0).number, 128000);
    EXPECT_EQ(j.find("added_tokens")->array.size(), 256u);
    EXPECT_EQ(c.find("bos_token")->string, "<|begin_of_text|>");
    EXPECT_TRUE(c.find("add_bos_token")->boolean);
    EXPECT_EQ(c.find("model_max_length")->number, 8192);
    EXPECT_TRUE(c.find("clean_up_tokenization_spaces")->boolean);
}

} // namespace
