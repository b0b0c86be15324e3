// MUL_MAT, MUL_MAT_BACK_X and OUT_PROD: batch and broadcast bookkeeping around the GEMM kernels of gemm.h
// (which are parallel and deterministic inside). Orientation: see ggml_rp/ops/mul_mat.h.
#include "ggml_rp/cpu/gemm.h"
#include "ggml_rp/cpu/kernels.h"
#include "ggml_rp/cpu/strided.h"

namespace rp::cpu {

namespace {

const char * wbatch(const Tensor * W, int64_t i2, int64_t i3, const Tensor * X) {
    const int64_t r2 = X->ne[2] / W->ne[2], r3 = X->ne[3] / W->ne[3];
    return static_cast<const char *>(W->data) + (i2 / r2) * W->nb[2] + (i3 / r3) * W->nb[3];
}

inline int64_t col_floats(const Tensor * t) { return static_cast<int64_t>(t->nb[1] / sizeof(float)); }

} // namespace

void mul_mat(Tensor * n) {
    const Tensor * W = n->src[0];
    const Tensor * X = n->src[1];
    const int64_t K = W->ne[0], N = W->ne[1], T = X->ne[1];
    for (int64_t i3 = 0; i3 < X->ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < X->ne[2]; ++i2)
            matmul_fwd(K, N, T, wbatch(W, i2, i3, X), W->type, W->nb[1],
                       reinterpret_cast<const float *>(row_ptr(X, 0, i2, i3)), col_floats(X),
                       reinterpret_cast<float *>(row_ptr(n, 0, i2, i3)), col_floats(n), false);
}

void mul_mat_back_x(Tensor * n) {
    const Tensor * W = n->src[0];
    const Tensor * dY = n->src[1];
    const int64_t K = W->ne[0], N = W->ne[1], T = n->ne[1];
    for (int64_t i3 = 0; i3 < n->ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < n->ne[2]; ++i2)
            matmul_bwd_x(K, N, T, wbatch(W, i2, i3, n), W->type, W->nb[1],
                         reinterpret_cast<const float *>(row_ptr(dY, 0, i2, i3)), col_floats(dY),
                         reinterpret_cast<float *>(row_ptr(n, 0, i2, i3)), col_floats(n), false);
}

void out_prod(Tensor * n) {
    const Tensor * X = n->src[0];
    const Tensor * dY = n->src[1];
    const bool accumulate = n->param_i32(0) != 0;
    const int64_t K = n->ne[0], N = n->ne[1], T = X->ne[1];
    const int64_t r2 = X->ne[2] / n->ne[2], r3 = X->ne[3] / n->ne[3];
    // Each weight batch sums the activation batches that used it, in a fixed order.
    for (int64_t w3 = 0; w3 < n->ne[3]; ++w3)
        for (int64_t w2 = 0; w2 < n->ne[2]; ++w2) {
            bool acc = accumulate;
            float * dW = reinterpret_cast<float *>(row_ptr(n, 0, w2, w3));
            for (int64_t i3 = w3 * r3; i3 < (w3 + 1) * r3; ++i3)
                for (int64_t i2 = w2 * r2; i2 < (w2 + 1) * r2; ++i2) {
                    matmul_bwd_w(K, N, T, reinterpret_cast<const float *>(row_ptr(X, 0, i2, i3)), col_floats(X),
                                 reinterpret_cast<const float *>(row_ptr(dY, 0, i2, i3)), col_floats(dY), dW,
                                 col_floats(n), acc);
                    acc = true;
                }
        }
}

} // namespace rp::cpu
