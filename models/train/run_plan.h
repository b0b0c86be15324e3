// A finetuning run's memory and traffic before it runs (rp-finetune --plan, rp-simulate --max-seq): the same
// memory model the RoundPipe runtime carves its devices with (roundpipe/call_planner.h), over a Trainer that
// holds shapes only (trainer.h TrainerData::ShapesOnly), so a plan of a 32B model takes milliseconds and
// never reads a weight.
//
// Device: the plan of the largest step, its per-device peak region by region, the smallest plan's peak.
// Host: the mapped GGUF, the trainable fp32 masters and their gradients, the optimizer state, and with
// devices the pinned working copies and gradient slots (async steps; sync steps upload the masters and sum the
// gradients in place, so only a tied parameter's second slot remains) and the boundary checkpoints (of the calls
// in flight: two with async steps, whose next forward overlaps the previous backward, one with sync steps); on the
// host path the per-layer inputs
// and the graphs: the decoder layers that keep their activations (FinetuneConfig::activation_memory) beside the
// largest program that runs while they are alive. Link: bytes each way per step.
#pragma once

#include "ggml_rp/optim/optimizer.h"
#include "ggml_rp/roundpipe/call_planner.h"
#include "ggml_rp/roundpipe/host_store.h"
#include "models/train/session.h"
#include "models/train/trainer.h"
#include "models/arch/model.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rp {

struct RunPlanOptions {
    // The run as a TrainingSession would run it: the trainer's configuration, optimizer, batch and micro-batches
    // (resolved_micro_batches), and with session.pipelined the devices (count, memory_each: the arena's whole
    // 256-byte units count; backend: whose memory rules) and the pipeline's schedule, grain, plan, token chunk,
    // resident weights and frozen pinning.
    SessionOptions session;
    int64_t seq_len = 64;
    bool packed = false;          // packed sequences (their programs build per-token positions and key starts)
    int64_t group = 0;            // sequences per batch unit (GRPO: completions per prompt); 0: the objective's (pairs 2, else 1)
    int64_t max_seq_limit = 0;    // > 0: also search the longest seq_len that fits, up to this
};

struct HostMemoryPlan {
    size_t mapped_weights = 0;    // the GGUF's tensor data (file-backed pages) but the full finetune's mastered weights
    size_t masters = 0;           // trainable fp32 tensors (LoRA factors, or the masters of a full finetune)
    size_t gradients = 0;         // their fp32 gradients (+ a tied head's second slot)
    size_t optimizer = 0;         // AdamW m and v, or SGD momentum
    size_t working_copies = 0;    // pipeline, async steps: pinned f32 copies the devices upload
    size_t frozen_copies = 0;     // pipeline, pinning by copy: the frozen weights once more, pinned
    size_t grad_slots = 0;        // pipeline: pinned per-layer gradient slots (sync steps: a tied parameter's second)
    size_t checkpoints = 0;       // pipeline: pinned boundary activations of the calls in flight; host: layer inputs
    int calls_in_flight = 0;      // pipeline: 2 with async steps, 1 with sync ones
    DType boundary = DType::F32;  // pipeline: the checkpoints' type (FinetuneConfig::boundary_type)
    size_t cpu_devices = 0;       // pipeline on CPU virtual devices: their memory is host RAM (each its planned peak)
    size_t graph = 0;             // host path: the graphs at their peak (kept layers' + the largest other program's)
    size_t kept_activations = 0;  // host path, of graph: the kept decoder layers' graphs (activation_memory)
    int kept_layers = 0;          // host path: how many decoder layers keep their activations
    size_t total() const {
        return mapped_weights + masters + gradients + optimizer + working_copies + frozen_copies + grad_slots + checkpoints +
               cpu_devices + graph;
    }
    // "mapped weights 75.53 MiB + gradients 1.80 MiB + ...": the regions that take memory.
    std::string describe() const;
};

struct RunPlan {
    std::vector<MicroBatchInfo> step;  // the largest step's micro-batches
    std::optional<CallPlan> call;      // pipeline: the plan and its device memory
    std::vector<std::string> device_names;  // pipeline, devices of different sizes: each device (else empty)
    size_t min_device_peak = 0;        // pipeline: the one-layer-per-stage plan's peak
    HostMemoryPlan host;
    LinkBytes link;                    // pipeline: per step (and the resident weights once per device)
    int64_t max_seq = -1;              // with max_seq_limit: the longest seq_len that fits (0: none)
    // Lines a script can grep: "device peak: N bytes", "host peak: N bytes", "max seq: N", ...
    std::string report() const;
};

// Throws MemoryError when the step does not fit the devices (what() says what would), rp::Error for bad
// options (named by field: seq_len, batch_size, micro_batches, ...).
RunPlan plan_run(const Model & model, const RunPlanOptions & options);

// The host side of a run checked before it allocates anything: throws MemoryError when the plan's host peak,
// on top of the `in_use` bytes the process already holds (the model's header, tokenizer, dataset, code), exceeds
// `limit` (bytes the process may take; `limit_source` says where the figure comes from, for the message). The
// message names the regions and the largest seq_len (same batch) whose plan fits. Returns the plan's host peak;
// 0 for a plan whose devices do not fit, left to the session, which reports that.
size_t require_host_memory(const Model & model, const RunPlanOptions & options, size_t in_use, size_t limit,
                           const std::string & limit_source);

// A pipeline run whose token chunk is the call planner's choice (session.pipeline.token_chunk -1) takes every token
// in one graph whenever the devices hold that. Its stages are then smaller, so there are more of them and more
// boundary checkpoints in host memory: a plan that fits the devices may not fit the host where a chunked one would
// (and whether a sequence fits the host then need not grow with its length). The token chunk to run with so that
// the host plan fits `limit` beside `in_use`: -1 (keep the planner's choice) when its plan fits, when it is not a
// pipeline run or its chunk is given, or when the devices cannot hold it; else the largest of the call planner's
// chunks whose plan fits the devices and the host; -1 when none does (require_host_memory then says why).
int64_t host_fitting_token_chunk(const Model & model, const RunPlanOptions & options, size_t in_use, size_t limit);

// How the run pins its frozen weights when options.session.pipeline.frozen_pinning is unset: on accelerators a
// pinned copy (the fastest uploads) when the plan with it fits `limit` beside `in_use`, else registration in place
// (no second copy of the weights: a model whose weights and copy would not fit the host); on CPU virtual devices
// registration (default_frozen_pinning). A set mode is returned as it is.
FrozenPinning choose_frozen_pinning(const Model & model, const RunPlanOptions & options, size_t in_use, size_t limit);

} // namespace rp
