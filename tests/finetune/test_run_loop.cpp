// The run of a finetune job as a library call (models/run_loop.h), without the rp-finetune binary: the
// evaluation cadence (step 0, every N, the end), early stopping with the best result kept, samples, the
// files beside the result, an interrupt that writes the checkpoint (resumed to the uninterrupted bytes), a
// diverged run that writes no result, and option errors that name the field.
#include "base/error.h"
#include "models/train/run_loop.h"
#include "tests/common/temp_dir.h"
#include "tests/finetune/ft_test_util.h"
#include "tests/finetune/stories_fixture.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

ft_test::StoriesFixture & fx() { return ft_test::StoriesFixture::get(); }

rp::SessionOptions session_options() {
    rp::SessionOptions o;
    o.finetune.lora_rank = 4;
    o.batch = 4;
    o.steps = 12;
    o.threads = 1;
    o.lr.lr_max = 3e-2;
    o.val_split = 0.3;
    return o;
}

struct Recorder : rp::RunObserver {
    std::vector<int64_t> steps, evals, samples, best;
    void step(const rp::StepReport & r, const rp::RunProgress & p) override {
        steps.push_back(r.step);
        EXPECT_EQ(p.total, 12);
    }
    void eval(int64_t step, double, const rp::EvalProgress &, bool is_best) override {
        evals.push_back(step);
        if (is_best) best.push_back(step);
    }
    void sample(int64_t step, const std::string & prompt, const std::string & completion) override {
        samples.push_back(step);
        EXPECT_EQ(prompt, "Once upon");
        EXPECT_FALSE(completion.empty());
    }
};

std::string slurp(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

} // namespace

TEST(RunLoop, EvaluationsSamplesAndTheFilesBesideTheResult) {
    rp_test::TempDir d;
    rp::TrainingSession run(*fx().model, fx().data, session_options());
    rp::RunLoopOptions o;
    o.out_path = d.file("a.gguf");
    o.eval_every = 5;
    o.sample_every = 4;
    o.sample_prompts = {"Once upon"};
    o.sample_tokens = 4;
    o.tokenizer = &fx().tok;
    o.save_best = true;
    Recorder rec;
    const rp::RunOutcome out = rp::run_training(run, o, rec);
    EXPECT_EQ(out.end, rp::RunEnd::Completed);
    EXPECT_EQ(rec.steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
    EXPECT_EQ(rec.evals, (std::vector<int64_t>{0, 5, 10, 12}));
    EXPECT_EQ(rec.samples, (std::vector<int64_t>{4, 8, 12}));
    ASSERT_FALSE(rec.best.empty());
    for (const char * f : {"a.gguf", "a.gguf.ckpt.gguf", "a.gguf.metrics.jsonl", "a.gguf.loss.svg", "a.gguf.best.gguf"})
        EXPECT_TRUE(std::filesystem::exists(d.file(f))) << f;
    EXPECT_EQ(run.curve().eval_step.size(), 4u);
}

TEST(RunLoop, EarlyStopKeepsTheBestResult) {
    rp_test::TempDir d;
    rp::SessionOptions so = session_options();
    so.lr.lr_max = 0.5;  // overfits at once: the validation loss stops improving
    rp::TrainingSession run(*fx().model, fx().data, so);
    rp::RunLoopOptions o;
    o.out_path = d.file("a.gguf");
    o.eval_every = 1;
    o.early_stop = 2;
    o.save_best = true;
    Recorder rec;
    const rp::RunOutcome out = rp::run_training(run, o, rec);
    ASSERT_EQ(out.end, rp::RunEnd::EarlyStopped);
    EXPECT_EQ(out.at_stop.since_best, 2);
    EXPECT_EQ(rec.evals.back(), run.steps_done());
    EXPECT_EQ(rec.evals.back() - out.at_stop.best_step, 2);
    EXPECT_LT(run.steps_done(), 12);
    EXPECT_EQ(rec.best.back(), out.at_stop.best_step);
    EXPECT_TRUE(std::filesystem::exists(d.file("a.gguf.best.gguf")));
}

TEST(RunLoop, AnInterruptWritesTheCheckpointThatResumesToTheSameBytes) {
    rp_test::TempDir d;
    Recorder rec;
    {
        rp::TrainingSession whole(*fx().model, fx().data, session_options());
        rp::RunLoopOptions o;
        o.out_path = d.file("whole.gguf");
        rp::run_training(whole, o, rec);
    }
    {
        rp::TrainingSession part(*fx().model, fx().data, session_options());
        rp::RunLoopOptions o;
        o.out_path = d.file("part.gguf");
        int asked = 0;
        o.interrupted = [&] { return part.steps_done() == 5 && ++asked > 0; };
        const rp::RunOutcome out = rp::run_training(part, o, rec);
        ASSERT_EQ(out.end, rp::RunEnd::Interrupted);
        EXPECT_EQ(part.steps_done(), 5);
        EXPECT_TRUE(std::filesystem::exists(d.file("part.gguf.ckpt.gguf")));
        EXPECT_FALSE(std::filesystem::exists(d.file("part.gguf")));
    }
    rp::TrainingSession resumed(*fx().model, fx().data, session_options());
    resumed.resume(d.file("part.gguf.ckpt.gguf"));
    rp::RunLoopOptions o;
    o.out_path = d.file("part.gguf");
    EXPECT_EQ(rp::run_training(resumed, o, rec).first, 5);
    EXPECT_EQ(slurp(d.file("part.gguf")), slurp(d.file("whole.gguf")));
}

TEST(RunLoop, ADivergedRunWritesNoResult) {
    rp_test::TempDir d;
    rp::SessionOptions so = session_options();
    so.lr.lr_max = 1e30;
    so.clip = 0;
    so.max_bad_steps = 1;
    rp::TrainingSession run(*fx().model, fx().data, so);
    rp::RunLoopOptions o;
    o.out_path = d.file("a.gguf");
    Recorder rec;
    const rp::RunOutcome out = rp::run_training(run, o, rec);
    ASSERT_EQ(out.end, rp::RunEnd::Diverged);
    EXPECT_FALSE(out.stop.empty());
    EXPECT_FALSE(std::filesystem::exists(d.file("a.gguf")));
    EXPECT_TRUE(std::filesystem::exists(d.file("a.gguf.metrics.jsonl")));
}

TEST(RunLoop, OptionErrorsNameTheField) {
    rp::SessionOptions so = session_options();
    rp::RunLoopOptions o;
    o.out_path = "x.gguf";
    o.early_stop = 2;
    try {
        o.validate(so);
        FAIL();
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("early_stop needs evaluations"), std::string::npos) << e.what();
    }
    o.early_stop = 0;
    o.sample_every = 3;
    EXPECT_THROW(o.validate(so), rp::Error);
    o.sample_every = 0;
    o.out_path.clear();
    EXPECT_THROW(o.validate(so), rp::Error);
}
