// Element-wise unary ops on the GPU (CPU reference: ggml_rp/cpu/unary.cpp; per-element math shared through
// ggml_rp/ops/unary_math.h). n contiguous f32 elements at device pointers; outputs may alias inputs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace rp::cuda {

void scale(const float * x, float s, float * y, int64_t n, cudaStream_t stream, float cap = 0.0f);  // y = s x; cap > 0: cap tanh(s x / cap)
void silu_fwd(const float * x, float * y, int64_t n, cudaStream_t stream);                         // y = silu(x)
void silu_bwd(const float * x, const float * dy, float * dx, int64_t n, cudaStream_t stream);      // dy silu'(x)
void sigmoid_fwd(const float * x, float * y, int64_t n, cudaStream_t stream);                      // 1 / (1 + exp(-x))
void softplus_fwd(const float * x, float * y, int64_t n, cudaStream_t stream);                     // log(1 + exp(x))
void swiglu_fwd(const float * g, const float * u, float * y, int64_t n, cudaStream_t stream);      // silu(g) u
// which = 0: d/dgate = dy u silu'(g);  which = 1: d/dup = dy silu(g).
void swiglu_bwd(const float * g, const float * u, const float * dy, float * out, int which, int64_t n,
                cudaStream_t stream);
// Gemma's GeGLU (unary_math.h gelu_tanh_f) and its gradients (which: 0 gate, 1 up).
void geglu_fwd(const float * g, const float * u, float * y, int64_t n, cudaStream_t stream);
void geglu_bwd(const float * g, const float * u, const float * dy, float * out, int which, int64_t n, cudaStream_t stream);
// gpt-oss's clamped SwiGLU (unary_math.h swiglu_oai_f) and its gradients.
void swiglu_oai_fwd(const float * g, const float * u, float alpha, float limit, float * y, int64_t n, cudaStream_t stream);
void swiglu_oai_bwd(const float * g, const float * u, const float * dy, float alpha, float limit, float * out, int which, int64_t n,
                    cudaStream_t stream);

} // namespace rp::cuda
