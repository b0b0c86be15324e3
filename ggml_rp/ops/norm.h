// RMSNorm over ne[0]: y = x / sqrt(mean(x^2) + eps) [* w], w (optional) f32 of shape [ne0] broadcast over rows.
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

Tensor * rms_norm(Context & ctx, Tensor * x, Tensor * weight, float eps);
// L2 normalization over ne[0] (ggml_l2_norm; Gated DeltaNet's q and k): y = x / max(sqrt(sum(x^2)), eps). The
// RMS_NORM op with param 1 = 1; its gradient the RMS formula with the sum for the mean, dy / eps where clamped.
Tensor * l2_norm(Context & ctx, Tensor * x, float eps);

// Gradient w.r.t. x. With r = 1/sqrt(mean(x^2) + eps) and g = dy * w (or dy without weight):
//   dx = r * g - r^3 * x * mean(g * x)
Tensor * rms_norm_back(Context & ctx, Tensor * x, Tensor * weight, Tensor * dy, float eps, bool l2 = false);

class Backward;
namespace rules {
// The backward rule of RMS_NORM (the op table's, core/ops.def).
void backward_norm(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
