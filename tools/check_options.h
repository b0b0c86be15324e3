// rp-check's and rp-merge-lora's options, each declared once against the library option it fills.
#pragma once

#include "models/check/model_check.h"
#include "models/convert/merge_lora.h"
#include "tools/options.h"

#include <string>
#include <vector>

namespace rp::cli {

struct CheckSettings {
    ModelCheckOptions check;  // .text: read from text_file by the tool
    std::string text_file;
    bool json = false;
    void validate() const;
};

// check.oracle's default: $RP_ORACLE_BIN, else rp-oracle next to the running program.
void declare_check_options(Options & opts, CheckSettings & s);

struct MergeSettings {
    std::string base, out;
    std::vector<MergeInput> adapters;
    MergeOptions merge;
    void validate() const;
};

void declare_merge_lora_options(Options & opts, MergeSettings & s);

} // namespace rp::cli
