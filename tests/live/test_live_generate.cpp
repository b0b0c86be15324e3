// Greedy generation against llama.cpp: rp-oracle's greedy continuation of "Once upon a time" on stories260K
// (its generate mode: the prompt in one batch, then one token per decode, argmax, stop at end-of-generation)
// must be reproduced token for token by our InferenceSession + Sampler at temperature 0, and character for
// character by `rp-generate --temp 0`.
#include "live_util.h"

#include "models/arch/inference.h"
#include "models/arch/model.h"
#include "models/text/tokenizer.h"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

using namespace rp::live;

namespace {

constexpr int kNew = 48;
const char * const kPrompt = "Once upon a time";

std::string slurp(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

} // namespace

TEST(LiveGenerate, GreedyStories260KMatchesLlamaCpp) {
    RP_REQUIRE_ORACLE();
    const std::string model = model_path("stories260K.gguf");
    const std::string m = rp::oracle::quote(model);

    // llama.cpp: prompt ids (BOS by the vocab's rule), the greedy continuation, and its text.
    TempDir dir;
    const std::string prompt_file = dir.file("prompt.txt");
    { std::ofstream(prompt_file, std::ios::binary) << kPrompt; }
    const auto ptok = rp::oracle::run("tokenize " + m + " --special", prompt_file);
    ASSERT_EQ(ptok.status, 0);
    const std::vector<int32_t> prompt = rp::oracle::parse_ids(ptok.out);
    ASSERT_GE(prompt.size(), 2u);
    ASSERT_EQ(prompt[0], 1) << "stories260K adds BOS";
    const auto gen = rp::oracle::run("generate " + m + " --prompt " + rp::oracle::quote(kPrompt) + " -n " + std::to_string(kNew));
    ASSERT_EQ(gen.status, 0);
    const std::vector<int32_t> ref = rp::oracle::parse_ids(gen.out);
    ASSERT_FALSE(ref.empty());
    std::vector<int32_t> text_ids(prompt.begin() + 1, prompt.end());  // no BOS: detok drops the first token's space
    text_ids.insert(text_ids.end(), ref.begin(), ref.end());
    const auto detok = rp::oracle::run("detok " + m + " " + rp::oracle::id_list(text_ids));
    ASSERT_EQ(detok.status, 0);
    ASSERT_EQ(detok.out.rfind(kPrompt, 0), 0u) << "llama.cpp's text does not start with the prompt: " << detok.out;
    std::printf("llama.cpp greedy (%zu tokens): %s\n  text: %s\n", ref.size(), rp::oracle::id_list(ref).c_str(), detok.out.c_str());

    // Ours, token ids: the same prompt ids, then the same greedy loop.
    auto mdl = rp::Model::load(model);
    rp::Tokenizer tok(mdl->file());
    EXPECT_EQ(tok.encode(kPrompt, true, false), prompt);
    rp::InferenceSession s(*mdl, static_cast<int64_t>(prompt.size()) + kNew, 1);  // 1 thread: see live_util.cpp
    rp::SamplerParams sp;
    sp.temperature = 0.0f;
    rp::Sampler greedy(sp);
    std::vector<int32_t> ours;
    std::vector<float> z = s.eval(prompt, false);
    for (int i = 0; i < kNew; ++i) {
        const int32_t next = greedy.sample(z.data(), s.n_vocab());
        if (tok.is_eog(next)) break;
        ours.push_back(next);
        z = s.eval({next}, false);
    }
    std::printf("ours     greedy (%zu tokens): %s\n", ours.size(), rp::oracle::id_list(ours).c_str());
    EXPECT_EQ(ours, ref);

    // Ours, the tool: the prompt, each generated piece, a newline.
    const std::string out = dir.file("out.txt");
    const std::string cmd = std::string(RP_BIN_DIR) + "/rp-generate -m " + m + " -p " + rp::oracle::quote(kPrompt) +
                            " -n " + std::to_string(kNew) + " --temp 0 --seed 1 -t 1 > " + rp::oracle::quote(out) + " 2> /dev/null";
    const int st = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << cmd;
    EXPECT_EQ(slurp(out), detok.out + "\n");
}
