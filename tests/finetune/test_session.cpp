// The training loop as a library object (models/session.h), without the rp-finetune binary: a step on the host
// and through the RoundPipe runtime on 2 CPU virtual devices give the same bytes (LoRA and full), evaluation,
// checkpoint + resume equal to an uninterrupted run, the async mode's gradient-norm labelling, the metrics log,
// and option errors that name the option.
#include "base/error.h"
#include "ggml_rp/core/json.h"
#include "models/train/finetune_report.h"
#include "models/arch/inference.h"
#include "models/arch/lora.h"
#include "models/train/session.h"
#include "models/text/tokenizer.h"
#include "tests/common/temp_dir.h"
#include "tests/finetune/ft_test_util.h"
#include "tests/finetune/stories_fixture.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

ft_test::StoriesFixture & fx() { return ft_test::StoriesFixture::get(); }

rp::SessionOptions options(bool full = false) {
    rp::SessionOptions o;
    o.finetune.full = full;
    o.finetune.lora_rank = 4;
    o.batch = 4;
    o.micro_batches = 2;
    o.steps = 3;
    o.threads = 1;
    o.lr.lr_max = 2e-3;
    o.lr.warmup_steps = 1;
    return o;
}

rp::SessionOptions pipelined(rp::SessionOptions o, bool async = false) {
    o.pipelined = true;
    o.devices.count = 2;
    o.devices.memory_each = size_t(64) << 20;
    o.pipeline.async = async;
    return o;
}

std::vector<std::vector<float>> masters(const rp::TrainingSession & s) {
    std::vector<std::vector<float>> out;
    for (const auto & p : s.trainer().params()) {
        const float * d = p.t->data_as<float>();
        out.emplace_back(d, d + p.t->nelements());
    }
    return out;
}

bool same_bytes(const std::vector<std::vector<float>> & a, const std::vector<std::vector<float>> & b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0) return false;
    return true;
}

std::vector<double> run_steps(rp::TrainingSession & s, int64_t n) {
    std::vector<double> losses;
    for (int64_t i = 0; i < n; ++i) losses.push_back(s.step().loss);
    s.synchronize();
    return losses;
}

} // namespace

TEST(TrainingSession, HostAndPipelineStepsGiveTheSameBytes) {
    for (bool full : {false, true}) {
        SCOPED_TRACE(full ? "full" : "lora");
        rp::TrainingSession host(*fx().model, fx().data, options(full));
        const auto before = masters(host);
        const auto host_losses = run_steps(host, 3);
        ASSERT_FALSE(same_bytes(before, masters(host))) << "the host session did not train";
        rp::TrainingSession pipe(*fx().model, fx().data, pipelined(options(full)));
        ASSERT_NE(pipe.pipeline(), nullptr);
        EXPECT_EQ(pipe.devices().size(), 2u);
        const auto pipe_losses = run_steps(pipe, 3);
        EXPECT_TRUE(same_bytes(masters(host), masters(pipe)));
        for (size_t i = 0; i < host_losses.size(); ++i) EXPECT_EQ(host_losses[i], pipe_losses[i]) << "step " << i + 1;
        EXPECT_EQ(host.steps_done(), 3);
        EXPECT_EQ(host.curve().train_loss.size(), 3u);
    }
}

TEST(TrainingSession, EvaluatesTheValidationSplit) {
    rp::SessionOptions o = options();
    o.val_split = 0.25;
    rp::TrainingSession s(*fx().model, fx().data, o);
    ASSERT_TRUE(s.has_validation());
    EXPECT_EQ(s.split().train.size() + s.split().val.size(), fx().data.size());
    const double v0 = s.evaluate();
    EXPECT_TRUE(std::isfinite(v0));
    EXPECT_GT(v0, 0.0);
    run_steps(s, 3);
    EXPECT_NE(s.evaluate(), v0);
    // Through the devices (the step's micro-batches, each one's loss summed in its own graph): the host's loss within
    // rounding, and the devices did the work (the jobs' adapters went up).
    rp::TrainingSession p(*fx().model, fx().data, pipelined(o));
    const size_t up = p.pipeline()->device_weight_bytes_uploaded(0);
    EXPECT_NEAR(p.evaluate(), v0, 1e-6 * v0);
    EXPECT_GT(p.pipeline()->device_weight_bytes_uploaded(0), up);
    run_steps(p, 3);
    const double after = s.evaluate();
    EXPECT_NEAR(p.evaluate(), after, 1e-6 * after);  // the same weights after the same steps
    rp::TrainingSession none(*fx().model, fx().data, options());
    EXPECT_FALSE(none.has_validation());
    EXPECT_TRUE(std::isnan(none.evaluate()));
}

TEST(TrainingSession, CheckpointAndResumeEqualAnUninterruptedRun) {
    rp_test::TempDir dir;
    for (bool pipe : {false, true}) {
        SCOPED_TRACE(pipe ? "pipeline" : "host");
        rp::SessionOptions o = options();
        o.steps = 5;
        if (pipe) o = pipelined(o);
        rp::TrainingSession straight(*fx().model, fx().data, o);
        run_steps(straight, 5);
        const std::string ckpt = dir.file(pipe ? "p.ckpt.gguf" : "h.ckpt.gguf");
        {
            rp::TrainingSession first(*fx().model, fx().data, o);
            run_steps(first, 2);
            first.save_checkpoint(ckpt);
        }
        rp::TrainingSession resumed(*fx().model, fx().data, o);
        EXPECT_NE(resumed.resume(ckpt).find("step 2"), std::string::npos);
        EXPECT_EQ(resumed.steps_done(), 2);
        run_steps(resumed, 3);
        EXPECT_TRUE(same_bytes(masters(straight), masters(resumed)));
        EXPECT_EQ(straight.curve().train_loss, resumed.curve().train_loss);
        EXPECT_THROW(resumed.step(), rp::Error);  // all 5 steps done
        EXPECT_THROW(resumed.resume(ckpt), rp::Error);  // only before the first step
    }
}

TEST(TrainingSession, AsyncStepsSayWhichStepTheirGradientNormBelongsTo) {
    rp::TrainingSession sync(*fx().model, fx().data, pipelined(options()));
    const rp::StepReport s1 = sync.step();
    EXPECT_EQ(s1.grad_norm_step, 1);
    EXPECT_TRUE(std::isfinite(s1.grad_norm));
    rp::TrainingSession async(*fx().model, fx().data, pipelined(options(), true));
    for (int i = 0; i < 3; ++i) {
        const rp::StepReport r = async.step();
        EXPECT_LE(r.grad_norm_step, r.step) << "a norm from the future";
        EXPECT_EQ(r.grad_norm_step < 0, std::isnan(r.grad_norm)) << "step " << r.step;
    }
    async.synchronize();
}

TEST(TrainingSession, MetricsLinesAreJsonEvenWhenAStepIsSkipped) {
    rp_test::TempDir dir;
    rp::SessionOptions o = options();
    o.lr.lr_max = 1e30;  // diverges: the loss and gradient norm become non-finite, the update is skipped
    o.clip = 0;
    o.steps = 4;
    rp::TrainingSession s(*fx().model, fx().data, o);
    const std::string path = dir.file("m.jsonl");
    {
        rp::MetricsLog log(path, false);
        for (int i = 0; i < 4; ++i) log.step(s.step());
        log.eval(4, std::nan(""));
        log.commit();
    }
    std::ifstream in(path);
    std::string line;
    int lines = 0, skipped = 0, null_norms = 0;
    while (std::getline(in, line)) {
        ++lines;
        rp::json::Value v;
        ASSERT_NO_THROW(v = rp::json::parse(line, path)) << line;
        ASSERT_TRUE(v.is_object()) << line;
        if (const rp::json::Value * sk = v.find("skipped")) {
            ++skipped;
            EXPECT_EQ(sk->string, "non-finite loss") << line;
        }
        if (const rp::json::Value * g = v.find("grad_norm"); g && g->type == rp::json::Value::Type::Null) ++null_norms;
    }
    EXPECT_EQ(lines, 5);
    EXPECT_GE(skipped, 1) << "lr 1e30 without clipping did not diverge";
    EXPECT_GE(null_norms, 1);
}

// The non-finite guard (issue 13): on the host, and through the pipeline in sync and async mode, a step whose
// loss or gradient norm is not finite leaves the masters and the optimizer untouched, and max_bad_steps of
// them in a row stop the run with a message naming the steps; step() refuses to go on.
TEST(TrainingSession, NonFiniteStepsAreNotAppliedAndStopTheRun) {
    for (const int mode : {0, 1, 2}) {  // host, pipeline sync, pipeline async
        rp::SessionOptions o = options();
        o.lr.lr_max = 1e30;
        o.clip = 0;
        o.steps = 20;
        o.max_bad_steps = 2;
        if (mode > 0) {
            o.pipelined = true;
            o.devices.count = 2;
            o.devices.memory_each = size_t(64) << 20;
            o.pipeline.async = mode == 2;
        }
        rp::TrainingSession s(*fx().model, fx().data, o);
        std::vector<std::vector<float>> good;
        std::string stop;
        int64_t applied_until = 0;
        for (int i = 0; i < 20 && stop.empty(); ++i) {
            const rp::StepReport r = s.step();
            stop = r.stop;
            if (r.grad_norm_step > 0 && !r.skipped) applied_until = r.grad_norm_step;
        }
        const std::string what = "mode " + std::to_string(mode);
        ASSERT_FALSE(stop.empty()) << what << ": lr 1e30 never stopped the run";
        EXPECT_NE(stop.find("max_bad_steps 2"), std::string::npos) << stop;
        EXPECT_NE(stop.find("step " + std::to_string(applied_until) + "'s weights are the last good ones"), std::string::npos)
            << what << ": " << stop;
        EXPECT_THROW(s.step(), rp::Error);
        // The masters are those of the last applied step: a fresh run stopped right after it has them.
        s.synchronize();
        rp::SessionOptions until = o;  // the same schedule, stopped after the last applied step
        until.max_bad_steps = 1 << 20;
        rp::TrainingSession t(*fx().model, fx().data, until);
        for (int64_t i = 0; i < applied_until; ++i) t.step();
        t.synchronize();
        ASSERT_EQ(s.trainer().params().size(), t.trainer().params().size());
        for (size_t i = 0; i < s.trainer().params().size(); ++i) {
            const rp::Tensor * a = s.trainer().params()[i].t;
            const rp::Tensor * b = t.trainer().params()[i].t;
            EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes()), 0) << what << " " << s.trainer().params()[i].name;
        }
    }
}

TEST(TrainingSession, BadOptionsNameTheOption) {
    auto error_of = [](rp::SessionOptions o) {
        try {
            rp::TrainingSession s(*fx().model, fx().data, o);
        } catch (const rp::Error & e) {
            return std::string(e.what());
        }
        return std::string();
    };
    rp::SessionOptions o = options();
    o.micro_batches = 5;
    EXPECT_NE(error_of(o).find("micro_batches"), std::string::npos);
    o = options();
    o.clip = -1;
    EXPECT_NE(error_of(o).find("clip"), std::string::npos);
    o = options();
    o.finetune.lora_rank = 0;
    EXPECT_NE(error_of(o).find("lora_rank"), std::string::npos);
    o = pipelined(options());
    o.devices.backend = "tpu";
    EXPECT_NE(error_of(o).find("tpu"), std::string::npos);
}

// --sample-every's completions (TrainingSession::sample) come from the weights the run saves: the same text as
// generating with the saved adapter / model, host and pipeline alike.
TEST(TrainingSession, SamplesWhatTheSavedResultGenerates) {
    rp_test::TempDir dir;
    const std::string prompt = "Once upon a time";
    for (bool full : {false, true}) {
        SCOPED_TRACE(full ? "full" : "lora");
        rp::SessionOptions o = options(full);
        o.lr.lr_max = full ? 1e-2f : 3e-2f;  // enough to move the greedy completion in 3 steps
        rp::TrainingSession host(*fx().model, fx().data, o);
        run_steps(host, 3);
        const std::string sampled = host.sample(fx().tok, prompt, 24);
        rp::TrainingSession pipe(*fx().model, fx().data, pipelined(o));
        run_steps(pipe, 3);
        EXPECT_EQ(pipe.sample(fx().tok, prompt, 24), sampled);
        const std::string out = dir.file(full ? "full.gguf" : "lora.gguf");
        host.save_result(out);
        auto generate = [&](const rp::Model & m, const rp::LoraSet * lora) {
            rp::InferenceSession s(m, 0, 1, lora);
            std::string text;
            for (const int32_t id : rp::complete_greedy(s, fx().tok, fx().tok.encode(prompt, true, false), 24))
                text += fx().tok.token_to_piece(id, false);
            return text;
        };
        const std::string base = generate(*fx().model, nullptr);
        std::string saved;
        if (full) {
            saved = generate(*rp::Model::load(out), nullptr);
        } else {
            auto adapter = rp::LoraAdapter::load(out, *fx().model);
            rp::LoraSet set;
            set.add(*adapter);
            saved = generate(*fx().model, &set);
        }
        std::printf("[ sample ] %s: base \"%s\" -> trained \"%s\"\n", full ? "full" : "lora", base.c_str(), sampled.c_str());
        EXPECT_EQ(saved, sampled);
        EXPECT_NE(sampled, base) << "training did not change the completion: the test would not see stale weights";
    }
}
