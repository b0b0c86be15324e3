// rp-finetune through the RoundPipe runtime (--devices N): the adapter and the full model it writes are
// byte-identical to the single-device run's; --trace writes one Chrome trace event per stream operation that
// rp-trace draws; a device too small for a layer, and pipeline flags without --devices, fail cleanly.
#include "ft_test_util.h"

#include "ggml_rp/roundpipe/trace.h"
#include "tests/common/temp_dir.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <fstream>
#include <iterator>
#include <string>

namespace {

std::string slurp(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string base_cmd(const std::string & out) {
    return ft_test::tool("rp-finetune") + " -m " + ft_test::stories() + " --data " + ft_test::shared_dir() +
           "/models/reference/train.txt -o " + out + " --seq-len 32 --batch 6 --micro-batches 3 --steps 3 --lr 3e-3 -t 1";
}

} // namespace

TEST(FinetunePipelineTool, DevicesGiveTheSingleDeviceBytes) {
    rp_test::TempDir d;
    for (const std::string mode : {"", " --full --lora-dropout 0"}) {
        std::string log;
        ASSERT_EQ(ft_test::run(base_cmd(d.file("host.gguf")) + mode, &log), 0) << log;
        for (const std::string extra : {" --devices 1", " --devices 3 --device-mem 6M", " --devices 2 --recompute layer",
                                        " --devices 4 --schedule 1f1b", " --devices 2 --schedule gpipe --link 2GB/s,5us",
                                        " --devices 2 --resident-weights off"}) {
            ASSERT_EQ(ft_test::run(base_cmd(d.file("pipe.gguf")) + mode + extra, &log), 0) << extra << "\n" << log;
            EXPECT_EQ(slurp(d.file("host.gguf")), slurp(d.file("pipe.gguf"))) << mode << extra;
            // LoRA keeps the frozen base on the devices when it fits (256 MiB each), unless told not to; a full
            // finetune has nothing frozen.
            const bool resident = mode.empty() && extra.find("--resident-weights off") == std::string::npos;
            EXPECT_EQ(log.find("resident frozen weights") != std::string::npos, resident) << mode << extra << "\n" << log;
        }
    }
}

// Issue #37 from the command line: CPU devices of speeds 1, 1, 0.5, 0.5 give the host's bytes under either dispatch,
// the summary names each device's speed as given, round-robin keeps every device's share (its job counts differ
// by one at most), and rp-trace lists every device with its jobs and prints the assignment. (Which work dispatch by
// readiness moves depends on the planner's measured times here; tests/roundpipe/test_pipeline.cpp asserts it on
// fixed ones.)
TEST(FinetunePipelineTool, MixedDeviceSpeedsGiveTheHostBytesAndTraceTheAssignment) {
    rp_test::TempDir d;
    std::string log;
    ASSERT_EQ(ft_test::run(base_cmd(d.file("host.gguf")), &log), 0) << log;
    for (const std::string dispatch : {"ready", "round-robin"}) {
        const std::string trace = d.file(dispatch + ".json");
        ASSERT_EQ(ft_test::run(base_cmd(d.file("pipe.gguf")) + " --devices 4 --device-speed 2,2,1,1 --dispatch " + dispatch +
                                   " --trace " + trace, &log), 0) << log;
        EXPECT_EQ(slurp(d.file("host.gguf")), slurp(d.file("pipe.gguf"))) << dispatch;
        EXPECT_NE(log.find("speed 0.50 (given)"), std::string::npos) << log;
        const std::vector<rp::TraceJob> jobs = rp::trace_jobs(rp::read_chrome_trace(trace));
        ASSERT_FALSE(jobs.empty());
        long per_device[4] = {0, 0, 0, 0};
        for (const rp::TraceJob & j : jobs) ++per_device[j.device];
        if (dispatch == "round-robin") {
            EXPECT_LE(*std::max_element(per_device, per_device + 4) - *std::min_element(per_device, per_device + 4), 1)
                << per_device[0] << "," << per_device[1] << "," << per_device[2] << "," << per_device[3];
        }
        // rp-trace: every device (one the dispatch left idle too) with its jobs, and each call's jobs and devices
        ASSERT_EQ(ft_test::run(ft_test::tool("rp-trace") + " " + trace + " --assignment", &log), 0) << log;
        EXPECT_NE(log.find("on 4 devices"), std::string::npos) << log;
        for (int dev = 0; dev < 4; ++dev) {
            const size_t at = log.find("device " + std::to_string(dev) + " ");
            ASSERT_NE(at, std::string::npos) << log;
            EXPECT_NE(log.find("jobs " + std::to_string(per_device[dev]) + "\n", at), std::string::npos) << dev << "\n" << log;
        }
        EXPECT_NE(log.find("call 0: " + jobs[0].stage + ":" + std::to_string(jobs[0].device) + " "), std::string::npos) << log;
    }
}

TEST(FinetunePipelineTool, LoraDropoutThroughThePipelineToo) {
    rp_test::TempDir d;
    std::string log;
    ASSERT_EQ(ft_test::run(base_cmd(d.file("host.gguf")) + " --lora-dropout 0.1", &log), 0) << log;
    ASSERT_EQ(ft_test::run(base_cmd(d.file("pipe.gguf")) + " --lora-dropout 0.1 --devices 3 --device-mem 6M", &log), 0) << log;
    EXPECT_EQ(slurp(d.file("host.gguf")), slurp(d.file("pipe.gguf")));
    ASSERT_EQ(ft_test::run(base_cmd(d.file("nodrop.gguf")), &log), 0) << log;
    EXPECT_NE(slurp(d.file("host.gguf")), slurp(d.file("nodrop.gguf")));
}

TEST(FinetunePipelineTool, TraceHasEveryStreamOperationAndDraws) {
    rp_test::TempDir d;
    std::string log;
    ASSERT_EQ(ft_test::run(base_cmd(d.file("a.gguf")) + " --devices 4 --device-mem 6M --async --trace " + d.file("t.json"), &log), 0)
        << log;
    EXPECT_NE(log.find("bubble ratio"), std::string::npos) << log;
    const rp::Trace t = rp::read_chrome_trace(d.file("t.json"));
    std::set<int> devices, streams;
    size_t weights = 0, kernels = 0;
    for (const rp::TraceEvent & e : t.events) {
        devices.insert(e.pid);
        streams.insert(e.tid);
        weights += e.tid == static_cast<int>(rp::StreamKind::WeightUpload);
        kernels += e.tid == static_cast<int>(rp::StreamKind::Compute);
        EXPECT_GE(e.dur_us, 0.0);
    }
    EXPECT_EQ(devices.size(), 4u);
    EXPECT_EQ(streams.size(), 4u);  // weight upload, activation upload, compute, download
    EXPECT_GT(weights, 0u);
    EXPECT_GT(kernels, 3u * 3u * 7u);  // at least every layer's program of every micro-batch of every step
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-trace") + " " + d.file("t.json") + " -o " + d.file("t.svg"), &log), 0) << log;
    EXPECT_NE(slurp(d.file("t.svg")).find("<svg"), std::string::npos);
}

TEST(FinetunePipelineTool, BadPipelineInputFailsCleanly) {
    rp_test::TempDir d;
    std::string log;
    EXPECT_EQ(ft_test::run(base_cmd(d.file("a.gguf")) + " --devices 2 --device-mem 16K", &log), 1);
    EXPECT_NE(log.find("error:"), std::string::npos) << log;
    EXPECT_NE(log.find("bytes"), std::string::npos) << log;
    EXPECT_FALSE(std::filesystem::exists(d.file("a.gguf")));
    // The smallest plan does not fit 1 MiB at --seq-len 64: refused before anything runs, with the largest
    // --seq-len that fits; that one trains, one more is refused again.
    const std::string tight = ft_test::tool("rp-finetune") + " -m " + ft_test::stories() + " --data " + ft_test::shared_dir() +
                              "/models/reference/train.txt -o " + d.file("a.gguf") +
                              " --batch 8 --micro-batches 4 --steps 1 -t 1 --devices 4 --device-mem 1M --seq-len ";
    EXPECT_EQ(ft_test::run(tight + "64", &log), 1);
    EXPECT_NE(log.find("cpu:0 has 1.00 MiB"), std::string::npos) << log;
    EXPECT_NE(log.find("weight slots (job"), std::string::npos) << log;
    const std::string key = "The largest --seq-len that fits is ";
    const size_t at = log.find(key);
    ASSERT_NE(at, std::string::npos) << log;
    const int fit = std::stoi(log.substr(at + key.size()));
    ASSERT_GT(fit, 1) << log;
    ASSERT_LT(fit, 64) << log;
    EXPECT_FALSE(std::filesystem::exists(d.file("a.gguf")));
    EXPECT_EQ(ft_test::run(tight + std::to_string(fit + 1), &log), 1) << log;
    EXPECT_FALSE(std::filesystem::exists(d.file("a.gguf")));
    EXPECT_EQ(ft_test::run(tight + std::to_string(fit), &log), 0) << log;
    EXPECT_TRUE(std::filesystem::exists(d.file("a.gguf")));
    std::filesystem::remove(d.file("a.gguf"));
    EXPECT_EQ(ft_test::run(base_cmd(d.file("a.gguf")) + " --async", &log), 1);
    EXPECT_NE(log.find("--devices"), std::string::npos) << log;
    EXPECT_EQ(ft_test::run(base_cmd(d.file("a.gguf")) + " --devices 2 --schedule zigzag", &log), 1);
    EXPECT_NE(log.find("zigzag"), std::string::npos) << log;
    EXPECT_EQ(ft_test::run(base_cmd(d.file("a.gguf")) + " --devices 2 --device-mem 12Q", &log), 1);
    EXPECT_NE(log.find("--device-mem"), std::string::npos) << log;
    EXPECT_EQ(ft_test::run(base_cmd(d.file("a.gguf")) + " --devices 2 --resident-weights maybe", &log), 1);
    EXPECT_NE(log.find("--resident-weights"), std::string::npos) << log;
    EXPECT_EQ(ft_test::run(base_cmd(d.file("a.gguf")) + " --lora-dropout 1", &log), 1);
    EXPECT_NE(log.find("--lora-dropout"), std::string::npos) << log;
    EXPECT_FALSE(std::filesystem::exists(d.file("a.gguf")));
}
