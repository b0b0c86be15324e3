// libFuzzer target: arbitrary bytes -> chat messages (role chosen by a byte, content up to the next 0xFF)
// -> render_chat with every template, with and without the generation prompt. Rendering never fails; every
// message's content (Llama 3: trimmed, as its template does) appears in the text in order; every assistant
// span lies inside the text, in order, and is exactly that turn's content followed by an end-of-turn marker.
#include "base/error.h"
#include "models/chat_template.h"

#include <cstddef>
#include <cstdint>
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

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static const char * const roles[] = {"system", "user", "assistant"};
    std::vector<rp::ChatMessage> msgs;
    for (size_t i = 0; i < size && msgs.size() < 64;) {
        const std::string role = roles[data[i] % 3];
        size_t j = i + 1;
        while (j < size && data[j] != 0xFF) ++j;
        msgs.push_back({role, std::string(reinterpret_cast<const char *>(data) + i + 1, j - i - 1)});
        i = j + 1;
    }
    for (const rp::ChatTemplate t : {rp::chat_template_from_name("chatml"), rp::chat_template_from_name("llama3")})
        for (const bool gen : {false, true}) {
            const bool trims = t == rp::chat_template_from_name("llama3");
            auto kept = [&](const std::string & c) { return trims ? std::string(llama3_trim(c)) : c; };
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
                if (r.text.compare(s.begin, s.content_end - s.begin, kept(m.content)) != 0) __builtin_trap();
                prev = s.end;
            }
            if (a != r.assistant.size()) __builtin_trap();
        }
    return 0;
}
