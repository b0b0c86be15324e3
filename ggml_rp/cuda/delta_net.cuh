// Gated DeltaNet's ops on the GPU (ops/delta_net.h; CPU reference: ggml_rp/cpu/delta_net.cpp). Device pointers to
// contiguous f32 (seg_start: i32, nullptr when the sequences are not packed; prefix, state0: nullptr for zeros).
#pragma once

#include "ggml_rp/ops/delta_net_math.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace rp::cuda {

// y [C, T, B] and the new conv state [C, K-1, B] (state: K > 1); ConvDims: ops/delta_net_math.h.
void ssm_conv_fwd(const float * x, const float * w, const float * prefix, const int32_t * seg_start, float * y, float * state,
                  const ConvDims & d, cudaStream_t stream);
// which 0: dx [C, T, B]; 1: dw [K, C] (each weight a sum over the tokens in a fixed order).
void ssm_conv_bwd(const float * x, const float * w, const float * dy, const float * prefix, const int32_t * seg_start, float * out,
                  int which, const ConvDims & d, cudaStream_t stream);

struct DeltaDims {
    int64_t Dk, Hk, Dv, Hv, T, B, chunk;
};
// o [Dv, Hv, T, B] and the states before each chunk plus the final one (states: (ceil(T / chunk) + 1) [Dk, Dv, Hv, B]).
// One warp per value column of a head: deterministic, no atomics.
void delta_net_fwd(const float * q, const float * k, const float * v, const float * g, const float * beta, const float * state0,
                   const int32_t * seg_start, float scale, float * o, float * states, const DeltaDims & d, cudaStream_t stream);
// The gradients (dstate0 nullptr without state0) from dout and the forward's saved states; `work` holds
// delta_net_bwd_workspace_bytes (launch.h).
void delta_net_bwd(const float * q, const float * k, const float * v, const float * g, const float * beta, const int32_t * seg_start,
                   const float * states, const float * dout, float scale, float * dq, float * dk, float * dv, float * dg, float * dbeta,
                   float * dstate0, void * work, const DeltaDims & d, cudaStream_t stream);

} // namespace rp::cuda
