#include "models/arch/rope_scaling.h"

#include <cmath>

namespace rp {

std::vector<float> llama3_rope_factors(float factor, float low, float high, uint32_t orig_ctx, float base, uint32_t n_rot) {
    const double ctx = orig_ctx, lo = low, hi = high, f = factor;
    std::vector<float> out(n_rot / 2);
    for (size_t i = 0; i < out.size(); ++i) {
        const double freq = std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / n_rot);
        const double wavelen = 2.0 * M_PI / freq;
        double v = 1.0;
        if (wavelen > ctx / lo) {
            v = f;
        } else if (wavelen >= ctx / hi) {
            const double smooth = (ctx / wavelen - lo) / (hi - lo);
            v = 1.0 / ((1.0 - smooth) / f + smooth);
        }
        out[i] = static_cast<float>(v);
    }
    return out;
}

} // namespace rp
