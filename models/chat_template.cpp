#include "models/chat_template.h"

#include "base/error.h"
#include "gguf/gguf.h"

namespace rp {

namespace {

// llama.cpp's trim(): ASCII whitespace (isspace in the C locale) at both ends.
std::string_view trim(std::string_view s) {
    auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; };
    size_t b = 0, e = s.size();
    while (b < e && space(s[b])) {
        ++b;
    }
    while (e > b && space(s[e - 1])) {
        --e;
    }
    return s.substr(b, e - b);
}

} // namespace

ChatTemplate chat_template_from_name(std::string_view name) {
    if (name == "chatml" || name == "qwen" || name == "qwen2" || name == "qwen3") {
        return ChatTemplate::ChatML;
    }
    if (name == "llama3" || name == "llama-3") {
        return ChatTemplate::Llama3;
    }
    throw Error("unknown chat template '" + std::string(name) + "' (known: chatml, llama3)");
}

ChatTemplate detect_chat_template(std::string_view jinja) {
    auto has = [&](const char * marker) { return jinja.find(marker) != std::string_view::npos; };
    if (has("<|im_start|>")) {
        return ChatTemplate::ChatML;
    }
    if (has("<|start_header_id|>") && has("<|end_header_id|>")) {
        return ChatTemplate::Llama3;
    }
    throw Error("chat template not recognised (neither ChatML <|im_start|> nor Llama 3 <|start_header_id|>): '" +
                std::string(jinja.substr(0, 80)) + (jinja.size() > 80 ? "...'" : "'"));
}

ChatTemplate chat_template_for(const gguf::Reader & reader, std::string_view name) {
    if (!name.empty()) {
        return chat_template_from_name(name);
    }
    const gguf::KV * kv = reader.find("tokenizer.chat_template");
    if (!kv) {
        throw Error(reader.path() + ": no tokenizer.chat_template; name a chat template (chatml, llama3)");
    }
    try {
        return detect_chat_template(reader.get_string("tokenizer.chat_template"));
    } catch (const Error & e) {
        throw Error(reader.path() + ": key 'tokenizer.chat_template': " + e.what());
    }
}

const char * chat_template_name(ChatTemplate t) {
    switch (t) {
        case ChatTemplate::ChatML: return "chatml";
        case ChatTemplate::Llama3: return "llama3";
    }
    return "?";
}

RenderedChat render_chat(ChatTemplate t, const std::vector<ChatMessage> & messages, bool add_generation_prompt) {
    RenderedChat r;
    std::string & s = r.text;
    for (const ChatMessage & m : messages) {
        std::string_view content = m.content;
        const char * eot = nullptr;
        if (t == ChatTemplate::ChatML) {
            s += "<|im_start|>" + m.role + "\n";
            eot = "<|im_end|>";
        } else {
            s += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
            content = trim(content);
            eot = "<|eot_id|>";
        }
        AssistantSpan span;
        span.begin = s.size();
        s += content;
        span.content_end = s.size();
        s += eot;
        span.end = s.size();
        if (t == ChatTemplate::ChatML) {
            s += "\n";
        }
        if (m.role == "assistant") {
            r.assistant.push_back(span);
        }
    }
    if (add_generation_prompt) {
        s += t == ChatTemplate::ChatML ? "<|im_start|>assistant\n" : "<|start_header_id|>assistant<|end_header_id|>\n\n";
    }
    return r;
}

} // namespace rp
