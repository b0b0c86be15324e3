#include "ggml_rp/optim/lr_schedule.h"

#include "base/error.h"

#include <cassert>
#include <cmath>
#include <numbers>
#include <string>

namespace rp {

LrDecay lr_decay_from_name(std::string_view name) {
    if (name == "constant") return LrDecay::Constant;
    if (name == "linear") return LrDecay::Linear;
    if (name == "cosine") return LrDecay::Cosine;
    throw Error("unknown learning-rate schedule '" + std::string(name) + "' (expected constant, linear or cosine)");
}

const char * lr_decay_name(LrDecay d) {
    switch (d) {
    case LrDecay::Constant: return "constant";
    case LrDecay::Linear: return "linear";
    case LrDecay::Cosine: return "cosine";
    }
    return "?";
}

void LrSchedule::validate() const {
    if (!(std::isfinite(lr_max) && lr_max >= 0.0)) {
        throw Error("lr schedule: lr_max = " + std::to_string(lr_max) + " must be finite and >= 0");
    }
    if (!(std::isfinite(lr_min) && lr_min >= 0.0)) {
        throw Error("lr schedule: lr_min = " + std::to_string(lr_min) + " must be finite and >= 0");
    }
    if (decay != LrDecay::Constant && lr_min > lr_max) {
        throw Error("lr schedule: lr_min = " + std::to_string(lr_min) + " exceeds lr_max = " + std::to_string(lr_max));
    }
    if (total_steps < 1) throw Error("lr schedule: total_steps = " + std::to_string(total_steps) + " must be >= 1");
    if (warmup_steps < 0 || warmup_steps > total_steps) {
        throw Error("lr schedule: warmup_steps = " + std::to_string(warmup_steps) + " must be in [0, total_steps = " +
                    std::to_string(total_steps) + "]");
    }
}

double LrSchedule::lr(int64_t step) const {
    assert(step >= 0);
    if (step < warmup_steps) return lr_max * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    if (decay == LrDecay::Constant) return lr_max;
    if (step >= total_steps) return lr_min;
    const double p = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    if (decay == LrDecay::Linear) return lr_max - (lr_max - lr_min) * p;
    return lr_min + (lr_max - lr_min) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

} // namespace rp
