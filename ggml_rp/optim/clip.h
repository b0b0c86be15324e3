// Global-norm gradient clipping, like PyTorch's torch.nn.utils.clip_grad_norm_ (norm_type 2):
//   norm = sqrt(sum over every tensor of sum(g^2));  coef = max_norm / (norm + 1e-6);  g *= min(1, coef)
// The sum is reduced in a fixed order in double (each tensor cut into fixed blocks of kNormBlock elements,
// blocks summed in order, tensors summed in list order), so the norm is the same for any thread count.
#pragma once

#include <cstddef>
#include <span>

namespace rp {

constexpr size_t kNormBlock = 4096;

// The L2 norm of all the gradients together.
double grad_norm(std::span<const std::span<const float>> grads);

// Scales the gradients in place when their global norm exceeds max_norm and returns the norm before
// clipping. A non-finite norm (inf / NaN gradients) leaves the gradients untouched and is returned as is:
// the caller should skip the step. Throws rp::Error when max_norm is not a positive finite number.
double clip_grad_norm(std::span<const std::span<float>> grads, double max_norm);

// The factor clip_grad_norm multiplies every gradient element by (in fp32) for this norm, or exactly 1 when it
// leaves them as they are (the norm is within max_norm, or not finite): an update given it as its
// GradientUse::scale reads the clipped gradient without the pass that stores it. Throws as clip_grad_norm.
float clip_scale(double norm, double max_norm);

} // namespace rp
