// RMS_NORM and RMS_NORM_BACK over ne[0]; row statistics in double.
#include "ggml_rp/cpu/kernels.h"
#include "ggml_rp/cpu/strided.h"

#include <cmath>

namespace rp::cpu {

void rms_norm(Tensor * n) {
    const Tensor * x = n->src[0];
    const Tensor * w = n->src[1];
    const float eps = n->param_f32(0);
    const int64_t ne0 = n->ne[0], nr = n->nrows();
    const float * wd = w ? w->data_as<float>() : nullptr;
    const size_t wnb = w ? w->nb[0] : 0;
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const char * xr = row_ptr(x, ri);
        char * d = row_ptr(n, ri);
        double ss = 0.0;
        for (int64_t i = 0; i < ne0; ++i) { const double v = at(xr, x->nb[0], i); ss += v * v; }
        const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(ne0) + eps));
        for (int64_t i = 0; i < ne0; ++i) {
            const float y = at(xr, x->nb[0], i) * rs;
            at(d, n->nb[0], i) = wd ? y * at(reinterpret_cast<const char *>(wd), wnb, i) : y;
        }
    }
}

void rms_norm_back(Tensor * n) {
    const Tensor * x = n->src[0];
    const Tensor * dy = n->src[1];
    const Tensor * w = n->src[2];
    const float eps = n->param_f32(0);
    const int64_t ne0 = n->ne[0], nr = n->nrows();
    const char * wd = w ? static_cast<const char *>(w->data) : nullptr;
    const size_t wnb = w ? w->nb[0] : 0;
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const char * xr = row_ptr(x, ri);
        const char * gr = row_ptr(dy, ri);
        char * d = row_ptr(n, ri);
        double ss = 0.0, gx = 0.0;
        for (int64_t i = 0; i < ne0; ++i) {
            const double v = at(xr, x->nb[0], i);
            const double g = static_cast<double>(at(gr, dy->nb[0], i)) * (wd ? at(wd, wnb, i) : 1.0f);
            ss += v * v;
            gx += g * v;
        }
        const double rs = 1.0 / std::sqrt(ss / static_cast<double>(ne0) + eps);
        const float a = static_cast<float>(rs);
        const float c = static_cast<float>(rs * rs * rs * gx / static_cast<double>(ne0));
        for (int64_t i = 0; i < ne0; ++i) {
            const float g = at(gr, dy->nb[0], i) * (wd ? at(wd, wnb, i) : 1.0f);
            at(d, n->nb[0], i) = a * g - c * at(xr, x->nb[0], i);
        }
    }
}

} // namespace rp::cpu
