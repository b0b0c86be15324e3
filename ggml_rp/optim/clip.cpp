#include "ggml_rp/optim/clip.h"

#include "base/error.h"

#include <cmath>
#include <string>
#include <vector>

namespace rp {

namespace {

// Sum of squares of one block, in double, over 32 interleaved lanes (element i in lane i % 32) combined pairwise
// in a fixed order: a shape the compiler vectorises without reassociating anything, in four independent vector
// chains (eight lanes, one chain, left the pass waiting on its adds: bench/design-measurements.md).
double block_sum_squares(const float * x, size_t n) {
    constexpr size_t kLanes = 32;
    double lane[kLanes] = {};
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (size_t j = 0; j < kLanes; ++j) lane[j] += static_cast<double>(x[i + j]) * static_cast<double>(x[i + j]);
    }
    for (; i < n; ++i) lane[i % kLanes] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    for (size_t w = kLanes / 2; w >= 1; w /= 2)
        for (size_t j = 0; j < w; ++j) lane[j] = lane[j] + lane[j + w];
    return lane[0];
}

double sum_squares(const float * x, size_t n) {
    const size_t n_blocks = (n + kNormBlock - 1) / kNormBlock;
    if (n_blocks <= 1) return n ? block_sum_squares(x, n) : 0.0;
    std::vector<double> partial(n_blocks);
#pragma omp parallel for schedule(static) if (n_blocks >= 8)
    for (size_t b = 0; b < n_blocks; ++b) {
        const size_t begin = b * kNormBlock;
        const size_t len = begin + kNormBlock <= n ? kNormBlock : n - begin;
        partial[b] = block_sum_squares(x + begin, len);
    }
    double s = 0.0;
    for (const double p : partial) s += p;
    return s;
}

} // namespace

double grad_norm(std::span<const std::span<const float>> grads) {
    double s = 0.0;
    for (const auto & g : grads) s += sum_squares(g.data(), g.size());
    return std::sqrt(s);
}

float clip_scale(double norm, double max_norm) {
    if (!(std::isfinite(max_norm) && max_norm > 0.0)) {
        throw Error("gradient clipping: max_norm = " + std::to_string(max_norm) + " must be a positive number");
    }
    if (!std::isfinite(norm)) return 1.0f;
    const double coef = max_norm / (norm + 1e-6);
    return coef >= 1.0 ? 1.0f : static_cast<float>(coef);
}

double clip_grad_norm(std::span<const std::span<float>> grads, double max_norm) {
    clip_scale(0.0, max_norm);  // max_norm checked before the pass over the gradients
    double s = 0.0;
    for (const auto & g : grads) s += sum_squares(g.data(), g.size());
    const double norm = std::sqrt(s);
    const float c = clip_scale(norm, max_norm);
    if (c == 1.0f) return norm;
    for (const auto & g : grads) {
        float * x = g.data();
        const size_t n = g.size();
#pragma omp parallel for simd schedule(static) if (n >= (size_t(1) << 15))
        for (size_t i = 0; i < n; ++i) x[i] *= c;
    }
    return norm;
}

} // namespace rp
