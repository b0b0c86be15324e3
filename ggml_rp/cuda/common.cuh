// Shared pieces of the CUDA kernels: error checks that throw rp::Error, warp/block reductions with a fixed
// order (so every result is the same bits on every run), element loads of the three float types.
#pragma once

#include "ggml_rp/core/fp16.h"
#include "base/error.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace rp::cuda {

// The error model of the CUDA code. A runtime call's failure is answered by its return value, and the
// runtime also keeps it as the calling thread's "last error", which is what cudaGetLastError reports after
// a kernel launch (a launch has no return value). So every place that receives a failure -- or an expected
// non-success answer such as cudaErrorNotReady from a query -- clears it there, and cudaGetLastError right
// after a launch (check_launch) then reports that launch and nothing older. Sticky errors (a kernel fault)
// are not cleared by this: every later call reports them again, as it should.
inline void clear_last_error(cudaError_t e) {
    if (e != cudaSuccess) (void)cudaGetLastError();
}

// Throws rp::Error "<what>: <cuda message>" for a failed runtime call (the thread's last error cleared).
inline void check(cudaError_t e, const char * what) {
    if (e != cudaSuccess) {
        clear_last_error(e);
        throw Error(std::string(what) + ": " + cudaGetErrorString(e));
    }
}

// A query's answer (cudaEventQuery, cudaStreamQuery): true when complete, false for cudaErrorNotReady (which
// the runtime also records as the thread's last error: cleared here, or the next launch check would report
// "device not ready"); throws rp::Error "<what>: ..." for any other error.
inline bool query_ready(cudaError_t e, const char * what) {
    if (e == cudaErrorNotReady) {
        clear_last_error(e);
        return false;
    }
    check(e, what);
    return true;
}

// Right after a launch: throws rp::Error naming the kernel for a bad configuration or a sticky error.
inline void check_launch(const char * kernel) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) throw Error(std::string("cuda ") + kernel + ": kernel launch failed: " + cudaGetErrorString(e));
}

// Throws rp::Error "<op>: <why>" for bad arguments (checked on the host before any launch).
inline void require(bool ok, const char * op, const std::string & why) {
    if (!ok) throw Error(std::string("cuda ") + op + ": " + why);
}

// The opt-in shared memory limit per block of the current device (cached per device).
size_t device_smem_optin();

__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum / max (blockDim.x a multiple of 32, at most 1024); every thread gets the result. `red` is
// 32 floats of shared memory. The tree is fixed by blockDim, so the result is deterministic.
__device__ inline float block_sum(float v, float * red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();   // red may still be read by a previous reduction
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = lane < nw ? red[lane] : 0.0f;
    return warp_sum(r);
}

__device__ inline float block_max(float v, float * red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = lane < nw ? red[lane] : -INFINITY;
    return warp_max(r);
}

// Input element -> float, float -> element (round to nearest even), for float, __half and __nv_bfloat16.
__device__ inline float to_f32(float x) { return x; }
__device__ inline float to_f32(__half x) { return __half2float(x); }
__device__ inline float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ inline T from_f32(float x);
template <> __device__ inline float from_f32<float>(float x) { return x; }
template <> __device__ inline __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ inline __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

} // namespace rp::cuda
