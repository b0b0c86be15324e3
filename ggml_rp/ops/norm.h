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

class Backward;
namespace rules {
// The backward rule of RMS_NORM (the op table's, core/ops.def).
void backward_norm(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
