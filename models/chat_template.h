// Chat templates: render a conversation into the text a chat model was trained on, and say which bytes
// of it are the assistant's replies (the tokens a finetune computes its loss on).
//
// We do not run Jinja. Like llama.cpp's built-in templates (llama-chat.cpp), a template is recognised by
// its markers in tokenizer.chat_template, or chosen by name, and rendered by code:
//   ChatML (Qwen2 / 2.5 / 3):  <|im_start|>{role}\n{content}<|im_end|>\n ...   [<|im_start|>assistant\n]
//   Llama 3:  <|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|> ...
//             [<|start_header_id|>assistant<|end_header_id|>\n\n]
// As in llama.cpp, no default system message is inserted and Llama 3's <|begin_of_text|> is not part of
// the text (the tokenizer adds it as BOS). Encode the rendered text with parse_special = true.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace gguf {
class Reader;
}

namespace rp {

enum class ChatTemplate { ChatML, Llama3 };

struct ChatMessage {
    std::string role;  // "system", "user", "assistant", ...
    std::string content;
};

// One assistant turn in the rendered text: [begin, content_end) is the reply itself, [content_end, end)
// the end-of-turn marker after it (<|im_end|> or <|eot_id|>), which a finetune usually trains too so the
// model learns to stop.
struct AssistantSpan {
    size_t begin = 0;
    size_t content_end = 0;
    size_t end = 0;
};

struct RenderedChat {
    std::string text;
    std::vector<AssistantSpan> assistant;
};

// "chatml" (also "qwen", "qwen2", "qwen3") or "llama3" (also "llama-3"). Throws rp::Error otherwise.
ChatTemplate chat_template_from_name(std::string_view name);
// Recognises a Jinja template by its markers ("<|im_start|>" -> ChatML; "<|start_header_id|>" and
// "<|end_header_id|>" -> Llama 3). Throws rp::Error when it is neither.
ChatTemplate detect_chat_template(std::string_view jinja);
// The template of a model: by `name` when it is not empty, else from tokenizer.chat_template.
// Throws rp::Error when the file has no template and no name is given, or the template is unknown.
ChatTemplate chat_template_for(const gguf::Reader & reader, std::string_view name = {});
const char * chat_template_name(ChatTemplate t);

// Renders the messages in order; add_generation_prompt appends the header of an assistant turn.
RenderedChat render_chat(ChatTemplate t, const std::vector<ChatMessage> & messages, bool add_generation_prompt);

} // namespace rp
