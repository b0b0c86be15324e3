// rp-perplexity and rp-generate, run as programs (RP_BIN_DIR).
#include "models_test_util.h"

#include "ggml_rp/cpu/gemm.h"
#include "models/arch/hparams.h"
#include "models/text/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>

using namespace models_test;

namespace {

const std::string kTrain = ref_path("train.txt");

double final_ppl(const std::string & out) {
    const std::string key = "Final estimate: PPL = ";
    const size_t p = out.find(key);
    if (p == std::string::npos) return -1.0;
    return std::stod(out.substr(p + key.size()));
}

// llama-perplexity -c 64 on train.txt with stories260K gives 3.5134 (reference-oracle.md §14).
TEST(Perplexity, MatchesLlamaPerplexity) {
    const ToolResult r = run_tool("rp-perplexity", "-m " + stories() + " -f " + kTrain + " -c 64 -t 1");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const double ppl = final_ppl(r.out);
    std::printf("rp-perplexity: PPL = %.4f (llama-perplexity 3.5134)\n%s", ppl, r.out.c_str());
    EXPECT_NEAR(ppl, 3.5134, 3.5134 * 1e-3);
    EXPECT_NE(r.out.find("[1]"), std::string::npos);
    EXPECT_NE(r.out.find("[13]"), std::string::npos);  // 840 tokens: 13 chunks of 64
    EXPECT_EQ(r.out.find("[14]"), std::string::npos);
    EXPECT_NE(r.out.find(" +/- "), std::string::npos);

    // Evaluating each chunk in batches of 16 through the KV cache gives the same numbers.
    const ToolResult b = run_tool("rp-perplexity", "-m " + stories() + " -f " + kTrain + " -c 64 -b 16 -t 1");
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(b.out, r.out);
}

TEST(Perplexity, StrideModeRuns) {
    const ToolResult r = run_tool("rp-perplexity", "-m " + stories() + " -f " + kTrain + " -c 64 --stride 32 -t 1");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // (840 - 64) / 32 rounded up = 25 windows.
    EXPECT_NE(r.out.find("[25]"), std::string::npos);
    EXPECT_EQ(r.out.find("[26]"), std::string::npos);
    const double ppl = final_ppl(r.out);
    EXPECT_GT(ppl, 1.0);
    EXPECT_LT(ppl, 10.0);
}

TEST(Perplexity, Errors) {
    ToolResult r = run_tool("rp-perplexity", "-m " + stories() + " -f " + kTrain + " -c 1024");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("at least 2048"), std::string::npos) << r.err;
    r = run_tool("rp-perplexity", "-m /nonexistent.gguf -f " + kTrain);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("/nonexistent.gguf"), std::string::npos) << r.err;
    r = run_tool("rp-perplexity", "-m " + stories() + " -f /nonexistent.txt");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("/nonexistent.txt"), std::string::npos) << r.err;
    r = run_tool("rp-perplexity", "-m " + stories() + " -f " + kTrain + " -c abc");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("-c"), std::string::npos) << r.err;
    r = run_tool("rp-perplexity", "--bogus");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("--bogus"), std::string::npos) << r.err;
    r = run_tool("rp-perplexity", "-m " + stories() + " -f " + kTrain + " -c 4096");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("longer than the model's 2048"), std::string::npos) << r.err;
    r = run_tool("rp-perplexity", "--help");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("usage"), std::string::npos);
}

int argmax_last_row(const std::vector<float> & logits, int64_t n_vocab) {
    const float * row = logits.data() + logits.size() - n_vocab;
    return static_cast<int>(std::max_element(row, row + n_vocab) - row);
}

// Greedy generation continues prompt 1 with llama.cpp's argmax of its last position.
TEST(Generate, GreedyFirstTokenIsLlamaCppsArgmax) {
    const std::string prompt = slurp(ref_path("prompt1.txt"));
    auto tok = rp::Tokenizer::load(stories());
    for (bool lora : {false, true}) {
        SCOPED_TRACE(lora ? "with lora" : "base");
        const std::string ref = lora ? "lora/stories260K+lora.prompt1.logits.16x512.f32" : "stories260K.prompt1.logits.16x512.f32";
        const int next = argmax_last_row(read_f32(ref_path(ref), 16 * 512), 512);
        if (!lora) {
            EXPECT_EQ(next, 338);  // MANIFEST.md
        }
        const std::string extra = lora ? " --lora " + ref_path("lora/stories260K-lora-r4-a8.gguf") : "";
        const ToolResult r = run_tool("rp-generate", "-m " + stories() + " -f " + ref_path("prompt1.txt") + " -n 1 --temp 0 -t 1" + extra);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.out, prompt + tok->token_to_piece(next, false) + "\n");
        EXPECT_NE(r.err.find("1 tokens, "), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("tokens/s (prompt: "), std::string::npos) << r.err;
    }
}

TEST(Generate, SameSeedSameText) {
    const std::string args = "-m " + stories() + " -p 'Once upon a time' -n 24 --temp 0.9 --top-k 20 --top-p 0.9 --seed 7 -t 1";
    const ToolResult a = run_tool("rp-generate", args), b = run_tool("rp-generate", args);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.out.rfind("Once upon a time", 0), 0u);
    EXPECT_GT(a.out.size(), std::string("Once upon a time").size() + 10);
}

TEST(Generate, Errors) {
    ToolResult r = run_tool("rp-generate", "-m /nonexistent.gguf -p hi");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("/nonexistent.gguf"), std::string::npos) << r.err;
    r = run_tool("rp-generate", "-m " + stories() + " -p hi --temp hot");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("--temp"), std::string::npos) << r.err;
    r = run_tool("rp-generate", "-m " + stories() + " -p hi -c 4096");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("context 4096 is longer than the model's 2048"), std::string::npos) << r.err;
    r = run_tool("rp-generate", "-m " + stories());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("-p"), std::string::npos) << r.err;
    r = run_tool("rp-generate", "-m " + stories() + " -p hi --lora " + model_path("synthetic/tiny-random-qwen2.gguf"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("tiny-random-qwen2.gguf"), std::string::npos) << r.err;
    r = run_tool("rp-generate", "-m " + stories() + " -p hi --lora-scale 2");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("--lora-scale"), std::string::npos) << r.err;
    r = run_tool("rp-generate", "-m " + stories() + " -p hi --chat");  // stories260K has no chat template
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
    r = run_tool("rp-generate", "-m " + stories() + " -p hi --matvec quick");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("--matvec: 'quick' is not fast or exact"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << "nothing generated: " << r.out;
    r = run_tool("rp-generate", "--help");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("usage"), std::string::npos);
    EXPECT_NE(r.out.find("--matvec M"), std::string::npos) << "the numerics are stated in --help";
}

TEST(Generate, ChatTemplateOnQwen) {
    // The synthetic qwen model has no template in the file: name it. Its weights are random; the test checks
    // that the ChatML prompt runs and generation stops within -n.
    const ToolResult r = run_tool("rp-generate", "-m " + model_path("synthetic/tiny-random-qwen2.gguf") +
                                                     " -p 'the weather' --chat-template chatml -n 8 --temp 0 -t 1");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
}

// A thinking template (its generation prompt opens "<think>", as DeepSeek-R1's and QwQ's do): the reply is
// reasoning until the model closes the block. Into a file it is left out, saying how long it was, unless
// --show-thinking prints it between the model's markers; --hide-thinking leaves it out anywhere; the flags
// need --chat. (The random model never closes the block: all of its reply is reasoning.)
TEST(Generate, ThinkingTemplatesKeepTheReasoningApart) {
    TempDir d;
    {
        std::ofstream f(d.file("think.jinja"));
        f << "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor %}"
             "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{%- endif %}";
    }
    const std::string base = "-m " + model_path("synthetic/tiny-random-qwen2.gguf") + " -p 'the weather' --chat-template " +
                             d.file("think.jinja") + " -n 12 --temp 0 -t 1";
    const ToolResult hidden = run_tool("rp-generate", base);
    ASSERT_EQ(hidden.exit_code, 0) << hidden.err;
    EXPECT_EQ(hidden.out, "\n");
    const std::string key = "(reasoning of ";
    const size_t at = hidden.err.find(key);
    ASSERT_NE(at, std::string::npos) << hidden.err;
    const size_t bytes = std::stoul(hidden.err.substr(at + key.size()));
    EXPECT_NE(hidden.err.find("bytes left out: --show-thinking prints it)"), std::string::npos) << hidden.err;

    const ToolResult shown = run_tool("rp-generate", base + " --show-thinking");
    ASSERT_EQ(shown.exit_code, 0) << shown.err;
    const std::string open = "<think>\n", close = "\n</think>\n";
    ASSERT_GE(shown.out.size(), open.size() + close.size()) << shown.out;
    EXPECT_EQ(shown.out.substr(0, open.size()), open) << shown.out;
    EXPECT_EQ(shown.out.substr(shown.out.size() - close.size()), close) << shown.out;
    EXPECT_EQ(shown.out.size() - open.size() - close.size(), bytes) << shown.out;
    EXPECT_GT(bytes, 0u);
    EXPECT_EQ(shown.err.find(key), std::string::npos) << shown.err;

    const ToolResult hide = run_tool("rp-generate", base + " --hide-thinking");
    ASSERT_EQ(hide.exit_code, 0) << hide.err;
    EXPECT_EQ(hide.out, "\n");
    // A template without a block: the reply as it comes.
    const ToolResult plain = run_tool("rp-generate", "-m " + model_path("synthetic/tiny-random-qwen2.gguf") +
                                                         " -p 'the weather' --chat-template chatml -n 12 --temp 0 -t 1");
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_EQ(plain.err.find(key), std::string::npos) << plain.err;
    const ToolResult bad = run_tool("rp-generate", "-m " + stories() + " -p hi --show-thinking");
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_NE(bad.err.find("need --chat"), std::string::npos) << bad.err;
}

// The tools' help lists every architecture the registry has (models/hparams.h), so the list cannot go
// stale as architectures are added; a file of another architecture is refused naming the same list.
TEST(Tools, HelpListsEverySupportedArchitecture) {
    const std::string archs = rp::supported_architectures();
    ASSERT_NE(archs.find("qwen3moe"), std::string::npos) << archs;
    for (const char * tool : {"rp-finetune", "rp-generate", "rp-perplexity", "rp-check"}) {
        const ToolResult r = run_tool(tool, "--help");
        ASSERT_EQ(r.exit_code, 0) << tool << r.err;
        EXPECT_NE(r.out.find("(" + archs), std::string::npos) << tool << ":\n" << r.out;
    }
}

// The tools' OpenMP wait default (tools/omp_defaults.cpp): with neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT
// set, libgomp itself runs with a spin count of 10,000 (its OMP_DISPLAY_ENV report says so) and the startup
// line names it; a user's setting is left alone.
TEST(Generate, OpenMPWaitDefaultAndUserSettingsReachLibgomp) {
    const auto run = [](const std::string & env) {
        TempDir d;
        const std::string err = d.file("err");
        const std::string cmd = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DISPLAY_ENV=verbose " + env + " " + std::string(RP_BIN_DIR) +
                                "/rp-generate -m " + stories() + " -p hi -n 1 --temp 0 -t 2 > /dev/null 2> " + err;
        EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
        return slurp(err);
    };
    std::string e = run("");
    EXPECT_NE(e.find("GOMP_SPINCOUNT = '10000'"), std::string::npos) << e;
    EXPECT_NE(e.find("2 threads (GOMP_SPINCOUNT=10000)"), std::string::npos) << e;
    e = run("OMP_WAIT_POLICY=passive");
    EXPECT_EQ(e.find("GOMP_SPINCOUNT = '10000'"), std::string::npos) << e;
    EXPECT_NE(e.find("OMP_WAIT_POLICY = 'PASSIVE'"), std::string::npos) << e;
    EXPECT_NE(e.find("2 threads (OMP_WAIT_POLICY=passive)"), std::string::npos) << e;
    e = run("GOMP_SPINCOUNT=1234");
    EXPECT_NE(e.find("GOMP_SPINCOUNT = '1234'"), std::string::npos) << e;
    EXPECT_NE(e.find("2 threads (GOMP_SPINCOUNT=1234)"), std::string::npos) << e;
}

// Every tool that takes a thread count says in --help how its threads wait.
TEST(Generate, EveryThreadedToolsHelpStatesTheWait) {
    for (const char * tool : {"rp-generate", "rp-finetune", "rp-perplexity", "rp-check", "rp-merge-lora", "rp-gguf convert"}) {
        TempDir d;
        const std::string out = d.file("out");
        const std::string cmd = std::string(RP_BIN_DIR) + "/" + tool + " --help > " + out + " 2>&1";
        EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
        const std::string help = slurp(out);
        EXPECT_NE(help.find("GOMP_SPINCOUNT=10000"), std::string::npos) << tool << "\n" << help;
        EXPECT_NE(help.find("OMP_WAIT_POLICY"), std::string::npos) << tool << "\n" << help;
    }
}

// OpenBLAS starts one thread, not one per core that spins against ours, unless the user asks
// (tools/omp_defaults.cpp); rp-bench reports its count at start.
TEST(Generate, OpenBlasStartsOneThreadUnlessTheUserSetsIt) {
    const auto run = [](const std::string & env) {
        TempDir d;
        const std::string out = d.file("out");
        const std::string cmd = "env -u OPENBLAS_NUM_THREADS " + env + " " + std::string(RP_BIN_DIR) +
                                "/rp-bench ops --only peak --reps 1 --threads 1 > " + out + " 2>&1";
        EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
        return slurp(out);
    };
    std::string o = run("");
    if (!rp::cpu::gemm_have_blas()) {
        EXPECT_NE(o.find("OpenBLAS not built in"), std::string::npos) << o;
        return;
    }
    EXPECT_NE(o.find("(1 thread at start)"), std::string::npos) << o;
    o = run("OPENBLAS_NUM_THREADS=2");
    EXPECT_NE(o.find("(2 threads at start)"), std::string::npos) << o;
}

// rp-bench ops --shape with a reduction length no quantized block divides (LoRA's rank 8): the f32 rows run, the
// quantized ones say why they are left out (a quantizer's error thrown inside the threads aborted the process).
TEST(Generate, BenchShapesOfAnyReductionLength) {
    TempDir d;
    const std::string out = d.file("out");
    const std::string cmd = std::string(RP_BIN_DIR) + "/rp-bench ops --only gemm --shape 8,16,4 --reps 1 --threads 1 > " + out + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const std::string o = slurp(out);
    EXPECT_NE(o.find("ours fwd f32"), std::string::npos) << o;
    EXPECT_NE(o.find("(K = 8 is not a multiple of its block of 32)"), std::string::npos) << o;
}

} // namespace
