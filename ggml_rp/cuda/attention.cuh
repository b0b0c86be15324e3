// Fused causal grouped-query attention on the GPU, flash style (CPU reference: ggml_rp/cpu/attention.h, the
// same layouts and semantics; op contract in ggml_rp/ops/attention.h).
//
// Layouts (contiguous, d fastest): q, o, dq, dout: [D, Hq, Tq, B]; k, v, dk, dv: [D, Hkv, Tk, B];
// lse: [Hq, Tq, B]. Query t sees keys key_start[t] <= j <= t + (Tk - Tq) (key_start optional: packed
// sequences), and with s.window > 0 only j > t + (Tk - Tq) - window. sinks (optional, f32 [Hq]): one logit per
// head in every row's softmax denominator (ops/attention.h). D <= 256, Hq % Hkv == 0.
// q, k, v and dout have the element type `type` (F32, F16 or BF16); o, lse and the gradients are f32.
// F16/BF16 inputs run the tile products on tensor cores (wmma, fp32 accumulation; the probabilities are
// rounded to the input type before P V, as FlashAttention does); F32 inputs run fp32 FMA products.
//
// Forward: per (query tile, head, sequence) block, online softmax over the visible key tiles; saves lse.
// Backward (recompute from lse): one kernel per (key tile, kv head, sequence) accumulates dK, dV over the
// group's query heads and the query tiles in order; one per (query tile, head, sequence) accumulates dQ over
// the key tiles in order. Every output row is owned by one block: deterministic, no atomics.
// Tile shapes follow the device's shared memory (attention_tiles in launch.h).
#pragma once

#include "ggml_rp/ops/attention_shape.h"
#include "gguf/types.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace rp::cuda {

using rp::AttentionShape;  // ops/attention_shape.h

// key_start (device memory, nullable): i32 [Tq, B], the first key each query sees (cpu/attention.h).
void attention_fwd(const AttentionShape & s, gguf::TensorType type, const void * q, const void * k, const void * v,
                   float * o, float * lse, cudaStream_t stream, const int32_t * key_start = nullptr, const float * sinks = nullptr);

// dq, dk, dv are overwritten. workspace: attention_bwd_workspace_bytes(Hq, Tq, B) bytes (launch.h).
// grad_unscale (device float, nullable): dout was multiplied by its inverse (a power of two, half_scale.h's
// attention_grad_scale_exponent) before rounding to f16; dq, dk and dv are multiplied by it (exact).
// With sinks, dsinks (f32 [Hq], overwritten) gets their gradient.
void attention_bwd(const AttentionShape & s, gguf::TensorType type, const void * q, const void * k, const void * v,
                   const float * o, const float * lse, const void * dout, float * dq, float * dk, float * dv,
                   void * workspace, size_t workspace_bytes, cudaStream_t stream, const int32_t * key_start = nullptr,
                   const float * grad_unscale = nullptr, const float * sinks = nullptr, float * dsinks = nullptr);

} // namespace rp::cuda
