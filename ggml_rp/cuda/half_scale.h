// The power-of-two scale that keeps f32 values inside f16's range when a GEMM's activations (or, in the
// backward, its output gradients) are rounded to f16 for the tensor cores. f16 has 5 exponent bits: below
// 6.1e-5 it is subnormal and below 6e-8 it is zero, so a loss scaled by 1/tokens gives head gradients of
// ~1e-9 that round to 0 and ordinary gradients of ~1e-6 that keep only a few bits. Scaling the operand by
// 2^k before rounding, and the GEMM's alpha by 2^-k, is exact in the product (powers of two commute with the
// accumulation) and puts the largest magnitude in [2^14, 2^15), so every value keeps f16's 11 bits down to
// 2^-10 of the largest (below that, as in any f16 product, relative precision degrades).
// RP_HD: the host tests (tests/cuda/test_launch.cpp) and the device kernels (cuda/mul_mat.cu) share it.
#pragma once

#include "ggml_rp/core/host_device.h"

#include <cmath>

namespace rp::cuda {

// The exponent k with max_abs * 2^k in [2^14, 2^15); 0 for max_abs 0, infinite or NaN (nothing to scale, or
// a non-finite result that the training loop's guard catches anyway). Clamped to [-64, 64].
RP_HD inline int half_scale_exponent(float max_abs) {
    if (!(max_abs > 0.0f) || !(max_abs < INFINITY)) return 0;
    int e = 0;
    frexpf(max_abs, &e);  // max_abs = m 2^e, m in [0.5, 1): max_abs in [2^(e-1), 2^e)
    int k = 15 - e;
    return k < -64 ? -64 : (k > 64 ? 64 : k);
}

// The exponent k by which attention's backward scales dO before rounding it to f16 (cuda/attention.cu).
// Everything downstream is linear in dO -- D_i = rowsum(dO_i * O_i), dP = dO V^T, dS = P * (dP - D_i), dV,
// dK, dQ -- so the kernels compute 2^k times the gradients and multiply the results by 2^-k (exact). Two
// values are rounded to f16 on the way: dO itself and dS. |dP_ij| and |D_i| are at most D max|dO| max|V| (O
// is a convex combination of V's rows) and P <= 1, so |dS| <= 2 D max|dO| max|V|: k puts the larger of that
// bound and max|dO| in [2^14, 2^15), below f16's largest value 65504, keeping realistic gradients (a loss
// scaled by 1/tokens gives dO of 1e-6..1e-9, under f16's normal range) at f16's full 11 bits.
RP_HD inline int attention_grad_scale_exponent(float max_abs_dout, float max_abs_v, int64_t D) {
    const float bound = 2.0f * static_cast<float>(D) * max_abs_dout * max_abs_v;
    return half_scale_exponent(bound > max_abs_dout ? bound : max_abs_dout);
}

} // namespace rp::cuda
