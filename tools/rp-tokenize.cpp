// rp-tokenize: print the tokens of a text under a GGUF model's tokenizer.
//
//   rp-tokenize -m MODEL.gguf [-p TEXT | -f FILE] [--no-bos] [--parse-special] [--ids]
//
// Default output: one line per token, "ID -> 'PIECE'" (as llama.cpp's llama-tokenize). --ids prints only
// the ids, space-separated, on one line. --no-bos adds no BOS / EOS; --parse-special turns special-token
// texts such as <|im_start|> into their ids.
#include "tools/cli.h"
#include "base/error.h"
#include "models/tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

namespace {

void usage(FILE * f) {
    std::fprintf(f,
                 "usage: rp-tokenize -m MODEL.gguf [-p TEXT | -f FILE] [--no-bos] [--parse-special] [--ids]\n"
                 "  -m, --model FILE     GGUF file whose tokenizer to use (a vocab-only file is fine)\n"
                 "  -p, --prompt TEXT    text to tokenize\n"
                 "  -f, --file FILE      read the text from FILE (bytes as they are)\n"
                 "      --no-bos         do not add BOS / EOS tokens\n"
                 "      --parse-special  match special-token texts (<|im_start|>, <s>, ...)\n"
                 "      --ids            print only the ids, on one line\n");
}

using rp::cli::read_file;


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
    std::string model, prompt, file;
    bool have_prompt = false, no_bos = false, parse_special = false, ids_only = false;
    try {
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            auto value = [&]() -> std::string {
                if (i + 1 >= argc) {
                    throw rp::Error("option " + a + " needs a value");
                }
                return argv[++i];
            };
            if (a == "-m" || a == "--model") {
                model = value();
            } else if (a == "-p" || a == "--prompt") {
                prompt = value();
                have_prompt = true;
            } else if (a == "-f" || a == "--file") {
                file = value();
            } else if (a == "--no-bos") {
                no_bos = true;
            } else if (a == "--parse-special") {
                parse_special = true;
            } else if (a == "--ids") {
                ids_only = true;
            } else if (a == "-h" || a == "--help") {
                usage(stdout);
                return 0;
            } else {
                throw rp::Error("unknown option '" + a + "' (see --help)");
            }
        }
        if (model.empty()) {
            throw rp::Error("no model given (-m MODEL.gguf)");
        }
        if (have_prompt == !file.empty()) {
            throw rp::Error("give exactly one of -p TEXT and -f FILE");
        }
        const std::string text = have_prompt ? prompt : read_file(file);
        const auto tok = rp::Tokenizer::load(model);
        const std::vector<int32_t> ids = tok->encode(text, !no_bos, parse_special);
        if (ids_only) {
            for (size_t i = 0; i < ids.size(); ++i) {
                std::printf(i ? " %d" : "%d", ids[i]);
            }
            std::printf("\n");
        } else {
            for (int32_t id : ids) {
                std::printf("%6d -> '%s'\n", id, printable(tok->token_to_piece(id)).c_str());
            }
        }
        if (std::fflush(stdout) != 0) {
            throw rp::Error("cannot write to standard output");
        }
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
