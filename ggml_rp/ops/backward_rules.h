// The backward (vector-Jacobian) rules of every op family, defined beside their forwards in
// ggml_rp/ops/<family>.cpp and dispatched by build_backward. Internal header.
#pragma once

#include "ggml_rp/ops/autodiff.h"

namespace rp::rules {

void backward_view(Backward & b, Tensor * node);      // VIEW (reshape, permute, view, after)
void backward_copy(Backward & b, Tensor * node);      // CPY
void backward_binary(Backward & b, Tensor * node);    // ADD, MUL
void backward_unary(Backward & b, Tensor * node);     // SCALE, SILU, SWIGLU
void backward_softmax(Backward & b, Tensor * node);   // SOFTMAX
void backward_reduce(Backward & b, Tensor * node);    // SUM, MEAN, REPEAT, SUM_TO
void backward_norm(Backward & b, Tensor * node);      // RMS_NORM
void backward_rope(Backward & b, Tensor * node);      // ROPE, ROPE_BACK
void backward_get_rows(Backward & b, Tensor * node);  // GET_ROWS
void backward_mul_mat(Backward & b, Tensor * node);   // MUL_MAT
void backward_attention(Backward & b, Tensor * node); // ATTENTION
void backward_cross_entropy(Backward & b, Tensor * node); // LM_HEAD_CE
void backward_dropout(Backward & b, Tensor * node);   // DROPOUT
void backward_moe_weights(Backward & b, Tensor * node); // MOE_WEIGHTS
void backward_mul_mat_id(Backward & b, Tensor * node);  // MUL_MAT_ID

} // namespace rp::rules
