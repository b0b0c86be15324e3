// libFuzzer target for the Jinja interpreter and the chat-template API.
//   Input: TEMPLATE 0x00 CONVERSATION, where CONVERSATION is messages (role chosen by a byte, content up to
//   the next 0xFF). Without a 0x00 the whole input is the conversation.
// 1. The template bytes are parsed and rendered (with and without the generation prompt, thinking on and
//    off) and their assistant spans computed: anything may be refused, but only with rp::Error — never a
//    crash, a hang, a leak or another exception.
// 2. The conversation is rendered with the built-in chatml and llama3 templates, which never fail: every
//    message's content (Llama 3: trimmed) appears in order, and every assistant span lies in the text, in
//    order, and is that turn's content followed by the end-of-turn marker (when the content does not hold
//    the marker itself, which is refused with rp::Error).
#include "base/error.h"
#include "models/text/chat_template.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

// What Llama 3's template keeps of a content (its `| trim`: ASCII whitespace at both ends, as llama.cpp).
std::string_view llama3_trim(std::string_view s) {
    auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; };
    while (!s.empty() && space(s.front())) s.remove_prefix(1);
    while (!s.empty() && space(s.back())) s.remove_suffix(1);
    return s;
}

void check_builtin(const rp::ChatTemplate & t, bool trims, const char * eot, const std::vector<rp::ChatMessage> & msgs) {
    for (const rp::ChatMessage & m : msgs)
        if (m.role == "assistant" && m.content.find(eot) != std::string::npos) return;  // refused by design
    auto kept = [&](const std::string & c) { return trims ? std::string(llama3_trim(c)) : c; };
    for (const bool gen : {false, true}) {
        rp::RenderedChat r;
        try {
            r = rp::render_chat(t, msgs, gen);
        } catch (const rp::Error &) {
            __builtin_trap();
        }
        size_t at = 0;
        for (const rp::ChatMessage & m : msgs) {
            const std::string c = kept(m.content);
            const size_t k = r.text.find(c, at);
            if (k == std::string::npos) __builtin_trap();
            at = k + c.size();
        }
        size_t prev = 0, a = 0;
        for (const rp::ChatMessage & m : msgs) {
            if (m.role != "assistant") continue;
            if (a >= r.assistant.size()) __builtin_trap();
            const rp::AssistantSpan & s = r.assistant[a++];
            if (s.begin < prev || s.begin > s.content_end || s.content_end > s.end || s.end > r.text.size()) __builtin_trap();
            // The span may start inside a reply that begins like the generation prompt's tail; it always
            // ends with the content and the marker.
            const std::string c = kept(m.content);
            if (s.content_end - s.begin > c.size() ||
                r.text.compare(s.begin, s.content_end - s.begin, c, c.size() - (s.content_end - s.begin)) != 0)
                __builtin_trap();
            if (r.text.compare(s.content_end, s.end - s.content_end, eot) != 0) __builtin_trap();
            prev = s.end;
        }
        if (a != r.assistant.size()) __builtin_trap();
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const char * bytes = reinterpret_cast<const char *>(data);
    const void * zero = std::memchr(data, 0, size);
    const size_t split = zero ? static_cast<size_t>(static_cast<const uint8_t *>(zero) - data) : 0;
    const size_t conv = zero ? split + 1 : 0;
    static const char * const roles[] = {"system", "user", "assistant"};
    std::vector<rp::ChatMessage> msgs;
    for (size_t i = conv; i < size && msgs.size() < 64;) {
        const std::string role = roles[static_cast<uint8_t>(bytes[i]) % 3];
        size_t j = i + 1;
        while (j < size && data[j] != 0xFF) ++j;
        msgs.push_back({role, std::string(bytes + i + 1, j - i - 1)});
        i = j + 1;
    }
    if (zero) {
        try {
            rp::ChatTemplate t(std::string(bytes, split), "fuzz");
            t.set_special_tokens("<s>", "</s>", (data[0] & 1) != 0, (data[0] & 2) != 0);
            for (const bool gen : {false, true})
                for (const bool think : {false, true}) {
                    rp::ChatOptions o;
                    o.add_generation_prompt = gen;
                    o.enable_thinking = think;
                    o.date = "2024-02-29";
                    try {
                        t.render(msgs, o);
                    } catch (const rp::Error &) {
                    }
                }
        } catch (const rp::Error &) {
        }
    }
    check_builtin(rp::chat_template_from_name("chatml"), false, "<|im_end|>", msgs);
    check_builtin(rp::chat_template_from_name("llama3"), true, "<|eot_id|>", msgs);
    return 0;
}
