#include "ggml_rp/optim/update.h"

#include "ggml_rp/optim/update_math.h"
#include "base/error.h"

#include <cassert>
#include <cmath>
#include <string>

namespace rp {

namespace {

// GCC vectorises the AdamW loop only under -fno-math-errno (sqrtf may set errno): the project-wide flags have
// it (bench/design-measurements.md). The flag changes no result.

// Below this many elements the OpenMP fork costs more than the update.
constexpr size_t kParallelMin = size_t(1) << 15;

// A value in [0, 1) (betas, momentum).
void check_unit(const char * opt, const char * field, double x) {
    if (!(std::isfinite(x) && x >= 0.0 && x < 1.0)) {
        throw Error(std::string(opt) + ": " + field + " = " + std::to_string(x) + " is outside [0, 1)");
    }
}

void check_non_negative(const char * opt, const char * field, double x) {
    if (!(std::isfinite(x) && x >= 0.0)) {
        throw Error(std::string(opt) + ": " + field + " = " + std::to_string(x) + " must be finite and >= 0");
    }
}

// The four variants of an update's pass over n elements (GradientUse: scaled or not, zeroed or not) as
// separate loops, so each vectorises without a branch. The gradient is read from g_in, and g_zero (g_in then)
// is set to 0 when Zero. (Written as plain loops over plain pointers: the same loop through a lambda capturing
// the arrays compiled to gathers and scatters.)
template <bool Scale, bool Zero>
void adamw_loop(size_t n, const AdamWScalars s, float * p, const float * g_in, float * g_zero, float * m, float * v,
                float scale) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (size_t i = 0; i < n; ++i) {
        adamw_element(s, p[i], Scale ? g_in[i] * scale : g_in[i], m[i], v[i]);
        if constexpr (Zero) g_zero[i] = 0.0f;
    }
}

template <bool Scale, bool Zero>
void sgd_loop(size_t n, const SgdScalars s, float * p, const float * g_in, float * g_zero, float * buf, float scale) {
    if (!buf) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
        for (size_t i = 0; i < n; ++i) {
            sgd_element(s, p[i], Scale ? g_in[i] * scale : g_in[i]);
            if constexpr (Zero) g_zero[i] = 0.0f;
        }
        return;
    }
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (size_t i = 0; i < n; ++i) {
        sgd_momentum_element(s, p[i], Scale ? g_in[i] * scale : g_in[i], buf[i]);
        if constexpr (Zero) g_zero[i] = 0.0f;
    }
}

// run.template operator()<Scale, Zero>() for use's variant.
template <class Run>
void with_gradient_use(GradientUse use, Run && run) {
    const bool scale = use.scale != 1.0f;
    if (scale && use.zero) run.template operator()<true, true>();
    else if (scale) run.template operator()<true, false>();
    else if (use.zero) run.template operator()<false, true>();
    else run.template operator()<false, false>();
}

// The gradient has param's length (the public functions assert it).
void adamw_pass(const AdamWConfig & cfg, int64_t t, double lr, std::span<float> param, const float * g_in, float * g_zero,
                std::span<float> m, std::span<float> v, GradientUse use) {
    assert(t >= 1);
    assert(m.size() == param.size() && v.size() == param.size());
    const AdamWScalars s = adamw_scalars(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, t);
    with_gradient_use(use, [&]<bool Scale, bool Zero>() {
        adamw_loop<Scale, Zero>(param.size(), s, param.data(), g_in, g_zero, m.data(), v.data(), use.scale);
    });
}

void sgd_pass(const SgdConfig & cfg, int64_t t, double lr, std::span<float> param, const float * g_in, float * g_zero,
              std::span<float> momentum_buf, GradientUse use) {
    assert(t >= 1);
    assert(cfg.momentum == 0.0 || momentum_buf.size() == param.size());
    const SgdScalars s = sgd_scalars(lr, cfg.momentum, cfg.weight_decay, t);
    float * buf = cfg.momentum == 0.0 ? nullptr : momentum_buf.data();
    with_gradient_use(use, [&]<bool Scale, bool Zero>() {
        sgd_loop<Scale, Zero>(param.size(), s, param.data(), g_in, g_zero, buf, use.scale);
    });
}

} // namespace

void validate(const AdamWConfig & c) {
    check_unit("AdamW", "beta1", c.beta1);
    check_unit("AdamW", "beta2", c.beta2);
    check_non_negative("AdamW", "eps", c.eps);
    check_non_negative("AdamW", "weight_decay", c.weight_decay);
}

void validate(const SgdConfig & c) {
    check_unit("SGD", "momentum", c.momentum);
    check_non_negative("SGD", "weight_decay", c.weight_decay);
}

void adamw_update(const AdamWConfig & cfg, int64_t t, double lr, std::span<float> param, std::span<const float> grad,
                  std::span<float> m, std::span<float> v) {
    assert(grad.size() == param.size());
    adamw_pass(cfg, t, lr, param, grad.data(), nullptr, m, v, GradientUse{});
}

void adamw_update(const AdamWConfig & cfg, int64_t t, double lr, std::span<float> param, std::span<float> grad,
                  std::span<float> m, std::span<float> v, GradientUse use) {
    assert(grad.size() == param.size());
    adamw_pass(cfg, t, lr, param, grad.data(), grad.data(), m, v, use);
}

void sgd_update(const SgdConfig & cfg, int64_t t, double lr, std::span<float> param, std::span<const float> grad,
                std::span<float> momentum_buf) {
    assert(grad.size() == param.size());
    sgd_pass(cfg, t, lr, param, grad.data(), nullptr, momentum_buf, GradientUse{});
}

void sgd_update(const SgdConfig & cfg, int64_t t, double lr, std::span<float> param, std::span<float> grad,
                std::span<float> momentum_buf, GradientUse use) {
    assert(grad.size() == param.size());
    sgd_pass(cfg, t, lr, param, grad.data(), grad.data(), momentum_buf, use);
}

} // namespace rp
