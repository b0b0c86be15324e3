// MUL_MAT, MUL_MAT_BACK_X, OUT_PROD (f32 weight gradient) and the LoRA composition through cuBLAS.
// cuBLAS is column-major: a row-major W [N rows of K] is the column-major K x N matrix with ld = row stride,
// and the [K, T] activations are column-major K x T. So
//   Y  (N x T) = W^T X        gemm(T, N)
//   dX (K x T) = W dY         gemm(N, N)
//   dW (K x N) = X dY^T       gemm(N, T)
#include "ggml_rp/cuda/mul_mat.cuh"

#include "ggml_rp/cuda/blas.cuh"
#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/dequant.cuh"
#include "ggml_rp/cuda/half_scale.h"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/node_kernel.cuh"
#include "ggml_rp/ops/node_args.h"

#include <algorithm>
#include <cublas_v2.h>

#include <vector>

namespace rp::cuda {

namespace {

void blas_check(cublasStatus_t st, const char * what) {
    if (st != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuda ") + what + ": cuBLAS failed: " + cublasGetStatusString(st));
}

// Columns of `rows` floats (column c at src + c*ld) -> contiguous columns of the half type, each value
// multiplied by *scale first (nullptr: 1; f16 only, half_scale.h).
template <class H>
__global__ void __launch_bounds__(kElemThreads) round_kernel(const float * __restrict__ src, int64_t ld, int64_t rows, int64_t n, const float * scale,
                             H * __restrict__ dst) {
    const float m = scale ? *scale : 1.0f;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = from_f32<H>(src[i / rows * ld + i % rows] * m);
}

// max |x| of the same columns, as the bits of a non-negative float (whose order is the integers' order), into
// *out with atomicMax: the maximum is exact, so any order of the atomics gives the same bits.
__global__ void __launch_bounds__(kElemThreads) absmax_kernel(const float * __restrict__ src, int64_t ld, int64_t rows, int64_t n, unsigned * out) {
    float m = 0.0f;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        m = fmaxf(m, fabsf(src[i / rows * ld + i % rows]));
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) atomicMax(out, __float_as_uint(m));
}

// The f16 header of the workspace: the max (bits), the scale 2^k, and the GEMM's alpha * 2^-k and beta.
struct HalfHeader {
    unsigned max_bits;
    float scale;
    float alpha;
    float beta;
};

__global__ void __launch_bounds__(1) half_scale_kernel(HalfHeader * h, float alpha, float beta) {
    const int k = half_scale_exponent(__uint_as_float(h->max_bits));
    h->scale = ldexpf(1.0f, k);
    h->alpha = alpha * ldexpf(1.0f, -k);
    h->beta = beta;
}


// f16: the power-of-two scale of src into the workspace header (alpha and beta next to it, for cuBLAS to
// read from device memory), then src rounded to f16 after the workspace header. Returns the header.
HalfHeader * scaled_to_f16(const float * src, int64_t ld, int64_t rows, int64_t cols, float alpha, float beta, void * ws,
                           cudaStream_t stream) {
    auto * h = static_cast<HalfHeader *>(ws);
    check(cudaMemsetAsync(&h->max_bits, 0, sizeof(unsigned), stream), "cuda mul_mat (f16 scale)");
    absmax_into(src, ld, rows, cols, &h->max_bits, stream);
    half_scale_kernel<<<1, 1, 0, stream>>>(h, alpha, beta);
    check_launch("mul_mat (f16 scale)");
    round_to_half(gguf::TensorType::F16, src, ld, rows, cols, static_cast<char *>(ws) + kHalfScaleHeader, &h->scale, stream);
    return h;
}

} // namespace

void round_to_half(gguf::TensorType t, const float * src, int64_t ld, int64_t rows, int64_t cols, void * dst,
                   const float * scale, cudaStream_t stream) {
    const int64_t n = rows * cols;
    if (n == 0) return;
    const unsigned grid = static_cast<unsigned>(elementwise_grid(n));
    if (t == gguf::TensorType::F16)
        round_kernel<__half><<<grid, kElemThreads, 0, stream>>>(src, ld, rows, n, scale, static_cast<__half *>(dst));
    else
        round_kernel<__nv_bfloat16><<<grid, kElemThreads, 0, stream>>>(src, ld, rows, n, scale, static_cast<__nv_bfloat16 *>(dst));
    check_launch("mul_mat (round activations)");
}

void absmax_into(const float * src, int64_t ld, int64_t rows, int64_t cols, unsigned * out_bits, cudaStream_t stream) {
    const int64_t n = rows * cols;
    if (n <= 0) return;
    absmax_kernel<<<static_cast<unsigned>(elementwise_grid(n)), kElemThreads, 0, stream>>>(src, ld, rows, n, out_bits);
    check_launch("absmax");
}

namespace {

bool is_half(gguf::TensorType t) { return t == gguf::TensorType::F16 || t == gguf::TensorType::BF16; }

// Checks the weight's type and row stride; returns the row stride in elements of the (dequantized) matrix.
int64_t weight_ld(const char * op, int64_t K, int64_t N, int64_t T, gguf::TensorType wtype, size_t w_row_bytes,
                  size_t workspace_bytes) {
    const uint32_t id = static_cast<uint32_t>(wtype);
    const gguf::TypeTraits * tt = gguf::type_traits(id);
    require(tt && can_dequantize(wtype), op, std::string("unsupported weight type ") + gguf::type_name(id));
    require(K >= 1 && N >= 1 && T >= 0, op,
            "bad shape K=" + std::to_string(K) + " N=" + std::to_string(N) + " T=" + std::to_string(T));
    require(K % tt->block_size == 0, op, "K=" + std::to_string(K) + " is not a multiple of the block size of " + tt->name);
    const size_t need = matmul_workspace_bytes(K, N, T, wtype);
    require(workspace_bytes >= need, op, "workspace of " + std::to_string(workspace_bytes) + " bytes for a " +
                                             tt->name + " weight is smaller than the " + std::to_string(need) + " needed");
    const size_t row = gguf::row_bytes(wtype, K);
    if (tt->block_size > 1) {
        require(w_row_bytes == row, op, std::string("rows of the ") + tt->name + " weight must be contiguous (" +
                                            std::to_string(row) + " bytes), got stride " + std::to_string(w_row_bytes));
        return K;
    }
    require(w_row_bytes >= row && w_row_bytes % tt->type_size == 0, op,
            "weight row stride " + std::to_string(w_row_bytes) + " bytes is not a whole number of " + tt->name +
                " elements >= K");
    return static_cast<int64_t>(w_row_bytes / tt->type_size);
}

// C (m x n, ldc) = alpha op(A) op(B) + beta C with A, B of the weight's float type and f32 C. With `scaled`
// (an f16 operand scaled by half_scale.h), alpha and beta are read from its header in device memory instead.
void gemm(const char * op, cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
          int64_t k, float alpha, const void * A, gguf::TensorType atype, int64_t lda, const void * B, int64_t ldb,
          float beta, float * C, int64_t ldc, const HalfHeader * scaled = nullptr) {
    if (m == 0 || n == 0) return;
    cublasHandle_t h = blas_handle(stream, op);
    if (scaled) {
        const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
        blas_check(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE), op);
        const cublasStatus_t st = cublasGemmEx(h, ta, tb, mi, ni, ki, &scaled->alpha, A, CUDA_R_16F, static_cast<int>(lda), B,
                                               CUDA_R_16F, static_cast<int>(ldb), &scaled->beta, C, CUDA_R_32F,
                                               static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        blas_check(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST), op);
        blas_check(st, op);
        return;
    }
    const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
    if (atype == gguf::TensorType::F32) {
        blas_check(cublasSgemm(h, ta, tb, mi, ni, ki, &alpha, static_cast<const float *>(A), static_cast<int>(lda),
                               static_cast<const float *>(B), static_cast<int>(ldb), &beta, C, static_cast<int>(ldc)),
                   op);
        return;
    }
    const cudaDataType_t dt = atype == gguf::TensorType::F16 ? CUDA_R_16F : CUDA_R_16BF;
    blas_check(cublasGemmEx(h, ta, tb, mi, ni, ki, &alpha, A, dt, static_cast<int>(lda), B, dt, static_cast<int>(ldb),
                            &beta, C, CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               op);
}

void check_int(const char * op, std::initializer_list<int64_t> v) {
    for (int64_t x : v) require(x >= 0 && x <= 0x7fffffff, op, "dimension or stride " + std::to_string(x) + " exceeds int");
}

} // namespace

void matmul_fwd(int64_t K, int64_t N, int64_t T, const void * W, gguf::TensorType wtype, size_t w_row_bytes,
                const float * X, int64_t x_col, float * Y, int64_t y_col, bool accumulate, void * ws, size_t ws_bytes,
                cudaStream_t stream, float alpha) {
    const char * op = "mul_mat";
    int64_t lda = weight_ld(op, K, N, T, wtype, w_row_bytes, ws_bytes);
    check_int(op, {K, N, T, lda, x_col, y_col});
    require(x_col >= K && y_col >= N, op, "column strides must be >= K and N");
    const float beta = accumulate ? 1.0f : 0.0f;
    if (T == 0) return;
    if (wtype == gguf::TensorType::F16) {  // X scaled into f16's range (half_scale.h), alpha scaled back
        const HalfHeader * h = scaled_to_f16(X, x_col, K, T, alpha, beta, ws, stream);
        gemm(op, stream, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, alpha, W, wtype, lda, static_cast<char *>(ws) + kHalfScaleHeader,
             K, beta, Y, y_col, h);
        return;
    }
    if (wtype == gguf::TensorType::F32 || is_half(wtype)) {
        const void * B = X;
        int64_t ldb = x_col;
        if (is_half(wtype)) { round_to_half(wtype, X, x_col, K, T, ws, nullptr, stream); B = ws; ldb = K; }
        gemm(op, stream, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, alpha, W, wtype, lda, B, ldb, beta, Y, y_col);
        return;
    }
    // Quantized: rows [n0, n0 + tile) of W dequantized into scratch give rows [n0, n0 + tile) of Y (each
    // element's sum over K is the same as with the whole matrix).
    float * Wf = static_cast<float *>(ws);
    const int64_t tile = dequant_tile_rows(K, N);
    const size_t row = gguf::row_bytes(wtype, K);
    for (int64_t n0 = 0; n0 < N; n0 += tile) {
        const int64_t nt = std::min(tile, N - n0);
        dequantize(wtype, static_cast<const char *>(W) + static_cast<size_t>(n0) * row, Wf, K * nt, stream);
        gemm(op, stream, CUBLAS_OP_T, CUBLAS_OP_N, nt, T, K, alpha, Wf, gguf::TensorType::F32, K, X, x_col, beta, Y + n0, y_col);
    }
}

void matmul_bwd_x(int64_t K, int64_t N, int64_t T, const void * W, gguf::TensorType wtype, size_t w_row_bytes,
                  const float * dY, int64_t dy_col, float * dX, int64_t dx_col, bool accumulate, void * ws,
                  size_t ws_bytes, cudaStream_t stream, float alpha) {
    const char * op = "mul_mat_back_x";
    int64_t lda = weight_ld(op, K, N, T, wtype, w_row_bytes, ws_bytes);
    check_int(op, {K, N, T, lda, dy_col, dx_col});
    require(dy_col >= N && dx_col >= K, op, "column strides must be >= N and K");
    const float beta = accumulate ? 1.0f : 0.0f;
    if (T == 0) return;
    if (wtype == gguf::TensorType::F16) {  // dY (often ~1e-6, below f16's normal range) scaled, alpha scaled back
        const HalfHeader * h = scaled_to_f16(dY, dy_col, N, T, alpha, beta, ws, stream);
        gemm(op, stream, CUBLAS_OP_N, CUBLAS_OP_N, K, T, N, alpha, W, wtype, lda, static_cast<char *>(ws) + kHalfScaleHeader,
             N, beta, dX, dx_col, h);
        return;
    }
    if (wtype == gguf::TensorType::F32 || is_half(wtype)) {
        const void * B = dY;
        int64_t ldb = dy_col;
        if (is_half(wtype)) { round_to_half(wtype, dY, dy_col, N, T, ws, nullptr, stream); B = ws; ldb = N; }
        gemm(op, stream, CUBLAS_OP_N, CUBLAS_OP_N, K, T, N, alpha, W, wtype, lda, B, ldb, beta, dX, dx_col);
        return;
    }
    // Quantized: dX = sum over row tiles of W_tile dY_tile, the first tile with beta, the rest accumulating
    // (stream order serialises the reuse of the scratch tile).
    float * Wf = static_cast<float *>(ws);
    const int64_t tile = dequant_tile_rows(K, N);
    const size_t row = gguf::row_bytes(wtype, K);
    for (int64_t n0 = 0; n0 < N; n0 += tile) {
        const int64_t nt = std::min(tile, N - n0);
        dequantize(wtype, static_cast<const char *>(W) + static_cast<size_t>(n0) * row, Wf, K * nt, stream);
        gemm(op, stream, CUBLAS_OP_N, CUBLAS_OP_N, K, T, nt, alpha, Wf, gguf::TensorType::F32, K, dY + n0, dy_col,
             n0 == 0 ? beta : 1.0f, dX, dx_col);
    }
}

void matmul_bwd_w(int64_t K, int64_t N, int64_t T, const float * X, int64_t x_col, const float * dY, int64_t dy_col,
                  float * dW, int64_t dw_row, bool accumulate, cudaStream_t stream, float alpha) {
    const char * op = "out_prod";
    require(K >= 1 && N >= 1 && T >= 0, op,
            "bad shape K=" + std::to_string(K) + " N=" + std::to_string(N) + " T=" + std::to_string(T));
    check_int(op, {K, N, T, x_col, dy_col, dw_row});
    require(x_col >= K && dy_col >= N && dw_row >= K, op, "strides must be >= K, N and K");
    if (T == 0) {
        if (!accumulate)
            for (int64_t n = 0; n < N; ++n)
                check(cudaMemsetAsync(dW + n * dw_row, 0, static_cast<size_t>(K) * 4, stream), "cuda out_prod");
        return;
    }
    gemm(op, stream, CUBLAS_OP_N, CUBLAS_OP_T, K, N, T, alpha, X, gguf::TensorType::F32, x_col, dY, dy_col,
         accumulate ? 1.0f : 0.0f, dW, dw_row);
}

void lora_linear_fwd(int64_t K, int64_t N, int64_t T, int64_t r, const void * W, gguf::TensorType wtype,
                     size_t w_row_bytes, const float * A, const float * B, float s, const float * x, float * y,
                     float * ax, void * ws, size_t ws_bytes, cudaStream_t stream) {
    const auto F32 = gguf::TensorType::F32;
    require(r >= 1, "lora_linear", "rank " + std::to_string(r) + " must be >= 1");
    matmul_fwd(K, N, T, W, wtype, w_row_bytes, x, K, y, N, false, ws, ws_bytes, stream);
    matmul_fwd(K, r, T, A, F32, size_t(K) * 4, x, K, ax, r, false, nullptr, 0, stream);
    matmul_fwd(r, N, T, B, F32, size_t(r) * 4, ax, r, y, N, true, nullptr, 0, stream, s);
}

void lora_linear_bwd(int64_t K, int64_t N, int64_t T, int64_t r, const void * W, gguf::TensorType wtype,
                     size_t w_row_bytes, const float * A, const float * B, float s, const float * x,
                     const float * ax, const float * dy, float * dx, float * dA, float * dB, float * dax, void * ws,
                     size_t ws_bytes, cudaStream_t stream) {
    const auto F32 = gguf::TensorType::F32;
    require(r >= 1, "lora_linear_back", "rank " + std::to_string(r) + " must be >= 1");
    matmul_bwd_x(K, N, T, W, wtype, w_row_bytes, dy, N, dx, K, false, ws, ws_bytes, stream);   // dx  = W dy
    matmul_bwd_w(r, N, T, ax, r, dy, N, dB, r, true, stream, s);                               // dB += s (Ax) dy^T
    matmul_bwd_x(r, N, T, B, F32, size_t(r) * 4, dy, N, dax, r, false, nullptr, 0, stream, s); // dax = s B dy
    matmul_bwd_w(K, r, T, x, K, dax, r, dA, K, true, stream);                                  // dA += x dax^T
    matmul_bwd_x(K, r, T, A, F32, size_t(K) * 4, dax, r, dx, K, true, nullptr, 0, stream);     // dx += A dax
}

// ---- node entries (the batch / broadcast loops are ops/node_args.h's, shared with the CPU) ----
namespace {
void run_mul_mat(Tensor * n, const NodeRun & r) {
    node::for_each_gemm_batch(n, [&](const node::MatmulArgs & a) {
        matmul_fwd(a.K, a.N, a.T, a.w, n->src[0]->type, a.w_row, a.x, a.ldx, a.out, a.ld_out, a.accumulate, r.scratch,
                   r.scratch_bytes, r.stream);
    });
}
void run_mul_mat_back_x(Tensor * n, const NodeRun & r) {
    node::for_each_gemm_batch(n, [&](const node::MatmulArgs & a) {
        matmul_bwd_x(a.K, a.N, a.T, a.w, n->src[0]->type, a.w_row, a.x, a.ldx, a.out, a.ld_out, a.accumulate, r.scratch,
                     r.scratch_bytes, r.stream);
    });
}
void run_out_prod(Tensor * n, const NodeRun & r) {
    node::for_each_out_prod_batch(n, [&](const node::MatmulArgs & a) {
        matmul_bwd_w(a.K, a.N, a.T, a.x, a.ldx, a.y_in, a.ldy_in, a.out, a.ld_out, a.accumulate, r.stream);
    });
}
const RegisterNodeKernels kRegister{
    {Op::MUL_MAT, run_mul_mat}, {Op::MUL_MAT_BACK_X, run_mul_mat_back_x}, {Op::OUT_PROD, run_out_prod}};
} // namespace

} // namespace rp::cuda
