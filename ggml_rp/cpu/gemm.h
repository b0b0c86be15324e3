// CPU matrix-product kernels behind the mul_mat op and its backward. Plain functions on raw pointers, so the
// op layer, the benchmarks and the CUDA tests share them.
//
// ORIENTATION (the one rule, as in ggml): a weight W has ne = [K=in, N=out]; each of its N rows holds K
// contiguous values. Activations X have ne = [K, T]: T columns of K contiguous values (one per token).
//     Y[ne0=N, ne1=T] = mul_mat(W, X)      Y[n, t] = sum_k W[k, n] * X[k, t]
//
// All three kernels are deterministic: every output element is reduced in a fixed order that does not
// depend on the number of threads.
#pragma once

#include "gguf/types.h"

#include <cstddef>
#include <cstdint>

namespace rp::cpu {

using gguf::TensorType;

// Y[n, t] (+)= sum_k W[k, n] * X[k, t].
// W: N rows of K elements of type wtype, row stride w_row_bytes (any dequantizable type; quantized rows are
// dequantized in tiles inside the kernel). X: column t at X + t*x_col (floats). Y: column t at Y + t*y_col.
void matmul_fwd(int64_t K, int64_t N, int64_t T,
                const void * W, TensorType wtype, size_t w_row_bytes,
                const float * X, int64_t x_col, float * Y, int64_t y_col, bool accumulate);

// Gradient w.r.t. the activations: dX[k, t] (+)= sum_n W[k, n] * dY[n, t]. W as in matmul_fwd.
void matmul_bwd_x(int64_t K, int64_t N, int64_t T,
                  const void * W, TensorType wtype, size_t w_row_bytes,
                  const float * dY, int64_t dy_col, float * dX, int64_t dx_col, bool accumulate);

// Gradient w.r.t. an f32 weight: dW[k, n] (+)= sum_t X[k, t] * dY[n, t]. dW row n at dW + n*dw_row (floats).
void matmul_bwd_w(int64_t K, int64_t N, int64_t T,
                  const float * X, int64_t x_col, const float * dY, int64_t dy_col,
                  float * dW, int64_t dw_row, bool accumulate);

} // namespace rp::cpu
