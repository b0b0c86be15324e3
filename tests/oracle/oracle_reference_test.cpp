// Self-checks of the oracle setup (docs/reference-oracle.md): rp-oracle, linked against the prebuilt npm
// libraries, must reproduce the reference outputs in shared/models/reference — made with the same libraries and
// the zen4 CPU build — bit for bit, the reference mean cross-entropy, and the tokenizer fixtures exactly. Only
// then can later tests use the oracle on new inputs. Where the host cannot run the zen4 build (no AVX-512), the
// oracle falls back to llama.cpp's own choice; logits are then compared within the tolerances of §7 instead.
#include "tests/oracle/oracle_run.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using rp::oracle::lines_starting;
using rp::oracle::quote;

std::string models(const std::string & rel) { return std::string(RP_SHARED_DIR) + "/models/" + rel; }
std::string reference(const std::string & rel) { return models("reference/" + rel); }

std::string slurp(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

std::vector<int> ints(const std::string & s) {
    std::vector<int> v;
    std::istringstream in(s);
    for (int x; in >> x;) v.push_back(x);
    return v;
}

// The single line of `text` starting with `prefix`, or "" (a missing line then fails the comparison).
std::string line(const std::string & text, const std::string & prefix) {
    auto v = lines_starting(text, prefix);
    return v.size() == 1 ? v[0] : std::string();
}

// The ids after "tokens(N):" in an oracle report.
std::vector<int> report_tokens(const std::string & text) {
    std::string l = line(text, "tokens(");
    return l.empty() ? std::vector<int>{} : ints(l.substr(l.find(':') + 1));
}

class Oracle : public ::testing::Test {
protected:
    void SetUp() override {
        RP_REQUIRE_ORACLE();
        const auto * info = ::testing::UnitTest::GetInstance()->current_test_info();
        std::string name = std::string(info->test_suite_name()) + "_" + info->name();
        std::replace(name.begin(), name.end(), '/', '_');
        dir_ = fs::temp_directory_path() / ("rp_oracle_" + std::to_string(getpid()) + "_" + name);
        fs::create_directories(dir_);
    }
    void TearDown() override {
        std::error_code ec;
        if (!dir_.empty()) fs::remove_all(dir_, ec);
    }
    std::string tmp(const std::string & name) const { return (dir_ / name).string(); }
    fs::path dir_;
};

// ---- logits ------------------------------------------------------------------------------------------------

struct LogitsCase {
    const char * name, * model, * prompt, * lora, * logits, * report;
    int n_tokens, n_vocab;
    double tol;  // only where the zen4 build cannot run: §7's bound for the file's weight type
};

const LogitsCase kLogitsCases[] = {
    {"stories260K_F32", "stories260K.gguf", "prompt1.txt", "", "stories260K.prompt1.logits.16x512.f32",
     "stories260K.prompt1.oracle.txt", 16, 512, 1e-4},
    {"stories260K_F16", "derived/stories260K-F16.gguf", "prompt1.txt", "", "stories260K-F16.prompt1.logits.16x512.f32",
     "stories260K-F16.prompt1.oracle.txt", 16, 512, 0.015},
    {"stories260K_BF16", "derived/stories260K-BF16.gguf", "prompt1.txt", "", "stories260K-BF16.prompt1.logits.16x512.f32",
     "stories260K-BF16.prompt1.oracle.txt", 16, 512, 0.11},
    {"stories260K_Q8_0", "derived/stories260K-Q8_0.gguf", "prompt1.txt", "", "stories260K-Q8_0.prompt1.logits.16x512.f32",
     "stories260K-Q8_0.prompt1.oracle.txt", 16, 512, 0.29},
    {"stories260K_Q4_0", "derived/stories260K-Q4_0.gguf", "prompt1.txt", "", "stories260K-Q4_0.prompt1.logits.16x512.f32",
     "stories260K-Q4_0.prompt1.oracle.txt", 16, 512, 3.9},
    {"qwen2", "synthetic/tiny-random-qwen2.gguf", "prompt2.txt", "", "tiny-random-qwen2.prompt2.logits.12x269.f32",
     "tiny-random-qwen2.prompt2.oracle.txt", 12, 269, 1e-4},
    {"qwen3", "synthetic/tiny-random-qwen3.gguf", "prompt2.txt", "", "tiny-random-qwen3.prompt2.logits.12x269.f32",
     "tiny-random-qwen3.prompt2.oracle.txt", 12, 269, 1e-4},
    {"stories260K_runtime_lora", "stories260K.gguf", "prompt1.txt", "reference/lora/stories260K-lora-r4-a8.gguf",
     "lora/stories260K+lora.prompt1.logits.16x512.f32", "lora/stories260K+lora.prompt1.oracle.txt", 16, 512, 1e-4},
};

void PrintTo(const LogitsCase & c, std::ostream * os) { *os << c.name; }

class OracleLogits : public Oracle, public ::testing::WithParamInterface<LogitsCase> {};

TEST_P(OracleLogits, ReproducesReference) {
    const LogitsCase & c = GetParam();
    const std::string out = tmp("logits.f32");
    std::string args = "logits " + quote(models(c.model)) + " --prompt-file " + quote(reference(c.prompt)) + " --out " + quote(out);
    if (*c.lora) args += " --lora " + quote(models(c.lora)) + " --lora-scale 1";
    auto r = rp::oracle::run(args);
    ASSERT_EQ(r.status, 0) << r.out;
    const std::string ref = slurp(reference(c.report));
    ASSERT_FALSE(ref.empty()) << reference(c.report);

    // Tokenization and pieces are independent of the CPU build: always exact.
    EXPECT_EQ(line(r.out, "tokens("), line(ref, "tokens("));
    EXPECT_EQ(line(r.out, "pieces:"), line(ref, "pieces:"));
    if (*c.lora) {
        EXPECT_EQ(line(r.out, "applied lora"), line(ref, "applied lora"));
    }

    const auto got = rp::oracle::read_f32(out), want = rp::oracle::read_f32(reference(c.logits));
    ASSERT_EQ(want.size(), (size_t) c.n_tokens * c.n_vocab);
    ASSERT_EQ(got.size(), want.size());
    double maxdiff = 0;
    for (size_t i = 0; i < got.size(); ++i) maxdiff = std::max(maxdiff, std::fabs((double) got[i] - want[i]));
    const bool reference_build = line(r.out, "backend:") == "backend: zen4";
    std::printf("[ oracle   ] %s: %s, max |dlogit| vs reference = %.3g%s\n", c.name,
                line(r.out, "backend:").c_str(), maxdiff, maxdiff == 0 ? " (bitwise)" : "");
    RecordProperty("max_abs_diff", std::to_string(maxdiff));

    if (reference_build) {
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << "not bit-identical: max |dlogit| = " << maxdiff;
        // Everything printed from bit-identical logits must match the stored report too.
        EXPECT_EQ(lines_starting(r.out, "pos "), lines_starting(ref, "pos "));
        EXPECT_EQ(line(r.out, "last-position logits"), line(ref, "last-position logits"));
    } else {
        EXPECT_LE(maxdiff, c.tol);
        // Argmax must agree wherever the reference's top two are further apart than the tolerance allows to swap.
        for (int p = 0; p < c.n_tokens; ++p) {
            const float * w = &want[(size_t) p * c.n_vocab], * g = &got[(size_t) p * c.n_vocab];
            std::vector<float> s(w, w + c.n_vocab);
            std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
            if (s[0] - s[1] > 2 * c.tol) {
                EXPECT_EQ(std::max_element(g, g + c.n_vocab) - g, std::max_element(w, w + c.n_vocab) - w) << "position " << p;
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Reference, OracleLogits, ::testing::ValuesIn(kLogitsCases),
                         [](const ::testing::TestParamInfo<LogitsCase> & i) { return std::string(i.param.name); });

// ---- mean cross-entropy (§9) -------------------------------------------------------------------------------

TEST_F(Oracle, MeanCrossEntropyTrain256) {
    const int N = 256;
    const std::string model = models("stories260K.gguf"), train = reference("train.txt"), out = tmp("ce.f32");
    // The whole text with BOS: inputs are ids[0..N), labels ids[1..N].
    auto tk = rp::oracle::run("tokenize " + quote(model) + " --special", train);
    ASSERT_EQ(tk.status, 0);
    const std::vector<int> ids = ints(tk.out);
    ASSERT_GT(ids.size(), (size_t) N);
    EXPECT_EQ(ids[0], 1);  // BOS of the SPM vocab

    auto r = rp::oracle::run("logits " + quote(model) + " --prompt-file " + quote(train) + " --ce " + std::to_string(N) + " --out " + quote(out));
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(report_tokens(r.out), std::vector<int>(ids.begin(), ids.begin() + N));
    const std::string ce_line = line(r.out, "mean CE");
    ASSERT_FALSE(ce_line.empty()) << r.out;
    const std::string ce_text = ce_line.substr(ce_line.find("= ") + 2);
    const std::string ref_line = slurp(reference("stories260K.train256.meanCE.txt"));
    const std::string ref_text = ref_line.substr(ref_line.find("= ") + 2, 11);  // "0.937640041"
    const double ref_ce = std::stod(ref_text);
    ASSERT_EQ(ref_text, "0.937640041");

    // Independent recomputation from the written logits: CE = mean(logsumexp(z_p) - z_p[label]), in double.
    const auto z = rp::oracle::read_f32(out);
    const int nv = 512;
    ASSERT_EQ(z.size(), (size_t) N * nv);
    double ce = 0;
    for (int p = 0; p < N; ++p) {
        const float * row = &z[(size_t) p * nv];
        const double m = *std::max_element(row, row + nv);
        double s = 0;
        for (int j = 0; j < nv; ++j) s += std::exp(row[j] - m);
        ce += m + std::log(s) - row[ids[p + 1]];
    }
    ce /= N;
    std::printf("[ oracle   ] mean CE: printed %s, recomputed %.12f, reference %s\n", ce_text.c_str(), ce, ref_text.c_str());
    EXPECT_NEAR(std::stod(ce_text), ce, 5e-10);  // the printed value is the same quantity rounded to 9 decimals
    if (line(r.out, "backend:") == "backend: zen4") {
        EXPECT_EQ(ce_text, ref_text);
        EXPECT_NEAR(ce, ref_ce, 5e-10);
    } else {
        EXPECT_NEAR(ce, ref_ce, 2e-4);  // |d(lse(z) - z_label)| <= 2 max|dz|, and max|dz| <= 1e-4 for F32 (§7)
    }
}

// ---- tokenizer (§11) ---------------------------------------------------------------------------------------

struct VocabCase {
    const char * name, * model, * inp, * out;
};

const VocabCase kVocabCases[] = {
    {"llama_spm", "vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-llama-spm.gguf.inp", "vocab/ggml-vocab-llama-spm.gguf.out"},
    {"llama_bpe", "vocab/ggml-vocab-llama-bpe.gguf", "vocab/ggml-vocab-llama-bpe.gguf.inp", "vocab/ggml-vocab-llama-bpe.gguf.out"},
    {"qwen2", "vocab/ggml-vocab-qwen2.gguf", "vocab/ggml-vocab-qwen2.gguf.inp", "vocab/ggml-vocab-qwen2.gguf.out"},
    {"gpt_2", "vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-gpt-2.gguf.inp", "vocab/ggml-vocab-gpt-2.gguf.out"},
    {"stories260K", "stories260K.gguf", "vocab/ggml-vocab-llama-spm.gguf.inp", "reference/stories260K.vocab-llama-spm-cases.out"},
};

void PrintTo(const VocabCase & c, std::ostream * os) { *os << c.name; }

class OracleTokenizer : public Oracle, public ::testing::WithParamInterface<VocabCase> {};

TEST_P(OracleTokenizer, ReproducesFixture) {
    const VocabCase & c = GetParam();
    // Fixture flags: add_special = false, parse_special = false; one output line per case.
    auto r = rp::oracle::run("tokenize " + quote(models(c.model)) + " --no-parse-special --cases", models(c.inp));
    ASSERT_EQ(r.status, 0);
    std::vector<std::vector<int>> got, want;
    std::istringstream g(r.out), w(slurp(models(c.out)));
    for (std::string l; std::getline(g, l);) got.push_back(ints(l));
    for (std::string l; std::getline(w, l);) want.push_back(ints(l));  // ints() skips the leading space
    ASSERT_EQ(want.size(), 46u);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "case " << i;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OracleTokenizer, ::testing::ValuesIn(kVocabCases),
                         [](const ::testing::TestParamInfo<VocabCase> & i) { return std::string(i.param.name); });

TEST_F(Oracle, PromptTokensWithSpecials) {
    // add_special (BOS for SPM, none for the qwen vocab) and parse_special (chat markers as single tokens).
    struct { const char * model, * prompt, * report; } const cases[] = {
        {"stories260K.gguf", "prompt1.txt", "stories260K.prompt1.oracle.txt"},
        {"synthetic/tiny-random-qwen2.gguf", "prompt2.txt", "tiny-random-qwen2.prompt2.oracle.txt"},
        {"synthetic/tiny-random-qwen3.gguf", "prompt2.txt", "tiny-random-qwen3.prompt2.oracle.txt"},
    };
    for (const auto & c : cases) {
        auto r = rp::oracle::run("tokenize " + quote(models(c.model)) + " --special", reference(c.prompt));
        ASSERT_EQ(r.status, 0);
        EXPECT_EQ(ints(r.out), report_tokens(slurp(reference(c.report)))) << c.model;
    }
    // The token lists stated in reference-oracle.md §12, independent of the report files.
    EXPECT_EQ(report_tokens(slurp(reference("stories260K.prompt1.oracle.txt"))),
              (std::vector<int>{1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426}));
    EXPECT_EQ(report_tokens(slurp(reference("tiny-random-qwen3.prompt2.oracle.txt"))),
              (std::vector<int>{267, 117, 115, 261, 258, 265, 101, 97, 116, 257, 114, 268}));
}

TEST_F(Oracle, DetokenizeRoundTrip) {
    // SPM: the tokens after BOS give back the prompt (the leading space the vocab adds is removed again).
    auto r = rp::oracle::run("detok " + quote(models("stories260K.gguf")) + " 403 407 261 378 432 383 286 261 376 298 315 421 395 317 426");
    ASSERT_EQ(r.status, 0);
    EXPECT_EQ(r.out, slurp(reference("prompt1.txt")));
    // Byte-level BPE with special tokens rendered.
    r = rp::oracle::run("detok " + quote(models("synthetic/tiny-random-qwen3.gguf")) + " 267 117 115 261 258 265 101 97 116 257 114 268");
    ASSERT_EQ(r.status, 0);
    EXPECT_EQ(r.out, slurp(reference("prompt2.txt")));
}

// ---- greedy generation -------------------------------------------------------------------------------------

TEST_F(Oracle, GreedyGenerationMatchesBatchArgmax) {
    const int n_gen = 12;
    const std::string model = models("stories260K.gguf");
    auto g = rp::oracle::run("generate " + quote(model) + " --prompt-file " + quote(reference("prompt1.txt")) + " -n " + std::to_string(n_gen));
    ASSERT_EQ(g.status, 0);
    const std::vector<int> gen = ints(g.out);
    ASSERT_EQ(gen.size(), (size_t) n_gen) << g.out;
    EXPECT_EQ(gen[0], 338);  // the reference's argmax at the last prompt position

    // Token-by-token decoding through the KV cache must agree with one batch over prompt + generated tokens.
    std::vector<int> all = report_tokens(slurp(reference("stories260K.prompt1.oracle.txt")));
    ASSERT_EQ(all.size(), 16u);
    const size_t n_prompt = all.size();
    all.insert(all.end(), gen.begin(), gen.end() - 1);
    std::string ids;
    for (int t : all) ids += std::to_string(t) + " ";
    const std::string out = tmp("gen.f32");
    auto r = rp::oracle::run("logits " + quote(model) + " --tokens " + quote(ids) + " --out " + quote(out));
    ASSERT_EQ(r.status, 0) << r.out;
    const auto z = rp::oracle::read_f32(out);
    ASSERT_EQ(z.size(), all.size() * 512);
    for (int i = 0; i < n_gen; ++i) {
        const float * row = &z[(n_prompt - 1 + i) * 512];
        EXPECT_EQ(std::max_element(row, row + 512) - row, gen[i]) << "generated token " << i;
    }
}

// ---- errors ------------------------------------------------------------------------------------------------

TEST_F(Oracle, RejectsBadInputWithMessage) {
    const std::string prompt = " --prompt-file " + quote(reference("prompt1.txt"));
    const std::string bad[] = {
        "logits " + quote(tmp("missing.gguf")) + prompt,
        "logits " + quote(models("invalid/tinyllamas-stories-260k-f32.ggufv1.gguf")) + prompt,
        "logits " + quote(models("synthetic/tiny-random-qwen2.gguf")) + prompt + " --lora " +
            quote(models("reference/lora/stories260K-lora-r4-a8.gguf")),
        "logits " + quote(models("stories260K.gguf")) + prompt + " --ce 16",  // needs 17 tokens
        "logits " + quote(models("stories260K.gguf")) + " --tokens '1 512'",  // id >= n_vocab
        "frobnicate " + quote(models("stories260K.gguf")),
    };
    for (const std::string & a : bad) {
        auto r = rp::oracle::run(a + " 2>&1");
        EXPECT_EQ(r.status, 1) << a;
        EXPECT_NE(r.out.find("error: "), std::string::npos) << a << "\n" << r.out;
    }
}

}  // namespace
