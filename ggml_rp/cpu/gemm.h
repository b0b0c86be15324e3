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
// One token (T == 1) is computed as per-row dot products in the weight's dot format instead (int8 activations
// for Q8_0/Q4_K/Q5_K/Q6_K, bf16 for BF16) when the process has asked for it (set_row_dots, matvec_dot.h: other
// numerics, stated there; off by default).
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

// The kernel scratch (kernel_scratch.h) one call of the kernels above takes: the packed copy of its left operand
// (X, dY, dY^T) when that is larger than the 16 MiB the calling thread keeps for it, else 0. A kernel calling
// them counts, beside its own arrays, the largest of its calls' (they run one after the other).
size_t matmul_fwd_scratch_bytes(int64_t K, int64_t N, int64_t T);
size_t matmul_bwd_x_scratch_bytes(int64_t K, int64_t N, int64_t T);
size_t matmul_bwd_w_scratch_bytes(int64_t K, int64_t N, int64_t T);

} // namespace rp::cpu

// ---- the engine under the three kernels above, for other CPU kernels (attention, cross-entropy) -----------

namespace rp::cpu {

// General f32 product C[i, j] (+)= sum_p A(i, p) * B(p, j) for i < M, j < N, p < K; C row i at C + i*ldc.
// A(i, p) = a_t ? A[p*lda + i] : A[i*lda + p];   B(p, j) = b_t ? B[j*ldb + p] : B[p*ldb + j].
// Single-threaded: meant to be called from inside a parallel loop. Same inner kernel and summation order as
// the kernels above: every C element adds, to its old value (or to 0), one partial sum per block of
// kGemmKC reduction steps, each summed in order with fused multiply-adds.
void gemm_f32_serial(int64_t M, int64_t N, int64_t K, const float * A, int64_t lda, bool a_t,
                     const float * B, int64_t ldb, bool b_t, float * C, int64_t ldc, bool accumulate);

// Reduction steps per partial sum (see above). Fixed, so results do not depend on shapes or threads.
constexpr int64_t kGemmKC = 256;

// Which f32 inner loop the matrix kernels run. Auto is Simd. Portable is the plain C++ micro-kernel that a
// build without AVX2 runs (tests select it to cover it). Blas hands f32 x f32 products to cblas_sgemm, one
// call per fixed output tile from our own threads (OpenBLAS set to one thread), so it stays deterministic;
// without OpenBLAS in the build it behaves as Simd. Process-wide; for tests and rp-bench.
enum class GemmBackend { Auto, Simd, Portable, Blas };
void set_gemm_backend(GemmBackend b);
GemmBackend gemm_backend();
bool gemm_have_blas();
const char * gemm_backend_name(GemmBackend b);

// The SIMD micro-kernel's shape for this build ("avx512 12x32", "avx2 6x16", "portable 4x8").
const char * gemm_simd_name();

// For rp-bench: `calls` calls of that micro-kernel at its full size (MR x NR over one reduction block) on one packed
// pair of panels, which stay in the calling thread's L1, into one C tile: the ceiling of the packed GEMM on this
// CPU, its loads included (the register-only FMA loop is the ceiling of the arithmetic alone). Returns the flops.
double gemm_micro_kernel_resident(int64_t calls);

// Rows per group of the one-token product (generation: one weight row read where it lies, no packing; the
// packed kernel's arithmetic): 16 with AVX-512, 8 with AVX2 + FMA + F16C; 0 in a build without either, where a
// token goes through the packed kernel like a batch.
int gemm_one_row_lanes();

// For rp-bench: what matmul_fwd computes for f32 weights (contiguous columns, no accumulation) as one plain
// cblas_sgemm call with OpenBLAS's own threading on `threads` threads, i.e. OpenBLAS at its best, not
// deterministic. Returns false (and does nothing) when OpenBLAS is not built in.
bool openblas_matmul_fwd(int64_t K, int64_t N, int64_t T, const float * W, const float * X, float * Y, int threads);
// The kernel family OpenBLAS picked for this CPU ("SkylakeX", "Prescott", ...); "" without OpenBLAS.
const char * openblas_core_name();
// OpenBLAS's own thread count now (0 without OpenBLAS).
int openblas_threads();

} // namespace rp::cpu
