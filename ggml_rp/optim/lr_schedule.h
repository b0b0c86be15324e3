// Learning-rate schedules as a pure function of the step, so a resumed run gets the same rates.
//
// `step` is the 0-based index of the optimizer update (the first update is step 0), as in llm.c:
//   warmup   step < warmup_steps:  lr = lr_max * (step + 1) / warmup_steps   (the first step is not wasted at 0)
//   decay    progress p = (step - warmup_steps) / (total_steps - warmup_steps), in [0, 1):
//              constant  lr = lr_max
//              linear    lr = lr_max - (lr_max - lr_min) * p
//              cosine    lr = lr_min + (lr_max - lr_min) * 0.5 * (1 + cos(pi * p))
//   after    step >= total_steps:  lr = lr_min (constant: lr_max)
// Computed in double (PyTorch's schedulers use Python floats).
#pragma once

#include <cstdint>
#include <string_view>

namespace rp {

enum class LrDecay { Constant, Linear, Cosine };

// "constant", "linear" or "cosine"; throws rp::Error naming the value otherwise.
LrDecay lr_decay_from_name(std::string_view name);
const char * lr_decay_name(LrDecay d);

struct LrSchedule {
    double lr_max = 1e-4;
    double lr_min = 0.0;          // ignored by Constant
    int64_t warmup_steps = 0;
    int64_t total_steps = 1;      // the number of optimizer steps of the run
    LrDecay decay = LrDecay::Cosine;

    // Throws rp::Error naming the field: negative or non-finite rates, lr_min > lr_max, total_steps < 1,
    // warmup_steps < 0 or > total_steps.
    void validate() const;
    // The rate of update number `step` (0-based; negative steps are a programming error).
    double lr(int64_t step) const;
};

} // namespace rp
