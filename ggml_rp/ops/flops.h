// The model FLOPs of a graph node: the multiply-adds of its matrix work (2 per multiply-add), by the math of
// the op, not by how a kernel computes it (a recompute is not counted; element-wise ops, norms and the
// softmax count 0). What an MFU figure divides by the machine's peak (bench/finetune/mfu.sh):
//   MUL_MAT, MUL_MAT_BACK_X, OUT_PROD        2 K N per column (W [K, N])
//   MUL_MAT_ID, its _BACK_X, OUT_PROD_ID     2 K N per (token, expert) pair
//   ATTENTION                                4 D per visible (query, key) pair and query head (q.k and p.v):
//                                            the causal (and windowed) pairs; a packed batch's
//                                            block-diagonal mask is not looked at (its pairs are counted as one
//                                            sequence's)
//   ATTENTION_BACK                           twice the forward (dv, dp, dq, dk)
//   LM_HEAD_CE                               2 C V per token, twice when the forward forms the gradient
//   LM_HEAD_CE_BACK                          2 C V per token for dh unless the forward formed it, and for dW
//   LM_HEAD_CE_RANGE                         a streamed head's range of n rows: 2 C n per token (twice with the
//                                            gradient); its LM_HEAD_CE and LM_HEAD_CE_BACK then count 0
//   DELTA_NET                                6 Dk Dv per token and value head (k.s, the update, q.s)
//   DELTA_NET_BACK                           twice the forward
#pragma once

#include "ggml_rp/core/tensor.h"

namespace rp {

double node_model_flops(const Tensor * node);

// Whether op is one a backward rule emits (its FLOPs belong to the backward pass).
bool is_backward_op(Op op);

} // namespace rp
