// CPU kernels of each op family, one function per op, dispatched by compute_node. Internal header.
// Every kernel reads sources through their strides and writes its node's memory (node->nb).
#pragma once

#include "ggml_rp/core/tensor.h"

namespace rp::cpu {

void fill(Tensor * node);
void cpy(Tensor * node);
void add(Tensor * node);
void mul(Tensor * node);
void scale(Tensor * node);
void silu(Tensor * node);
void silu_back(Tensor * node);
void swiglu(Tensor * node);
void swiglu_back(Tensor * node);
void softmax(Tensor * node);
void softmax_back(Tensor * node);
void sum(Tensor * node);
void mean(Tensor * node);
void repeat(Tensor * node);
void sum_to(Tensor * node);
void rms_norm(Tensor * node);
void rms_norm_back(Tensor * node);
void rope(Tensor * node);
void get_rows(Tensor * node);
void get_rows_back(Tensor * node);
void mul_mat(Tensor * node);
void mul_mat_back_x(Tensor * node);
void out_prod(Tensor * node);
void attention(Tensor * node);
void attention_back(Tensor * node);
void lm_head_ce(Tensor * node);
void lm_head_ce_back(Tensor * node);
void dropout(Tensor * node);
void moe_topk(Tensor * node);
void moe_weights(Tensor * node);
void moe_weights_back(Tensor * node);
void mul_mat_id(Tensor * node);
void mul_mat_id_back_x(Tensor * node);
void out_prod_id(Tensor * node);

} // namespace rp::cpu
