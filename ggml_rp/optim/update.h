// Optimizer updates over flat fp32 spans: one parameter tensor's master weights, its gradient and its state.
// The host store and the optimizer thread call these per tensor. Element-wise only (no reduction), so the
// result does not depend on the number of OpenMP threads. Formulas: optim/update_math.h.
#pragma once

#include <cstdint>
#include <span>

namespace rp {

// Hyper-parameters are doubles, like PyTorch's Python floats: 1 - beta1 is computed from 0.9, not from 0.9f.
struct AdamWConfig {
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.01;  // PyTorch's AdamW default; decoupled: p *= 1 - lr * weight_decay
};

struct SgdConfig {
    double momentum = 0.0;       // 0: plain SGD, no state
    double weight_decay = 0.0;   // decoupled, like AdamW (not PyTorch SGD's L2 term)
};

// Throws rp::Error naming the field for values outside their ranges (betas and momentum in [0, 1),
// eps and weight_decay >= 0, everything finite).
void validate(const AdamWConfig & cfg);
void validate(const SgdConfig & cfg);

// Update number t (1-based) of one tensor at learning rate lr. All spans have the same length (asserted);
// m and v start as zeros. The step's scalars are computed in double and rounded to fp32 once.
void adamw_update(const AdamWConfig & cfg, int64_t t, double lr, std::span<float> param, std::span<const float> grad,
                  std::span<float> m, std::span<float> v);

// momentum_buf may be empty when cfg.momentum == 0.
void sgd_update(const SgdConfig & cfg, int64_t t, double lr, std::span<float> param, std::span<const float> grad,
                std::span<float> momentum_buf);

// What an update does with the gradient besides reading it, in the same pass over memory (each is otherwise a
// pass of its own over every gradient: a full finetune's step is bound by those passes' bytes):
//   scale  the gradient is multiplied by it as it is read: the fp32 product gradient clipping stores
//          (clip_scale), so the update is the bits of clip_grad_norm then the update;
//   zero   the gradient is set to 0 once read (a host step accumulates the next step's gradient into it).
struct GradientUse {
    float scale = 1.0f;
    bool zero = false;
};

void adamw_update(const AdamWConfig & cfg, int64_t t, double lr, std::span<float> param, std::span<float> grad,
                  std::span<float> m, std::span<float> v, GradientUse use);
void sgd_update(const SgdConfig & cfg, int64_t t, double lr, std::span<float> param, std::span<float> grad,
                std::span<float> momentum_buf, GradientUse use);

} // namespace rp
