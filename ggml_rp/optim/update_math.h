// Per-element optimizer math, one code path for the CPU loops (optim/update.cpp) and future CUDA kernels.
//
// The scalars of one step are computed once on the host in double, as PyTorch computes them in Python floats,
// and rounded to fp32 once; the per-element work is then plain fp32 arithmetic in PyTorch's operation order
// (roundpipe.md §12.2), each operation rounded: optim/update.cpp is compiled with -ffp-contract=off (GCC contracts
// a*b+c into an FMA in C++ under -std=c++20 too, wherever the target has one), so the result is the same on every
// machine. (A CUDA kernel would need mul_rn / add_rn, core/quant_block.h: nvcc fuses by default.)
#pragma once

#include <cmath>
#include <cstdint>

#include "ggml_rp/core/host_device.h"

namespace rp {

// torch.lerp(start, end, weight) as ATen computes it: the formula anchored at the nearer end point.
RP_HD inline float lerp_torch(float start, float end, float weight) {
    return weight < 0.5f ? start + weight * (end - start) : end - (end - start) * (1.0f - weight);
}

// The scalars of one AdamW update (PyTorch's _single_tensor_adam with decoupled weight decay).
struct AdamWScalars {
    float decay;           // 1 - lr * weight_decay; exactly 1 when weight_decay == 0 (p * 1 == p: PyTorch skips it)
    float one_minus_beta1; // lerp weight of the first moment
    float beta2;
    float one_minus_beta2;
    float bc2_sqrt;        // sqrt(1 - beta2^t)
    float eps;
    float neg_step_size;   // -lr / (1 - beta1^t)
};

// t: 1-based number of this update. Double precision like Python's float scalars.
inline AdamWScalars adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                                  int64_t t) {
    AdamWScalars s;
    s.decay = weight_decay != 0.0 ? static_cast<float>(1.0 - lr * weight_decay) : 1.0f;
    s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
    s.beta2 = static_cast<float>(beta2);
    s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(t));
    s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    s.eps = static_cast<float>(eps);
    s.neg_step_size = static_cast<float>(-(lr / bc1));
    return s;
}

// One element, in PyTorch's order (no conditional stores, so the loops vectorise):
//   param.mul_(1 - lr*wd); exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
//   denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps); param.addcdiv_(exp_avg, denom, -step_size)
RP_HD inline void adamw_element(const AdamWScalars & s, float & p, float g, float & m, float & v) {
    p = p * s.decay;
    m = lerp_torch(m, g, s.one_minus_beta1);
    v = v * s.beta2 + s.one_minus_beta2 * g * g;
    const float denom = sqrtf(v) / s.bc2_sqrt + s.eps;
    p = p + s.neg_step_size * (m / denom);
}

// SGD with optional momentum (PyTorch's buffer rule, dampening 0: buf = g on the first update, then
// buf = momentum*buf + g) and *decoupled* weight decay p *= 1 - lr*wd, applied before the step as in AdamW
// (PyTorch's SGD adds wd*p to the gradient instead; we keep one meaning of weight decay for both optimizers).
struct SgdScalars {
    float decay;      // 1 - lr * weight_decay (exactly 1 without decay)
    float momentum;
    float first;      // 1 on the first update (the buffer starts as a copy of the gradient), else 0
    float neg_lr;
};

inline SgdScalars sgd_scalars(double lr, double momentum, double weight_decay, int64_t t) {
    SgdScalars s;
    s.decay = weight_decay != 0.0 ? static_cast<float>(1.0 - lr * weight_decay) : 1.0f;
    s.momentum = static_cast<float>(momentum);
    s.first = t == 1 ? 1.0f : 0.0f;
    s.neg_lr = static_cast<float>(-lr);
    return s;
}

// Without momentum (no state).
RP_HD inline void sgd_element(const SgdScalars & s, float & p, float g) {
    p = p * s.decay;
    p = p + s.neg_lr * g;
}

// With momentum: buf = g on the first update, then buf = momentum * buf + g.
RP_HD inline void sgd_momentum_element(const SgdScalars & s, float & p, float g, float & buf) {
    p = p * s.decay;
    buf = s.first != 0.0f ? g : buf * s.momentum + g;
    p = p + s.neg_lr * buf;
}

} // namespace rp
