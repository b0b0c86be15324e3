// RMSNorm over ne[0]: y = x / sqrt(mean(x^2) + eps) [* w], w (optional) f32 of shape [ne0] broadcast over rows.
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

Tensor * rms_norm(Context & ctx, Tensor * x, Tensor * weight, float eps);
// L2 normalization over ne[0] (ggml_l2_norm; Gated DeltaNet's q and k): y = x / max(sqrt(sum(x^2)), eps). The
// RMS_NORM op with param 1 = 1. It also writes each row's scale s = 1 / max(|x|, eps) (negated where clamped) after
// y, so its gradient reads y and s, not x: dx = s (dy - y (y . dy)), or s dy where clamped (l2_norm_back). A
// backward holds the normalised q and k for the delta rule anyway; their inputs are freed after the forward.
Tensor * l2_norm(Context & ctx, Tensor * x, float eps);
// That gradient: y an l2_norm node, dy its gradient.
Tensor * l2_norm_back(Context & ctx, Tensor * y, Tensor * dy);

// Gradient w.r.t. x. With r = 1/sqrt(mean(x^2) + eps) and g = dy * w (or dy without weight):
//   dx = r * g - r^3 * x * mean(g * x)
Tensor * rms_norm_back(Context & ctx, Tensor * x, Tensor * weight, Tensor * dy, float eps, bool l2 = false);

// Qwen3.5's gated output norm as one op: y = rms_norm(x, weight, eps) * silu(z), z of x's shape, with the bits of those
// three ops (the same float operations in the same order). Its backward reads x and z only, recomputing each row's
// scale and silu(z), so a graph keeps neither the normed rows nor silu(z) (two more [n, rows] arrays) for it.
Tensor * rms_norm_gated(Context & ctx, Tensor * x, Tensor * weight, Tensor * z, float eps);
// Its gradients, which 0: dx; 1: dz. With r, g = dy * w * silu(z) and the normed x' = x r:
//   dx = r g - r^3 x mean(g x),   dz = dy * x' * w * silu'(z).
Tensor * rms_norm_gated_back(Context & ctx, Tensor * x, Tensor * weight, Tensor * z, Tensor * dy, float eps, int which);
// dz written over dy (the node is a view of dy: no buffer of its own; element i reads only dy's element i), for a
// rule whose dy nothing reads afterwards; dy must be contiguous, and ordered after its other readers (view.h after).
Tensor * rms_norm_gated_back_over_dy(Context & ctx, Tensor * x, Tensor * weight, Tensor * z, Tensor * dy, float eps);

class Backward;
namespace rules {
// The backward rules of RMS_NORM and RMS_NORM_GATED (the op table's, core/ops.def).
void backward_norm(Backward & b, Tensor * node);
void backward_norm_gated(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
