// RMS_NORM and RMS_NORM_BACK over ne[0] (and their L2 form), L2_NORM_BACK, RMS_NORM_GATED and its gradients; row
// statistics in double.
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/strided.h"
#include "ggml_rp/cpu/vec_math.h"
#include "ggml_rp/ops/unary_math.h"

#include <algorithm>
#include <cmath>

namespace rp::cpu {

namespace {

// A row's sums in double over 8 lanes (element i into lane i % 8 while 8 remain), combined
// ((0+4)+(2+6))+((1+5)+(3+7)), then the rest in order: 8 independent chains that vectorize, where one running
// sum was a chain of dependent adds. term(i) gives
// element i's addend; contiguous and strided rows use the same order, so they give the same bits.
// The 8 lanes added in that fixed tree.
inline double lane_tree(const double lanes[8]) {
    return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

template <class Term>
double row_sum(int64_t n, Term term) {
    double lanes[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l) lanes[l] += term(i + l);
    double s = lane_tree(lanes);
    for (; i < n; ++i) s += term(i);
    return s;
}

// A row's sum of squares in double (row_sum's order; a contiguous and a strided row give the same bits).
double sum_squares(const char * xr, size_t nb, int64_t n) {
    if (nb == sizeof(float))
        return row_sum(n, [xp = reinterpret_cast<const float *>(xr)](int64_t i) { const double v = xp[i]; return v * v; });
    return row_sum(n, [&](int64_t i) { const double v = at(xr, nb, i); return v * v; });
}

// A row's rms_norm scale 1 / sqrt(mean(x^2) + eps) in double, as rms_norm computes it (and rounds it to float).
double rms_scale(const char * xr, size_t nb, int64_t n, float eps) {
    return 1.0 / std::sqrt(sum_squares(xr, nb, n) / static_cast<double>(n) + eps);
}

// The gated norm's rows go a piece at a time, so that exp(-z) is computed in vectors (exp_affine) on contiguous
// rows, as the SILU kernel computes it (vec_exp one at a time on strided ones: the same bits).
constexpr int64_t kGatePiece = 512;
void neg_exps(const char * zr, size_t nb, int64_t i0, int64_t m, float * e) {
    if (nb == sizeof(float)) return exp_affine(reinterpret_cast<const float *>(zr) + i0, e, m, -1.0f, 0.0f);
    for (int64_t i = 0; i < m; ++i) e[i] = vec_exp(-at(zr, nb, i0 + i));
}

} // namespace

void rms_norm(Tensor * n) {
    const Tensor * x = n->src[0];
    const Tensor * w = n->src[1];
    const float eps = n->param_f32(0);
    const bool l2 = n->param_i32(1) != 0;
    const int64_t ne0 = n->ne[0], nr = n->nrows();
    const float * wd = w ? w->data_as<float>() : nullptr;
    const size_t wnb = w ? w->nb[0] : 0;
    // The L2 form's aux: each row's scale, negated where the norm is clamped (L2_NORM_BACK reads it).
    float * scales = l2 && n->aux_bytes ? reinterpret_cast<float *>(static_cast<char *>(n->data) + n->nbytes()) : nullptr;
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const char * xr = row_ptr(x, ri);
        char * d = row_ptr(n, ri);
        const double ss = sum_squares(xr, x->nb[0], ne0);
        const float rs = l2 ? static_cast<float>(1.0 / std::max(std::sqrt(ss), static_cast<double>(eps)))
                            : static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(ne0) + eps));
        if (scales) scales[r] = std::sqrt(ss) > eps ? rs : -rs;
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
    const bool l2 = n->param_i32(1) != 0;
    const int64_t ne0 = n->ne[0], nr = n->nrows();
    const char * wd = w ? static_cast<const char *>(w->data) : nullptr;
    const size_t wnb = w ? w->nb[0] : 0;
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const char * xr = row_ptr(x, ri);
        const char * gr = row_ptr(dy, ri);
        char * d = row_ptr(n, ri);
        const double ss = sum_squares(xr, x->nb[0], ne0);
        double gx;
        if (x->nb[0] == sizeof(float) && dy->nb[0] == sizeof(float) && (!wd || wnb == sizeof(float))) {
            const float * xp = reinterpret_cast<const float *>(xr);
            const float * gp = reinterpret_cast<const float *>(gr);
            const float * wp = reinterpret_cast<const float *>(wd);
            gx = wp ? row_sum(ne0, [=](int64_t i) { return static_cast<double>(gp[i]) * wp[i] * static_cast<double>(xp[i]); })
                    : row_sum(ne0, [=](int64_t i) { return static_cast<double>(gp[i]) * 1.0f * static_cast<double>(xp[i]); });
        } else {
            gx = row_sum(ne0, [&](int64_t i) {
                return static_cast<double>(at(gr, dy->nb[0], i)) * (wd ? at(wd, wnb, i) : 1.0f) * static_cast<double>(at(xr, x->nb[0], i));
            });
        }
        // L2: the norm clamped at eps is a constant there (dx = dy / eps); else the RMS formula with n = 1.
        const bool clamped = l2 && !(std::sqrt(ss) > eps);
        const double rs = l2 ? (clamped ? 1.0 / eps : 1.0 / std::sqrt(ss)) : 1.0 / std::sqrt(ss / static_cast<double>(ne0) + eps);
        const float a = static_cast<float>(rs);
        const float c = clamped ? 0.0f : static_cast<float>(rs * rs * rs * gx / (l2 ? 1.0 : static_cast<double>(ne0)));
        for (int64_t i = 0; i < ne0; ++i) {
            const float g = at(gr, dy->nb[0], i) * (wd ? at(wd, wnb, i) : 1.0f);
            at(d, n->nb[0], i) = a * g - c * at(xr, x->nb[0], i);
        }
    }
}

// The L2 norm's gradient from its output: y = s x with s = 1 / |x| gives dx = s (dy - y (y . dy)); where the norm was
// clamped (s stored negated) s = 1 / eps is a constant and dx = s dy.
void l2_norm_back(Tensor * n) {
    const Tensor * y = n->src[0];
    const float * scales = n->src[1]->data_as<float>();
    const Tensor * dy = n->src[2];
    const int64_t ne0 = n->ne[0], nr = n->nrows();
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const float * yp = reinterpret_cast<const float *>(row_ptr(y, ri));
        const float * gp = reinterpret_cast<const float *>(row_ptr(dy, ri));
        float * d = reinterpret_cast<float *>(row_ptr(n, ri));
        const float s = scales[r];
        if (s < 0.0f) {
            for (int64_t i = 0; i < ne0; ++i) d[i] = -s * gp[i];
            continue;
        }
        const double yg = row_sum(ne0, [=](int64_t i) { return static_cast<double>(yp[i]) * static_cast<double>(gp[i]); });
        const float c = static_cast<float>(s * yg);
        for (int64_t i = 0; i < ne0; ++i) d[i] = s * gp[i] - c * yp[i];
    }
}

// y = ((x r) w) silu(z): rms_norm's product, then SILU's and MUL's, in their order (the same bits as the three ops).
void rms_norm_gated(Tensor * n) {
    const Tensor * x = n->src[0];
    const Tensor * z = n->src[1];
    const Tensor * w = n->src[2];
    const float eps = n->param_f32(0);
    const int64_t ne0 = n->ne[0], nr = n->nrows();
    const char * wd = w ? static_cast<const char *>(w->data) : nullptr;
    const size_t wnb = w ? w->nb[0] : 0;
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const char * xr = row_ptr(x, ri);
        const char * zr = row_ptr(z, ri);
        char * d = row_ptr(n, ri);
        const float rs = static_cast<float>(rms_scale(xr, x->nb[0], ne0, eps));
        float e[kGatePiece];
        for (int64_t i0 = 0; i0 < ne0; i0 += kGatePiece) {
            const int64_t m = std::min(kGatePiece, ne0 - i0);
            neg_exps(zr, z->nb[0], i0, m, e);
            for (int64_t i = 0; i < m; ++i) {
                const float y = at(xr, x->nb[0], i0 + i) * rs;
                const float yw = wd ? y * at(wd, wnb, i0 + i) : y;
                at(d, n->nb[0], i0 + i) = yw * silu_of(at(zr, z->nb[0], i0 + i), e[i]);
            }
        }
    }
}

// param 1 = 0: dx = r g - r^3 x mean(g x) with g = dy w silu(z) (mean(g x) in double, element i in lane i % 8);
//           1: dz = dy (x r w) silu'(z).
void rms_norm_gated_back(Tensor * n) {
    const Tensor * x = n->src[0];
    const Tensor * z = n->src[1];
    const Tensor * dy = n->src[2];
    const Tensor * w = n->src[3];
    const float eps = n->param_f32(0);
    const bool dz = n->param_i32(1) == 1;
    const int64_t ne0 = n->ne[0], nr = n->nrows();
    const char * wd = w ? static_cast<const char *>(w->data) : nullptr;
    const size_t wnb = w ? w->nb[0] : 0, xnb = x->nb[0], znb = z->nb[0], gnb = dy->nb[0], dnb = n->nb[0];
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const char * xr = row_ptr(x, ri);
        const char * zr = row_ptr(z, ri);
        const char * gr = row_ptr(dy, ri);
        char * d = row_ptr(n, ri);
        const double rsd = rms_scale(xr, xnb, ne0, eps);
        const float rs = static_cast<float>(rsd);
        float e[kGatePiece];
        auto weight = [&](int64_t i) { return wd ? at(wd, wnb, i) : 1.0f; };
        if (dz) {
            for (int64_t i0 = 0; i0 < ne0; i0 += kGatePiece) {
                const int64_t m = std::min(kGatePiece, ne0 - i0);
                neg_exps(zr, znb, i0, m, e);
                for (int64_t i = 0; i < m; ++i) {
                    const float y = at(xr, xnb, i0 + i) * rs * weight(i0 + i);
                    at(d, dnb, i0 + i) = at(gr, gnb, i0 + i) * y * silu_grad_of(at(zr, znb, i0 + i), e[i]);
                }
            }
            continue;
        }
        // g_i = dy_i w_i silu(z_i), formed twice (for the sum, then for dx) rather than stored.
        auto g_of = [&](int64_t i, float ei) { return at(gr, gnb, i) * weight(i) * silu_of(at(zr, znb, i), ei); };
        double lanes[8] = {};
        for (int64_t i0 = 0; i0 < ne0; i0 += kGatePiece) {
            const int64_t m = std::min(kGatePiece, ne0 - i0);
            neg_exps(zr, znb, i0, m, e);
            for (int64_t i = 0; i < m; ++i) lanes[(i0 + i) % 8] += static_cast<double>(g_of(i0 + i, e[i])) * at(xr, xnb, i0 + i);
        }
        const double gx = lane_tree(lanes);
        const float c = static_cast<float>(rsd * rsd * rsd * gx / static_cast<double>(ne0));
        for (int64_t i0 = 0; i0 < ne0; i0 += kGatePiece) {
            const int64_t m = std::min(kGatePiece, ne0 - i0);
            neg_exps(zr, znb, i0, m, e);
            for (int64_t i = 0; i < m; ++i) at(d, dnb, i0 + i) = rs * g_of(i0 + i, e[i]) - c * at(xr, xnb, i0 + i);
        }
    }
}

const RegisterKernels kRegister{{Op::RMS_NORM, rms_norm},
                                {Op::RMS_NORM_BACK, rms_norm_back},
                                {Op::L2_NORM_BACK, l2_norm_back},
                                {Op::RMS_NORM_GATED, rms_norm_gated},
                                {Op::RMS_NORM_GATED_BACK, rms_norm_gated_back}};

} // namespace rp::cpu
