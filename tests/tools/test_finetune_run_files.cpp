// rp-finetune with run files, end to end: --print-config of a command line, fed back as --config, trains to
// the same adapter bytes; the configuration lands beside the result and in the checkpoint, and
// `--resume CKPT` alone continues with the recorded options to the uninterrupted run's bytes; a bad run file
// exits 1 naming the file, line and key, leaving nothing.
#include "tests/common/temp_dir.h"
#include "tests/finetune/ft_test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string finetune() { return ft_test::tool("rp-finetune"); }
std::string train_txt() { return ft_test::shared_dir() + "/models/reference/train.txt"; }

} // namespace

TEST(FinetuneRunFiles, PrintedConfigTrainsToTheSameBytes) {
    rp_test::TempDir d;
    const std::string flags = " -m " + ft_test::stories() + " --data " + train_txt() +
                              " --seq-len 16 --batch 2 --steps 3 -t 1 --lora-rank 4 --lr 2e-3 --warmup 1 --lora-targets attn_q,ffn_down";
    std::string log;
    ASSERT_EQ(ft_test::run(finetune() + flags + " -o " + d.file("a.gguf"), &log), 0) << log;
    ASSERT_EQ(ft_test::run(finetune() + flags + " -o " + d.file("b.gguf") + " --print-config > " + d.file("run.toml"), &log), 0) << log;
    EXPECT_FALSE(fs::exists(d.file("b.gguf"))) << "--print-config trains nothing";
    ASSERT_EQ(ft_test::run(finetune() + " --config " + d.file("run.toml"), &log), 0) << log;
    ASSERT_TRUE(fs::exists(d.file("b.gguf"))) << log;
    EXPECT_EQ(slurp(d.file("a.gguf")), slurp(d.file("b.gguf")));
    // The configuration beside each result: the same but for the output path.
    std::string a = slurp(d.file("a.gguf.config.toml")), b = slurp(d.file("b.gguf.config.toml"));
    ASSERT_NE(a.find("lora-rank = 4\n"), std::string::npos) << a;
    a.replace(a.find("a.gguf"), 6, "b.gguf");
    EXPECT_EQ(a, b);
    EXPECT_EQ(b, slurp(d.file("run.toml")));
    // A flag overrides the file.
    ASSERT_EQ(ft_test::run(finetune() + " --config " + d.file("run.toml") + " -o " + d.file("c.gguf") + " --lora-rank 2", &log), 0) << log;
    EXPECT_NE(slurp(d.file("c.gguf.config.toml")).find("lora-rank = 2\n"), std::string::npos);
}

TEST(FinetuneRunFiles, ResumeAloneReusesTheCheckpointsOptions) {
    rp_test::TempDir d;
    const std::string flags = " -m " + ft_test::stories() + " --data " + train_txt() + " --seq-len 16 --batch 2 --steps 4 -t 1 --lora-rank 4 --lr 3e-3";
    std::string log;
    ASSERT_EQ(ft_test::run(finetune() + flags + " -o " + d.file("whole.gguf"), &log), 0) << log;
    ASSERT_EQ(ft_test::run(finetune() + flags + " -o " + d.file("part.gguf") + " --stop-at 2", &log), 0) << log;
    // Nothing but the checkpoint: its --stop-at is not carried over (it was that invocation's), the rest is; a
    // changed option is reported.
    ASSERT_EQ(ft_test::run(finetune() + " --resume " + d.file("part.gguf.ckpt.gguf") + " --sample-tokens 5", &log), 0) << log;
    EXPECT_NE(log.find("resume: options changed since the checkpoint: sample-tokens = 5 (was 32)"), std::string::npos) << log;
    EXPECT_EQ(slurp(d.file("whole.gguf")), slurp(d.file("part.gguf")));
}

TEST(FinetuneRunFiles, ABadRunFileExitsOneNamingTheLineAndLeavesNothing) {
    rp_test::TempDir d;
    {
        std::ofstream f(d.file("run.toml"));
        f << "model = \"" << ft_test::stories() << "\"\ndata = \"" << train_txt() << "\"\noutput = \"" << d.file("a.gguf") << "\"\nlora-rank = 0\n";
    }
    std::string log;
    EXPECT_EQ(ft_test::run(finetune() + " --config " + d.file("run.toml"), &log), 1);
    EXPECT_NE(log.find("error: " + d.file("run.toml") + ":4: lora-rank = 0: --lora-rank: '0' is not an integer in [1, 1048576]"), std::string::npos)
        << log;
    EXPECT_EQ(ft_test::run(finetune() + " --config " + d.file("nope.toml"), &log), 1);
    EXPECT_NE(log.find("nope.toml: cannot open file"), std::string::npos) << log;
    EXPECT_EQ(std::distance(fs::directory_iterator(d.path), fs::directory_iterator()), 1) << "only run.toml";
}

// The example run files read cleanly (every key an option, every value in range), and the main job's trains.
TEST(FinetuneRunFiles, TheExamplesAreValidRunFiles) {
    for (const char * name : {"stories260K-lora.toml", "chat-lora.toml", "stories260K-dpo.toml", "stories260K-grpo.toml"}) {
        std::string log;
        EXPECT_EQ(ft_test::run(finetune() + " --config " + std::string(RP_SOURCE_DIR) + "/examples/runs/" + name + " --print-config", &log), 0)
            << name << "\n" << log;
        EXPECT_NE(log.find("lora-rank = "), std::string::npos) << log;
    }
    rp_test::TempDir d;
    std::string log;
    ASSERT_EQ(ft_test::run(finetune() + " --config " + std::string(RP_SOURCE_DIR) + "/examples/runs/stories260K-lora.toml -m " + ft_test::stories() +
                               " --data " + std::string(RP_SOURCE_DIR) + "/examples/data/stories.txt --steps 2 --warmup 1 --eval-every 1 -t 1 -o " + d.file("a.gguf"),
                           &log),
              0)
        << log;
    EXPECT_TRUE(fs::exists(d.file("a.gguf")));
    // The preference example: DPO from an SFT adapter (here llama.cpp's reference adapter of stories260K).
    ASSERT_EQ(ft_test::run(finetune() + " --config " + std::string(RP_SOURCE_DIR) + "/examples/runs/stories260K-dpo.toml -m " + ft_test::stories() +
                               " --data " + std::string(RP_SOURCE_DIR) + "/examples/data/stories-pairs.jsonl --adapter " +
                               ft_test::model_path("reference/lora/stories260K-lora-r4-a8.gguf") + " --steps 2 --eval-every 1 --sample-every 2 -t 1 -o " +
                               d.file("dpo.gguf"),
                           &log),
              0)
        << log;
    EXPECT_NE(log.find("step 1/2 | loss 0.6931"), std::string::npos) << log;
    EXPECT_TRUE(fs::exists(d.file("dpo.gguf")));
    // The GRPO example: two steps of its rollouts and rewards.
    ASSERT_EQ(ft_test::run(finetune() + " --config " + std::string(RP_SOURCE_DIR) + "/examples/runs/stories260K-grpo.toml -m " + ft_test::stories() +
                               " --data " + std::string(RP_SOURCE_DIR) + "/examples/data/stories-prompts.jsonl --steps 2 -t 1 -o " + d.file("grpo.gguf"),
                           &log),
              0)
        << log;
    EXPECT_NE(log.find("24 prompts (0 cut to --max-prompt-len), 8 completions each of up to 12 tokens"), std::string::npos) << log;
    EXPECT_NE(log.find("  reward "), std::string::npos) << log;
    EXPECT_TRUE(fs::exists(d.file("grpo.gguf")));
}
