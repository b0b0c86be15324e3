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
    assert(t >= 1);
    assert(grad.size() == param.size() && m.size() == param.size() && v.size() == param.size());
    const AdamWScalars s = adamw_scalars(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, t);
    const size_t n = param.size();
    float * p = param.data();
    const float * g = grad.data();
    float * pm = m.data();
    float * pv = v.data();
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (size_t i = 0; i < n; ++i) adamw_element(s, p[i], g[i], pm[i], pv[i]);
}

void sgd_update(const SgdConfig & cfg, int64_t t, double lr, std::span<float> param, std::span<const float> grad,
                std::span<float> momentum_buf) {
    assert(t >= 1);
    assert(grad.size() == param.size());
    assert(cfg.momentum == 0.0 || momentum_buf.size() == param.size());
    const SgdScalars s = sgd_scalars(lr, cfg.momentum, cfg.weight_decay, t);
    const size_t n = param.size();
    float * p = param.data();
    const float * g = grad.data();
    if (cfg.momentum == 0.0) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
        for (size_t i = 0; i < n; ++i) sgd_element(s, p[i], g[i]);
        return;
    }
    float * b = momentum_buf.data();
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (size_t i = 0; i < n; ++i) sgd_momentum_element(s, p[i], g[i], b[i]);
}

} // namespace rp
