// The few-token product behind matmul_fwd (gemm.h) when T <= kMatvecMaxTokens: generation evaluates one
// token at a time, and there the GEMM's packing of every weight panel costs more than the product. Here each
// weight row is read once, in its stored layout: f32 rows directly, other types dequantized row by row into a
// per-thread buffer (quant_block.h's per-element math, so the values equal the GEMM's), then dotted with the
// T activation columns. Rows are split statically over the threads and each output element is one thread's
// dot product in a fixed order: the bits do not depend on the thread count. The sums are in f32 with 16
// partial lanes (what the compiler turns into one vector register), added up in lane order.
#include "ggml_rp/cpu/matvec.h"

#include "ggml_rp/core/quant.h"
#include "ggml_rp/cpu/strided.h"

#include <algorithm>
#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace rp::cpu {

namespace {

constexpr int kLanes = 16;

// sum_k w[k] * x[k] with kLanes partial sums over k mod kLanes, then the lanes in order.
inline float dot(const float * w, const float * x, int64_t K) {
    float acc[kLanes] = {};
    int64_t k = 0;
    for (; k + kLanes <= K; k += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] += w[k + l] * x[k + l];
    for (int l = 0; k < K; ++k, ++l) acc[l] += w[k] * x[k];
    float s = 0.0f;
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    return s;
}

} // namespace

void matvec_fwd(int64_t K, int64_t N, int64_t T, const void * W, TensorType wtype, size_t w_row_bytes, const float * X,
                int64_t x_col, float * Y, int64_t y_col, bool accumulate) {
    const char * base = static_cast<const char *>(W);
    const bool direct = wtype == TensorType::F32;
    // Rows per thread chunk: a static split of N, chunks of 16 rows so neighbours share cache lines of Y.
    const int64_t chunk = 16, n_chunks = (N + chunk - 1) / chunk;
#ifdef _OPENMP
#pragma omp parallel if (N * K >= min_parallel_elements())
#endif
    {
        std::vector<float> row(direct ? 0 : static_cast<size_t>(K));
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t c = 0; c < n_chunks; ++c) {
            for (int64_t n = c * chunk; n < std::min(N, (c + 1) * chunk); ++n) {
                const char * src = base + static_cast<size_t>(n) * w_row_bytes;
                const float * w = direct ? reinterpret_cast<const float *>(src) : row.data();
                if (!direct) dequantize_row(wtype, src, row.data(), K);
                for (int64_t t = 0; t < T; ++t) {
                    const float v = dot(w, X + t * x_col, K);
                    float & y = Y[t * y_col + n];
                    y = accumulate ? y + v : v;
                }
            }
        }
    }
}

} // namespace rp::cpu
