// rp-tokenize: print the tokens of a text under a GGUF model's tokenizer.
//
//   rp-tokenize -m MODEL.gguf [-p TEXT | -f FILE] [--no-bos] [--parse-special] [--ids]
//
// Default output: one line per token, "ID -> 'PIECE'" (as llama.cpp's llama-tokenize). --ids prints only
// the ids, space-separated, on one line. --no-bos adds no BOS / EOS; --parse-special turns special-token
// texts such as <|im_start|> into their ids.
//
//   rp-tokenize -m MODEL.gguf --render-chat CONV.jsonl [--chat-template FILE.jinja|NAME]
//               [--no-generation-prompt] [--no-thinking] [--date YYYY-MM-DD] [--mask]
//
// renders each conversation of CONV.jsonl (one {"messages": [...]} per line) with the model's chat
// template (or the one named) and prints the text, then a line holding only the byte 0x1D. --mask wraps
// each assistant span (the tokens a finetune trains) in U+27EA / U+27EB brackets.
#include "tools/tokenize_options.h"

#include "base/error.h"
#include "ggml_rp/core/json.h"
#include "models/text/chat_template.h"
#include "models/text/tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

namespace {

// One conversation of a --render-chat file: its text, with the assistant spans bracketed when `mask`.
std::string render_conversation(const rp::ChatTemplate & t, const std::string & line, const std::string & where,
                                const rp::ChatOptions & opt, bool mask) {
    const rp::json::Value v = rp::json::parse(line, where);
    const rp::json::Value * msgs = v.find("messages");
    if (!msgs || !msgs->is_array()) throw rp::Error(where + ": expected {\"messages\": [...]}");
    std::vector<rp::ChatMessage> chat;
    for (const rp::json::Value & m : msgs->array) {
        const rp::json::Value * role = m.find("role");
        const rp::json::Value * content = m.find("content");
        const rp::json::Value * reasoning = m.find("reasoning_content");
        if (!role || !role->is_string() || !content || !content->is_string())
            throw rp::Error(where + ": each message needs a string \"role\" and \"content\"");
        chat.push_back({role->string, content->string, reasoning && reasoning->is_string() ? reasoning->string : ""});
    }
    try {
        if (!mask) return t.apply(chat, opt);  // rendering never depends on finding the spans
        const rp::RenderedChat r = t.render(chat, opt);
        std::string out;
        size_t at = 0;
        for (const rp::AssistantSpan & s : r.assistant) {
            out.append(r.text, at, s.begin - at);
            out += "\xe2\x9f\xaa";
            out.append(r.text, s.begin, s.end - s.begin);
            out += "\xe2\x9f\xab";
            at = s.end;
        }
        return out.append(r.text, at, std::string::npos);
    } catch (const rp::Error & e) {
        throw rp::Error(where + ": " + e.what());
    }
}

// --render-chat: one conversation per JSONL line, each followed by a line holding only 0x1D. A conversation
// that fails is named on stderr and its record left empty; the others still render (exit status 1 then).
int render_chats(const rp::Tokenizer & tok, const std::string & path, const std::string & tmpl_name,
                 const rp::ChatOptions & opt, bool mask) {
    const rp::ChatTemplate t = rp::chat_template_for(tok, tmpl_name);
    std::istringstream in(rp::cli::read_file(path));
    std::string line;
    int failed = 0;
    for (size_t n = 1; std::getline(in, line); ++n) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        std::string out;
        try {
            out = render_conversation(t, line, path + " line " + std::to_string(n), opt, mask);
        } catch (const rp::Error & e) {
            std::fprintf(stderr, "error: %s\n", e.what());
            ++failed;
        }
        out += "\n\x1d\n";
        std::fwrite(out.data(), 1, out.size(), stdout);
    }
    return failed ? 1 : 0;
}

// Pieces may hold control characters or partial UTF-8; show those bytes escaped.
std::string printable(const std::string & s) {
    std::string out;
    for (unsigned char c : s) {
        if (c == '\n') {
            out += "\\n";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c < 0x20 || c == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    return out;
}

} // namespace

int main(int argc, char ** argv) {
    try {
        rp::cli::TokenizeSettings s;
        rp::cli::Options opts("rp-tokenize", "usage: rp-tokenize -m MODEL.gguf [-p TEXT | -f FILE] [--no-bos] [--parse-special] [--ids]\n"
                                             "       rp-tokenize -m MODEL.gguf --render-chat CONV.jsonl [options]");
        rp::cli::declare_tokenize_options(opts, s);
        if (!opts.parse(argc, argv)) return 0;
        s.validate();
        if (!s.chats.empty()) {
            rp::ChatOptions chat_opt;
            chat_opt.add_generation_prompt = !s.no_generation_prompt;
            chat_opt.enable_thinking = !s.no_thinking;
            chat_opt.date = s.date;
            const auto tok = rp::Tokenizer::load(s.model_path);
            const int rc = render_chats(*tok, s.chats, s.chat_template, chat_opt, s.mask);
            if (std::fflush(stdout) != 0) throw rp::Error("cannot write to standard output");
            return rc;
        }
        const std::string text = s.prompt ? *s.prompt : rp::cli::read_file(s.text_file);
        const auto tok = rp::Tokenizer::load(s.model_path);
        const std::vector<int32_t> ids = tok->encode(text, !s.no_bos, s.parse_special);
        if (s.ids_only) {
            for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
            std::printf("\n");
        } else {
            for (int32_t id : ids) std::printf("%6d -> '%s'\n", id, printable(tok->token_to_piece(id)).c_str());
        }
        if (std::fflush(stdout) != 0) throw rp::Error("cannot write to standard output");
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
