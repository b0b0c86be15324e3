// JSONL datasets: the three line kinds with their masked positions checked by hand, truncation, padding,
// skipping, and errors that name the line.
#include "dataset_test_util.h"

using namespace ds_test;

namespace {

rp::DatasetOptions opts(int32_t seq_len) {
    rp::DatasetOptions o;
    o.seq_len = seq_len;
    o.n_ctx = 2048;
    return o;
}

rp::Dataset jsonl(const std::string & text, int32_t seq_len) {
    return rp::Dataset::from_jsonl(text, "t.jsonl", stories(), opts(seq_len));
}

TEST(JsonlDataset, TextLine) {
    const rp::Dataset d = jsonl(R"({"text": "Once upon a time, there was a little girl named Lily."})", 20);
    ASSERT_EQ(d.size(), 1u);
    std::vector<int32_t> in = kPrompt1, lab(kPrompt1.begin() + 1, kPrompt1.end());
    in.insert(in.end(), {kEos, kEos, kEos, kEos});  // EOS, then 3 padding tokens (EOS: no pad token)
    lab.insert(lab.end(), {kEos, X, X, X, X});
    EXPECT_EQ(row(d.inputs(0)), in);
    EXPECT_EQ(row(d.labels(0)), lab);
}

TEST(JsonlDataset, PromptCompletionMasksThePrompt) {
    // Prompt "Once upon a time," = tokens 0..5 (BOS Once upon a time ,); the completion starts at " there".
    const rp::Dataset d = jsonl(R"({"id": 7, "prompt": "Once upon a time,", "completion": " there was a little girl named Lily."})", 20);
    ASSERT_EQ(d.size(), 1u);
    std::vector<int32_t> in = kPrompt1;
    in.insert(in.end(), {kEos, kEos, kEos, kEos});
    EXPECT_EQ(row(d.inputs(0)), in);
    // Position t predicts token t+1: targets 1..5 are prompt tokens (masked), 6..15 and the EOS are trained.
    const std::vector<int32_t> lab = {X, X, X, X, X, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, kEos, X, X, X, X};
    EXPECT_EQ(row(d.labels(0)), lab);
    EXPECT_EQ(d.stats().n_trained, 11u);
    EXPECT_EQ(d.stats().n_tokens, 17u);
}

TEST(JsonlDataset, TruncationAndSkipping) {
    const std::string line = R"({"prompt": "Once upon a time,", "completion": " there was a little girl named Lily."})";
    // seq_len 8 keeps the first 9 tokens: 3 completion targets remain.
    const rp::Dataset d = jsonl(line, 8);
    EXPECT_EQ(row(d.inputs(0)), (std::vector<int32_t>{1, 403, 407, 261, 378, 432, 383, 286}));
    EXPECT_EQ(row(d.labels(0)), (std::vector<int32_t>{X, X, X, X, X, 383, 286, 261}));
    EXPECT_EQ(d.stats().n_truncated, 1u);
    // seq_len 4 keeps only prompt tokens: the example is skipped; alone, that leaves nothing.
    const std::string two = line + "\n" + R"({"text": "Once upon"})" + "\n";
    const rp::Dataset s = jsonl(two, 4);
    EXPECT_EQ(s.size(), 1u);
    EXPECT_EQ(s.stats().n_skipped, 1u);
    EXPECT_EQ(s.stats().n_examples, 2u);
    EXPECT_EQ(row(s.inputs(0)), (std::vector<int32_t>{1, 403, 407, kEos}));
    EXPECT_EQ(row(s.labels(0)), (std::vector<int32_t>{403, 407, kEos, X}));
    const std::string e = error_of([&] { jsonl(line, 4); });
    EXPECT_NE(e.find("no training sequences"), std::string::npos) << e;
}

TEST(JsonlDataset, MessagesTrainOnlyAssistantTurns) {
    const rp::Tokenizer & q = qwen();
    const int32_t im_start = 267, im_end = 268;
    ASSERT_EQ(q.text_to_token("<|im_start|>"), im_start);
    ASSERT_EQ(q.text_to_token("<|im_end|>"), im_end);
    auto enc = [&](const char * s) { return q.encode(s, false, false); };
    // <|im_start|>user\nthe weather<|im_end|>\n<|im_start|>assistant\nhe ate<|im_end|>\n
    std::vector<int32_t> toks;
    std::vector<uint8_t> trained;
    auto add = [&](const std::vector<int32_t> & ids, bool t) {
        toks.insert(toks.end(), ids.begin(), ids.end());
        trained.insert(trained.end(), ids.size(), t);
    };
    if (q.add_bos()) add({q.bos()}, false);
    add({im_start}, false);
    add(enc("user"), false);
    add(enc("\n"), false);
    add(enc("the weather"), false);
    add({im_end}, false);
    add(enc("\n"), false);
    add({im_start}, false);
    add(enc("assistant"), false);
    add(enc("\n"), false);
    add(enc("he ate"), true);   // the reply ...
    add({im_end}, true);        // ... and its end-of-turn marker
    add(enc("\n"), false);      // not the newline after it

    rp::DatasetOptions o = opts(64);
    o.chat = rp::chat_template_from_name("chatml");
    const rp::Dataset d = rp::Dataset::from_jsonl(
        R"({"messages": [{"role": "user", "content": "the weather"}, {"role": "assistant", "content": "he ate"}]})",
        "chat.jsonl", q, o);
    ASSERT_EQ(d.size(), 1u);
    const std::vector<int32_t> in = row(d.inputs(0)), lab = row(d.labels(0));
    for (size_t i = 0; i < toks.size(); ++i) EXPECT_EQ(in[i], toks[i]) << i;
    for (size_t i = 0; i + 1 < 64; ++i) {
        const int32_t want = i + 1 < toks.size() && trained[i + 1] ? toks[i + 1] : X;
        EXPECT_EQ(lab[i], want) << i;
    }
    EXPECT_EQ(lab[63], X);
    EXPECT_EQ(d.stats().n_trained, enc("he ate").size() + 1);
}

TEST(JsonlDataset, TwoAssistantTurnsAndSystem) {
    rp::DatasetOptions o = opts(128);
    o.chat = rp::chat_template_from_name("chatml");
    const rp::Dataset d = rp::Dataset::from_jsonl(
        R"({"messages": [{"role": "system", "content": "be"}, {"role": "user", "content": "a"},)"
        R"( {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]})",
        "chat.jsonl", qwen(), o);
    std::vector<int32_t> targets;
    for (const int32_t l : d.labels(0)) {
        if (l != X) targets.push_back(l);
    }
    const int32_t b = qwen().encode("b", false)[0], dd = qwen().encode("d", false)[0];
    EXPECT_EQ(targets, (std::vector<int32_t>{b, 268, dd, 268}));
}

TEST(JsonlDataset, TrainOnInputsTrainsEveryToken) {
    rp::DatasetOptions o = opts(64);
    o.chat = rp::chat_template_from_name("chatml");
    o.train_on_inputs = true;
    const std::string line = R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})";
    const rp::Dataset d = rp::Dataset::from_jsonl(line, "chat.jsonl", qwen(), o);
    // every token but the first (nothing predicts it) is a target
    const size_t n = qwen().encode("<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n", true, true).size();
    EXPECT_EQ(d.stats().n_trained, n - 1);
}

struct BadLine {
    const char * text;
    const char * needle;
};

TEST(JsonlDataset, ErrorsNameTheLine) {
    const BadLine cases[] = {
        {"{\"text\": \"ok\"}\n\n{\"text\" \"x\"}\n", "t.jsonl line 3: invalid JSON at byte offset 8: expected ':'"},
        {"{\"text\": \"a\"}\n{\"text\": \"unterminated}\n", "t.jsonl line 2: invalid JSON"},
        {"{\"text\": \"a\", \"prompt\": \"b\", \"completion\": \"c\"}", "line 1: expected the keys {\"text\"}, {\"prompt\", \"completion\"} or {\"messages\"}, got {\"text\", \"prompt\", \"completion\"}"},
        {"{\"prompt\": \"b\"}", "line 1: expected the keys"},
        {"{\"title\": \"b\"}", "got {\"title\"}"},
        {"\n[1, 2]", "line 2: expected a JSON object"},
        {"{\"text\": 5}", "line 1: \"text\" must be a string"},
        {"{\"prompt\": \"a\", \"completion\": null}", "\"completion\" must be a string"},
        {"{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}]}", "line 1: \"messages\" needs a chat template"},
        {"{\"messages\": []}", "\"messages\" must be a non-empty array"},
    };
    for (const BadLine & c : cases) {
        const std::string e = error_of([&] { jsonl(c.text, 16); });
        EXPECT_NE(e.find(c.needle), std::string::npos) << "got: " << e << "\nwant: " << c.needle;
    }
    rp::DatasetOptions o = opts(16);
    o.chat = rp::chat_template_from_name("chatml");
    const BadLine chat_cases[] = {
        {"{\"text\": \"a\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "line 2: \"messages\" has no assistant turn"},
        {"{\"messages\": [{\"content\": \"x\"}]}", "messages[0] needs a string \"role\""},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [1]}]}", "messages[0] needs a string \"content\""},
        {"{\"messages\": [\"hi\"]}", "messages[0] must be an object"},
        {"{\"text\": \"a\"}\n{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}",
         "line 2: messages[0]: role \"tool\" is not one the chat template knows"},
    };
    for (const BadLine & c : chat_cases) {
        const std::string e = error_of([&] { rp::Dataset::from_jsonl(c.text, "c.jsonl", qwen(), o); });
        EXPECT_NE(e.find(c.needle), std::string::npos) << "got: " << e << "\nwant: " << c.needle;
    }
}

TEST(JsonlDataset, CrlfAndBomAndBlankLines) {
    const rp::Dataset d = jsonl("\xEF\xBB\xBF{\"text\": \"Once upon\"}\r\n\r\n  \r\n{\"text\": \"a time\"}", 6);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d.inputs(0)[1], 403);
    EXPECT_EQ(d.stats().n_examples, 2u);
}

} // namespace
