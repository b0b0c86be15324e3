// rp-generate's options, each declared once against the setting it fills.
#pragma once

#include "models/arch/inference.h"
#include "tools/cli_lora.h"
#include "tools/options.h"

#include <optional>
#include <string>
#include <vector>

namespace rp::cli {

struct GenerateSettings {
    std::string model_path, prompt_file, chat_template;
    std::optional<std::string> prompt;
    long long n_predict = 128, n_ctx = 0;
    int threads = 0;
    SamplerParams sampler;
    std::optional<uint64_t> seed;       // unset: a random one
    bool chat = false;                  // --chat, or implied by --chat-template
    std::optional<bool> show_thinking;  // unset: on a terminal only (dimmed)
    bool no_thinking = false;
    bool row_dots = true;               // --matvec fast
    std::vector<LoraArg> loras;

    // The rules between options (rp::Error naming the flags).
    void validate() const;
};

void declare_generate_options(Options & opts, GenerateSettings & s);

} // namespace rp::cli
