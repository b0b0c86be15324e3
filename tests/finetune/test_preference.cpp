// Preference training (DPO, IPO, SimPO, ORPO, KTO; FinetuneConfig::preference): pairs from JSONL (strings and TRL's
// conversational form) laid out as two sequences trained on the answers only, KTO's unpaired examples with their KL
// sequences, truncation and bad pairs; the
// split and the batches never separate a pair; the step-0 closed forms through the model (the reference pass
// gives the policy's own bits); every trainable tensor's gradient against finite differences of an independent
// loss (whole-model forward + the losses in long double); a toy task that learns; a bit-exact resume that keeps
// the reference; the tool's flags, metrics and refusals.
#include "base/error.h"
#include "ggml_rp/ops/preference_math.h"
#include "models/train/run_plan.h"
#include "models/train/session.h"
#include "models/text/chat_template.h"
#include "models/text/tokenizer.h"
#include "tests/common/preference_reference.h"
#include "tests/common/temp_dir.h"
#include "tests/finetune/ft_test_util.h"
#include "tests/finetune/preference_data.h"
#include "tests/finetune/stories_fixture.h"
#include "tests/finetune/trainer_checks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace pref_test;

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t> & b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

} // namespace

TEST(PreferenceData, APairIsTwoSequencesTrainedOnTheAnswersOnly) {
    const rp::Dataset d = pairs(pair_line("Once upon a time", " a dog ran.", " a cat sat down."), 32);
    ASSERT_TRUE(d.pairs());
    EXPECT_EQ(d.group(), 2);
    EXPECT_EQ(d.size(), 2u);
    EXPECT_EQ(d.units(), 1u);
    EXPECT_FALSE(d.packed());
    const rp::Tokenizer & tok = fx().tok;
    // TRL's rule: prompt and answer tokenized apart (the prompt with BOS, the answer without), EOS after it.
    const std::vector<int32_t> prompt = tok.encode("Once upon a time", true, false);
    for (int s = 0; s < 2; ++s) {
        const std::vector<int32_t> answer = concat(tok.encode(s == 0 ? " a dog ran." : " a cat sat down.", false, false), {tok.eos()});
        const std::vector<int32_t> ids = concat(prompt, answer);
        const auto in = d.inputs(static_cast<size_t>(s));
        const auto lab = d.labels(static_cast<size_t>(s));
        for (size_t i = 0; i < 32; ++i) {
            if (i < ids.size()) {
                EXPECT_EQ(in[i], ids[i]) << "sequence " << s << " token " << i;
            }
            const int32_t want = i + 1 < ids.size() && i + 1 >= prompt.size() ? ids[i + 1] : rp::kIgnoreLabel;
            EXPECT_EQ(lab[i], want) << "sequence " << s << " label " << i;
        }
    }
    EXPECT_EQ(d.stats().n_examples, 1u);
    EXPECT_EQ(d.stats().n_truncated, 0u);
}

// TRL's conversational form: the prompt's messages and each answer's rendered together with the chat template;
// the answer is what follows the assistant header, its end of turn included, and it alone is trained.
TEST(PreferenceData, ConversationalPairsAreRenderedWithTheChatTemplate) {
    const std::string line = R"({"prompt": [{"role": "user", "content": "Tell me a story"}], )"
                             R"("chosen": [{"role": "assistant", "content": "A dog ran."}], )"
                             R"("rejected": [{"role": "assistant", "content": "No."}]})"
                             "\n";
    const rp::Dataset d = pairs(line, 96, 0, true);
    ASSERT_EQ(d.size(), 2u);
    const rp::Tokenizer & tok = fx().tok;
    const std::string prompt = "<|im_start|>user\nTell me a story<|im_end|>\n<|im_start|>assistant\n";
    for (int s = 0; s < 2; ++s) {
        const std::vector<int32_t> p = tok.encode(prompt, true, true);
        const std::vector<int32_t> a = tok.encode(std::string(s == 0 ? "A dog ran." : "No.") + "<|im_end|>\n", false, true);
        const std::vector<int32_t> ids = concat(p, a);
        const auto in = d.inputs(static_cast<size_t>(s));
        const auto lab = d.labels(static_cast<size_t>(s));
        ASSERT_LT(ids.size(), 96u);
        for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(in[i], ids[i]) << "sequence " << s << " token " << i;
        size_t trained = 0;
        for (size_t i = 0; i < 96; ++i) trained += lab[i] != rp::kIgnoreLabel;
        EXPECT_EQ(trained, a.size()) << "sequence " << s;
        EXPECT_EQ(lab[p.size() - 1], a[0]);
        EXPECT_EQ(lab[p.size() - 2], rp::kIgnoreLabel);
    }
    // An answer holds assistant messages only.
    expect_data_error(R"({"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "user", "content": "A"}], )"
                      R"("rejected": [{"role": "assistant", "content": "B"}]})",
                      "line 1: \"chosen\" holds assistant messages only, got a \"user\" message", true);
    // Without a template a conversational pair names what it needs.
    rp::DatasetOptions o;
    o.seq_len = 96;
    try {
        rp::Dataset::from_jsonl(line, "chat.jsonl", tok, o);
        FAIL() << "no error";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("chat.jsonl line 1: a conversational pair needs a chat template"), std::string::npos) << e.what();
    }
}

// Too long: the prompt keeps its last max_prompt_len tokens, then the answers are cut to what the sequence leaves.
TEST(PreferenceData, TruncationCutsThePromptFirstThenTheAnswers) {
    const rp::Tokenizer & tok = fx().tok;
    const std::string prompt = "Once upon a time there was a little girl who loved to play in the big green park";
    const std::vector<int32_t> p = tok.encode(prompt, true, false);
    ASSERT_GT(p.size(), 12u);
    const std::string line = pair_line(prompt, " with her dog and her friends every day.", " alone.");
    const rp::Dataset d = pairs(line, 16, 8);
    EXPECT_EQ(d.stats().n_truncated, 1u);
    const std::vector<int32_t> kept(p.end() - 8, p.end());
    const std::vector<int32_t> chosen = concat(tok.encode(" with her dog and her friends every day.", false, false), {tok.eos()});
    const auto in = d.inputs(0);
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(in[i], kept[i]) << i;
    for (size_t i = 8; i < 16; ++i) EXPECT_EQ(in[i], chosen[i - 8]) << i;
    EXPECT_EQ(d.labels(0)[15], chosen[8]);  // seq_len + 1 tokens: the last label is the ninth answer token
    // Without max_prompt_len the whole prompt stays; a prompt longer than the sequence leaves no answer token.
    try {
        pairs(line, 12);
        FAIL() << "no error";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("pairs.jsonl line 1: the prompt takes " + std::to_string(p.size()) + " tokens"), std::string::npos)
            << e.what();
    }
}

TEST(PreferenceData, BadPairsAreErrorsNamingTheLine) {
    const std::string good = pair_line("Once upon a time", " a dog.", " a cat.");
    expect_data_error(good + pair_line("Once", "", " a cat."), "pairs.jsonl line 2: the chosen answer is empty");
    expect_data_error(good + good + pair_line("Once", " same.", " same."), "line 3: the chosen and the rejected answer are the same text");
    expect_data_error(good + "{\"prompt\": \"a\", \"chosen\": \" b\"}\n", "line 2: a preference pair has the keys");
    expect_data_error(good + "{\"text\": \"a story\"}\n", "line 2: an SFT example in a file of preference pairs");
    expect_data_error("{\"text\": \"a story\"}\n" + good, "line 2: a preference pair in a file of SFT examples");
    expect_data_error(good + "{\"prompt\": \"a\", \"completion\": \" b\", \"label\": true}\n", "line 2: a KTO example in a file of preference pairs");
    expect_data_error(pair_line("Once", " a dog.", " a cat.").replace(0, 1, "{\"messages\": [], "), "line 1: a preference pair has the keys");
}

TEST(PreferenceData, TheSplitAndTheBatchesNeverSeparateAPair) {
    const rp::Dataset d = pairs(toy_pairs(10));
    ASSERT_EQ(d.units(), 10u);
    const rp::DatasetSplit split = rp::split_dataset(d.units(), 0.2, 42);
    EXPECT_EQ(split.val.size(), 2u);
    EXPECT_EQ(split.train.size(), 8u);
    rp::Batcher b(d, split.train, 3, 7);
    for (int k = 0; k < 4; ++k) {
        const rp::Batch bt = b.next();
        ASSERT_EQ(bt.n_seq, 6);
        ASSERT_EQ(bt.units.size(), 3u);
        for (int i = 0; i < bt.n_seq; ++i) {
            const auto want = d.inputs(bt.units[static_cast<size_t>(i / 2)] * 2 + static_cast<size_t>(i % 2));
            EXPECT_TRUE(std::equal(want.begin(), want.end(), bt.inputs.begin() + i * bt.seq_len)) << "batch " << k << " sequence " << i;
        }
    }
    // Micro-batches split pairs, never a pair: 3 pairs in 2 micro-batches are 1 + 2 pairs.
    const auto shapes = rp::micro_batch_shapes(48, 6, 2, false, 2);
    ASSERT_EQ(shapes.size(), 2u);
    EXPECT_EQ(shapes[0].n_seq, 2);
    EXPECT_EQ(shapes[1].seq_offset, 2);
    EXPECT_EQ(shapes[1].n_seq, 4);
}

// KTO's unpaired form: unit k is the example (trained on its completion) and its KL sequence, the same prompt with
// the next example's completion; desirability per unit; a set with one label only, or a label that is not a
// boolean, is refused naming the file or the line.
TEST(PreferenceData, KtoExamplesCarryTheirKlSequences) {
    const std::string a = "{\"prompt\": \"Once upon a time\", \"completion\": \" a dog ran.\", \"label\": true}\n";
    const std::string b = "{\"prompt\": \"One day\", \"completion\": \" a cat sat.\", \"label\": false}\n";
    const rp::Dataset d = pairs(a + b, 32);
    ASSERT_TRUE(d.kto());
    EXPECT_FALSE(d.pairs());
    ASSERT_EQ(d.units(), 2u);
    ASSERT_EQ(d.answer_slots(), 1);
    EXPECT_EQ(d.answers(0)[0].kind, 1);   // desirable
    EXPECT_EQ(d.answers(1)[0].kind, 0);   // its KL sequence
    EXPECT_EQ(d.answers(2)[0].kind, -1);  // undesirable
    EXPECT_EQ(d.answers(3)[0].kind, 0);
    const rp::Tokenizer & tok = fx().tok;
    const std::vector<int32_t> p0 = tok.encode("Once upon a time", true, false), p1 = tok.encode("One day", true, false);
    const std::vector<int32_t> c0 = concat(tok.encode(" a dog ran.", false, false), {tok.eos()});
    const std::vector<int32_t> c1 = concat(tok.encode(" a cat sat.", false, false), {tok.eos()});
    const std::vector<std::vector<int32_t>> want = {concat(p0, c0), concat(p0, c1), concat(p1, c1), concat(p1, c0)};
    const size_t prompt_len[] = {p0.size(), p0.size(), p1.size(), p1.size()};
    for (size_t s = 0; s < 4; ++s) {
        const auto in = d.inputs(s);
        const auto lab = d.labels(s);
        for (size_t i = 0; i < want[s].size(); ++i) EXPECT_EQ(in[i], want[s][i]) << "sequence " << s << " token " << i;
        for (size_t i = 0; i < 32; ++i) {
            const int32_t l = i + 1 < want[s].size() && i + 1 >= prompt_len[s] ? want[s][i + 1] : rp::kIgnoreLabel;
            EXPECT_EQ(lab[i], l) << "sequence " << s << " label " << i;
        }
    }
    expect_data_error(a + a, "pairs.jsonl: every KTO example is desirable (label true): KTO needs examples of both kinds");
    expect_data_error(b + b + b, "every KTO example is undesirable (label false)");
    expect_data_error(a + "{\"prompt\": \"x\", \"completion\": \" y\", \"label\": 1}\n", "line 2: \"label\" must be true (desirable) or false");
    expect_data_error(a + "{\"prompt\": \"x\", \"completion\": \"\", \"label\": false}\n", "line 2: the completion is empty");
    expect_data_error(a + "{\"text\": \"x\"}\n", "line 2: an SFT example in a file of KTO examples");
}

// At step 0 the policy is the reference, bit for bit (the reference pass's whole-model forward and the training
// programs compute the same floats): DPO's loss is ln 2 whatever beta and the smoothing, every reward 0; IPO's
// 1 / (4 beta^2).
TEST(PreferenceTraining, StepZeroIsTheClosedFormThroughTheModel) {
    const rp::Dataset d = pairs(toy_pairs(8));
    for (double eps : {0.0, 0.2}) {
        rp::TrainingSession s(*fx().model, d, pref_options(method(rp::PreferenceMethod::Dpo, 0.1, eps)));
        EXPECT_TRUE(s.reference_pass());
        EXPECT_FALSE(s.reference_pass());  // once
        const rp::StepReport r = s.step();
        EXPECT_EQ(static_cast<float>(r.loss), static_cast<float>(std::numbers::ln2)) << "eps " << eps;
        ASSERT_TRUE(r.preference.has_value());
        EXPECT_EQ(r.preference->reward_chosen, 0.0);
        EXPECT_EQ(r.preference->reward_rejected, 0.0);
        EXPECT_EQ(r.preference->accuracy, 0.0);
        EXPECT_EQ(r.preference->pairs, 4);
        EXPECT_LT(r.preference->logp_chosen, r.preference->logp_rejected + 50.0);  // finite, log-probabilities of answers
        EXPECT_LT(r.preference->logp_chosen, 0.0);
    }
    rp::TrainingSession ipo(*fx().model, d, pref_options(method(rp::PreferenceMethod::Ipo, 0.5)));
    EXPECT_EQ(static_cast<float>(ipo.step().loss), 1.0f);
    // KTO: every logratio and the KL 0: each example's loss is its weight times 1 - s(0) = 1/2.
    const rp::Dataset k = pairs(toy_kto(8));
    rp::TrainingSession kto(*fx().model, k, pref_options(method(rp::PreferenceMethod::Kto, 0.1)));
    const rp::StepReport r = kto.step();
    EXPECT_EQ(r.loss, 0.5);
    ASSERT_TRUE(r.preference.has_value());
    EXPECT_TRUE(r.preference->unpaired);
    EXPECT_EQ(r.preference->kl, 0.0);
    EXPECT_EQ(r.preference->reward_chosen, 0.0);
    EXPECT_TRUE(std::isnan(r.preference->accuracy));
    EXPECT_EQ(r.preference->chosen + r.preference->rejected, 4);
}

// KTO learns the toy task from unpaired examples: the desirable completions' reward rises above the undesirable
// ones' on held-out examples, and the greedy completion says "dog".
TEST(PreferenceTraining, KtoLearnsFromUnpairedExamples) {
    const rp::Dataset d = pairs(toy_kto(96));
    rp::SessionOptions o = pref_options(method(rp::PreferenceMethod::Kto, 0.1), 30);
    o.finetune.lora_rank = 8;
    o.batch = 8;
    o.micro_batches = 1;
    o.val_split = 0.2;
    o.threads = 0;
    o.lr.lr_max = 1e-3;
    rp::TrainingSession s(*fx().model, d, o);
    EXPECT_NEAR(s.evaluate(), 0.5, 1e-6);
    for (int i = 0; i < 30; ++i) ASSERT_TRUE(std::isfinite(s.step().loss));
    const double l = s.evaluate();
    std::printf("[ preference ] toy KTO: val loss 0.5 -> %.4f, rewards desirable %.3f undesirable %.3f, kl %.3f\n", l,
                s.eval_preference()->reward_chosen, s.eval_preference()->reward_rejected, s.eval_preference()->kl);
    EXPECT_LT(l, 0.35);
    EXPECT_GT(s.eval_preference()->margin, 1.0);
    const std::string sample = s.sample(fx().tok, "Once upon a time, Tom went out. There Tom played with a big", 3);
    EXPECT_NE(sample.find("dog"), std::string::npos) << sample;
}

// d loss / d every trainable tensor (the training programs: per-token head backward weighted by each answer's
// d loss / d log-probability) against central differences of an independent loss: the whole-model forward's
// answer log-probabilities and the method's loss written out in long double here, for every method.
TEST(PreferenceTraining, GradientsMatchFiniteDifferencesForEveryMethod) {
    const rp::Dataset d = pairs(toy_pairs(2), 32);
    std::vector<uint32_t> units = {0, 1};
    const rp::Batch bt = rp::make_batch(d, units);
    const int64_t B = bt.n_seq, T = bt.seq_len;
    struct M {
        rp::PreferenceParams p;
        const char * name;
    };
    rp::PreferenceParams simpo = method(rp::PreferenceMethod::Simpo, 2.0, 0.1);
    simpo.gamma = 0.3;
    rp::PreferenceParams kto = method(rp::PreferenceMethod::Kto, 0.5);
    kto.undesirable_weight = 1.3;
    for (const M & m : {M{method(rp::PreferenceMethod::Dpo, 0.5, 0.1), "dpo"}, M{method(rp::PreferenceMethod::Ipo, 0.5), "ipo"}, M{simpo, "simpo"},
                        M{method(rp::PreferenceMethod::Orpo, 0.5), "orpo"}, M{kto, "kto"}}) {
        SCOPED_TRACE(m.name);
        rp::FinetuneConfig cfg;
        cfg.lora_rank = 2;
        cfg.lora_targets = {"attn_q", "ffn_down"};
        cfg.preference = m.p;
        rp::Trainer tr(*fx().model, cfg);
        ft_test::randomize_trainables(tr, 3);
        // The pairs' values: references off the policy by up to 2 nats (KTO: the KL sequences' below it, a KL
        // > 0), the answers' token counts, ORPO's NLL weights, KTO's kinds (a desirable and an undesirable example).
        const bool is_kto = m.p.method == rp::PreferenceMethod::Kto;
        constexpr int S = rp::kSequenceValues;
        const std::vector<float> lp0 = tr.sequence_logps(bt.inputs.data(), bt.labels.data(), T, B, 1);
        std::vector<float> sv(static_cast<size_t>(S * B));
        double chosen_tokens = 0;
        for (int64_t i = 0; i < B; ++i) {
            float * v = sv.data() + S * i;
            v[rp::kReference] = lp0[size_t(i)] + (i % 2 ? (is_kto ? -0.7f : 1.5f) : -2.0f);
            int n = 0;
            for (int64_t t = 0; t < T; ++t) n += bt.labels[size_t(i * T + t)] != rp::kIgnoreLabel;
            v[rp::kAnswerTokens] = static_cast<float>(n);
            if (i % 2 == 0) chosen_tokens += n;
            if (is_kto && i % 2 == 0) v[rp::kKind] = i == 0 ? 1.0f : -1.0f;
        }
        if (m.p.method == rp::PreferenceMethod::Orpo)
            for (int64_t i = 0; i < B; i += 2) sv[size_t(S * i + rp::kNllWeight)] = static_cast<float>(1.0 / chosen_tokens);
        const float scale = 0.5f;  // two pairs
        // KTO's KL at the starting weights, held there (TRL detaches it: no gradient reaches the KL sequences).
        double kl0 = 0;
        for (int64_t k = 1; k < B; k += 2) kl0 += double(lp0[size_t(k)]) - sv[size_t(S * k)];
        kl0 = std::max(0.0, kl0 / double(B / 2));
        if (is_kto) {
            ASSERT_GT(kl0, 0.5);
        }
        auto loss_at = [&]() {  // independent: the whole-model forward's log-probabilities + the losses in long double
            const std::vector<float> lp = tr.sequence_logps(bt.inputs.data(), bt.labels.data(), T, B, 1);
            return static_cast<double>(pref_ref::batch_loss(m.p, lp.data(), sv.data(), B, scale, is_kto ? kl0 : -1.0L));
        };
        rp::MicroBatchInfo mb;
        mb.seq_len = T;
        mb.n_seq = B;
        mb.loss_scale = scale;
        mb.sequence_values = sv.data();
        tr.zero_grads();
        std::vector<float> results(tr.head_results(mb));
        const double loss = tr.accumulate(bt.inputs.data(), bt.labels.data(), mb, 1, results.data());
        tr.collect_grads();
        EXPECT_NEAR(loss, loss_at(), 1e-6 * std::max(1.0, std::fabs(loss)));
        for (int64_t i = 0; i < B; ++i) EXPECT_EQ(results[size_t(1 + i)], lp0[size_t(i)]) << "sequence " << i << ": the head's log-probability";
        // h: 5% of the tensor's RMS, at most what moves the loss by 2% of max(1, L) (the rest is curvature)
        const double worst = ft_test::check_gradients_by_differences(tr, loss_at, loss, 0.05, 0.02, 2e-3);
        std::printf("[ preference ] %s: loss %.6f, worst relative gradient error %.2e over %zu tensors\n", m.name, loss, worst, tr.params().size());
    }
}

// The toy task: pairs whose chosen answer has a dog where the rejected one has a cat. Held-out reward accuracy
// starts at 0 (every reward is 0) and rises above 0.9 within 30 steps; the policy's own greedy completion then
// says "dog".
TEST(PreferenceTraining, AToyTaskLearnsToPreferTheChosenWord) {
    const rp::Dataset d = pairs(toy_pairs(96));
    rp::SessionOptions o = pref_options(method(rp::PreferenceMethod::Dpo, 0.1), 30);
    o.finetune.lora_rank = 8;  // rp-finetune's defaults: rank 8, alpha 16
    o.batch = 8;
    o.micro_batches = 1;
    o.val_split = 0.2;
    o.threads = 0;
    rp::TrainingSession s(*fx().model, d, o);
    EXPECT_NEAR(s.evaluate(), std::numbers::ln2, 1e-6);
    ASSERT_TRUE(s.eval_preference().has_value());
    EXPECT_EQ(s.eval_preference()->accuracy, 0.0);
    EXPECT_EQ(s.eval_preference()->pairs, 19);
    std::string curve;
    for (int i = 0; i < 30; ++i) {
        const rp::StepReport r = s.step();
        if (i % 5 == 4) {
            const double l = s.evaluate();
            char buf[128];
            std::snprintf(buf, sizeof buf, " step %d: val loss %.4f accuracy %.3f margin %.3f;", i + 1, l, s.eval_preference()->accuracy,
                          s.eval_preference()->margin);
            curve += buf;
        }
        ASSERT_TRUE(std::isfinite(r.loss));
    }
    std::printf("[ preference ] toy DPO:%s\n", curve.c_str());
    EXPECT_GT(s.eval_preference()->accuracy, 0.9);
    EXPECT_GT(s.eval_preference()->margin, 1.0);
    const std::string sample = s.sample(fx().tok, "Once upon a time, Tom went to the park. There Tom played with a big", 4);
    EXPECT_NE(sample.find("dog"), std::string::npos) << sample;
}

// A checkpoint keeps the reference log-probabilities: the resumed run does not compute them again (the policy
// has moved) and ends with the uninterrupted run's bytes.
TEST(PreferenceTraining, ResumeKeepsTheReferenceAndIsBitExact) {
    expect_resume_is_bit_exact(pairs(toy_pairs(12)), pref_options(method(rp::PreferenceMethod::Dpo, 0.1), 4));
}

// With LoRA dropout (on a starting adapter, whose B is not 0) the reference pass runs in evaluation mode on the
// devices as on the host (no dropout: the whole adapter), so both give the same bits, while the steps train with
// dropout (at step 1 the policy is not the reference).
TEST(PreferenceTraining, TheReferencePassThroughTheDevicesHasNoDropout) {
    const rp::Dataset d = pairs(toy_pairs(8));
    rp::SessionOptions o = pref_options(method(rp::PreferenceMethod::Dpo, 0.1), 1);
    o.finetune.lora_dropout = 0.3f;
    o.finetune.start_adapter = ft_test::model_path("reference/lora/stories260K-lora-r4-a8.gguf");  // B != 0: dropout shows
    rp::TrainingSession host(*fx().model, d, o);
    ASSERT_TRUE(host.reference_pass());
    rp::SessionOptions po = o;
    po.pipelined = true;
    po.devices.count = 2;
    po.devices.memory_each = size_t(64) << 20;
    rp::TrainingSession pipe(*fx().model, d, po);
    ASSERT_TRUE(pipe.reference_pass());
    ASSERT_EQ(pipe.reference_logps().size(), host.reference_logps().size());
    EXPECT_EQ(std::memcmp(pipe.reference_logps().data(), host.reference_logps().data(), host.reference_logps().size() * sizeof(float)), 0);
    // The training step does drop: at step 0 the policy's log-probabilities differ from the reference's.
    const rp::StepReport r = pipe.step();
    EXPECT_NE(static_cast<float>(r.loss), static_cast<float>(std::numbers::ln2));
    EXPECT_EQ(r.loss, host.step().loss);
}

// The memory plan (rp-finetune --plan) counts a step's pairs as two sequences each, in micro-batches of whole pairs.
TEST(PreferenceTraining, ThePlanCountsTwoSequencesPerPair) {
    rp::RunPlanOptions po;
    po.session = pref_options(method(rp::PreferenceMethod::Dpo, 0.1));  // batch 4 pairs, 2 micro-batches
    po.seq_len = 48;
    const rp::RunPlan pref = rp::plan_run(*fx().model, po);
    ASSERT_EQ(pref.step.size(), 2u);
    EXPECT_EQ(pref.step[0].n_seq, 4);
    EXPECT_EQ(pref.step[1].n_seq, 4);
    EXPECT_EQ(pref.step[1].seq_offset, 4);
    po.session.finetune.preference.reset();
    const rp::RunPlan sft = rp::plan_run(*fx().model, po);
    EXPECT_EQ(sft.step[0].n_seq, 2);
    EXPECT_EQ(pref.host.checkpoints, 2 * sft.host.checkpoints);
}

TEST(PreferenceTraining, TheObjectiveMustMatchTheData) {
    const rp::Dataset d = pairs(toy_pairs(4));
    rp::SessionOptions sft = pref_options(method(rp::PreferenceMethod::Dpo, 0.1));
    sft.finetune.preference.reset();
    EXPECT_THROW(rp::TrainingSession(*fx().model, d, sft), rp::Error);
    EXPECT_THROW(rp::TrainingSession(*fx().model, fx().data, pref_options(method(rp::PreferenceMethod::Dpo, 0.1))), rp::Error);
}

// Through RoundPipe (2 and 3 CPU devices, sync; the RoundPipe and GPipe schedules): the reference pass runs on
// the devices (Pipeline::forward: the heads' forward alone) and gives the host's bits; the heads read the
// pairs' values and report the answers' log-probabilities as on the host; masters, losses and metrics are the
// host run's bits (so the forward-only call left nothing behind for the steps). DPO also with bf16 boundaries
// (FinetuneConfig::boundary_type: the heads read rounded hidden states on both paths).
TEST(PreferenceTraining, ThePipelineEqualsTheHostBitForBit) {
    const rp::Dataset d = pairs(toy_pairs(12));
    for (const auto & [m, boundary] : {std::pair{rp::PreferenceMethod::Dpo, rp::DType::F32}, std::pair{rp::PreferenceMethod::Orpo, rp::DType::F32},
                                       std::pair{rp::PreferenceMethod::Dpo, rp::DType::BF16}}) {
        rp::SessionOptions o = pref_options(method(m, 0.1), 3);
        o.finetune.boundary_type = boundary;
        rp::TrainingSession host(*fx().model, d, o);
        EXPECT_EQ(host.reference_pass(), m == rp::PreferenceMethod::Dpo);
        std::vector<rp::StepReport> want;
        for (int i = 0; i < 3; ++i) want.push_back(host.step());
        for (const auto & [devices, schedule] : {std::pair{2, rp::ScheduleKind::RoundPipe}, std::pair{3, rp::ScheduleKind::RoundPipe},
                                                 std::pair{2, rp::ScheduleKind::GPipe}}) {
            SCOPED_TRACE(std::to_string(devices) + " devices, schedule " + std::to_string(static_cast<int>(schedule)) + ", method " +
                         std::to_string(static_cast<int>(m)) + ", boundaries " + rp::dtype_name(boundary));
            rp::SessionOptions po = o;
            po.pipelined = true;
            po.devices.count = devices;
            po.devices.memory_each = size_t(64) << 20;
            po.pipeline.schedule = schedule;
            rp::TrainingSession pipe(*fx().model, d, po);
            EXPECT_EQ(pipe.reference_pass(), m == rp::PreferenceMethod::Dpo);
            ASSERT_EQ(pipe.reference_logps().size(), host.reference_logps().size());
            if (!host.reference_logps().empty()) {
                EXPECT_EQ(std::memcmp(pipe.reference_logps().data(), host.reference_logps().data(), host.reference_logps().size() * sizeof(float)), 0)
                    << "the reference pass through the devices";
            }
            for (int i = 0; i < 3; ++i) {
                const rp::StepReport r = pipe.step();
                EXPECT_EQ(r.loss, want[size_t(i)].loss) << "step " << i + 1;
                ASSERT_TRUE(r.preference.has_value());
                EXPECT_EQ(r.preference->logp_chosen, want[size_t(i)].preference->logp_chosen);
                EXPECT_EQ(r.preference->logp_rejected, want[size_t(i)].preference->logp_rejected);
                EXPECT_EQ(r.preference->margin, want[size_t(i)].preference->margin);
            }
            pipe.synchronize();
            EXPECT_EQ(ft_test::first_different_master(host.trainer(), pipe.trainer()), "");
        }
    }
}

// rp-finetune: --method and its parameters, TRL's metric names in the JSONL, and bad data refused before
// anything is written.
TEST(PreferenceTool, TrainsFromTheCommandLineAndRefusesBadPairs) {
    rp_test::TempDir dir;
    {
        std::ofstream(dir.file("pairs.jsonl")) << toy_pairs(24);
    }
    const std::string base = ft_test::tool("rp-finetune") + " -m " + ft_test::stories() + " --data " + dir.file("pairs.jsonl") +
                             " --seq-len 48 --batch 4 --steps 3 -t 1 --lr 5e-4";
    std::string out;
    ASSERT_EQ(ft_test::run(base + " --method simpo --beta 2 --gamma 0.5 -o " + dir.file("a.gguf"), &out), 0)
        << out;
    EXPECT_NE(out.find("24 preference pairs"), std::string::npos) << out;
    EXPECT_NE(out.find("method simpo, beta 2"), std::string::npos) << out;
    EXPECT_TRUE(std::filesystem::exists(dir.file("a.gguf")));
    std::ifstream m(dir.file("a.gguf.metrics.jsonl"));
    std::stringstream ms;
    ms << m.rdbuf();
    EXPECT_NE(ms.str().find("\"rewards/chosen\":"), std::string::npos) << ms.str();
    EXPECT_NE(ms.str().find("\"rewards/accuracies\":"), std::string::npos) << ms.str();
    // DPO needs the reference pass; ORPO none.
    ASSERT_EQ(ft_test::run(base + " --method dpo -o " + dir.file("b.gguf"), &out), 0) << out;
    EXPECT_NE(out.find("reference pass: the log-probabilities of 48 answers"), std::string::npos) << out;
    EXPECT_NE(out.find("24 preference pairs (prompt + chosen, prompt + rejected: 48 sequences"), std::string::npos) << out;
    // --pack: several pairs a sequence; the same answers, fewer sequences, step 1 at ln 2.
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-finetune") + " -m " + ft_test::stories() + " --data " + dir.file("pairs.jsonl") +
                               " --seq-len 256 --batch 2 --steps 2 -t 1 --method dpo --pack -o " + dir.file("p.gguf"),
                           &out),
              0)
        << out;
    EXPECT_NE(out.find("reference pass: the log-probabilities of 48 answers"), std::string::npos) << out;
    EXPECT_NE(out.find("24 preference pairs (prompt + chosen, prompt + rejected: packed, up to 3 pairs a sequence, into"), std::string::npos)
        << out;
    EXPECT_NE(out.find("step 1/2 | loss 0.6931 |"), std::string::npos) << out;
    ASSERT_EQ(ft_test::run(base + " --method orpo --orpo-lambda 0.2 -o " + dir.file("c.gguf"), &out), 0) << out;
    EXPECT_EQ(out.find("reference pass"), std::string::npos) << out;
    // KTO on unpaired examples: its KL in the log and the metrics.
    {
        std::ofstream(dir.file("kto.jsonl")) << toy_kto(24);
    }
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-finetune") + " -m " + ft_test::stories() + " --data " + dir.file("kto.jsonl") +
                               " --seq-len 48 --batch 4 --steps 3 -t 1 --method kto --undesirable-weight 1.33 -o " + dir.file("k.gguf"),
                           &out),
              0)
        << out;
    EXPECT_NE(out.find("24 KTO examples"), std::string::npos) << out;
    EXPECT_NE(out.find("rewards desirable"), std::string::npos) << out;
    std::ifstream km(dir.file("k.gguf.metrics.jsonl"));
    std::stringstream kms;
    kms << km.rdbuf();
    EXPECT_NE(kms.str().find("\"kl\":"), std::string::npos) << kms.str();
    // Refusals: pairs without a method, a method on SFT data, an unknown method, label smoothing on IPO, a bad pair.
    EXPECT_NE(ft_test::run(base + " -o " + dir.file("x.gguf"), &out), 0);
    EXPECT_NE(out.find("the dataset holds preference pairs"), std::string::npos) << out;
    EXPECT_NE(ft_test::run(base + " --method rlhf -o " + dir.file("x.gguf"), &out), 0);
    EXPECT_NE(out.find("--method \"rlhf\" is not one of sft, dpo, ipo, simpo, orpo, kto"), std::string::npos) << out;
    EXPECT_NE(ft_test::run(base + " --method kto -o " + dir.file("x.gguf"), &out), 0);
    EXPECT_NE(out.find("--method kto trains on unpaired examples"), std::string::npos) << out;
    EXPECT_NE(ft_test::run(base + " --method kto --undesirable-weight 0 -o " + dir.file("x.gguf"), &out), 0);
    EXPECT_NE(out.find("--desirable-weight and --undesirable-weight must be finite numbers > 0"), std::string::npos) << out;
    EXPECT_NE(ft_test::run(ft_test::tool("rp-finetune") + " -m " + ft_test::stories() + " --data " + ft_test::model_path("reference/train.txt") +
                               " --max-prompt-len 8 --steps 1 -o " + dir.file("x.gguf"),
                           &out),
              0);
    EXPECT_NE(out.find("--max-prompt-len truncates the prompts of preference pairs"), std::string::npos) << out;
    EXPECT_NE(ft_test::run(base + " --method ipo --label-smoothing 0.1 -o " + dir.file("x.gguf"), &out), 0);
    EXPECT_NE(out.find("--label-smoothing applies to dpo and simpo"), std::string::npos) << out;
    {
        std::ofstream(dir.file("bad.jsonl")) << toy_pairs(3) << pair_line("Once", " same.", " same.");
    }
    EXPECT_NE(ft_test::run(ft_test::tool("rp-finetune") + " -m " + ft_test::stories() + " --data " + dir.file("bad.jsonl") +
                               " --method dpo --seq-len 48 --steps 1 -o " + dir.file("x.gguf"),
                           &out),
              0);
    EXPECT_NE(out.find("bad.jsonl line 4: the chosen and the rejected answer are the same text"), std::string::npos) << out;
    EXPECT_FALSE(std::filesystem::exists(dir.file("x.gguf")));
    EXPECT_NE(ft_test::run(ft_test::tool("rp-finetune") + " -m " + ft_test::stories() + " --data " + ft_test::model_path("reference/train.txt") +
                               " --method dpo --seq-len 48 --steps 1 -o " + dir.file("x.gguf"),
                           &out),
              0);
    EXPECT_NE(out.find("a preference --method trains on pairs"), std::string::npos) << out;
    EXPECT_FALSE(std::filesystem::exists(dir.file("x.gguf")));
}
