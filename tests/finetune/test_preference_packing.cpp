// Packed preference data (DatasetOptions::pack with pairs or KTO examples): a pair's two documents share one
// sequence as separate documents, several pairs per sequence; the head sums each answer by its slot. The layout
// against the unpacked dataset's sequences, the packed truncation rule, the loss, every gradient and every answer's
// log-probability against the unpacked run of the same pairs (every method), the pipeline (reference pass and
// steps) against the host bit for bit, and a bit-exact resume; a mixture of experts and a full finetune.
#include "models/convert/synth_model.h"
#include "models/text/tokenizer.h"
#include "models/train/preference.h"
#include "models/train/run_plan.h"
#include "tests/common/preference_reference.h"
#include "tests/common/shared_paths.h"
#include "tests/common/temp_dir.h"
#include "tests/finetune/ft_test_util.h"
#include "tests/finetune/preference_data.h"
#include "tests/finetune/trainer_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <numeric>
#include <string>
#include <vector>

using namespace pref_test;

namespace {

// A document of a packed sequence: its inputs and labels.
struct Doc {
    std::vector<int32_t> in, lab;
    bool operator==(const Doc &) const = default;
};

// The documents of packed sequence i, in order (the padding run after them left out).
std::vector<Doc> documents(const rp::Dataset & d, size_t i) {
    const auto pos = d.positions(i), in = d.inputs(i), lab = d.labels(i);
    std::vector<Doc> docs;
    for (size_t t = 0; t < pos.size(); ++t) {
        if (pos[t] == 0) docs.emplace_back();
        docs.back().in.push_back(in[t]);
        docs.back().lab.push_back(lab[t]);
    }
    while (!docs.empty() && std::all_of(docs.back().lab.begin(), docs.back().lab.end(), [](int32_t l) { return l == rp::kIgnoreLabel; }))
        docs.pop_back();
    return docs;
}

// Unpacked sequence i as a document: its positions up to its last label (the last token is only a label).
Doc as_document(const rp::Dataset & d, size_t i) {
    const auto in = d.inputs(i), lab = d.labels(i);
    size_t n = 0;
    for (size_t t = 0; t < lab.size(); ++t)
        if (lab[t] != rp::kIgnoreLabel) n = t + 1;
    return {{in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n)}, {lab.begin(), lab.begin() + static_cast<std::ptrdiff_t>(n)}};
}

std::vector<uint32_t> all_units(const rp::Dataset & d) {
    std::vector<uint32_t> u(d.units());
    std::iota(u.begin(), u.end(), 0u);
    return u;
}

} // namespace

// Every pair of the unpacked dataset is, once, two consecutive documents of one packed sequence (chosen then
// rejected; KTO: the example then its KL sequence) with the same tokens and labels, in answer slots whose token
// counts and kinds are the unpacked sequences'; the unused slots are empty; a sequence is a unit.
TEST(PreferencePacking, PairsShareSequencesAsSeparateDocuments) {
    for (const bool kto : {false, true}) {
        SCOPED_TRACE(kto ? "kto" : "pairs");
        const std::string jsonl = kto ? toy_kto(10) : toy_pairs(10);
        const rp::Dataset u = pairs(jsonl, 48), p = pairs(jsonl, 256, 0, false, true);
        ASSERT_TRUE(p.packed());
        EXPECT_EQ(p.pairs(), !kto);
        EXPECT_EQ(p.kto(), kto);
        EXPECT_EQ(p.group(), 1);
        EXPECT_EQ(p.units(), p.size());
        const int32_t D = p.answer_slots();
        EXPECT_GE(D, 4);  // several pairs per sequence
        EXPECT_EQ(D % 2, 0);
        EXPECT_EQ(p.n_answer_slots(), p.size() * size_t(D));
        EXPECT_LT(p.size(), u.units());
        EXPECT_LT(p.stats().padding_fraction(), p.stats().unpacked_padding_fraction());
        EXPECT_EQ(p.stats().n_examples, u.stats().n_examples);
        std::vector<int> seen(u.units(), 0);
        for (size_t i = 0; i < p.size(); ++i) {
            const std::vector<Doc> docs = documents(p, i);
            ASSERT_EQ(docs.size() % 2, 0u) << "sequence " << i;
            const auto slots = p.answers(i);
            for (size_t j = docs.size(); j < size_t(D); ++j) EXPECT_EQ(slots[j].tokens, 0) << "sequence " << i << " slot " << j;
            for (size_t j = 0; j < docs.size(); j += 2) {
                size_t k = 0;
                while (k < u.units() && (seen[k] || !(docs[j] == as_document(u, 2 * k) && docs[j + 1] == as_document(u, 2 * k + 1)))) ++k;
                ASSERT_LT(k, u.units()) << "sequence " << i << " documents " << j << ", " << j + 1 << ": no unpacked pair has them";
                ++seen[k];
                for (size_t a = 0; a < 2; ++a) {
                    EXPECT_EQ(slots[j + a].tokens, u.answers(2 * k + a)[0].tokens);
                    EXPECT_EQ(slots[j + a].kind, u.answers(2 * k + a)[0].kind);
                    EXPECT_GT(slots[j + a].tokens, 0);
                }
            }
        }
        EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
    }
}

// Packed, a pair's two documents (P + a - 1 positions each) share seq_len: the longer answer is cut first down to
// what the shorter leaves, then both evenly; a prompt longer than half the sequence is an error naming the line.
TEST(PreferencePacking, APairFitsOneSequenceOrIsCut) {
    const rp::Tokenizer & tok = fx().tok;
    const std::string prompt = "Once upon a time";
    const int32_t P = static_cast<int32_t>(tok.encode(prompt, true, false).size());
    const std::string long_text = " a big dog ran to the park and played with a red ball all day long until the sun went down.";
    const int32_t L = 2 * P + 12, budget = L + 2 - 2 * P;  // answer tokens the pair may keep
    ASSERT_GT(static_cast<int32_t>(tok.encode(long_text, false, false).size()) + 1, budget);
    // The rejected answer short: kept whole; the chosen takes the rest.
    const rp::Dataset a = pairs(pair_line(prompt, long_text, " no."), L, 0, false, true);
    const int32_t short_n = static_cast<int32_t>(tok.encode(" no.", false, false).size()) + 1;  // + EOS
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(a.answers(0)[1].tokens, short_n);
    EXPECT_EQ(a.answers(0)[0].tokens, budget - short_n);
    EXPECT_EQ(a.stats().n_truncated, 1u);
    // Both long: an even split, the chosen keeping the odd token.
    const rp::Dataset b = pairs(pair_line(prompt, long_text, long_text + " The end."), L + 1, 0, false, true);
    EXPECT_EQ(b.answers(0)[0].tokens, (budget + 1) - (budget + 1) / 2);
    EXPECT_EQ(b.answers(0)[1].tokens, (budget + 1) / 2);
    for (const rp::Dataset * d : {&a, &b}) {  // the documents fill the sequence exactly
        const std::vector<Doc> docs = documents(*d, 0);
        ASSERT_EQ(docs.size(), 2u);
        EXPECT_EQ(docs[0].in.size() + docs[1].in.size(), size_t(d->seq_len()));
    }
    // A prompt over half the sequence leaves the pair no answer token.
    try {
        pairs(pair_line("a", "b", "c") + pair_line(prompt, " a dog.", " a cat."), 2 * P - 1, 0, false, true);
        ADD_FAILURE() << "no error";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("line 2: the prompt takes " + std::to_string(P) + " tokens: a packed pair's two documents"),
                  std::string::npos)
            << e.what();
    }
}

// The packed micro-batch's loss, every LoRA gradient and every answer's log-probability equal the unpacked run of
// the same pairs (float summation order aside: the answers are summed by slot, the attention runs over longer
// rows), for every method; the loss is also the double reference's of the head's own log-probabilities.
TEST(PreferencePacking, LossGradientsAndLogpsEqualTheUnpackedRun) {
    struct M {
        const char * name;
        rp::PreferenceMethod m;
    };
    for (const M m : {M{"dpo", rp::PreferenceMethod::Dpo}, M{"ipo", rp::PreferenceMethod::Ipo}, M{"simpo", rp::PreferenceMethod::Simpo},
                      M{"orpo", rp::PreferenceMethod::Orpo}, M{"kto", rp::PreferenceMethod::Kto}}) {
        SCOPED_TRACE(m.name);
        const bool kto = m.m == rp::PreferenceMethod::Kto;
        const std::string jsonl = kto ? toy_kto(8) : toy_pairs(8);
        const rp::Dataset u = pairs(jsonl, 48), p = pairs(jsonl, 256, 0, false, true);
        const rp::PreferenceParams pp = method(m.m, 0.5);
        struct Run {
            double loss;
            std::vector<float> results, values;
            std::vector<std::vector<float>> grads;
        };
        auto run = [&](const rp::Dataset & d, Run & r) {
            rp::FinetuneConfig cfg;
            cfg.lora_rank = 2;
            cfg.lora_targets = {"attn_q", "attn_v", "ffn_down"};
            cfg.preference = pp;
            cfg.answer_slots = d.answer_slots();
            cfg.start_adapter = ft_test::model_path("reference/lora/stories260K-lora-r4-a8.gguf");  // B != 0: every factor has a gradient
            rp::Trainer tr(*fx().model, cfg);
            const rp::Batch bt = rp::make_batch(d, all_units(d));
            r.values = rp::preference_values(d, bt, pp, {});
            // The host's whole-model forward: each answer's log-probability (the head must report it). References
            // off it by -0.9 (chosen answers, desirable examples), -0.3 (undesirable ones) and +0.7 nats
            // (rejected answers, KL sequences), so that no loss saturates.
            const std::vector<float> lp = tr.sequence_logps(bt.inputs.data(), bt.labels.data(), bt.seq_len, bt.n_seq, 1, bt.positions_or_null());
            ASSERT_EQ(lp.size() * rp::kSequenceValues, r.values.size());
            for (size_t i = 0; i < lp.size(); ++i) {
                float * v = r.values.data() + rp::kSequenceValues * i;  // (the offset is the answer's, whatever its slot)
                if (v[rp::kAnswerTokens] > 0) v[rp::kReference] = lp[i] + (i % 2 ? 0.7f : v[rp::kKind] < 0 ? -0.3f : -0.9f);
            }
            rp::MicroBatchInfo mb;
            mb.seq_len = bt.seq_len;
            mb.n_seq = bt.n_seq;
            mb.packed = d.packed();
            mb.positions = bt.positions_or_null();
            mb.loss_scale = 1.0f / static_cast<float>(rp::preference_pairs(r.values));
            mb.sequence_values = r.values.data();
            tr.zero_grads();
            r.results.resize(tr.head_results(mb));
            r.loss = tr.accumulate(bt.inputs.data(), bt.labels.data(), mb, 1, r.results.data());
            tr.collect_grads();
            for (const auto & prm : tr.params())
                r.grads.emplace_back(prm.t->grad->data_as<float>(), prm.t->grad->data_as<float>() + prm.t->nelements());
            EXPECT_EQ(lp.size() + 1, r.results.size());
            for (size_t i = 0; i < lp.size(); ++i) EXPECT_NEAR(lp[i], r.results[i + 1], 1e-5 * std::fabs(lp[i])) << "answer " << i;
        };
        Run a, b;
        run(u, a);
        run(p, b);
        // Independent: the losses in long double from each run's own log-probabilities.
        for (const Run * r : {&a, &b}) {
            const int64_t n = static_cast<int64_t>(r->results.size() - 1);
            const double want = static_cast<double>(pref_ref::batch_loss(pp, r->results.data() + 1, r->values.data(), n,
                                                                         1.0L / static_cast<long double>(rp::preference_pairs(r->values))));
            EXPECT_NEAR(r->loss, want, 1e-6 * std::max(1.0, std::fabs(want)));
        }
        EXPECT_NEAR(b.loss, a.loss, 2e-6 * std::max(1.0, std::fabs(a.loss)));
        // The answers' log-probabilities: the same multiset (the packed slots hold them in another order).
        auto answers = [](const Run & r, int parity) {
            std::vector<float> v;
            for (size_t i = 0; i + 1 < r.results.size(); ++i)
                if (r.values[rp::kSequenceValues * i + rp::kAnswerTokens] > 0 && int(i % 2) == parity) v.push_back(r.results[i + 1]);
            std::sort(v.begin(), v.end());
            return v;
        };
        for (int parity : {0, 1}) {
            const std::vector<float> x = answers(a, parity), y = answers(b, parity);
            ASSERT_EQ(x.size(), y.size());
            for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 2e-5 * std::fabs(x[i]));
        }
        ASSERT_EQ(a.grads.size(), b.grads.size());
        double worst = 0;
        for (size_t k = 0; k < a.grads.size(); ++k) {
            double diff = 0, norm = 0;
            for (size_t i = 0; i < a.grads[k].size(); ++i) {
                diff = std::max(diff, std::fabs(double(a.grads[k][i]) - b.grads[k][i]));
                norm = std::max(norm, std::fabs(double(a.grads[k][i])));
            }
            ASSERT_GT(norm, 0.0) << "tensor " << k;
            worst = std::max(worst, diff / norm);
        }
        std::printf("[ preference ] packed = unpacked, %s: loss %.7f vs %.7f, worst gradient difference %.2e of the tensor's largest\n", m.name,
                    b.loss, a.loss, worst);
        EXPECT_LT(worst, 1e-4);
    }
}

// Through RoundPipe (2 CPU devices, RoundPipe and GPipe): the packed reference pass and steps are the host's bits;
// the step-1 DPO loss is ln 2 (the reference is the policy); the metrics count the pairs, not the slots; the plan
// counts sequences of pairs.
TEST(PreferencePacking, ThePipelineEqualsTheHostAndStepOneIsTheClosedForm) {
    const rp::Dataset d = pairs(toy_pairs(24), 256, 0, false, true);
    ASSERT_GE(d.units(), 4u);
    rp::SessionOptions o = pref_options(method(rp::PreferenceMethod::Dpo, 0.1), 3);
    o.batch = 2;  // sequences of pairs
    rp::TrainingSession host(*fx().model, d, o);
    ASSERT_TRUE(host.reference_pass());
    EXPECT_EQ(host.reference_logps().size(), d.n_answer_slots());
    std::vector<rp::StepReport> want;
    for (int i = 0; i < 3; ++i) want.push_back(host.step());
    EXPECT_EQ(static_cast<float>(want[0].loss), static_cast<float>(std::numbers::ln2));
    ASSERT_TRUE(want[0].preference.has_value());
    EXPECT_GE(want[0].preference->pairs, 4);
    EXPECT_EQ(want[0].preference->reward_chosen, 0.0);
    for (const rp::ScheduleKind schedule : {rp::ScheduleKind::RoundPipe, rp::ScheduleKind::GPipe}) {
        SCOPED_TRACE(static_cast<int>(schedule));
        rp::SessionOptions po = o;
        po.pipelined = true;
        po.devices.count = 2;
        po.devices.memory_each = size_t(64) << 20;
        po.pipeline.schedule = schedule;
        rp::TrainingSession pipe(*fx().model, d, po);
        ASSERT_TRUE(pipe.reference_pass());
        ASSERT_EQ(pipe.reference_logps().size(), host.reference_logps().size());
        EXPECT_EQ(std::memcmp(pipe.reference_logps().data(), host.reference_logps().data(), host.reference_logps().size() * sizeof(float)), 0);
        for (int i = 0; i < 3; ++i) {
            const rp::StepReport r = pipe.step();
            EXPECT_EQ(r.loss, want[size_t(i)].loss) << "step " << i + 1;
            ASSERT_TRUE(r.preference.has_value());
            EXPECT_EQ(r.preference->pairs, want[size_t(i)].preference->pairs);
            EXPECT_EQ(r.preference->margin, want[size_t(i)].preference->margin);
        }
        pipe.synchronize();
        EXPECT_EQ(ft_test::first_different_master(host.trainer(), pipe.trainer()), "");
    }
    rp::RunPlanOptions plan;
    plan.session = o;
    plan.seq_len = 256;
    plan.packed = true;
    EXPECT_EQ(rp::plan_run(*fx().model, plan).step[0].n_seq, 1);  // batch 2 sequences, 2 micro-batches
}

// A packed run's checkpoint keeps the slots' references; resuming gives the uninterrupted run's bytes.
TEST(PreferencePacking, ResumeIsBitExact) {
    rp::SessionOptions o = pref_options(method(rp::PreferenceMethod::Kto, 0.1), 4);
    o.batch = 2;
    expect_resume_is_bit_exact(pairs(toy_kto(24), 256, 0, false, true), o);
}

// Every architecture trains on preference pairs the same way: a mixture of experts (qwen3moe, LoRA, with the
// load-balancing loss) and a full finetune (stories260K): step 1 is ln 2 (the reference pass gives the policy's own
// bits), the steps are finite and through RoundPipe (2 CPU devices) the steps and masters are the host's bits.
TEST(PreferencePacking, OnAMixtureOfExpertsAndInAFullFinetune) {
    rp_test::TempDir dir;
    rp::SynthSpec s;
    s.arch = "qwen3moe";
    s.vocab_from = rp_test::shared_dir() + "/models/stories260K.gguf";
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 8, s.n_ff = 48, s.n_layer = 3;
    s.n_expert = 4, s.n_expert_used = 2, s.n_ff_exp = 24;
    s.seed = 13;
    rp::write_synth_model(s, dir.file("moe.gguf"));
    const auto moe = rp::Model::load(dir.file("moe.gguf"));
    const rp::Tokenizer moe_tok(moe->file());
    rp::DatasetOptions o;
    o.seq_len = 128;
    o.pack_preference = true;
    const rp::Dataset moe_pairs = rp::Dataset::from_jsonl(toy_pairs(12), "pairs.jsonl", moe_tok, o);
    struct Case {
        const char * name;
        const rp::Model * model;
        const rp::Dataset * data;
        bool full;
    };
    for (const Case & c : {Case{"qwen3moe, LoRA", moe.get(), &moe_pairs, false}, Case{"stories260K, full", fx().model.get(), nullptr, true}}) {
        SCOPED_TRACE(c.name);
        const rp::Dataset stories_pairs = pairs(toy_pairs(12), 256, 0, false, true);
        const rp::Dataset & d = c.data ? *c.data : stories_pairs;
        rp::SessionOptions so = pref_options(method(rp::PreferenceMethod::Dpo, 0.1), 3);
        so.batch = 2;
        so.finetune.full = c.full;
        if (!c.full) so.finetune.moe_aux_loss = 0.01f;
        rp::TrainingSession host(*c.model, d, so);
        std::vector<double> want;
        for (int i = 0; i < 3; ++i) want.push_back(host.step().loss);
        EXPECT_EQ(static_cast<float>(want[0]), static_cast<float>(std::numbers::ln2));
        for (double l : want) EXPECT_TRUE(std::isfinite(l));
        rp::SessionOptions po = so;
        po.pipelined = true;
        po.devices.count = 2;
        po.devices.memory_each = size_t(256) << 20;
        rp::TrainingSession pipe(*c.model, d, po);
        for (int i = 0; i < 3; ++i) EXPECT_EQ(pipe.step().loss, want[size_t(i)]) << "step " << i + 1;
        pipe.synchronize();
        EXPECT_EQ(ft_test::first_different_master(host.trainer(), pipe.trainer()), "");
    }
}
