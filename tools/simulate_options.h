// rp-simulate's options, each declared once against the setting it fills.
#pragma once

#include "ggml_rp/roundpipe/sim_presets.h"
#include "models/check/max_seq.h"
#include "tools/options.h"

#include <string>

namespace rp::cli {

struct SimulateSettings {
    std::string model, trace;
    bool all = false;
    PresetSimOptions sim;
    std::string link = "32GB/s", node_link = "25Gbit/s,10us";
    double tokens_per_mb = 8192;
    SimPreset custom{"custom", "custom", 0, -1, -1, -1, -1, 0, ""};
    bool max_seq = false, full = false;
    std::vector<std::string> device_speed;  // --device-speed, one per GPU (empty: all 1)
    std::string devices;                    // --devices: a mix of named GPUs, "4090x4,3090x4" (sets the count)
    std::string dispatch = "round-robin";   // round-robin | ready | both
    std::string vocab_on_host = "auto";     // --max-seq: auto | on | off (MaxSeqOptions::vocab_on_host)
    MaxSeqOptions mem;
};

void declare_simulate_options(Options & opts, SimulateSettings & s);

} // namespace rp::cli
