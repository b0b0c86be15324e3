// FILL and CPY on the GPU (CPU reference: ggml_rp/cpu/copy.cpp; ops in ggml_rp/ops/copy.h), and the strided
// element access that the copy and reduction kernels share: sizes and byte strides passed by value, element
// loads and stores of f32 / f16 / bf16 through them.
#pragma once

#include "ggml_rp/core/tensor.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace rp::cuda {

// Sizes and byte strides of a tensor, passed by value to a kernel.
struct Strided {
    int64_t ne[4];
    int64_t nb[4];
};

inline Strided strided(const Tensor * t) {
    Strided s;
    for (int i = 0; i < 4; ++i) {
        s.ne[i] = t->ne[i];
        s.nb[i] = static_cast<int64_t>(t->nb[i]);
    }
    return s;
}

// Element types of the strided kernels: 0 f32, 1 f16, 2 bf16.
inline int float_code(DType t) { return t == DType::F16 ? 1 : t == DType::BF16 ? 2 : 0; }

__device__ inline int64_t offset_of(const Strided & s, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return i0 * s.nb[0] + i1 * s.nb[1] + i2 * s.nb[2] + i3 * s.nb[3];
}

// Linear index i (i0 fastest) of a tensor with sizes ne -> its four coordinates.
__device__ inline void coords(const Strided & s, int64_t i, int64_t c[4]) {
    c[0] = i % s.ne[0];
    i /= s.ne[0];
    c[1] = i % s.ne[1];
    i /= s.ne[1];
    c[2] = i % s.ne[2];
    c[3] = i / s.ne[2];
}

__device__ inline float load_float(const char * p, int code) {
    if (code == 1) return __half2float(*reinterpret_cast<const __half *>(p));
    if (code == 2) return __bfloat162float(*reinterpret_cast<const __nv_bfloat16 *>(p));
    return *reinterpret_cast<const float *>(p);
}

__device__ inline void store_float(char * p, int code, float v) {
    if (code == 1) *reinterpret_cast<__half *>(p) = __float2half_rn(v);
    else if (code == 2) *reinterpret_cast<__nv_bfloat16 *>(p) = __float2bfloat16_rn(v);
    else *reinterpret_cast<float *>(p) = v;
}

// Enqueues dst = src element by element through both tensors' strides, converting f32/f16/bf16 (the CPY
// node, and the backend's packing of strided operands).
void enqueue_cpy(const Tensor * src, const Tensor * dst, cudaStream_t stream);

} // namespace rp::cuda
