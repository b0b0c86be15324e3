// rp-chat-oracle: llama.cpp's own chat-template rendering (prebuilt libllama-common, the v0.4.0 oracle), for
// the parity test test_chat_oracle.cpp.
//   rp-chat-oracle TEMPLATE.jinja [--no-generation-prompt] [--no-thinking] [--bos TEXT] [--eos TEXT]
//                  [--date YYYY-MM-DD] < CONVERSATIONS.jsonl
// Each input line is {"messages": [{"role": ..., "content": ..., "reasoning_content": ...}, ...]}; for each
// the program writes common_chat_templates_apply(...).prompt (use_jinja, no tools) followed by one 0x1D byte.
// No model is loaded: the template comes from the file and bos/eos from the flags, so add_bos / add_eos are
// false and nothing is stripped. --date sets `now` and, as chat_template_kwargs, the date_string / datetime
// that llama.cpp otherwise takes from the clock (same formats as its common_chat_extra_context). An error
// is written as "ERROR: what" in place of the rendering (a template that raises is a test case too).
//   rp-chat-oracle --builtin NAME [--no-generation-prompt] < CONVERSATIONS.jsonl
// renders with llama.cpp's built-in formatter NAME instead (llama_chat_apply_template: "phi4", "chatml", ...), the
// independent statement of a format that a template of ours must render.
#include "chat.h"
#include "llama.h"

#include <vector>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

static std::string quoted(const std::string & s) { return common_json(s).dump(); }

// Each non-empty input line parsed and rendered by `render`, written with a 0x1D after it; an exception's text
// stands in as "ERROR: what".
static void render_lines(const std::function<std::string(const common_json &)> & render) {
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line.empty()) continue;
        std::string out;
        try {
            out = render(common_json::parse(line));
        } catch (const std::exception & e) {
            out = std::string("ERROR: ") + e.what();
        }
        std::fwrite(out.data(), 1, out.size(), stdout);
        std::fputc(0x1D, stdout);
    }
}

// llama.cpp's built-in formatter `name` (llama_chat_apply_template) on one conversation.
static std::string builtin_format(const std::string & name, const common_json & j, bool add_ass) {
    std::vector<std::string> roles, contents;
    for (const common_json & m : j.at("messages")) {
        roles.push_back(m.at("role").get<std::string>());
        contents.push_back(m.at("content").get<std::string>());
    }
    std::vector<llama_chat_message> chat;
    for (size_t k = 0; k < roles.size(); ++k) chat.push_back({roles[k].c_str(), contents[k].c_str()});
    std::vector<char> buf(4096);
    for (const std::string & c : contents) buf.resize(buf.size() + 2 * c.size());
    int32_t n = llama_chat_apply_template(name.c_str(), chat.data(), chat.size(), add_ass, buf.data(), (int32_t) buf.size());
    if (n > (int32_t) buf.size()) {
        buf.resize((size_t) n);
        n = llama_chat_apply_template(name.c_str(), chat.data(), chat.size(), add_ass, buf.data(), (int32_t) buf.size());
    }
    if (n < 0) throw std::runtime_error("llama_chat_apply_template has no format '" + name + "'");
    return std::string(buf.data(), (size_t) n);
}

int main(int argc, char ** argv) {
    if (argc >= 3 && std::string(argv[1]) == "--builtin") {
        const std::string name = argv[2];
        const bool add_ass = !(argc >= 4 && std::string(argv[3]) == "--no-generation-prompt");
        render_lines([&](const common_json & j) { return builtin_format(name, j, add_ass); });
        return 0;
    }
    if (argc < 2) {
        std::fprintf(stderr, "usage: rp-chat-oracle TEMPLATE.jinja [--no-generation-prompt] [--no-thinking] "
                             "[--bos TEXT] [--eos TEXT] [--date YYYY-MM-DD] < conversations.jsonl\n");
        return 2;
    }
    std::ifstream f(argv[1], std::ios::binary);
    if (!f) {
        std::fprintf(stderr, "rp-chat-oracle: cannot open %s\n", argv[1]);
        return 2;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    bool gen = true, think = true;
    std::string bos, eos, date;
    for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--no-generation-prompt") gen = false;
        else if (a == "--no-thinking") think = false;
        else if (a == "--bos" && i + 1 < argc) bos = argv[++i];
        else if (a == "--eos" && i + 1 < argc) eos = argv[++i];
        else if (a == "--date" && i + 1 < argc) date = argv[++i];
        else {
            std::fprintf(stderr, "rp-chat-oracle: bad argument %s\n", a.c_str());
            return 2;
        }
    }
    auto tmpls = common_chat_templates_init(nullptr, ss.str(), bos, eos);
    std::tm day{};
    if (!date.empty()) {
        if (std::sscanf(date.c_str(), "%d-%d-%d", &day.tm_year, &day.tm_mon, &day.tm_mday) != 3) {
            std::fprintf(stderr, "rp-chat-oracle: --date %s is not YYYY-MM-DD\n", date.c_str());
            return 2;
        }
        day.tm_year -= 1900;
        day.tm_mon -= 1;
        day.tm_hour = 12;
        day.tm_isdst = -1;
    }
    render_lines([&](const common_json & j) {
        common_chat_templates_inputs in;
        for (const common_json & m : j.at("messages")) {
            common_chat_msg msg;
            msg.role = m.at("role").get<std::string>();
            msg.content = m.at("content").get<std::string>();
            if (m.contains("reasoning_content")) msg.reasoning_content = m.at("reasoning_content").get<std::string>();
            in.messages.push_back(msg);
        }
        in.use_jinja = true;
        in.add_generation_prompt = gen;
        in.enable_thinking = think;
        if (!date.empty()) {
            std::tm tm = day;
            in.now = std::chrono::system_clock::from_time_t(std::mktime(&tm));
            char b1[64], b2[64];
            std::strftime(b1, sizeof b1, "%d %b %Y", &tm);
            std::strftime(b2, sizeof b2, "%b %d %Y", &tm);
            in.chat_template_kwargs["date_string"] = quoted(b1);
            in.chat_template_kwargs["datetime"] = quoted(b2);
        }
        return common_chat_templates_apply(tmpls.get(), in).prompt;
    });
    return 0;
}
