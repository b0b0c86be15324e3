// rp-finetune's memory plan as a user meets it (roundpipe/call_planner.h, models/run_plan.h):
//   --plan on a Qwen3-0.6B-shaped bf16 model (the real shape and vocabulary) answers in under a second and
//   never reads the weights (its peak RSS stays far below the file), with the lines a script greps;
//   the deep-model case of issue 12 (16 layers, 4 devices of 4M) gives the same outcome and the same bytes
//   on every one of 20 runs;
//   the smallest peak --plan predicts trains, and 5% less is refused before anything is written.
#include "ft_test_util.h"

#include "tests/common/temp_dir.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace {

std::string slurp(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The number after "key: " in a report line.
long long field(const std::string & log, const std::string & key) {
    const size_t at = log.find("\n" + key + ": ");
    const size_t start = at == std::string::npos ? (log.rfind(key + ": ", 0) == 0 ? 0 : std::string::npos) : at + 1;
    if (start == std::string::npos) return -1;
    return std::stoll(log.substr(start + key.size() + 2));
}

std::string deep_model(const rp_test::TempDir & d) {
    const std::string path = d.file("deep.gguf");
    std::string log;
    EXPECT_EQ(ft_test::run(ft_test::tool("rp-gguf") + " synth " + path + " --vocab " + ft_test::stories() +
                               " --n-layer 16 --n-embd 128 --n-ff 256 --n-head 4 --n-head-kv 2 --head-dim 32",
                           &log),
              0)
        << log;
    return path;
}

std::string deep_cmd(const std::string & model, const std::string & out) {
    return ft_test::tool("rp-finetune") + " -m " + model + " --data " + ft_test::shared_dir() + "/models/reference/train.txt -o " +
           out + " --seq-len 64 --batch 10 --micro-batches 5 --steps 2 -t 2 --lora-rank 4 --devices 4";
}

} // namespace

TEST(FinetunePlanTool, PlanOfAQwen3ShapeIsFastAndReadsNoWeights) {
    rp_test::TempDir d;
    std::string log;
    const std::string model = d.file("qwen3-0.6b.gguf");
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-gguf") + " synth " + model + " --shape qwen3-0.6b --type bf16 --vocab " +
                               ft_test::shared_dir() + "/models/vocab/ggml-vocab-qwen2.gguf",
                           &log),
              0)
        << log;
    const auto bytes = static_cast<long long>(std::filesystem::file_size(model));
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-finetune") + " -m " + model +
                               " --plan --devices 4 --device-mem 1G --seq-len 256 --batch 2 --lora-rank 8",
                           &log),
              0)
        << log;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#ifdef RP_SANITIZED
    EXPECT_LT(s, 20.0) << log;  // the tools run instrumented here
#else
    EXPECT_LT(s, 1.0) << log;
#endif
    const long long peak = field(log, "device peak"), host = field(log, "host peak"), rss = field(log, "plan rss");
    EXPECT_GT(peak, 0) << log;
    EXPECT_LE(peak, 1LL << 30) << log;
    EXPECT_GT(host, bytes) << log;  // the mapped weights are part of it
    EXPECT_GT(rss, 0) << log;
    EXPECT_LT(rss, bytes / 8) << log;  // 1.2 GB of weights mapped, not read
    EXPECT_NE(log.find("plan: F "), std::string::npos) << log;
    EXPECT_NE(log.find("link per step: "), std::string::npos) << log;
    // --max-seq: the longest sequence; the report at that length fits, one token more is refused.
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-finetune") + " -m " + model +
                               " --plan --max-seq --devices 4 --device-mem 1G --seq-len 256 --batch 1 --lora-rank 8",
                           &log),
              0)
        << log;
    const long long longest = field(log, "max seq");
    ASSERT_GT(longest, 256) << log;
    std::string at;
    EXPECT_EQ(ft_test::run(ft_test::tool("rp-finetune") + " -m " + model + " --plan --devices 4 --device-mem 1G --batch 1 --lora-rank 8 --seq-len " +
                               std::to_string(longest),
                           &at),
              0)
        << at;
    EXPECT_EQ(ft_test::run(ft_test::tool("rp-finetune") + " -m " + model + " --plan --devices 4 --device-mem 1G --batch 1 --lora-rank 8 --seq-len " +
                               std::to_string(longest + 1),
                           &at),
              1)
        << at;
    EXPECT_NE(at.find("largest --seq-len that fits is " + std::to_string(longest)), std::string::npos) << at;
}

TEST(FinetunePlanTool, TheDeepModelCaseEndsTheSameWayEveryRun) {
    rp_test::TempDir d;
    const std::string model = deep_model(d);
    std::string first_log, first_bytes;
    int first_rc = -1;
#ifdef RP_SANITIZED
    constexpr int kRuns = 5;  // each run is a whole instrumented rp-finetune: 5 keep the sanitizer builds in budget
#else
    constexpr int kRuns = 20;
#endif
    for (int i = 0; i < kRuns; ++i) {
        std::string log;
        const int rc = ft_test::run(deep_cmd(model, d.file("a.gguf")) + " --device-mem 4M", &log);
        const std::string bytes = rc == 0 ? slurp(d.file("a.gguf")) : "";
        if (i == 0) {
            first_rc = rc, first_bytes = bytes, first_log = log;
            ASSERT_TRUE(rc == 0 || log.find("error: cpu:0 has") != std::string::npos) << log;
        } else {
            ASSERT_EQ(rc, first_rc) << "run " << i << "\n" << log;
            ASSERT_EQ(bytes, first_bytes) << "run " << i;
        }
        std::filesystem::remove_all(d.file("a.gguf"));
        for (const char * ext : {".metrics.jsonl", ".loss.svg", ".ckpt.gguf"}) std::filesystem::remove(d.file("a.gguf") + ext);
    }
    EXPECT_EQ(first_rc, 0) << first_log;  // with the exact plan, 4M is enough
}

TEST(FinetunePlanTool, ThePredictedPeakTrainsAndFivePercentLessIsRefused) {
    rp_test::TempDir d;
    const std::string model = deep_model(d);
    std::string log;
    ASSERT_EQ(ft_test::run(deep_cmd(model, d.file("a.gguf")) + " --device-mem 64M --plan", &log), 0) << log;
    const long long least = field(log, "device min peak");
    ASSERT_GT(least, 0) << log;
    ASSERT_EQ(ft_test::run(deep_cmd(model, d.file("a.gguf")) + " --device-mem " + std::to_string(least), &log), 0) << log;
    EXPECT_TRUE(std::filesystem::exists(d.file("a.gguf")));
    rp_test::TempDir e;
    EXPECT_EQ(ft_test::run(deep_cmd(model, e.file("b.gguf")) + " --device-mem " + std::to_string(least - least / 20), &log), 1) << log;
    EXPECT_NE(log.find("error: cpu:0 has"), std::string::npos) << log;
    EXPECT_NE(log.find("largest --seq-len that fits is"), std::string::npos) << log;
    EXPECT_TRUE(std::filesystem::is_empty(e.path)) << "a refused run left files";
}

// The max-sequence table of issue 12: one 24 GiB device (CUDA memory rules), bf16 weights, LoRA r=32 on
// every linear layer, one sequence per micro-batch; at least twice the paper's 73k / 49k / 28k.
TEST(FinetunePlanTool, MaxSeqOfThePaperModelsIsAtLeastTwiceThePapers) {
    std::string log;
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-simulate") + " --max-seq --all --device-mem 24G", &log), 0) << log;
    int models = 0;
    for (size_t at = log.find("ours / paper = "); at != std::string::npos; at = log.find("ours / paper = ", at + 1)) {
        ++models;
        EXPECT_GE(std::stod(log.substr(at + 15)), 2.0) << log;
    }
    EXPECT_EQ(models, 3) << log;
    EXPECT_NE(log.find("at seq "), std::string::npos) << log;  // the breakdown at the maximum
}

// rp-simulate --nodes: the data-parallel timing model on the real shapes. LoRA gradients of Qwen3-32B
// (r = 32: about 1 GB per iteration) hide behind a 22 s iteration even at 25 Gbit/s; a full finetune's
// 131 GB of fp32 gradients cannot, and 100 Gbit/s recovers part of it.
TEST(ToolPlan, SimulateNodesReportsTheDataParallelEfficiency) {
    auto efficiency = [](const std::string & flags) {
        std::string log;
        EXPECT_EQ(ft_test::run(ft_test::tool("rp-simulate") + " --model qwen3-32b " + flags, &log), 0) << log;
        const size_t at = log.find("efficiency ");
        EXPECT_NE(at, std::string::npos) << log;
        return at == std::string::npos ? -1.0 : std::stod(log.substr(at + 11));
    };
    const double lora4 = efficiency("--nodes 4");
    EXPECT_GE(lora4, 90.0);
    EXPECT_LE(lora4, 100.0);
    const double full4 = efficiency("--nodes 4 --full"), full4_fast = efficiency("--nodes 4 --full --node-link 100Gbit/s,5us");
    EXPECT_LT(full4, 60.0);
    EXPECT_GT(full4_fast, full4);
    std::string log;
    EXPECT_EQ(ft_test::run(ft_test::tool("rp-simulate") + " --model qwen3-32b --nodes 2 --full", &log), 0);
    EXPECT_NE(log.find("131048.5 MB of gradients per iteration"), std::string::npos) << log;  // 32.76e9 fp32 weights
    EXPECT_NE(ft_test::run(ft_test::tool("rp-simulate") + " --layers 4 --fwd-ms 1 --bwd-ms 1 --head-fwd-ms 1 --head-bwd-ms 1 --nodes 2", &log), 0);
    EXPECT_NE(log.find("--nodes needs a named model"), std::string::npos) << log;
}
