// Preference tests' data and options: the toy pairs (the chosen answer has a dog where the rejected one has a cat),
// their unpaired KTO form, the dataset as the tests load it (stories260K's tokenizer), and a small run's options.
#pragma once

#include "base/error.h"
#include "ggml_rp/ops/preference_math.h"
#include "models/data/dataset.h"
#include "models/text/chat_template.h"
#include "models/train/session.h"
#include "tests/common/temp_dir.h"
#include "tests/finetune/stories_fixture.h"
#include "tests/finetune/trainer_checks.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

namespace pref_test {

inline ft_test::StoriesFixture & fx() { return ft_test::StoriesFixture::get(); }

inline std::string json_string(const std::string & s) { return "\"" + s + "\""; }  // (the texts here need no escapes)

inline std::string pair_line(const std::string & prompt, const std::string & chosen, const std::string & rejected) {
    return "{\"prompt\": " + json_string(prompt) + ", \"chosen\": " + json_string(chosen) + ", \"rejected\": " + json_string(rejected) + "}\n";
}

// The toy task: the chosen answer has a dog where the rejected one has a cat.
inline std::string toy_pairs(int n, uint32_t seed = 1) {
    const char * names[] = {"Tom", "Lily", "Ben", "Sue", "Max", "Anna", "Tim", "Mia"};
    const char * places[] = {"park", "house", "garden", "forest", "school", "beach"};
    const char * verbs[] = {"played", "ran", "walked", "sat", "slept", "danced"};
    std::mt19937 rng(seed);
    std::string out;
    for (int i = 0; i < n; ++i) {
        const std::string who = names[rng() % 8], where = places[rng() % 6], verb = verbs[rng() % 6];
        out += pair_line("Once upon a time, " + who + " went to the " + where + ". There " + who, " " + verb + " with a big dog. The dog was happy.",
                         " " + verb + " with a big cat. The cat was happy.");
    }
    return out;
}

// The toy task unpaired for KTO: a desirable example with the dog, an undesirable one with the cat.
inline std::string toy_kto(int n, uint32_t seed = 1) {
    const char * names[] = {"Tom", "Lily", "Ben", "Sue", "Max", "Anna", "Tim", "Mia"};
    const char * verbs[] = {"played", "ran", "walked", "sat", "slept", "danced"};
    std::mt19937 rng(seed);
    std::string out;
    for (int i = 0; i < n; ++i) {
        const std::string who = names[rng() % 8], verb = verbs[rng() % 6];
        const bool good = i % 2 == 0;
        out += "{\"prompt\": \"Once upon a time, " + who + " went out. There " + who + "\", \"completion\": \" " + verb + " with a big " +
               (good ? "dog" : "cat") + ".\", \"label\": " + (good ? "true" : "false") + "}\n";
    }
    return out;
}

inline rp::Dataset pairs(const std::string & jsonl, int32_t seq_len = 48, int32_t max_prompt = 0, bool chat = false, bool pack = false) {
    rp::DatasetOptions o;
    o.seq_len = seq_len;
    o.n_ctx = fx().model->hparams().n_ctx_train;
    o.max_prompt_len = max_prompt;
    o.pack_preference = pack;
    if (chat) o.chat = rp::chat_template_for(fx().tok, "chatml");
    return rp::Dataset::from_jsonl(jsonl, "pairs.jsonl", fx().tok, o);
}

// Loading `jsonl` fails with an rp::Error whose message contains `what`.
inline void expect_data_error(const std::string & jsonl, const std::string & what, bool chat = false) {
    try {
        pairs(jsonl, 48, 0, chat);
        ADD_FAILURE() << "no error for: " << jsonl;
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
}

inline rp::PreferenceParams method(rp::PreferenceMethod m, double beta, double eps = 0.0) {
    rp::PreferenceParams p;
    p.method = m;
    p.beta = beta;
    p.label_smoothing = eps;
    return p;
}

inline rp::SessionOptions pref_options(const rp::PreferenceParams & p, int64_t steps = 3) {
    rp::SessionOptions o;
    o.finetune.lora_rank = 4;
    o.finetune.preference = p;
    o.batch = 4;  // pairs
    o.micro_batches = 2;
    o.steps = steps;
    o.threads = 1;
    o.lr.lr_max = 5e-4;
    o.lr.warmup_steps = 0;
    return o;
}

// A run of 4 steps against one checkpointed after 2 and resumed: the resumed run takes the reference from the
// checkpoint (it does not compute it again: the policy has moved) and ends with the uninterrupted run's bytes,
// losses and rewards.
inline void expect_resume_is_bit_exact(const rp::Dataset & d, const rp::SessionOptions & o) {
    rp_test::TempDir dir;
    rp::TrainingSession whole(*fx().model, d, o);
    for (int i = 0; i < 4; ++i) whole.step();
    rp::TrainingSession first(*fx().model, d, o);
    first.step();
    first.step();
    first.save_checkpoint(dir.file("ckpt.gguf"));
    rp::TrainingSession second(*fx().model, d, o);
    second.resume(dir.file("ckpt.gguf"));
    EXPECT_FALSE(second.reference_pass());  // from the checkpoint
    second.step();
    second.step();
    EXPECT_EQ(ft_test::first_different_master(whole.trainer(), second.trainer()), "");
    EXPECT_EQ(whole.curve().train_loss, second.curve().train_loss);
    EXPECT_EQ(whole.curve().reward_chosen, second.curve().reward_chosen);
    EXPECT_EQ(whole.curve().reward_rejected, second.curve().reward_rejected);
    EXPECT_EQ(second.curve().reward_chosen.size(), 4u);
}

} // namespace pref_test
