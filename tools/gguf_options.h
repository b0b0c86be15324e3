// rp-gguf's option tables that are more than a few flags: synth's model shape.
#pragma once

#include "models/convert/synth_model.h"
#include "tools/options.h"

#include <string>
#include <vector>

namespace rp::cli {

struct SynthSettings {
    std::vector<std::string> out;  // the one file to write
    SynthSpec spec;
    bool preset = false, head_dim_given = false, n_vocab_given = false;
    // --shape: the preset's shape, which the other options then override.
    void apply_preset(const std::string & name);
    // Defaults that depend on the options (head_dim = n_embd / n_head), and the vocabulary rule.
    void finish();
};

void declare_synth_options(Options & opts, SynthSettings & s);

} // namespace rp::cli
