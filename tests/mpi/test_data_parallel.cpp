// Data-parallel training under mpirun (models/data_parallel.h, ggml_rp/dist): R ranks on this machine's CPU
// (--oversubscribe), each on the host path or on its own CPU virtual devices.
//
//   bit for bit:  an R-rank run equals the single process told to sum its gradients in the same R groups
//                 (--dp-groups R), LoRA and full, host and --devices 2; reruns and device counts change nothing;
//   tolerance:    against the plain single process (one sum of every micro-batch) the gradients and one
//                 SGD step's masters differ only by fp32 reassociation (<= 1e-6 relative);
//   faults:       a rank that hangs or dies ends every rank with an error within the timeout and no output;
//                 a corrupted replica is named by the replica check; a checkpoint of the whole job killed
//                 with SIGKILL resumes to the uninterrupted bytes; a resume with another world size is refused;
//   trace:        every rank's all-reduces are a row of its trace, and rp-trace merges the ranks' files.
#include "gguf/gguf.h"
#include "tests/common/temp_dir.h"
#include "tests/finetune/ft_test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace {

using ft_test::run;
using ft_test::stories;
using ft_test::tool;

// Each test process gives mpirun a session directory of its own (TMPDIR): two mpiruns that ctest starts at
// once otherwise race to create /tmp/ompi.<host>.<uid> and one fails in orte_init ("File exists").
std::string mpirun(int np) {
    static const rp_test::TempDir session;
    std::string cmd = "env TMPDIR=" + session.path.string() + " " + std::string(RP_MPIEXEC) + " --oversubscribe -np " + std::to_string(np);
    if (geteuid() == 0) cmd += " --allow-run-as-root";  // CI containers run as root
    return cmd + " ";
}

// 6 micro-batches of one sequence, so R = 2 and 3 both split them; a high lr so the steps move the weights.
std::string job(int64_t steps = 4) {
    return tool("rp-finetune") + " -m " + stories() + " --data " + ft_test::model_path("reference/train.txt") +
           " --seq-len 32 --batch 6 --micro-batches 6 --lr 1e-2 -t 1 --steps " + std::to_string(steps);
}

std::string bytes_of(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

// Over every f32 tensor of two GGUF files of the same layout: max |a - b| / max |b|, per tensor, the largest.
double max_relative_difference(const std::string & a_path, const std::string & b_path) {
    auto a = gguf::Reader::open(a_path), b = gguf::Reader::open(b_path);
    EXPECT_EQ(a->tensors().size(), b->tensors().size());
    double worst = 0;
    for (size_t i = 0; i < a->tensors().size(); ++i) {
        const auto & ta = a->tensors()[i];
        const auto & tb = b->tensors()[i];
        EXPECT_EQ(ta.name, tb.name);
        if (ta.type != gguf::TensorType::F32) continue;  // frozen tensors of a full finetune's output are byte-equal anyway
        const size_t n = static_cast<size_t>(ta.nelements());
        const float * x = reinterpret_cast<const float *>(a->tensor_data(ta));
        const float * y = reinterpret_cast<const float *>(b->tensor_data(tb));
        double diff = 0, scale = 0;
        for (size_t e = 0; e < n; ++e) {
            diff = std::max(diff, std::fabs(static_cast<double>(x[e]) - y[e]));
            scale = std::max(scale, std::fabs(static_cast<double>(y[e])));
        }
        if (scale > 0) worst = std::max(worst, diff / scale);
    }
    return worst;
}

struct Case {
    std::string name;
    std::string flags;  // what the R-rank run and its references add to job()
};

// An R-rank run against its references: bitwise the grouped single process (AdamW, 4 steps) and itself on a
// rerun; within fp32 reassociation the plain single process: the first step's summed gradients, and the
// masters after one SGD step (AdamW's first step is about lr * sign(g), so a reassociated gradient element
// near zero moves its weight by up to 2 lr: its masters are compared bitwise to the grouped reference only).
void expect_equalities(int R, const std::string & flags, bool host_reference) {
    rp_test::TempDir dir;
    std::string log;
    ASSERT_EQ(run(mpirun(R) + job() + " " + flags + " -o " + dir.file("dp.gguf"), &log), 0) << log;
    EXPECT_NE(log.find("data parallel: rank 0 of " + std::to_string(R)), std::string::npos) << log;
    ASSERT_EQ(run(mpirun(R) + job() + " " + flags + " -o " + dir.file("again.gguf"), &log), 0) << log;
    EXPECT_EQ(bytes_of(dir.file("dp.gguf")), bytes_of(dir.file("again.gguf"))) << "two identical runs differ";
    if (host_reference) {  // on the host: the pipeline equals the host bit for bit (tests/roundpipe)
        std::string ref_flags = " " + flags;
        for (const char * f : {" --devices 2", " --devices 1"}) {
            const size_t at = ref_flags.find(f);
            if (at != std::string::npos) ref_flags.erase(at, std::strlen(f));
        }
        ASSERT_EQ(run(job() + ref_flags + " --dp-groups " + std::to_string(R) + " -o " + dir.file("grouped.gguf"), &log), 0) << log;
        EXPECT_EQ(bytes_of(dir.file("dp.gguf")), bytes_of(dir.file("grouped.gguf")))
            << R << " ranks differ from one process summing in " << R << " groups";
    }
    const std::string sgd = job(1) + " --optimizer sgd " + flags;
    ASSERT_EQ(run(mpirun(R) + sgd + " --dump-grads " + dir.file("g_dp.gguf") + " -o " + dir.file("sgd_dp.gguf"), &log), 0) << log;
    ASSERT_EQ(run(sgd + " --dump-grads " + dir.file("g_one.gguf") + " -o " + dir.file("sgd_one.gguf"), &log), 0) << log;
    const double grads = max_relative_difference(dir.file("g_dp.gguf"), dir.file("g_one.gguf"));
    EXPECT_LE(grads, 1e-6) << R << " ranks vs one process: gradients";
    EXPECT_GT(grads, 0.0) << "the sums were reassociated: some bit should differ (else this compares nothing)";
    EXPECT_LE(max_relative_difference(dir.file("sgd_dp.gguf"), dir.file("sgd_one.gguf")), 1e-6) << R << " ranks vs one process: masters";
}

TEST(DataParallel, LoraHostTwoAndThreeRanksEqualTheGroupedSingleProcessBitForBit) {
    expect_equalities(2, "", true);
    expect_equalities(3, "", true);
}

TEST(DataParallel, FullFinetuneHostEqualsTheGroupedSingleProcessBitForBit) {
    expect_equalities(2, "--full", true);
    expect_equalities(3, "--full", true);
}

TEST(DataParallel, PipelinedOnTwoDevicesPerRankEqualsTheGroupedHostBitForBit) {
    expect_equalities(2, "--devices 2", true);
    expect_equalities(3, "--devices 2 --full", true);
}

// Async has no host reference (it exists only in the pipeline): reruns and the device count per rank change
// no bit, and it stays within reassociation of the single-process async run.
TEST(DataParallel, AsyncIsDeterministicAcrossDeviceCountsAndCloseToOneProcess) {
    expect_equalities(2, "--devices 2 --async", false);
    rp_test::TempDir dir;
    std::string log;
    ASSERT_EQ(run(mpirun(2) + job() + " --devices 2 --async -o " + dir.file("g2.gguf"), &log), 0) << log;
    ASSERT_EQ(run(mpirun(2) + job() + " --devices 1 --async -o " + dir.file("g1.gguf"), &log), 0) << log;
    EXPECT_EQ(bytes_of(dir.file("g2.gguf")), bytes_of(dir.file("g1.gguf")));
    ASSERT_EQ(run(mpirun(2) + job() + " --devices 2 --sync -o " + dir.file("sync.gguf"), &log), 0) << log;
    EXPECT_NE(bytes_of(dir.file("g2.gguf")), bytes_of(dir.file("sync.gguf"))) << "async should be one update behind";
}

TEST(DataParallel, OnlyRankZeroWritesAndTheCheckpointRecordsTheWorldSize) {
    rp_test::TempDir dir;
    std::string log;
    ASSERT_EQ(run(mpirun(3) + job() + " -o " + dir.file("a.gguf"), &log), 0) << log;
    std::vector<std::string> files;
    for (const auto & e : std::filesystem::directory_iterator(dir.path)) files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    EXPECT_EQ(files, (std::vector<std::string>{"a.gguf", "a.gguf.ckpt.gguf", "a.gguf.config.toml", "a.gguf.loss.svg", "a.gguf.metrics.jsonl"}));
    // one progress line per step, from rank 0 only
    size_t lines = 0;
    for (size_t at = log.find("step 1/4"); at != std::string::npos; at = log.find("step 1/4", at + 1)) ++lines;
    EXPECT_EQ(lines, 1u) << log;
    EXPECT_EQ(gguf::Reader::open(dir.file("a.gguf.ckpt.gguf"))->get_u32_or("rp.ckpt.grad_groups", 0), 3u);
    // another world size is refused, naming both
    EXPECT_NE(run(mpirun(2) + job(6) + " --resume " + dir.file("a.gguf.ckpt.gguf") + " -o " + dir.file("b.gguf"), &log), 0);
    EXPECT_NE(log.find("summed over 3 data-parallel rank(s)"), std::string::npos) << log;
    EXPECT_NE(log.find("this run has 2"), std::string::npos) << log;
    EXPECT_FALSE(std::filesystem::exists(dir.file("b.gguf")));
    // as is a single-process resume of it, and a grouped single process resumes it
    EXPECT_NE(run(job(6) + " --resume " + dir.file("a.gguf.ckpt.gguf") + " -o " + dir.file("b.gguf"), &log), 0);
    EXPECT_NE(log.find("this run has 1"), std::string::npos) << log;
}

TEST(DataParallel, ResumeAfterTheWholeJobIsKilledIsBitExact) {
    rp_test::TempDir dir;
    std::string log;
    ASSERT_EQ(run(mpirun(3) + job(8) + " --save-every 2 -o " + dir.file("ref.gguf"), &log), 0) << log;
    // every rank SIGKILLs itself at the start of step 6: the checkpoint of step 4 is the last one
    const std::string out = dir.file("a.gguf");
    EXPECT_NE(run(mpirun(3) + job(8) + " --save-every 2 --inject-dp-fault die:all:6 -o " + out, &log), 0);
    ASSERT_FALSE(std::filesystem::exists(out)) << log;
    ASSERT_TRUE(std::filesystem::exists(out + ".ckpt.gguf")) << log;
    EXPECT_EQ(gguf::Reader::open(out + ".ckpt.gguf")->get_u64("rp.ckpt.step"), 4u);
    std::filesystem::copy_file(out + ".ckpt.gguf", dir.file("step4.gguf"));
    ASSERT_EQ(run(mpirun(3) + job(8) + " --save-every 2 --resume " + out + ".ckpt.gguf -o " + out, &log), 0) << log;
    EXPECT_NE(log.find("resumed"), std::string::npos) << log;
    EXPECT_EQ(bytes_of(out), bytes_of(dir.file("ref.gguf")));
    // and one process summing in 3 groups continues the 3-rank checkpoint to the same bytes
    ASSERT_EQ(run(job(8) + " --dp-groups 3 --resume " + dir.file("step4.gguf") + " -o " + dir.file("x.gguf"), &log), 0) << log;
    EXPECT_EQ(bytes_of(dir.file("x.gguf")), bytes_of(dir.file("ref.gguf")));
}

// A rank that hangs (or dies) must not hang the others: within the timeout every rank stops with an error
// naming the silent rank, the job exits non-zero, and no output is written.
void expect_fault_ends_the_job(const std::string & kind) {
    rp_test::TempDir dir;
    std::string log;
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = run("timeout 60 " + mpirun(3) + job(6) + " --dp-timeout 3 --inject-dp-fault " + kind + ":1:3 -o " + dir.file("a.gguf"), &log);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(rc, 0) << log;
    EXPECT_NE(rc, 124) << "the job hung until timeout(1) killed it\n" << log;
    EXPECT_LT(secs, 30.0) << log;
    EXPECT_FALSE(std::filesystem::exists(dir.file("a.gguf"))) << log;
    EXPECT_FALSE(std::filesystem::exists(dir.file("a.gguf.ckpt.gguf"))) << log;
    EXPECT_FALSE(std::filesystem::exists(dir.file("a.gguf.metrics.jsonl"))) << log;
    EXPECT_FALSE(std::filesystem::exists(dir.file("a.gguf.loss.svg"))) << log;
    if (kind == "hang") {  // the others' error names the rank that went silent and the flag
        EXPECT_NE(log.find("for rank 1"), std::string::npos) << log;
        EXPECT_NE(log.find("--dp-timeout"), std::string::npos) << log;
    } else {  // mpirun ends the job when a rank dies
        EXPECT_NE(log.find("rank 1"), std::string::npos) << log;
    }
}

TEST(DataParallel, AHungRankEndsEveryRankWithinTheTimeout) { expect_fault_ends_the_job("hang"); }
TEST(DataParallel, ADeadRankEndsEveryRank) { expect_fault_ends_the_job("die"); }

TEST(DataParallel, TheReplicaCheckNamesACorruptedTensor) {
    rp_test::TempDir dir;
    std::string log;
    EXPECT_NE(run("timeout 60 " + mpirun(3) + job(6) + " --dp-check-every 2 --inject-dp-fault corrupt:2:3 -o " + dir.file("a.gguf"), &log), 0);
    EXPECT_NE(log.find("replica check after step 4: rank 2's 'blk.0.attn_q.weight.lora_a' differs from rank 0's"), std::string::npos) << log;
    EXPECT_FALSE(std::filesystem::exists(dir.file("a.gguf"))) << log;
    // the same corruption with checks only at the end is caught there
    EXPECT_NE(run("timeout 60 " + mpirun(2) + job(4) + " --dp-check-every 0 --inject-dp-fault corrupt:1:2 -o " + dir.file("b.gguf"), &log), 0);
    EXPECT_NE(log.find("replica check at the end: rank 1's"), std::string::npos) << log;
    EXPECT_FALSE(std::filesystem::exists(dir.file("b.gguf"))) << log;
}

TEST(DataParallel, RanksWithDifferentJobsAreRefused) {
    rp_test::TempDir dir;
    std::string log;
    // rank 0 and rank 1 given different seeds (an MPMD launch): refused before the first step
    const std::string a = job() + " --seed 1 -o " + dir.file("a.gguf"), b = job() + " --seed 2 -o " + dir.file("a.gguf");
    std::string cmd = std::string(RP_MPIEXEC) + " --oversubscribe" + (geteuid() == 0 ? " --allow-run-as-root" : "") + " -np 1 " + a + " : -np 1 " + b;
    EXPECT_NE(run("timeout 60 " + cmd, &log), 0);
    EXPECT_NE(log.find("the ranks' jobs differ: rank 1's seed differs from rank 0's"), std::string::npos) << log;
    EXPECT_FALSE(std::filesystem::exists(dir.file("a.gguf")));
    // fewer micro-batches than ranks
    EXPECT_NE(run(mpirun(3) + job() + " --micro-batches 2 -o " + dir.file("c.gguf"), &log), 0);
    EXPECT_NE(log.find("--micro-batches 2 must be at least the number of data-parallel ranks (3)"), std::string::npos) << log;
}

// Without --micro-batches a data-parallel run takes one per rank (a single process takes 1): the same step as
// one process told --micro-batches 2 --dp-groups 2, bit for bit, and the startup line says so.
TEST(DataParallel, MicroBatchesDefaultToOnePerRank) {
    rp_test::TempDir dir;
    std::string log;
    const std::string base = tool("rp-finetune") + " -m " + stories() + " --data " + ft_test::model_path("reference/train.txt") +
                             " --seq-len 32 --batch 6 --lr 1e-2 -t 1 --steps 3";
    ASSERT_EQ(run(mpirun(2) + base + " -o " + dir.file("dp.gguf"), &log), 0) << log;
    EXPECT_NE(log.find("each rank computes 1 of 2 micro-batches per step: --micro-batches defaults to one per rank"), std::string::npos) << log;
    ASSERT_EQ(run(base + " --micro-batches 2 --dp-groups 2 -o " + dir.file("one.gguf"), &log), 0) << log;
    EXPECT_EQ(bytes_of(dir.file("dp.gguf")), bytes_of(dir.file("one.gguf")));
}

TEST(DataParallel, EveryRanksAllReducesAreTracedAndRpTraceMergesThem) {
    rp_test::TempDir dir;
    std::string log;
    ASSERT_EQ(run(mpirun(2) + job() + " --devices 2 --trace " + dir.file("t.json") + " -o " + dir.file("a.gguf"), &log), 0) << log;
    ASSERT_TRUE(std::filesystem::exists(dir.file("t.rank0.json"))) << log;
    ASSERT_TRUE(std::filesystem::exists(dir.file("t.rank1.json"))) << log;
    EXPECT_NE(bytes_of(dir.file("t.rank0.json")).find("all-reduce bucket 0"), std::string::npos);
    ASSERT_EQ(run(tool("rp-trace") + " " + dir.file("t.rank0.json") + " " + dir.file("t.rank1.json") + " -o " + dir.file("t.svg"), &log), 0) << log;
    EXPECT_NE(log.find("2 rank traces"), std::string::npos) << log;
    EXPECT_NE(log.find("on 4 devices"), std::string::npos) << log;  // 2 ranks x 2 devices; the all-reduce rows are not devices
    EXPECT_NE(log.find("rank 1 device 1"), std::string::npos) << log;
    EXPECT_NE(log.find("exchanges on 2 ranks"), std::string::npos) << log;
    EXPECT_TRUE(std::filesystem::exists(dir.file("t.svg")));
}

TEST(DataParallel, ValidationLossIsSharedAcrossRanksAndEqualsOneProcess) {
    rp_test::TempDir dir;
    std::string log, one;
    ASSERT_EQ(run(mpirun(2) + job() + " --val-split 0.3 --eval-every 2 -o " + dir.file("a.gguf"), &log), 0) << log;
    ASSERT_EQ(run(job() + " --val-split 0.3 --eval-every 2 --dp-groups 2 -o " + dir.file("b.gguf"), &one), 0) << one;
    // the same evaluations (each rank a share of the batches, the sums added): the same printed losses
    const size_t a = log.find("eval step 4: val loss "), b = one.find("eval step 4: val loss ");
    ASSERT_NE(a, std::string::npos) << log;
    ASSERT_NE(b, std::string::npos) << one;
    EXPECT_EQ(log.substr(a, 40), one.substr(b, 40));
    EXPECT_EQ(bytes_of(dir.file("a.gguf")), bytes_of(dir.file("b.gguf")));
}

// `base` (3 steps, no output) on two ranks and as one process grouping its micro-batches in two: the same result
// file, the same step-3 loss line and the same `metrics` line after it (its first `len` characters).
void expect_two_ranks_equal_the_grouped_process(const rp_test::TempDir & dir, const std::string & base, const std::string & metrics, size_t len) {
    std::string log, one;
    ASSERT_EQ(run(mpirun(2) + base + " -o " + dir.file("dp.gguf"), &log), 0) << log;
    ASSERT_EQ(run(base + " --dp-groups 2 -o " + dir.file("one.gguf"), &one), 0) << one;
    EXPECT_EQ(bytes_of(dir.file("dp.gguf")), bytes_of(dir.file("one.gguf")));
    const size_t a = log.find("step 3/3 | loss "), b = one.find("step 3/3 | loss ");
    ASSERT_NE(a, std::string::npos) << log;
    ASSERT_NE(b, std::string::npos) << one;
    EXPECT_EQ(log.substr(a, 24), one.substr(b, 24));
    const size_t ra = log.find(metrics, a), rb = one.find(metrics, b);
    ASSERT_NE(ra, std::string::npos) << log;
    ASSERT_NE(rb, std::string::npos) << one;
    EXPECT_EQ(log.substr(ra, len), one.substr(rb, len));
}

// Preference training over ranks: each rank computes its micro-batches' pairs, the answers' log-probabilities are
// summed over the ranks for the metrics; the result, the losses and the rewards equal the grouped single process.
TEST(DataParallel, DpoOnTwoRanksEqualsTheGroupedSingleProcessBitForBit) {
    rp_test::TempDir dir;
    {
        std::ofstream f(dir.file("pairs.jsonl"));
        const char * names[] = {"Tom", "Lily", "Ben", "Sue", "Max", "Anna"};
        for (int i = 0; i < 24; ++i)
            f << "{\"prompt\": \"Once upon a time, " << names[i % 6] << " went out. There " << names[i % 6] << "\", \"chosen\": \" played with a big dog"
              << std::string(static_cast<size_t>(i % 3), '!') << ".\", \"rejected\": \" sat with a small cat.\"}\n";
    }
    const std::string base = tool("rp-finetune") + " -m " + stories() + " --data " + dir.file("pairs.jsonl") +
                             " --method dpo --seq-len 40 --batch 4 --micro-batches 4 --lr 1e-3 -t 1 --steps 3";
    expect_two_ranks_equal_the_grouped_process(dir, base, "rewards chosen", 90);
}

// GRPO over ranks: each rank samples, scores and passes through the reference and the sampling policy only the
// prompts of its micro-batches (a reward program that counts what it scores, per rank), and the ranks share them;
// with two updates per rollout batch and a KL term, the result, the losses and the rewards equal the grouped single
// process.
TEST(DataParallel, GrpoOnTwoRanksEqualsTheGroupedSingleProcessBitForBit) {
    rp_test::TempDir dir;
    {
        std::ofstream f(dir.file("prompts.jsonl"));
        for (int i = 0; i < 8; ++i) f << "{\"prompt\": \"Once upon a time, there was a little\", \"id\": " << i << "}\n";
        std::ofstream(dir.file("count.sh")) << "while IFS= read -r line; do echo x >> " << dir.file("scored.") << "${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-one}}; echo 0; done\n";
    }
    const std::string base = tool("rp-finetune") + " -m " + stories() + " --data " + dir.file("prompts.jsonl") +
                             " --method grpo --reward regex:a --reward-cmd 'sh " + dir.file("count.sh") +
                             "' --group 4 --max-completion-len 6 --batch 2 --micro-batches 2 --beta 0.04 --iterations 2 --lr 5e-3 -t 1 --steps 3";
    expect_two_ranks_equal_the_grouped_process(dir, base, "  reward ", 120);
    auto lines = [&](const std::string & who) {
        std::ifstream f(dir.file("scored." + who));
        return std::count(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>(), '\n');
    };
    // steps 1 and 3 sample (2 updates a batch): 2 x 2 prompts x 4 completions, the ranks a prompt each a step
    EXPECT_EQ(lines("one"), 16);
    EXPECT_EQ(lines("0"), 8);
    EXPECT_EQ(lines("1"), 8);
}

} // namespace
