// RP_HD marks functions that the CPU kernels and the CUDA kernels share (per-element math, block formats):
// __host__ __device__ under nvcc, nothing for the host compiler.
#pragma once

#if defined(__CUDACC__)
#define RP_HD __host__ __device__
#else
#define RP_HD
#endif
