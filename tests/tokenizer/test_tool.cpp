// rp-tokenize, run as a program: ids of prompt1 (MANIFEST.md), the piece listing, and errors (exit 1 with
// "error: ..." on stderr).
#include <unistd.h>
#include "tok_test_util.h"

#include <gtest/gtest.h>

#include <fstream>

#include <cstdio>
#include <cstdlib>
#include <sys/wait.h>

using namespace tok_test;

namespace {

struct ToolRun {
    int code = -1;
    std::string out;
};

// Runs a shell command; stdout is captured, stderr goes to the file `err` when given.
ToolRun run_tool(const std::string & args, const std::string & err = "/dev/null") {
    const std::string cmd = std::string(RP_BIN_DIR) + "/rp-tokenize " + args + " 2>" + err;
    ToolRun r;
    FILE * p = popen(cmd.c_str(), "r");
    if (!p) {
        ADD_FAILURE() << "popen failed: " << cmd;
        return r;
    }
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) {
        r.out.append(buf, n);
    }
    const int status = pclose(p);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

TEST(TokenizeTool, Prompt1Ids) {
    const ToolRun r = run_tool("-m " + models_dir() + "/stories260K.gguf -f " + models_dir() + "/reference/prompt1.txt --ids");
    EXPECT_EQ(r.code, 0);
    EXPECT_EQ(r.out, "1 403 407 261 378 432 383 286 261 376 298 315 421 395 317 426\n");
    const ToolRun nobos = run_tool("-m " + models_dir() + "/stories260K.gguf -p 'Once upon' --no-bos --ids");
    EXPECT_EQ(nobos.out, "403 407\n");
}

TEST(TokenizeTool, PiecesAndSpecial) {
    const ToolRun r = run_tool("-m " + models_dir() + "/synthetic/tiny-random-qwen2.gguf -f " + models_dir() +
                      "/reference/prompt2.txt --parse-special");
    EXPECT_EQ(r.code, 0);
    EXPECT_EQ(r.out.rfind("   267 -> '<|im_start|>'\n   117 -> 'u'\n", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("   258 -> ' the'\n"), std::string::npos);
}

TEST(TokenizeTool, RenderChatWithMask) {
    // The Qwen vocabulary's own template; --mask brackets the assistant span (reply + <|im_end|>); each
    // rendering is followed by a line holding only 0x1D.
    const std::string conv = ::testing::TempDir() + "/rp_chat." + std::to_string(getpid()) + ".jsonl";
    FILE * f = std::fopen(conv.c_str(), "wb");
    ASSERT_TRUE(f);
    std::fputs("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]}\n", f);
    std::fclose(f);
    const ToolRun r = run_tool("-m " + models_dir() + "/vocab/ggml-vocab-qwen2.gguf --render-chat " + conv +
                               " --mask --no-generation-prompt");
    EXPECT_EQ(r.code, 0);
    EXPECT_EQ(r.out, "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                     "<|im_start|>assistant\n\xe2\x9f\xaaYo<|im_end|>\xe2\x9f\xab\n\n\x1d\n");
    const ToolRun bad = run_tool("-m " + models_dir() + "/vocab/ggml-vocab-qwen2.gguf --render-chat " + conv +
                                 " --chat-template /nonexistent.jinja");
    EXPECT_EQ(bad.code, 1);
    std::remove(conv.c_str());
}

// Rendering never depends on finding the assistant spans: a template with no end-of-turn marker renders, and
// only --mask fails on it; a conversation that fails is named on stderr, its record left empty, and the
// others still render (exit status 1).
TEST(TokenizeTool, RenderChatWithoutMaskAndAConversationThatFails) {
    const std::string base = ::testing::TempDir() + "/rp_chat_nomask." + std::to_string(getpid());
    const std::string conv = base + ".jsonl", tmpl = base + ".jinja";
    FILE * f = std::fopen(conv.c_str(), "wb");
    ASSERT_TRUE(f);
    std::fputs("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]}\n"
               "{\"messages\": [oops\n"
               "{\"messages\": [{\"role\": \"user\", \"content\": \"Bye\"}]}\n",
               f);
    std::fclose(f);
    f = std::fopen(tmpl.c_str(), "wb");
    ASSERT_TRUE(f);
    // Nothing marks the end of a turn and the replies come out rewritten: no span can be found.
    std::fputs("{% for m in messages %}{{ m.content | upper }} {% endfor %}", f);
    std::fclose(f);
    const std::string args = "-m " + models_dir() + "/vocab/ggml-vocab-qwen2.gguf --render-chat " + conv + " --chat-template " + tmpl;
    auto slurp = [](const std::string & path) {
        std::ifstream in(path, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), {});
    };
    const ToolRun plain = run_tool(args, base + ".err");
    EXPECT_EQ(plain.code, 1) << "line 2 is not JSON";
    EXPECT_EQ(plain.out, "HI YO \n\x1d\n\n\x1d\nBYE \n\x1d\n");
    std::string err = slurp(base + ".err");
    EXPECT_NE(err.find(conv + " line 2"), std::string::npos) << err;
    EXPECT_EQ(err.find("line 1"), std::string::npos) << err;
    const ToolRun masked = run_tool(args + " --mask", base + ".err");
    EXPECT_EQ(masked.code, 1);
    EXPECT_EQ(masked.out, "\n\x1d\n\n\x1d\nBYE \n\x1d\n") << "no assistant turn in line 3: nothing to find";
    err = slurp(base + ".err");
    EXPECT_NE(err.find(conv + " line 1: chat template " + tmpl + ": it does not render a reply"), std::string::npos) << err;
    std::remove(conv.c_str());
    std::remove((base + ".err").c_str());
    std::remove(tmpl.c_str());
}

TEST(TokenizeTool, Errors) {
    const std::string err = ::testing::TempDir() + "/rp_tokenize_err." + std::to_string(getpid()) + ".txt";
    const std::string stories = "-m " + models_dir() + "/stories260K.gguf";
    const std::vector<std::string> bad = {
        "-p x",                                  // no model
        stories,                                 // no text
        stories + " -p x -f /dev/null",          // both
        "-m /nonexistent.gguf -p x",             // missing file
        "-m " + models_dir() + "/vocab/ggml-vocab-qwen2.gguf.inp -p x",  // not a GGUF
        stories + " -p x --bogus",               // unknown option
        stories + " -f " + models_dir(),         // a directory
        stories + " -p",                         // missing value
    };
    for (const std::string & args : bad) {
        const ToolRun r = run_tool(args, err);
        EXPECT_EQ(r.code, 1) << args;
        EXPECT_EQ(read_file(err).rfind("error: ", 0), 0u) << args;
    }
    std::remove(err.c_str());
}

} // namespace
