// The optimizer state of a training run: one AdamW (m, v) or SGD-momentum buffer per trainable tensor,
// fp32 (or bf16, OptimizerConfig::bf16_state), in host RAM next to the fp32 masters, plus the step count. The masters and gradients stay with
// their owner (the host store) and are passed in per tensor, so a pipeline can update each tensor as soon
// as its gradient is complete. Different tensors may be updated from different threads at once.
//
// Checkpoints: state_arrays() names every array ("<param>.adam_m", "<param>.adam_v" or "<param>.momentum")
// for a writer (the finetune session puts them in a GGUF file next to the step count); load_state() takes
// them back by name, so a resumed run continues bit for bit.
#pragma once

#include "ggml_rp/optim/update.h"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rp {

enum class OptimizerKind { AdamW, Sgd };

// "adamw" or "sgd"; throws rp::Error otherwise.
OptimizerKind optimizer_kind_from_name(std::string_view name);
const char * optimizer_kind_name(OptimizerKind k);

struct OptimizerConfig {
    OptimizerKind kind = OptimizerKind::AdamW;
    AdamWConfig adamw;  // used when kind == AdamW
    SgdConfig sgd;      // used when kind == Sgd
    // The state arrays in bfloat16: half their memory (for LoRA on a 235B MoE, 24.6 of 49.2 GiB). Each update
    // reads them as fp32, computes as the fp32 state does, and rounds the new state to nearest even; the
    // masters stay fp32. Deterministic; not the fp32 run's bits (the state loses 16 mantissa bits per step).
    bool bf16_state = false;
};

// One named state array (a view: it points into the optimizer or into the caller's buffer): fp32 in `data`,
// or bfloat16 bits in `bf16` (the other empty).
struct StateArray {
    std::string name;
    std::span<const float> data;
    std::span<const uint16_t> bf16;
    size_t size() const { return bf16.empty() ? data.size() : bf16.size(); }
    const void * bytes() const { return bf16.empty() ? static_cast<const void *>(data.data()) : bf16.data(); }
    size_t size_bytes() const { return bf16.empty() ? data.size_bytes() : bf16.size_bytes(); }
};

class Optimizer {
public:
    // Throws rp::Error for invalid hyper-parameters (see validate() in update.h).
    explicit Optimizer(const OptimizerConfig & cfg);

    const OptimizerConfig & config() const { return cfg_; }

    // Registers a trainable tensor of n elements with zeroed state; returns its index. Throws rp::Error for
    // an empty or repeated name.
    size_t add_param(const std::string & name, size_t n);
    size_t n_params() const { return slots_.size(); }
    const std::string & param_name(size_t i) const { return slots_[i].name; }
    size_t param_size(size_t i) const { return slots_[i].n; }

    // Applies update number step() + 1 to parameter i: param (its fp32 masters) moves along grad at rate lr.
    // Call once per parameter per step, then end_step(). Throws rp::Error when the spans do not have the
    // registered size or the parameter was already updated in this step.
    void update(size_t i, std::span<float> param, std::span<const float> grad, double lr);
    // The same, doing `use` with the gradient in the update's pass (update.h: clipping's scale, zeroing).
    void update(size_t i, std::span<float> param, std::span<float> grad, double lr, GradientUse use);
    // Ends the step. Throws rp::Error naming a parameter that was not updated.
    void end_step();
    // Completed steps (0 before the first update).
    int64_t step() const { return step_; }

    // Every state array, in registration order (AdamW: m then v per parameter; SGD with momentum: the buffer;
    // plain SGD: none). The views stay valid until the next add_param.
    std::vector<StateArray> state_arrays() const;
    // Restores a checkpoint. `arrays` must hold exactly the names state_arrays() lists, each with the same
    // number of elements and type (fp32 or bf16, as config().bf16_state); throws rp::Error naming the first
    // missing, unexpected, repeated, mis-sized or mis-typed one (and then leaves the state unchanged).
    void load_state(int64_t step, std::span<const StateArray> arrays);

private:
    struct Slot {
        std::string name;
        size_t n = 0;
        std::vector<float> a;  // AdamW m, or SGD momentum buffer
        std::vector<float> b;  // AdamW v
        std::vector<uint16_t> a16, b16;  // the same in bf16 (bf16_state; a and b then empty)
        int64_t updated_at = 0;  // step number (1-based) of the last update
    };
    std::vector<const char *> state_suffixes() const;

    OptimizerConfig cfg_;
    std::vector<Slot> slots_;
    int64_t step_ = 0;
};

} // namespace rp
