// The rope angle and its scale, one definition for the CPU and CUDA kernels. Computed in double: at position
// 100k a float angle would already be off by ~0.01 rad.
//
// YaRN (ggml's rope_ext with ext_factor > 0, the context extension of gpt-oss, Qwen3 long context, ...): pair i's
// angle mixes the interpolated angle (freq_scale x the extrapolated one) with the extrapolated angle by
// ramp(i) x ext_factor, where the ramp falls from 1 to 0 across the pairs between the correction dimensions
// of beta_fast and beta_slow for the training context n_ctx_orig; cos and sin are scaled by attn_factor x
// (1 + 0.1 ln(1 / freq_scale)). Without ext_factor the angle is the interpolated one and the scale attn_factor.
#pragma once

#include <cmath>
#include <cstdint>

#include "ggml_rp/core/host_device.h"

namespace rp {

// theta for pair i (0 <= i < n_rot/2) at position pos, without YaRN.
RP_HD inline double rope_theta(int32_t pos, int64_t i, int32_t n_rot, float freq_base, float freq_scale) {
    return static_cast<double>(pos) * pow(static_cast<double>(freq_base), -2.0 * static_cast<double>(i) / n_rot) *
           static_cast<double>(freq_scale);
}

// What the YaRN mix needs, decided once per op.
struct RopeYarn {
    double ext_factor = 0.0;
    double mscale = 1.0;              // the cos / sin scale
    double corr_low = 0.0, corr_high = 0.0;
};

// ggml_rope_yarn_corr_dim: the dimension (pair index x 2) whose wavelength rotates beta times in n_ctx_orig
// tokens.
RP_HD inline double rope_yarn_corr_dim(int32_t n_rot, int32_t n_ctx_orig, double beta, double freq_base) {
    return n_rot * log(n_ctx_orig / (beta * 2.0 * 3.14159265358979323846)) / (2.0 * log(freq_base));
}

RP_HD inline RopeYarn rope_yarn(int32_t n_rot, float freq_base, float freq_scale, float ext_factor, float attn_factor, float beta_fast,
                                float beta_slow, int32_t n_ctx_orig) {
    RopeYarn y;
    y.ext_factor = ext_factor;
    y.mscale = attn_factor;
    if (ext_factor != 0.0f) {
        y.mscale *= 1.0 + 0.1 * log(1.0 / static_cast<double>(freq_scale));
        const double lo = floor(rope_yarn_corr_dim(n_rot, n_ctx_orig, beta_fast, freq_base));
        const double hi = ceil(rope_yarn_corr_dim(n_rot, n_ctx_orig, beta_slow, freq_base));
        y.corr_low = lo > 0.0 ? lo : 0.0;
        y.corr_high = hi < n_rot - 1 ? hi : n_rot - 1;
    }
    return y;
}

// Attention temperature tuning (Llama 4, Mistral 3): the rotated query times
// log(floor((pos + offset) / floor_scale) + 1) * scale + 1, which grows with the position past floor_scale.
// Rotation and scale commute, so it is a factor on cos and sin. scale 0: none. Computed as llama.cpp's input is.
struct RopeTemperature {
    float scale = 0.0f;
    int32_t floor_scale = 0;
    float offset = 0.0f;
};

RP_HD inline double rope_temperature(int32_t pos, const RopeTemperature & t) {
    if (t.scale == 0.0f) return 1.0;
    const float steps = floorf((static_cast<float>(pos) + t.offset) / static_cast<float>(t.floor_scale));
    return static_cast<double>(static_cast<float>(log(static_cast<double>(steps) + 1.0) * t.scale + 1.0));
}

// cos and sin of pair i at position pos, both times the YaRN scale (and the temperature factor t); ff divides
// the pair's angle before interpolation (ggml_rope_ext's freq factors: Llama 3's rope_freqs, LongRoPE).
RP_HD inline void rope_cos_sin(int32_t pos, int64_t i, int32_t n_rot, float freq_base, float freq_scale, const RopeYarn & y, double & c,
                               double & s, double t = 1.0, double ff = 1.0) {
    const double extrap = rope_theta(pos, i, n_rot, freq_base, 1.0f) / ff;
    const double interp = extrap * static_cast<double>(freq_scale);
    double theta = interp;
    if (y.ext_factor != 0.0) {
        const double span = y.corr_high - y.corr_low > 0.001 ? y.corr_high - y.corr_low : 0.001;
        double ramp = (static_cast<double>(i) - y.corr_low) / span;  // ggml: (i0 / 2 - low) / max(0.001, high - low)
        ramp = 1.0 - (ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp);
        const double mix = ramp * y.ext_factor;
        theta = interp * (1.0 - mix) + extrap * mix;
    }
    c = cos(theta) * y.mscale * t;
    s = sin(theta) * y.mscale * t;
}

} // namespace rp
