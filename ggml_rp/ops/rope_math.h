// The rope angle, one definition for the CPU and CUDA kernels. Computed in double: at position 100k a float
// angle would already be off by ~0.01 rad.
#pragma once

#include <cmath>
#include <cstdint>

#include "ggml_rp/core/host_device.h"

namespace rp {

// theta for pair i (0 <= i < n_rot/2) at position pos.
RP_HD inline double rope_theta(int32_t pos, int64_t i, int32_t n_rot, float freq_base, float freq_scale) {
    return static_cast<double>(pos) * pow(static_cast<double>(freq_base), -2.0 * static_cast<double>(i) / n_rot) *
           static_cast<double>(freq_scale);
}

} // namespace rp
