// The longest sequence one device trains, planned by the runtime's memory model (models/train/run_plan.h,
// roundpipe/call_planner.h) on the real shapes of a model (convert/synth_model.h presets): bf16 weights,
// LoRA on every linear layer, one sequence per micro-batch — the setting of the RoundPipe paper's
// max-sequence figures (qwen3-1.7b 73k, llama3.1-8b 49k, qwen3-32b 28k on an RTX 4090), which it reports
// beside ours. The model is a shapes-only GGUF (every weight a hole: no disk, never read) in a temporary
// directory. rp-simulate --max-seq is its command line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rp {

struct MaxSeqOptions {
    int lora_rank = 32;
    int micro_batches = 16;  // at least 2 are planned
    int devices = 8;
    size_t device_memory = size_t(24) << 30;
    // > 0: the sequence must also fit this much host RAM (the plan's host peak: pinned boundary checkpoints grow
    // with it); 0: the devices alone decide.
    size_t host_memory = 0;
    // The embedding and LM-head matrices on the host (PipelineOptions::vocab_on_host): -1 = when no plan fits
    // without (the least memory), 0 = never, 1 = always.
    int vocab_on_host = -1;
};

struct MaxSeqResult {
    std::string model;         // the preset
    std::string error;         // non-empty: this model could not be planned (the other fields are unset)
    size_t weight_bytes = 0;   // the weights: bf16, the experts of gpt-oss MXFP4 (as released)
    std::string weight_types;  // "bf16" or "bf16, experts mxfp4"
    int micro_batches = 0;     // planned
    int64_t max_seq = 0;
    int64_t device_max_seq = 0; // what the devices alone allow (max_seq is less when host_memory caps it)
    size_t host_peak = 0;       // the plan's host peak at max_seq
    int64_t paper_max_seq = 0; // the paper's figure (0: none for this model)
    std::string report;        // the plan at max_seq (RunPlan::report), empty when nothing fits
};

// The models the paper gives a max-sequence figure for.
std::vector<std::string> paper_max_seq_models();

// One result per model, in order. Throws rp::Error when no temporary directory with sparse files can be made
// (TMPDIR names where).
std::vector<MaxSeqResult> plan_max_seq(const std::vector<std::string> & models, const MaxSeqOptions & options);

} // namespace rp
