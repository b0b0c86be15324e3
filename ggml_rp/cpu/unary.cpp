// SCALE, SILU, SILU_BACK, SWIGLU, SWIGLU_BACK: element-wise over same-shaped strided sources.
#include "ggml_rp/cpu/kernels.h"
#include "ggml_rp/cpu/strided.h"
#include "ggml_rp/ops/unary_math.h"

namespace rp::cpu {

namespace {

// out[i] = f(src0[i], src1[i], src2[i]) for the first n_src sources (all with the node's shape).
template <int NSrc, typename F>
void elementwise(Tensor * n, F f) {
    const int64_t ne0 = n->ne[0], nr = n->nrows();
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const char * s[3] = {nullptr, nullptr, nullptr};
        size_t snb[3] = {0, 0, 0};
        for (int k = 0; k < NSrc; ++k) { s[k] = row_ptr(n->src[k], ri); snb[k] = n->src[k]->nb[0]; }
        char * d = row_ptr(n, ri);
        const size_t dnb = n->nb[0];
        bool packed = dnb == sizeof(float);
        for (int k = 0; k < NSrc; ++k) packed = packed && snb[k] == sizeof(float);
        if (packed) {  // contiguous rows: plain pointers, so the loop vectorizes (the math is exp_poly's)
            float * dp = reinterpret_cast<float *>(d);
            const float * p0 = reinterpret_cast<const float *>(s[0]);
            const float * p1 = NSrc > 1 ? reinterpret_cast<const float *>(s[1]) : p0;
            const float * p2 = NSrc > 2 ? reinterpret_cast<const float *>(s[2]) : p0;
#pragma omp simd
            for (int64_t i = 0; i < ne0; ++i) dp[i] = f(p0[i], NSrc > 1 ? p1[i] : 0.0f, NSrc > 2 ? p2[i] : 0.0f);
            continue;
        }
        for (int64_t i = 0; i < ne0; ++i) {
            const float x0 = at(s[0], snb[0], i);
            const float x1 = NSrc > 1 ? at(s[1], snb[1], i) : 0.0f;
            const float x2 = NSrc > 2 ? at(s[2], snb[2], i) : 0.0f;
            at(d, dnb, i) = f(x0, x1, x2);
        }
    }
}

} // namespace

void scale(Tensor * n) {
    const float s = n->param_f32(0);
    elementwise<1>(n, [s](float x, float, float) { return x * s; });
}

void silu(Tensor * n) { elementwise<1>(n, [](float x, float, float) { return silu_f(x); }); }

void silu_back(Tensor * n) { elementwise<2>(n, [](float x, float dy, float) { return dy * silu_grad_f(x); }); }

void swiglu(Tensor * n) { elementwise<2>(n, [](float g, float u, float) { return silu_f(g) * u; }); }

void swiglu_back(Tensor * n) {
    if (n->param_i32(0) == 0) elementwise<3>(n, [](float g, float u, float dy) { return dy * u * silu_grad_f(g); });
    else elementwise<3>(n, [](float g, float, float dy) { return dy * silu_f(g); });
}

} // namespace rp::cpu
