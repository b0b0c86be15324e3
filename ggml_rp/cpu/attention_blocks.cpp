#include "ggml_rp/cpu/attention_blocks.h"

#include "ggml_rp/cpu/gemm.h"

#include <cmath>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RP_ATTN_AVX2 1
#endif

namespace rp::cpu {

namespace {

// ---- the small-head kernels: the scalar form of every element (the vector tiles below do the same) ----

float dot_element(int64_t D, const float * a, const float * bt, int64_t ldw) {
    float v = a[0] * bt[0];
    for (int64_t d = 1; d < D; ++d) v = std::fma(a[d], bt[d * ldw], v);
    return v;
}

void rows_dot_scalar(int64_t i0, int64_t m, int64_t j0, int64_t n, int64_t D, const float * a, int64_t as, const float * bt,
                     int64_t ldw, float * S) {
    for (int64_t i = i0; i < m; ++i)
        for (int64_t j = j0; j < n; ++j) S[i * ldw + j] = dot_element(D, a + i * as, bt + j, ldw);
}

void accumulate_scalar(int64_t r0, int64_t rows, int64_t K, int64_t D, const float * w, int64_t wr, int64_t wk, const float * x,
                       int64_t xs, float * C) {
    for (int64_t r = r0; r < rows; ++r)
        for (int64_t d = 0; d < D; ++d) {
            float c = C[r * D + d];
            for (int64_t k = 0; k < K; ++k) c = std::fma(w[r * wr + k * wk], x[k * xs + d], c);
            C[r * D + d] = c;
        }
}

#ifdef RP_ATTN_AVX2
// S rows [0, R) x columns [0, 8C) of one tile: R x C accumulators over the d-sum.
template <int R, int C>
inline void dot_tile(int64_t D, const float * a, int64_t as, const float * bt, int64_t ldw, float * S) {
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r) {
        const __m256 x = _mm256_set1_ps(a[r * as]);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_mul_ps(x, _mm256_loadu_ps(bt + 8 * c));
    }
    for (int64_t d = 1; d < D; ++d) {
        __m256 b[C];
        for (int c = 0; c < C; ++c) b[c] = _mm256_loadu_ps(bt + d * ldw + 8 * c);
        for (int r = 0; r < R; ++r) {
            const __m256 x = _mm256_set1_ps(a[r * as + d]);
            for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(x, b[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) _mm256_storeu_ps(S + r * ldw + 8 * c, acc[r][c]);
}

// C rows [0, R), all 8C columns (D = 8C): the k-sum onto C's values.
template <int R, int C>
inline void accumulate_tile(int64_t K, const float * w, int64_t wr, int64_t wk, const float * x, int64_t xs, float * Cm) {
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_loadu_ps(Cm + r * 8 * C + 8 * c);
    for (int64_t k = 0; k < K; ++k) {
        __m256 xv[C];
        for (int c = 0; c < C; ++c) xv[c] = _mm256_loadu_ps(x + k * xs + 8 * c);
        for (int r = 0; r < R; ++r) {
            const __m256 s = _mm256_set1_ps(w[r * wr + k * wk]);
            for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(s, xv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) _mm256_storeu_ps(Cm + r * 8 * C + 8 * c, acc[r][c]);
}

template <int C>
void accumulate_rows(int64_t rows, int64_t K, const float * w, int64_t wr, int64_t wk, const float * x, int64_t xs, float * Cm) {
    // Eight accumulators in flight (two FMA pipes of latency 4: each row's sum is one dependency chain), within
    // the 16 ymm registers of AVX2 with the x row and the broadcast.
    constexpr int R = 8 / C;
    int64_t r = 0;
    for (; r + R <= rows; r += R) accumulate_tile<R, C>(K, w + r * wr, wr, wk, x, xs, Cm + r * 8 * C);
    for (; r < rows; ++r) accumulate_tile<1, C>(K, w + r * wr, wr, wk, x, xs, Cm + r * 8 * C);
}
#endif

} // namespace

AttentionBlocks::AttentionBlocks(int64_t head_dim, int64_t bk_stride)
    : D_(head_dim), ldw_(bk_stride), small_(head_dim == 8 || head_dim == 16) {}

const float * AttentionBlocks::transposed(int64_t n, const float * b, int64_t bs, float * bt) const {
    if (!small_) return b;
    for (int64_t j = 0; j < n; ++j)
        for (int64_t d = 0; d < D_; ++d) bt[d * ldw_ + j] = b[j * bs + d];
    return bt;
}

void AttentionBlocks::rows_dot(int64_t m, int64_t n, const float * a, int64_t as, const float * bt, int64_t bs, float * S) const {
    if (!small_) {
        gemm_f32_serial(m, n, D_, a, as, false, bt, bs, true, S, ldw_, false);
        return;
    }
    int64_t n_vec = 0;
#ifdef RP_ATTN_AVX2
    if (gemm_backend() != GemmBackend::Portable) {
        n_vec = n / 8 * 8;
        int64_t i = 0;
        for (; i + 4 <= m; i += 4) {
            int64_t j = 0;
            for (; j + 16 <= n_vec; j += 16) dot_tile<4, 2>(D_, a + i * as, as, bt + j, ldw_, S + i * ldw_ + j);
            for (; j < n_vec; j += 8) dot_tile<4, 1>(D_, a + i * as, as, bt + j, ldw_, S + i * ldw_ + j);
        }
        for (; i < m; ++i)
            for (int64_t j = 0; j < n_vec; j += 8) dot_tile<1, 1>(D_, a + i * as, as, bt + j, ldw_, S + i * ldw_ + j);
    }
#endif
    rows_dot_scalar(0, m, n_vec, n, D_, a, as, bt, ldw_, S);
}

void AttentionBlocks::accumulate(int64_t rows, int64_t K, const float * w, bool transpose_w, const float * x, int64_t xs,
                                 float * C) const {
    if (!small_) {
        gemm_f32_serial(rows, D_, K, w, ldw_, transpose_w, x, xs, false, C, D_, true);
        return;
    }
    const int64_t wr = transpose_w ? 1 : ldw_, wk = transpose_w ? ldw_ : 1;
#ifdef RP_ATTN_AVX2
    if (gemm_backend() != GemmBackend::Portable) {
        if (D_ == 8) accumulate_rows<1>(rows, K, w, wr, wk, x, xs, C);
        else accumulate_rows<2>(rows, K, w, wr, wk, x, xs, C);
        return;
    }
#endif
    accumulate_scalar(0, rows, K, D_, w, wr, wk, x, xs, C);
}

} // namespace rp::cpu
