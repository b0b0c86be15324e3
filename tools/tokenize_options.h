// rp-tokenize's options, each declared once against the setting it fills.
#pragma once

#include "tools/options.h"

#include <optional>
#include <string>

namespace rp::cli {

struct TokenizeSettings {
    std::string model_path, text_file;
    std::optional<std::string> prompt;
    bool no_bos = false, parse_special = false, ids_only = false;
    // --render-chat
    std::string chats, chat_template, date;
    bool no_generation_prompt = false, no_thinking = false, mask = false;

    void validate() const;
};

void declare_tokenize_options(Options & opts, TokenizeSettings & s);

} // namespace rp::cli
