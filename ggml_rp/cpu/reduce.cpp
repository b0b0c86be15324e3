// SUM, MEAN (to a scalar), REPEAT and SUM_TO. Sums run in double in a fixed order: per-row partial sums
// (each by one thread), then the partials in row order.
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/strided.h"

#include <algorithm>
#include <vector>

namespace rp::cpu {

namespace {

double total(const Tensor * x) {
    const int64_t ne0 = x->ne[0], nr = x->nrows();
    std::vector<double> part(static_cast<size_t>(nr));
#pragma omp parallel for schedule(static) if (x->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const char * xr = row_ptr(x, row_idx(x, r));
        double s = 0.0;
        for (int64_t i = 0; i < ne0; ++i) s += at(xr, x->nb[0], i);
        part[static_cast<size_t>(r)] = s;
    }
    double s = 0.0;
    for (double p : part) s += p;
    return s;
}

} // namespace

void sum(Tensor * n) { *n->data_as<float>() = static_cast<float>(total(n->src[0])); }

void mean(Tensor * n) {
    const Tensor * x = n->src[0];
    *n->data_as<float>() = static_cast<float>(total(x) / static_cast<double>(x->nelements()));
}

void repeat(Tensor * n) {
    const Tensor * x = n->src[0];
    const int64_t ne0 = n->ne[0], nr = n->nrows(), xne0 = x->ne[0];
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const char * xr = bcast_row_ptr(x, ri);
        char * d = row_ptr(n, ri);
        for (int64_t i = 0; i < ne0; ++i) at(d, n->nb[0], i) = at(xr, x->nb[0], i % xne0);
    }
}

void sum_to(Tensor * n) {
    const Tensor * x = n->src[0];
    const int64_t m0 = n->ne[0], m1 = n->ne[1], m2 = n->ne[2], m3 = n->ne[3];
    const int64_t r0 = x->ne[0] / m0, r1 = x->ne[1] / m1, r2 = x->ne[2] / m2, r3 = x->ne[3] / m3;
    // Work items: (output row, block of 256 output columns). Each output element is summed by one thread,
    // over source rows in (i3, i2, i1) order and then over its repeats along ne[0].
    constexpr int64_t kBlock = 256;
    const int64_t nblk = (m0 + kBlock - 1) / kBlock;
    const int64_t items = n->nrows() * nblk;
#pragma omp parallel for schedule(static) if (x->nelements() >= min_parallel_elements())
    for (int64_t w = 0; w < items; ++w) {
        const RowIdx o = row_idx(n, w / nblk);
        const int64_t j0 = (w % nblk) * kBlock, j1 = std::min(m0, j0 + kBlock);
        double acc[kBlock] = {};
        for (int64_t a3 = 0; a3 < r3; ++a3)
        for (int64_t a2 = 0; a2 < r2; ++a2)
        for (int64_t a1 = 0; a1 < r1; ++a1) {
            const char * xr = row_ptr(x, o.i1 + a1 * m1, o.i2 + a2 * m2, o.i3 + a3 * m3);
            for (int64_t j = j0; j < j1; ++j)
                for (int64_t a0 = 0; a0 < r0; ++a0) acc[j - j0] += at(xr, x->nb[0], j + a0 * m0);
        }
        char * d = row_ptr(n, o);
        for (int64_t j = j0; j < j1; ++j) at(d, n->nb[0], j) = static_cast<float>(acc[j - j0]);
    }
}

const RegisterKernels kRegister{{Op::SUM, sum}, {Op::MEAN, mean}, {Op::REPEAT, repeat}, {Op::SUM_TO, sum_to}};

} // namespace rp::cpu
