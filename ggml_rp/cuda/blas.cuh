// cuBLAS handles: one per (GPU, stream), bound to that stream once and given a workspace of its own, so that
// two logical devices (two streams) never share a handle or a workspace. cuBLAS then picks the same algorithm
// with the same workspace for the same shape every time: GEMM results are the same bits on every call, on
// every logical device, whatever runs beside them (the property the RoundPipe tests hold the CUDA backend to).
//
// A handle and its workspace (cudaMalloc'd, blas_workspace_bytes) are made on a stream's first GEMM and
// released with the stream (CudaStream's destructor). A CudaDevice makes its compute stream's handle at
// construction, so the workspace is reserved before any work and counted in the device's memory footprint
// (make_cuda_devices checks capacity + workspace against the GPU's free memory).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace rp::cuda {

// The workspace a CUDA device reserves for its compute stream's cuBLAS handle: 32 MiB on Hopper (cuBLAS's
// recommendation for sm_90), 4 MiB before.
inline constexpr size_t blas_workspace_bytes(int cc_major) { return size_t(cc_major >= 9 ? 32 : 4) << 20; }

// The handle of `stream` on the current GPU, made on first use. Throws rp::Error naming `what`.
cublasHandle_t blas_handle(cudaStream_t stream, const char * what);
// How the stream's handle runs f32 GEMMs (cublasSgemm: the LoRA products, the weight gradients, dequantized
// block-type weights): on TF32 tensor cores (inputs rounded to 10 mantissa bits, fp32 accumulation; about 8x
// the fp32 rate on Ampere and Hopper, relative error ~1e-3 per product) or in plain fp32 (the default). Still
// the same bits on every run for one GPU model, toolkit and shape. Makes the handle when there is none.
void blas_set_tf32(cudaStream_t stream, bool tf32, const char * what);
// Destroys the stream's handle and frees its workspace (with the stream's GPU current; a no-op without one).
void blas_release(cudaStream_t stream);

} // namespace rp::cuda
