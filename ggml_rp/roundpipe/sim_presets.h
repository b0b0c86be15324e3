// The RoundPipe paper's simulator settings (roundpipe.md §13.8: per-layer times on an RTX 4090, sequence
// 2048, 4 sequences per micro-batch) and its published partitions (§11.4), and one simulation of a model
// given that way: the planner's partition (or a given one), one iteration alone and the steady state of
// overlapping iterations (schedule_sim.h), and with nodes > 1 the data-parallel steady state. rp-simulate
// is its command line.
//
// The sequential view is prefix (embedding, time 0) + decoder layers + postfix (norm, head, loss); times are
// per micro-batch: forward = recompute time, backward = the backward call alone (the planner's tb is their
// sum).
#pragma once

#include "ggml_rp/roundpipe/schedule_sim.h"

#include <string>
#include <vector>

namespace rp {

struct SimPreset {
    std::string key;   // "qwen3-1.7b"; "custom" for a model given by its times
    std::string name;  // "Qwen3-1.7B"
    int layers = 0;    // decoder layers
    double fwd_ms = 0, bwd_ms = 0, head_fwd_ms = 0, head_bwd_ms = 0;
    double hop_ms = 0;      // activation hand-off device -> host -> device
    std::string published;  // roundpipe.md §11.4 partition in decoder layers ("" if none)
};

// qwen3-1.7b, llama3.1-8b, gpt-oss-20b, gpt-oss-120b (the 20B's per-layer times: not in the paper),
// qwen3-32b, qwen3-235b.
const std::vector<SimPreset> & sim_presets();
// nullptr when `key` is not one of them.
const SimPreset * find_sim_preset(const std::string & key);
// "qwen3-1.7b  llama3.1-8b  ..." for help texts and errors.
std::string sim_preset_keys();

// A GPU's compute speed relative to the RTX 4090 the presets' times are measured on, for mixed machines
// (rp-simulate --devices 4090x4,3090x4). Where the paper measured RoundPipe on the device, its throughput ratio
// to 8 x RTX 4090 over the dense models it gives (roundpipe.md 13.3, 13.9); else the ratio of NVIDIA's peak dense
// FP16 tensor throughput with FP32 accumulation, the compute-bound ratio (memory-bound work runs closer to the
// 4090). `source` says which.
struct GpuSpeed {
    std::string key;   // "4090"
    std::string name;  // "RTX 4090"
    double speed = 1;
    std::string source;
};
const std::vector<GpuSpeed> & gpu_speeds();
// "4090x4,3090x4" (or relative speeds: "1x4,0.5x4", and a count of 1 may be left out: "4090,3090"): one speed per
// device, in order. rp::Error naming the entry that is not a known GPU or a speed in (0, 100] with a count >= 1.
std::vector<double> parse_device_mix(const std::string & mix);

struct PresetSimOptions {
    SimConfig config;           // devices, micro-batches, async, link, optimizer and copy-back times; nodes and
                                // node_link for data parallel; hop_ms < 0: the preset's
    int iterations = 0;         // 0: 2 + 8 x the mapping cycle (steady_window)
    std::string partition;      // decoder layers per stage (plan_from_decoder_counts) instead of the planner
    bool published = false;     // the preset's §11.4 partition
    bool balance = true;        // the planner's even re-spread
    double weight_mb = 0;       // weights uploaded per decoder layer and job, MB (0: not modelled)
    std::vector<double> grad_bytes;  // nodes > 1: per layer of the sequential view (layers + 2)
};

struct PresetSimResult {
    std::string plan_counts;  // decoder_counts of the plan simulated
    double stage_bound = 0;   // the planner's T (0 for a given partition)
    int stages = 0;
    SimResult alone, steady, dp;  // dp: the steady state with config.nodes
    double grad_mb = 0;           // all-reduced per iteration
};

// Throws rp::Error on a partition that does not cover the model or a bad setting.
PresetSimResult simulate_preset(const SimPreset & model, PresetSimOptions options);

} // namespace rp
