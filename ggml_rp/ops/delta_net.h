// Gated DeltaNet's two sequence ops (Qwen3.5's linear-attention layers; Yang, Kautz, Hatamizadeh 2024):
//
// ssm_conv: the short causal depthwise convolution over time (llama.cpp's ggml_ssm_conv, without its layout):
//   x [C, T, B], w [K, C] -> y [C, T, B],   y[c, t, b] = sum_{j < K} w[j, c] x[c, t + j - (K-1), b]
//   where x before the sequence is the conv state `prefix` [C, K-1, B] (the inputs of earlier tokens; nullptr:
//   zeros) and, for packed sequences, x before the token's own example is 0 (seg_start i32 [T * B]: the first
//   token of each token's example, as the attention's key_start; then no prefix). The node's aux bytes hold the
//   new conv state [C, K-1, B], the last K-1 columns of [prefix | x] (ssm_conv_state), which generation keeps.
//
// delta_net: the gated delta rule, per sequence b and value head h (reading key head h % Hk, the layout of
// llama.cpp's files, whose converter orders the value heads so), with a state S [Dk, Dv] (column j: value j):
//   S <- exp(g_t) S                    (g <= 0: the decay)
//   S <- S + k_t (beta_t (v_t - S^T k_t))^T
//   o_t = scale S^T q_t
//   q, k [Dk, Hk, T, B], v [Dv, Hv, T, B], g, beta [Hv, T, B], state0 [Dk, Dv, Hv, B] (nullptr: zeros) ->
//   o [Dv, Hv, T, B]. seg_start (as above) sets S to 0 before each example's first token (no state0 then).
// The value columns of S never mix, so a kernel may run them apart; every sum runs in a fixed order
// (deterministic, independent of threads). The aux bytes hold n_chunks + 1 states [Dk, Dv, Hv, B]: the state
// before tokens 0, chunk, 2 chunk, ... and the final state (delta_net_state, for generation). The backward
// recomputes the states within a chunk from these checkpoints, so training keeps O(T / chunk) states per
// layer, not O(T).
//
// Kernels: cpu/delta_net.cpp (the reference) and cuda/delta_net.cu (one warp per state column; not yet run on a GPU:
// tests/cuda checks it against the CPU where one is present).
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

Tensor * ssm_conv(Context & ctx, Tensor * x, Tensor * w, Tensor * prefix = nullptr, Tensor * seg_start = nullptr);
// The new conv state of an ssm_conv node: f32 [C, K-1, B].
Tensor * ssm_conv_state(Context & ctx, Tensor * y);
// which 0: dx [C, T, B]; 1: dw [K, C]. No gradient reaches the prefix. Sources: x, w, dy, prefix, seg_start; dx
// needs neither x nor the prefix (null there, so a graph need not keep x for it: it is the node's shape).
Tensor * ssm_conv_back(Context & ctx, Tensor * y, Tensor * dy, int which);

// chunk: tokens between two saved states; 0 (the default): delta_net_chunk(T, Dv).
Tensor * delta_net(Context & ctx, Tensor * q, Tensor * k, Tensor * v, Tensor * g, Tensor * beta, float scale,
                   Tensor * state0 = nullptr, Tensor * seg_start = nullptr, int64_t chunk = 0);
// The states the forward saves, T / chunk of [Dk, Dv] per value head, against what the backward holds to recompute
// one chunk, about 12 chunk x Dk floats per value head (CUDA: 4 warps of a head, each a chunk's states and two
// chunk x Dk arrays): their sum is least at chunk = sqrt(T Dv / 12). The power of two nearest that, at least 64
// (llama.cpp's chunk). The bits are the same for any chunk; only memory and the backward's locality change.
int64_t delta_net_chunk(int64_t T, int64_t Dv);
// The final state of a delta_net node: f32 [Dk, Dv, Hv, B].
Tensor * delta_net_state(Context & ctx, Tensor * o);

struct DeltaNetGrads {
    Tensor * dq;
    Tensor * dk;
    Tensor * dv;
    Tensor * dg;
    Tensor * dbeta;
    Tensor * dstate0;  // nullptr without state0
};
// Gradients of every input from dout (the final state's gradient taken as 0: training reads only o). dq is the
// node; the others are views of its aux bytes. It reads o's saved chunk states through a copy of them (a node of
// T / chunk states), not o itself, so o's buffer need not live until it runs.
DeltaNetGrads delta_net_back(Context & ctx, Tensor * o, Tensor * dout);

class Backward;
namespace rules {
// The backward rules of SSM_CONV and DELTA_NET (the op table's, core/ops.def).
void backward_ssm_conv(Backward & b, Tensor * node);
void backward_delta_net(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
