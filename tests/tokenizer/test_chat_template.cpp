// Chat templates: rendering against hand-written expected strings (llama.cpp's built-in ChatML and Llama 3
// formats), detection from the Qwen vocabulary's tokenizer.chat_template, assistant spans, and the
// rendered text tokenized with special tokens parsed.
#include "tok_test_util.h"

#include "base/error.h"
#include "gguf/gguf.h"
#include "models/text/chat_template.h"

#include <gtest/gtest.h>

using namespace tok_test;
using rp::ChatMessage;

namespace {

const std::vector<ChatMessage> kChat = {
    {"system", "You are terse."},
    {"user", "Hi there"},
    {"assistant", "  Hello!\n"},
    {"user", "Bye"},
};

TEST(ChatTemplate, ChatMLRendering) {
    const rp::RenderedChat r = rp::render_chat(rp::chat_template_from_name("chatml"), kChat, true);
    EXPECT_EQ(r.text,
              "<|im_start|>system\nYou are terse.<|im_end|>\n"
              "<|im_start|>user\nHi there<|im_end|>\n"
              "<|im_start|>assistant\n  Hello!\n<|im_end|>\n"
              "<|im_start|>user\nBye<|im_end|>\n"
              "<|im_start|>assistant\n");
    ASSERT_EQ(r.assistant.size(), 1u);
    const rp::AssistantSpan & a = r.assistant[0];
    EXPECT_EQ(r.text.substr(a.begin, a.content_end - a.begin), "  Hello!\n");  // ChatML keeps content as is
    EXPECT_EQ(r.text.substr(a.content_end, a.end - a.content_end), "<|im_end|>");
    EXPECT_EQ(a.begin, std::string("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                                   "<|im_start|>assistant\n").size());
    EXPECT_EQ(rp::render_chat(rp::chat_template_from_name("chatml"), {{"user", "x"}}, false).text, "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplate, Llama3Rendering) {
    const rp::RenderedChat r = rp::render_chat(rp::chat_template_from_name("llama3"), kChat, true);
    EXPECT_EQ(r.text,
              "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    ASSERT_EQ(r.assistant.size(), 1u);
    const rp::AssistantSpan & a = r.assistant[0];
    EXPECT_EQ(r.text.substr(a.begin, a.content_end - a.begin), "Hello!");  // Llama 3 trims content
    EXPECT_EQ(r.text.substr(a.content_end, a.end - a.content_end), "<|eot_id|>");
}

TEST(ChatTemplate, SeveralAssistantTurns) {
    const rp::RenderedChat r = rp::render_chat(
        rp::chat_template_from_name("chatml"), {{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}}, false);
    ASSERT_EQ(r.assistant.size(), 2u);
    EXPECT_EQ(r.text.substr(r.assistant[0].begin, 1), "b");
    EXPECT_EQ(r.text.substr(r.assistant[1].begin, 1), "d");
    EXPECT_EQ(r.assistant[1].end, r.text.size() - 1);  // only the final "\n" follows
}

// Templates that write no marker right after a reply: the marker is what they write between a reply and the next
// user turn's opening ("\n\n" here, as rwkv-world's), only where the rendering has it (not after the last reply);
// one that writes nothing (GLM's next "<|user|>" opens a turn) gives the reply alone; a reply that contains the
// terminator is still found where it was put (substitution, not a search for the marker).
TEST(ChatTemplate, TemplatesWithoutAMarkerRightAfterAReply) {
    const rp::ChatTemplate rwkv(R"J({% for m in messages %}{% if not loop.first %}{{ '\n\n' }}{% endif %}{{ m.role | capitalize }}: {{ m.content }}{% endfor %})J",
                                "rwkv-like");
    const rp::RenderedChat r = rwkv.render({{"user", "a"}, {"assistant", "b\n\nc"}, {"user", "d"}, {"assistant", "e"}}, {});
    EXPECT_EQ(r.text, "User: a\n\nAssistant: b\n\nc\n\nUser: d\n\nAssistant: e");
    ASSERT_EQ(r.assistant.size(), 2u);
    EXPECT_EQ(r.text.substr(r.assistant[0].begin, r.assistant[0].end - r.assistant[0].begin), "b\n\nc\n\n");
    EXPECT_EQ(r.assistant[0].content_end - r.assistant[0].begin, 4u);
    EXPECT_EQ(r.text.substr(r.assistant[1].begin), "e");  // the last reply: nothing after it
    EXPECT_EQ(r.assistant[1].end, r.text.size());
    const rp::ChatTemplate glm("[gMASK]{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{% endfor %}", "glm-like");
    const rp::RenderedChat g = glm.render({{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}}, {});
    ASSERT_EQ(g.assistant.size(), 2u);
    for (const rp::AssistantSpan & s : g.assistant) EXPECT_EQ(s.end, s.content_end);
    EXPECT_EQ(g.text.substr(g.assistant[0].begin, 1), "b");
    EXPECT_EQ(g.text.substr(g.assistant[1].begin, 1), "d");
}

TEST(ChatTemplate, FromModelAndNames) {
    // The Qwen vocabulary's own template renders (it adds Qwen2.5's default system message); a name overrides it.
    const auto reader = gguf::Reader::open(models_dir() + "/vocab/ggml-vocab-qwen2.gguf");
    const rp::RenderedChat own = rp::render_chat(rp::chat_template_for(*reader), {{"user", "Hi"}}, true);
    EXPECT_NE(own.text.find("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), std::string::npos) << own.text;
    EXPECT_EQ(rp::chat_template_for(*reader, "llama3").name(), "llama3");
    EXPECT_NE(vocab("qwen2").chat_template().find("<|im_start|>"), std::string::npos);
    EXPECT_EQ(rp::chat_template_from_name("chatml").name(), "chatml");
    EXPECT_THROW(rp::chat_template_from_name("vicuna"), rp::Error);
    EXPECT_THROW(rp::chat_template_from_name("/nonexistent/x.jinja"), rp::Error);
    const auto stories = gguf::Reader::open(models_dir() + "/stories260K.gguf");
    try {
        rp::chat_template_for(*stories);
        ADD_FAILURE() << "no error";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("stories260K.gguf"), std::string::npos) << e.what();
    }
}

TEST(ChatTemplate, TokenizedWithSpecialTokensAndMask) {
    // Qwen: the rendered text tokenizes into the control ids, and the assistant span covers exactly the
    // reply's tokens plus <|im_end|>.
    const rp::Tokenizer & q = vocab("qwen2");
    const rp::RenderedChat r = rp::render_chat(rp::chat_template_from_name("chatml"), {{"user", "Hi"}, {"assistant", "Hello"}}, false);
    std::vector<size_t> offs;
    const std::vector<int32_t> ids = q.encode(r.text, false, true, &offs);
    // ids read off the vocabulary: user 872, Ċ 198, Hi 13048, assistant 77091, Hello 9707
    EXPECT_EQ(ids, (std::vector<int32_t>{151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198, 9707, 151645, 198}));
    std::vector<int32_t> trained;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (offs[i] >= r.assistant[0].begin && offs[i] < r.assistant[0].end) {
            trained.push_back(ids[i]);
        }
    }
    EXPECT_EQ(trained, (std::vector<int32_t>{9707, 151645}));
    // Llama 3 with BOS
    const rp::Tokenizer & l = vocab("llama-bpe");
    const rp::RenderedChat r3 = rp::render_chat(rp::chat_template_from_name("llama3"), {{"user", "Hi"}}, true);
    EXPECT_EQ(l.encode(r3.text, true, true),
              (std::vector<int32_t>{128000, 128006, 882, 128007, 271, 13347, 128009, 128006, 78191, 128007, 271}));
}

TEST(ChatTemplate, OwnGgufTemplateEndToEnd) {
    // The vocabulary's own tokenizer.chat_template, rendered by the interpreter and tokenized with special
    // tokens parsed: the control tokens become their ids and the span covers exactly the reply's tokens
    // and <|im_end|>.
    const rp::Tokenizer & q = vocab("qwen2");
    const rp::ChatTemplate t = rp::chat_template_for(q);
    const rp::RenderedChat r = rp::render_chat(t, {{"user", "Hi"}, {"assistant", "Hello"}}, false);
    EXPECT_EQ(r.text, "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                      "<|im_start|>assistant\nHello<|im_end|>\n");
    std::vector<size_t> offs;
    const std::vector<int32_t> ids = q.encode(r.text, false, true, &offs);
    ASSERT_EQ(r.assistant.size(), 1u);
    std::vector<int32_t> trained;
    for (size_t i = 0; i < ids.size(); ++i)
        if (offs[i] >= r.assistant[0].begin && offs[i] < r.assistant[0].end) trained.push_back(ids[i]);
    EXPECT_EQ(trained, (std::vector<int32_t>{9707, 151645}));
    EXPECT_EQ(ids.front(), 151644);  // <|im_start|>
}

TEST(ChatTemplate, BosStrippedWhenTheTokenizerAddsIt) {
    // A template that writes bos_token (Llama 3.1) with a tokenizer that adds BOS: the text does not
    // start with it, so the encoded ids hold one BOS, not two.
    rp::ChatTemplate t("{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}", "t");
    t.set_special_tokens("<|begin_of_text|>", "<|end_of_text|>", true, false);
    EXPECT_EQ(rp::render_chat(t, {{"user", "a"}}, false).text, "[a]");
    t.set_special_tokens("<|begin_of_text|>", "<|end_of_text|>", false, false);
    EXPECT_EQ(rp::render_chat(t, {{"user", "a"}}, false).text, "<|begin_of_text|>[a]");
}

TEST(ChatTemplate, ErrorsNameTheTemplateAndLine) {
    try {
        rp::ChatTemplate("ok\n{% include 'other.jinja' %}", "my.jinja");
        ADD_FAILURE() << "no error";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("chat template my.jinja: jinja: line 2, column 4: unsupported statement"),
                  std::string::npos) << e.what();
    }
    const rp::ChatTemplate raising("{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}"
                                   "{% endif %}{% endfor %}", "r");
    try {
        rp::render_chat(raising, {{"tool", "x"}}, false);
        ADD_FAILURE() << "no error";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("no tools here"), std::string::npos) << e.what();
    }
    // a reply holding the end-of-turn marker cannot be masked
    EXPECT_THROW(rp::render_chat(rp::chat_template_from_name("chatml"), {{"user", "a"}, {"assistant", "x<|im_end|>y"}}, false),
                 rp::Error);
}

} // namespace
