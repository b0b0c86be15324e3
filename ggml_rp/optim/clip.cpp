#include "ggml_rp/optim/clip.h"

#include "base/error.h"

#include <cmath>
#include <string>
#include <vector>

namespace rp {

namespace {

// Sum of squares of one block, in double, over 8 interleaved lanes combined in a fixed order (a shape the
// compiler can vectorise without reassociating anything).
double block_sum_squares(const float * x, size_t n) {
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; ++j) lane[j] += static_cast<double>(x[i + j]) * static_cast<double>(x[i + j]);
    }
    for (; i < n; ++i) lane[i % 8] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
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

double clip_grad_norm(std::span<const std::span<float>> grads, double max_norm) {
    if (!(std::isfinite(max_norm) && max_norm > 0.0)) {
        throw Error("gradient clipping: max_norm = " + std::to_string(max_norm) + " must be a positive number");
    }
    double s = 0.0;
    for (const auto & g : grads) s += sum_squares(g.data(), g.size());
    const double norm = std::sqrt(s);
    if (!std::isfinite(norm)) return norm;
    const double coef = max_norm / (norm + 1e-6);
    if (coef >= 1.0) return norm;
    const float c = static_cast<float>(coef);
    for (const auto & g : grads) {
        float * x = g.data();
        const size_t n = g.size();
#pragma omp parallel for simd schedule(static) if (n >= (size_t(1) << 15))
        for (size_t i = 0; i < n; ++i) x[i] *= c;
    }
    return norm;
}

} // namespace rp
