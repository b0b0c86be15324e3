// Per-element rules of Gated DeltaNet's ops (ops/delta_net.h), one definition for the CPU and CUDA kernels.
#pragma once

#include "ggml_rp/core/host_device.h"

#include <cstdint>

namespace rp {

// ssm_conv's shape: x [C, T, B], w [K, C].
struct ConvDims {
    int64_t C, T, B, K;
};

// The first token of token t's example in sequence b (seg_start, i32 [T * B]; nullptr: not packed, 0).
RP_HD inline int64_t example_start(const int32_t * seg, int64_t t, int64_t T, int64_t b) { return seg ? seg[t + T * b] : 0; }

// Whether the delta rule's state restarts at token t: the first token of a packed example past the sequence's first.
RP_HD inline bool state_restarts(const int32_t * seg, int64_t t, int64_t T, int64_t b) { return seg && t > 0 && seg[t + T * b] == t; }

// The convolution's input x of channel c at time tau as a token whose example starts at `start` reads it: before the
// sequence (tau < 0) the conv state `prefix` [C, K-1, B] (nullptr: 0), before the example 0.
RP_HD inline float conv_input(const float * x, const float * prefix, const ConvDims & d, int64_t c, int64_t tau, int64_t b, int64_t start) {
    if (tau >= 0) return tau >= start ? x[c + d.C * (tau + d.T * b)] : 0.0f;
    if (!prefix) return 0.0f;
    return prefix[c + d.C * (tau + (d.K - 1) + (d.K - 1) * b)];
}

} // namespace rp
