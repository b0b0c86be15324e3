// mul_mat and its two backward products on the GPU through cuBLAS (CPU reference: ggml_rp/cpu/gemm.h, the
// same raw-pointer signatures plus alpha, a workspace and a stream). ORIENTATION as in ggml_rp/ops/mul_mat.h:
//     W [ne0 = K = in, ne1 = N = out]  x  X [K, T]  ->  Y [N, T],     Y[n, t] = sum_k W[k, n] X[k, t]
// All pointers are device pointers; enqueued on `stream` with a cuBLAS handle per (host thread, device).
//   f32 W:        cublasSgemm: fp32 throughout, or on TF32 tensor cores when the stream's handle says so
//                 (blas_set_tf32; a CUDA device made with tf32_gemm).
//   f16/bf16 W:   the f32 activations are rounded to W's type in the workspace, then cublasGemmEx on tensor
//                 cores with fp32 accumulation and f32 output.
//   block types:  W is dequantized (ggml_rp/cuda/dequant.cuh) into the workspace, then f32 as above; the rows
//                 must be contiguous (w_row_bytes == row bytes of K elements).
// workspace: matmul_workspace_bytes(K, N, T, wtype) bytes (launch.h), or nullptr when that is 0.
// cuBLAS gives the same bits on every run for one GPU model, toolkit and stream.
#pragma once

#include "gguf/types.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace rp::cuda {

// Y[n, t] = alpha * sum_k W[k, n] X[k, t]  (+ Y[n, t] when accumulate). X column t at X + t*x_col.
void matmul_fwd(int64_t K, int64_t N, int64_t T, const void * W, gguf::TensorType wtype, size_t w_row_bytes,
                const float * X, int64_t x_col, float * Y, int64_t y_col, bool accumulate,
                void * workspace, size_t workspace_bytes, cudaStream_t stream, float alpha = 1.0f);

// dX[k, t] = alpha * sum_n W[k, n] dY[n, t]  (+ dX when accumulate).
void matmul_bwd_x(int64_t K, int64_t N, int64_t T, const void * W, gguf::TensorType wtype, size_t w_row_bytes,
                  const float * dY, int64_t dy_col, float * dX, int64_t dx_col, bool accumulate,
                  void * workspace, size_t workspace_bytes, cudaStream_t stream, float alpha = 1.0f);

// dW[k, n] = alpha * sum_t X[k, t] dY[n, t]  (+ dW when accumulate); f32 dW row n at dW + n*dw_row.
void matmul_bwd_w(int64_t K, int64_t N, int64_t T, const float * X, int64_t x_col, const float * dY, int64_t dy_col,
                  float * dW, int64_t dw_row, bool accumulate, cudaStream_t stream, float alpha = 1.0f);

// max |x| over the columns of `rows` floats (column c at src + c*ld) folded into *out_bits, a non-negative
// float's bits (whose order is the integers'), with atomicMax: exact, so the same bits in any order. Set
// *out_bits (to 0) first.
void absmax_into(const float * src, int64_t ld, int64_t rows, int64_t cols, unsigned * out_bits, cudaStream_t stream);
// The same columns rounded to the half type t (F16 or BF16) into contiguous dst, each multiplied by *scale
// first (device pointer; nullptr: 1).
void round_to_half(gguf::TensorType t, const float * src, int64_t ld, int64_t rows, int64_t cols, void * dst,
                   const float * scale, cudaStream_t stream);

// LoRA linear as a composition of the products above (ggml_rp/ops/lora.h):  y = W x + s * B (A x)
// A: f32 [K, r] (r rows of K), B: f32 [r, N]; x: [K, T], y: [N, T] contiguous. ax ([r, T]) receives A x and
// is kept for the backward. workspace as matmul_fwd for W.
void lora_linear_fwd(int64_t K, int64_t N, int64_t T, int64_t r, const void * W, gguf::TensorType wtype,
                     size_t w_row_bytes, const float * A, const float * B, float s, const float * x, float * y,
                     float * ax, void * workspace, size_t workspace_bytes, cudaStream_t stream);

// dx = W dy + s A (B dy) is overwritten; dA and dB are accumulated; dax ([r, T]) is scratch.
void lora_linear_bwd(int64_t K, int64_t N, int64_t T, int64_t r, const void * W, gguf::TensorType wtype,
                     size_t w_row_bytes, const float * A, const float * B, float s, const float * x,
                     const float * ax, const float * dy, float * dx, float * dA, float * dB, float * dax,
                     void * workspace, size_t workspace_bytes, cudaStream_t stream);

} // namespace rp::cuda
