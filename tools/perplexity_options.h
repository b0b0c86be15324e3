// rp-perplexity's options, each declared once against the setting it fills.
#pragma once

#include "tools/cli_lora.h"
#include "tools/options.h"

#include <optional>
#include <string>
#include <vector>

namespace rp::cli {

struct PerplexitySettings {
    std::string model_path, text_file, kl_base;
    std::optional<long long> n_ctx;  // unset: 512, or with --kl-divergence the saved base's
    long long stride = 0, n_batch = 0;
    int threads = 0;
    bool kl_divergence = false;
    std::vector<LoraArg> loras;

    long long context() const { return n_ctx.value_or(512); }
    // The rules between options (rp::Error naming the flags).
    void validate() const;
};

void declare_perplexity_options(Options & opts, PerplexitySettings & s);

} // namespace rp::cli
