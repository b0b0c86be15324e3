// SOFTMAX and SOFTMAX_BACK over ne[0]. Row sums in double.
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/strided.h"

#include <cmath>

namespace rp::cpu {

void softmax(Tensor * n) {
    const Tensor * x = n->src[0];
    const int64_t ne0 = n->ne[0], nr = n->nrows();
    const size_t xnb = x->nb[0], dnb = n->nb[0];
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const char * xr = row_ptr(x, ri);
        char * d = row_ptr(n, ri);
        float mx = -INFINITY;
        for (int64_t i = 0; i < ne0; ++i) mx = std::fmax(mx, at(xr, xnb, i));
        double s = 0.0;
        for (int64_t i = 0; i < ne0; ++i) {
            const float e = std::exp(at(xr, xnb, i) - mx);
            at(d, dnb, i) = e;
            s += e;
        }
        const float inv = static_cast<float>(1.0 / s);
        for (int64_t i = 0; i < ne0; ++i) at(d, dnb, i) *= inv;
    }
}

void softmax_back(Tensor * n) {
    const Tensor * y = n->src[0];
    const Tensor * dy = n->src[1];
    const int64_t ne0 = n->ne[0], nr = n->nrows();
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const char * yr = row_ptr(y, ri);
        const char * gr = row_ptr(dy, ri);
        char * d = row_ptr(n, ri);
        double dot = 0.0;
        for (int64_t i = 0; i < ne0; ++i) dot += static_cast<double>(at(yr, y->nb[0], i)) * at(gr, dy->nb[0], i);
        const float fdot = static_cast<float>(dot);
        for (int64_t i = 0; i < ne0; ++i) at(d, n->nb[0], i) = at(yr, y->nb[0], i) * (at(gr, dy->nb[0], i) - fdot);
    }
}

const RegisterKernels kRegister{{Op::SOFTMAX, softmax}, {Op::SOFTMAX_BACK, softmax_back}};

} // namespace rp::cpu
