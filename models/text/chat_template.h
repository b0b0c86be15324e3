// Chat templates: render a conversation into the text a chat model was trained on, and say which bytes
// of it are the assistant's replies (the tokens a finetune computes its loss on).
//
// The template is the model's own Jinja source (tokenizer.chat_template), rendered by our interpreter
// (models/jinja/jinja.h) to exactly the text llama.cpp's common_chat_templates_apply puts in `.prompt`
// (use_jinja, no tools) for the templates we test against it. The variables it sees are llama.cpp's:
//   messages            [{content, reasoning_content (only when not empty), role}, ...]
//   bos_token, eos_token the vocabulary's BOS / EOS text ("" when the template is used without a vocabulary)
//   enable_thinking     (Qwen3 / QwQ / DeepSeek-R1 thinking switch)
//   add_generation_prompt  set only when true (llama.cpp leaves it undefined otherwise, and templates test
//                       `is defined`)
//   date_string, datetime  the date as "%d %b %Y" and "%b %d %Y" (llama.cpp always sets both, so Llama 3.1+
//                       print that date, not their "26 Jul 2024" fallback); strftime_now formats the same day.
// No format-specific rewrite is applied but for gpt-oss's harmony format (a template with "<|channel|>",
// llama.cpp's test for it): as llama.cpp does, a message's reasoning_content is also passed as `thinking`
// (what that template reads), and an inference prompt without a generation prompt has its last <|return|>
// (the token that ends a final answer) replaced by <|end|> (a message that the conversation goes on
// after); a training text keeps it, so the model learns to stop. For the other templates llama.cpp's
// `.prompt` is the plain rendering (its autoparser only adds to `.prompt` when continuing a final message,
// which we never do). When the
// tokenizer adds BOS itself (strip_bos), a leading bos_token is removed from the text, as llama.cpp does
// with the vocabulary's add_bos, so a Llama 3 rendering does not get two <|begin_of_text|>.
//
// Assistant spans (the mask rule, TRL's incremental rendering): for assistant message i,
//   begin = after the longest piece of the generation prompt that the turn's rendering starts with, cut
//           after a newline, after a '>' (the end of a marker) or at the prompt's end. That is, past
//           render(messages[0..i), add_generation_prompt = false), which must be a prefix of the whole
//           rendering, and then as far into render(messages[0..i), add_generation_prompt = true) as the
//           whole rendering agrees with it. So the span starts after the turn's header
//           (<|im_start|>assistant\n, <｜Assistant｜>, ...) even where the generation prompt goes on with
//           a think opener that the turn does not have (QwQ and DeepSeek-R1 earlier replies, Qwen3 with
//           thinking off), and after that opener where the turn has it.
//   end   = just after the first end-of-turn marker at or after `begin` (the marker is found once per
//           template by rendering a probe reply: the text that follows the reply up to a blank, e.g.
//           <|im_end|>, <|eot_id|>, <｜end▁of▁sentence｜>); whitespace after the marker is not part of it.
//   content_end = end - the marker's length.
// So a span holds whatever the template writes for the reply after the generation prompt: the content,
// rewritten as the template does (Qwen3 adds "<think>\n\n</think>\n\n" to a reply after the last user
// message; DeepSeek-R1 drops an earlier reply's <think> part) and the marker. A template for which the
// prefix is not a prefix of the whole, or no marker follows, throws rp::Error naming the message; so does
// a reply whose content contains the marker itself.
// Harmony (gpt-oss): an assistant message may be several messages, an analysis (its reasoning) then the
// final answer ("<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...").
// Its span is the final one, from its "<|channel|>final<|message|>" header to its marker, <|end|> or
// <|return|>; with ChatOptions::train_analysis it starts after the generation prompt instead, taking in the
// analysis too.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gguf {
class Reader;
}

namespace rp {

class Tokenizer;

namespace jinja {
class Template;
}

struct ChatMessage {
    std::string role;  // "system", "user", "assistant", ...
    std::string content;
    std::string reasoning_content = {};  // Qwen3, gpt-oss: the reply's thinking; empty = none
};

// One assistant turn in the rendered text: [begin, content_end) is the reply as the template writes it,
// [content_end, end) the end-of-turn marker after it, which a finetune trains too so the model learns to stop.
// A template that writes no marker right after a reply (GLM's "<|user|>" opens the next turn; rwkv-world's "\n\n",
// Nemotron-Nano-v2's "\n<SPECIAL_12>" and Laguna's "\n</assistant>" start with whitespace) gets as its marker what
// it writes between a reply and the next user turn's own opening (the text before a lone user message's content):
// possibly nothing (GLM-4: the span is the reply alone), and only where the rendering has it (Apertus writes its
// "<|assistant_end|>" after every reply but the last).
struct AssistantSpan {
    size_t begin = 0;
    size_t content_end = 0;
    size_t end = 0;
};

struct RenderedChat {
    std::string text;
    std::vector<AssistantSpan> assistant;
};

struct ChatOptions {
    bool add_generation_prompt = false;
    bool enable_thinking = true;
    std::string date;  // "YYYY-MM-DD"; empty: today (local time)
    // A prompt for inference (llama.cpp's is_inference), or a training text: only harmony renders them
    // differently (the header's rule).
    bool inference = true;
    // Harmony: the assistant spans also hold the analysis (reasoning) messages, not only the final answers.
    bool train_analysis = false;
};

class ChatTemplate {
public:
    // Parses `source` (throws rp::Error with the line on a syntax error or unsupported construct). `name`
    // is for messages ("tokenizer.chat_template", a file name, "chatml").
    ChatTemplate(const std::string & source, std::string name);

    // BOS / EOS texts for bos_token / eos_token; strip_bos / strip_eos: the tokenizer adds them itself, so
    // a leading bos_token (trailing eos_token) is removed from renderings.
    void set_special_tokens(std::string bos, std::string eos, bool strip_bos, bool strip_eos);

    const std::string & name() const { return name_; }
    const std::string & source() const { return source_; }

    // The rendering alone (what llama.cpp's common_chat_templates_apply returns as .prompt). A template that
    // has no system role (one that raises on it, or leaves it out: Gemma 2's) gets the system message as
    // llama.cpp passes it: "system\nfirst message" in the message after it, or dropped when alone.
    std::string apply(const std::vector<ChatMessage> & messages, const ChatOptions & opt) const;
    // The rendering with its assistant spans (the rule above).
    RenderedChat render(const std::vector<ChatMessage> & messages, const ChatOptions & opt) const;

private:
    std::string end_of_turn(const ChatOptions & opt) const;
    // The marker of a template without one right after a reply (AssistantSpan's rule); "" when it writes none.
    std::string turn_terminator(const ChatOptions & opt) const;
    // For a template that writes more after a conversation's last reply than after the others (Cohere's open the
    // next assistant turn, or a system instruction): what a reply's end has in common wherever it stands, without
    // the next turn's opening (the start of the generation prompt).
    std::string shared_terminator(const ChatOptions & opt) const;
    AssistantSpan harmony_span(const std::string & text, size_t begin, const ChatMessage & m, const std::string & where,
                               const ChatOptions & opt) const;

    std::string name_, source_;
    bool harmony_ = false;      // gpt-oss's channels
    bool blocks_ = false;       // Ministral 3: system and assistant contents as a list of typed blocks
    bool system_role_ = true;   // false: a system message is folded into the next one (llama.cpp's workaround)
    bool trim_contents_ = false;  // StepFun-3.5's template: every content and reasoning trimmed first (llama.cpp's workaround)
    std::shared_ptr<const jinja::Template> tmpl_;
    std::string bos_, eos_;
    bool strip_bos_ = false, strip_eos_ = false;
};

// A built-in template by name: "chatml" (also "qwen", "qwen2", "qwen3") or "llama3" (also "llama-3"), the
// two fixed formats of earlier versions (ChatML; Llama 3 without BOS in the text and with trimmed contents,
// no system message added). Or, when `name` ends in ".jinja" or names an existing file, that file's
// template. Throws rp::Error otherwise.
ChatTemplate chat_template_from_name(std::string_view name);
// The template of a model: `name` (as chat_template_from_name) when not empty, else tokenizer.chat_template.
// The Tokenizer form also sets bos/eos from the vocabulary (and strips BOS / EOS when the tokenizer adds
// them). Throws rp::Error when the file has no template and no name is given.
ChatTemplate chat_template_for(const gguf::Reader & reader, std::string_view name = {});
ChatTemplate chat_template_for(const Tokenizer & tok, std::string_view name = {});

// render() with default options and the given add_generation_prompt.
RenderedChat render_chat(const ChatTemplate & t, const std::vector<ChatMessage> & messages, bool add_generation_prompt);
// The rendering a finetune trains on: no generation prompt, a training text (ChatOptions::inference false).
RenderedChat render_training_chat(const ChatTemplate & t, const std::vector<ChatMessage> & messages, bool train_analysis = false);

} // namespace rp
