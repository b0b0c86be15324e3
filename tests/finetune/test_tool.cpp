// rp-finetune end to end on stories260K and the shared training text: the loss falls and validation
// perplexity improves, a fixed seed reproduces the run bit for bit, an interrupted and resumed run ends
// with the same bytes as an uninterrupted one, and bad input fails cleanly (exit 1, "error: ...", no output).
#include "ft_test_util.h"

#include "gguf/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct TmpDir {
    fs::path p;
    TmpDir() {
        char tmpl[] = "/tmp/rp-ft-XXXXXX";
        p = mkdtemp(tmpl);
    }
    ~TmpDir() { fs::remove_all(p); }
    std::string operator/(const std::string & f) const { return (p / f).string(); }
};

std::string slurp(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string train_txt() { return ft_test::shared_dir() + "/models/reference/train.txt"; }

// Values of `key` in the JSONL metrics, in order.
std::vector<double> metric(const std::string & path, const std::string & key) {
    std::vector<double> out;
    std::ifstream f(path);
    std::string line;
    const std::string k = "\"" + key + "\":";
    while (std::getline(f, line)) {
        const size_t p = line.find(k);
        if (p != std::string::npos) out.push_back(std::stod(line.substr(p + k.size())));
    }
    return out;
}

const std::string kCommon = " --seq-len 32 --batch 4 --micro-batches 2 -t 1 --seed 3";

std::string finetune(const std::string & args) { return ft_test::tool("rp-finetune") + " -m " + ft_test::stories() + " " + args; }

TEST(FinetuneTool, LossFallsValidationImprovesAndSeedReproduces) {
    TmpDir d;
    const std::string args = " --data " + train_txt() + kCommon + " --steps 8 --lr 1e-3 --warmup 2 --val-split 0.25 --eval-every 4";
    std::string log;
    ASSERT_EQ(ft_test::run(finetune("-o " + (d / "a.gguf") + args), &log), 0) << log;
    const std::vector<double> loss = metric(d / "a.gguf.metrics.jsonl", "loss");
    const std::vector<double> val = metric(d / "a.gguf.metrics.jsonl", "val_loss");
    ASSERT_EQ(loss.size(), 8u);
    ASSERT_EQ(val.size(), 3u);  // steps 0, 4, 8
    std::printf("train loss:");
    for (double l : loss) std::printf(" %.4f", l);
    std::printf("\nval loss: %.4f %.4f %.4f (ppl %.3f -> %.3f)\n", val[0], val[1], val[2], std::exp(val[0]), std::exp(val[2]));
    EXPECT_LT(loss[6] + loss[7], loss[0] + loss[1] - 0.1);
    EXPECT_LT(val[2], val[0]);
    EXPECT_TRUE(fs::exists(d / "a.gguf.loss.svg"));
    EXPECT_NE(slurp(d / "a.gguf.loss.svg").find("<polyline"), std::string::npos);
    // The summary's model FLOPs (Trainer::model_flops, which ModelFlops checks against the closed form).
    EXPECT_NE(log.find("model FLOPs: "), std::string::npos) << log;
    EXPECT_NE(log.find(" GFLOP/s over the steps"), std::string::npos) << log;

    // The same seed: the same losses and the same adapter bytes (with another thread count, too).
    ASSERT_EQ(ft_test::run(finetune("-o " + (d / "b.gguf") + args + " -t 2 --dump-grads " + (d / "g.gguf")), &log), 0) << log;
    EXPECT_EQ(metric(d / "b.gguf.metrics.jsonl", "loss"), loss);
    EXPECT_EQ(slurp(d / "a.gguf"), slurp(d / "b.gguf"));

    // --dump-grads: one f32 gradient per adapter tensor, same names and shapes, finite and not all zero; and
    // what they came from: the batch, its loss and loss scale, the first sequence's logits.
    auto grads = gguf::Reader::open(d / "g.gguf");
    auto adapter = gguf::Reader::open(d / "a.gguf");
    ASSERT_EQ(grads->tensors().size(), adapter->tensors().size() + 3);
    const gguf::TensorInfo * inputs = grads->find_tensor("batch.inputs");
    const gguf::TensorInfo * labels = grads->find_tensor("batch.labels");
    const gguf::TensorInfo * logits = grads->find_tensor("batch.logits0");
    ASSERT_TRUE(inputs && labels && logits);
    EXPECT_EQ(inputs->type, gguf::TensorType::I32);
    EXPECT_EQ(inputs->ne[0], labels->ne[0]);
    EXPECT_EQ(inputs->ne[1], labels->ne[1]);
    EXPECT_EQ(logits->ne[0], 512);  // stories260K's vocabulary
    EXPECT_EQ(logits->ne[1], inputs->ne[0]);
    const auto * lab = reinterpret_cast<const int32_t *>(grads->tensor_data(*labels));
    int64_t trained = 0;
    for (int64_t i = 0; i < labels->nelements(); ++i) trained += lab[i] >= 0;
    EXPECT_FLOAT_EQ(grads->get_f32("rp.loss_scale"), 1.0f / static_cast<float>(trained));
    EXPECT_NEAR(grads->get_f32("rp.loss"), metric(d / "b.gguf.metrics.jsonl", "loss").front(), 1e-5);
    for (const gguf::TensorInfo & t : adapter->tensors()) {
        const gguf::TensorInfo * g = grads->find_tensor(t.name);
        ASSERT_NE(g, nullptr) << t.name;
        EXPECT_EQ(g->nelements(), t.nelements()) << t.name;
        const float * v = reinterpret_cast<const float *>(grads->tensor_data(*g));
        double ss = 0;
        for (int64_t i = 0; i < g->nelements(); ++i) ss += static_cast<double>(v[i]) * v[i];
        EXPECT_TRUE(std::isfinite(ss)) << t.name;
        // PEFT init: B = 0, so only the B factors get a gradient at the first step.
        if (t.name.find(".lora_b") != std::string::npos) {
            EXPECT_GT(ss, 0.0) << t.name;
        }
    }
}

TEST(FinetuneTool, ResumeIsBitExact) {
    TmpDir d;
    const std::string args = " --data " + train_txt() + kCommon + " --steps 6 --lr 2e-3 --warmup 1 --lr-schedule cosine";
    std::string log;
    std::string f32_result;
    for (const char * mode : {"", " --full", " --optimizer-state bf16"}) {
        ASSERT_EQ(ft_test::run(finetune("-o " + (d / "full.gguf") + args + mode), &log), 0) << log;
        ASSERT_EQ(ft_test::run(finetune("-o " + (d / "part.gguf") + args + mode + " --stop-at 3"), &log), 0) << log;
        ASSERT_EQ(ft_test::run(finetune("-o " + (d / "part.gguf") + args + mode + " --resume " + (d / "part.gguf.ckpt.gguf")), &log), 0) << log;
        EXPECT_NE(log.find("resumed"), std::string::npos) << log;
        EXPECT_EQ(slurp(d / "full.gguf"), slurp(d / "part.gguf")) << "mode" << mode;
        EXPECT_EQ(metric(d / "full.gguf.metrics.jsonl", "loss"), metric(d / "part.gguf.metrics.jsonl", "loss"));
        if (std::string(mode).empty()) f32_result = slurp(d / "full.gguf");
        if (std::string(mode) == " --optimizer-state bf16") {
            // The checkpoint keeps the state as bf16; the result is not the fp32 state's; a resume takes the
            // state type from the checkpoint's run (the flag need not be repeated).
            const auto ck = gguf::Reader::open(d / "part.gguf.ckpt.gguf");
            const gguf::TensorInfo * m = nullptr;
            for (const gguf::TensorInfo & t : ck->tensors())
                if (t.name.ends_with(".adam_m")) m = &t;
            ASSERT_NE(m, nullptr);
            EXPECT_EQ(m->type, gguf::TensorType::BF16) << m->name;
            EXPECT_NE(slurp(d / "full.gguf"), f32_result);
            ASSERT_EQ(ft_test::run(finetune("-o " + (d / "again.gguf") + args + " --resume " + (d / "part.gguf.ckpt.gguf")), &log), 0) << log;
            EXPECT_EQ(slurp(d / "again.gguf"), slurp(d / "full.gguf"));
        }
    }
    // The form: a shorter --steps first, then --resume to the full count (constant schedule, which
    // does not depend on the total).
    const std::string c = " --data " + train_txt() + kCommon + " --lr 2e-3 --lr-schedule constant";
    ASSERT_EQ(ft_test::run(finetune("-o " + (d / "x.gguf") + c + " --steps 5"), &log), 0) << log;
    ASSERT_EQ(ft_test::run(finetune("-o " + (d / "y.gguf") + c + " --steps 2"), &log), 0) << log;
    ASSERT_EQ(ft_test::run(finetune("-o " + (d / "y.gguf") + c + " --steps 5 --resume " + (d / "y.gguf.ckpt.gguf")), &log), 0) << log;
    EXPECT_EQ(slurp(d / "x.gguf"), slurp(d / "y.gguf"));
}

void expect_fails(const TmpDir & d, const std::string & cmd, const std::string & needle) {
    std::string log;
    EXPECT_EQ(ft_test::run(cmd, &log), 1) << cmd << "\n" << log;
    EXPECT_EQ(log.rfind("error: ", 0), 0u) << log;
    EXPECT_NE(log.find(needle), std::string::npos) << "expected '" << needle << "' in: " << log;
    EXPECT_FALSE(fs::exists(d / "o.gguf")) << cmd;
    EXPECT_FALSE(fs::exists(d / "o.gguf.metrics.jsonl")) << cmd;
    EXPECT_FALSE(fs::exists(d / "o.gguf.tmp")) << cmd;
}

TEST(FinetuneTool, BadInput) {
    TmpDir d;
    {
        std::ofstream(d / "bad.jsonl") << "{\"text\": \"Once upon a time\"}\n{\"text\": oops}\n";
        std::ofstream(d / "empty.txt") << "";
    }
    const std::string o = " -o " + (d / "o.gguf") + " --steps 1 --seq-len 16";
    expect_fails(d, finetune("--data " + (d / "bad.jsonl") + o), "line 2");
    expect_fails(d, finetune("--data " + (d / "empty.txt") + o), "empty.txt");
    expect_fails(d, finetune("--data " + train_txt() + " -o " + (d / "o.gguf") + " --seq-len 4096"), "4096");
    expect_fails(d, finetune("--data " + train_txt() + o + " --lora-rank 0"), "--lora-rank");
    expect_fails(d, finetune("--data " + train_txt() + o + " --lora-targets attn_q,attn_zz"), "attn_zz");
    expect_fails(d, finetune("--data " + train_txt() + o + " --activation-memory lots"), "--activation-memory");
    // An adapter made for another base model.
    expect_fails(d,
                 ft_test::tool("rp-finetune") + " -m " + ft_test::model_path("synthetic/tiny-random-qwen2.gguf") + " --data " +
                     train_txt() + o + " --resume " + ft_test::shared_dir() + "/models/reference/lora/stories260K-lora-r4-a8.gguf",
                 "architecture");
}

} // namespace

namespace {

// The validation losses a run printed ("eval step S: val loss V"), by step.
std::vector<std::pair<int, double>> evals_of(const std::string & log) {
    std::vector<std::pair<int, double>> v;
    std::istringstream in(log);
    for (std::string l; std::getline(in, l);) {
        int s = 0;
        double x = 0;
        if (std::sscanf(l.c_str(), "eval step %d: val loss %lf", &s, &x) == 2) v.push_back({s, x});
    }
    return v;
}

} // namespace

// --early-stop N ends the run after N evaluations without a better validation loss; --save-best keeps the
// result of the best one, byte for byte what a run stopped at that step (same schedule) writes. The loss SVG
// labels its step axis.
// JSONL examples longer than the sequence are counted in the user's terms: longer than --seq-len N.
TEST(FinetuneTool, TheDataLineCountsExamplesLongerThanTheSeqLen) {
    TmpDir d;
    {
        std::ofstream f(d / "long.jsonl");
        f << "{\"text\": \"Once upon a time there was a little girl who lived in a village near the forest and she "
             "liked to walk in the woods every day with her dog\"}\n";
        for (int i = 0; i < 3; ++i) f << "{\"text\": \"A cat sat.\"}\n";
    }
    std::string log;
    ASSERT_EQ(ft_test::run(finetune("-o " + (d / "a.gguf") + " --data " + (d / "long.jsonl") + " --seq-len 16 --batch 2 --steps 1 -t 1"), &log), 0)
        << log;
    EXPECT_NE(log.find("; 1 longer than --seq-len 16 (cut to it), 0 skipped"), std::string::npos) << log;
}

TEST(FinetuneTool, EarlyStopAndSaveBest) {
    TmpDir d;
    const std::string data = " --data " + std::string(RP_SOURCE_DIR) + "/examples/data/stories.txt";
    const std::string common = data + " --seq-len 64 --batch 8 --steps 60 --lr 3e-3 --warmup 2 --val-split 0.1 --eval-every 4 -t 1 --seed 5";
    std::string log;
    ASSERT_EQ(ft_test::run(finetune("-o " + (d / "a.gguf") + common + " --early-stop 2 --save-best"), &log), 0) << log;
    const auto ev = evals_of(log);
    ASSERT_GE(ev.size(), 3u) << log;
    EXPECT_NE(log.find("early stop at step " + std::to_string(ev.back().first)), std::string::npos) << log;
    // Each evaluation's perplexity is printed as the summary prints it (one formatting of the kept value).
    std::vector<std::string> ppl;
    {
        std::istringstream in(log);
        for (std::string l; std::getline(in, l);) {
            const size_t at = l.find(", ppl ");
            if (l.rfind("eval step ", 0) != 0 || at == std::string::npos) continue;
            const size_t b = at + 6;
            ppl.push_back(l.substr(b, l.find_first_of(" ;(", b) - b));
        }
    }
    ASSERT_EQ(ppl.size(), ev.size()) << log;
    EXPECT_NE(log.find("(ppl " + ppl.front() + " -> " + ppl.back() + ")"), std::string::npos) << log;
    EXPECT_LT(ev.back().first, 60) << "the run went on to the end:\n" << log;
    // The last two evaluations are no better than the best before them, which is the best of all.
    size_t best = 0;
    for (size_t i = 0; i < ev.size(); ++i)
        if (ev[i].second < ev[best].second) best = i;
    EXPECT_EQ(best, ev.size() - 3) << log;
    EXPECT_EQ(metric(d / "a.gguf.metrics.jsonl", "val_loss").size(), ev.size());
    ASSERT_TRUE(fs::exists(d / "a.gguf.best.gguf")) << log;
    // The same run stopped at the best step writes the same bytes.
    const int best_step = ev[best].first;
    if (best_step > 0) {
        ASSERT_EQ(ft_test::run(finetune("-o " + (d / "b.gguf") + common + " --stop-at " + std::to_string(best_step)), &log), 0) << log;
        EXPECT_EQ(slurp(d / "a.gguf.best.gguf"), slurp(d / "b.gguf")) << "best at step " << best_step;
    } else {  // the untrained adapter was best: B = 0
        EXPECT_NE(log.find("validation never improved"), std::string::npos) << log;
    }
    // The loss curve's step axis has tick labels 0, 4, 8, ...
    const std::string svg = slurp(d / "a.gguf.loss.svg");
    EXPECT_NE(svg.find("text-anchor=\"middle\">0<"), std::string::npos) << svg;
    EXPECT_NE(svg.find("text-anchor=\"middle\">step<"), std::string::npos) << svg;
    // Without evaluations there is nothing to stop on: refused, no file written.
    EXPECT_EQ(ft_test::run(finetune("-o " + (d / "c.gguf") + data + " --early-stop 2"), &log), 1);
    EXPECT_NE(log.find("--early-stop needs evaluations"), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(d / "c.gguf.metrics.jsonl"));
}

// --activation-memory 0 (recompute every layer) writes the bytes the default (every layer kept) writes, and
// --profile-ops reports each op kind's time over the steps and what ran outside the graphs; the plan names
// what it keeps.
TEST(FinetuneTool, KeptActivationsWriteTheRecomputedBytesAndTheProfileNamesTheOps) {
    TmpDir d;
    const std::string args = " --data " + train_txt() + kCommon + " --steps 3 --full";
    std::string log, kept_log;
    ASSERT_EQ(ft_test::run(finetune("-o " + (d / "r.gguf") + args + " --activation-memory 0"), &log), 0) << log;
    ASSERT_EQ(ft_test::run(finetune("-o " + (d / "k.gguf") + args + " --profile-ops"), &kept_log), 0) << kept_log;
    EXPECT_EQ(slurp(d / "r.gguf"), slurp(d / "k.gguf"));
    EXPECT_EQ(log.find("op profile"), std::string::npos) << log;
    for (const char * row : {"op profile: ", "MUL_MAT ", "OUT_PROD ", "ATTENTION_BACK ", "(outside graphs)"})
        EXPECT_NE(kept_log.find(row), std::string::npos) << row << "\n" << kept_log;
    ASSERT_EQ(ft_test::run(finetune("--plan --full --seq-len 32 --batch 4"), &log), 0) << log;
    EXPECT_NE(log.find("5 layers keep their activations"), std::string::npos) << log;
    ASSERT_EQ(ft_test::run(finetune("--plan --full --seq-len 32 --batch 4 --activation-memory 0"), &log), 0) << log;
    EXPECT_NE(log.find("every layer recomputed"), std::string::npos) << log;
}
