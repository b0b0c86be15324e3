// GRPO's policy loss over a micro-batch's completion tokens (kernels: rp::cpu's and rp::cuda's grpo_loss; the
// per-token math, TRL's, in ops/grpo_math.h).
//
//   logp   f32 [N]: the policy's log-probability of each token (minus lm_head_token_nll's per-token value)
//   values f32 [kTokenValues = 4, N]: per token its sequence's advantage, the rollout policy's log-probability
//          (read when not on-policy), the reference model's (read when beta > 0) and its weight w_t (0: not a
//          completion token; see grpo_math.h for the loss types' weights)
//   loss = sum_t w_t (pg_t + beta k_t)                                                   -> f32 [1]
// The sum runs in double (CPU: in token order; CUDA: in a fixed tree order) and is rounded once. Backward: each
// token's d logp_t = dloss * w_t (d pg_t + beta d k_t), independent of the others.
#pragma once

#include "ggml_rp/core/context.h"
#include "ggml_rp/core/graph.h"
#include "ggml_rp/ops/grpo_math.h"

namespace rp {

Tensor * grpo_loss(Context & ctx, Tensor * logp, Tensor * values, const GrpoParams & p);

// d loss / d logp (f32 [N]) for dloss, an f32 scalar.
Tensor * grpo_loss_back(Context & ctx, Tensor * loss, Tensor * dloss);

// The parameters of a GRPO_LOSS or GRPO_LOSS_BACK node.
GrpoParams grpo_params(const Tensor * node);

class Backward;
namespace rules {
// The backward rule of GRPO_LOSS (the op table's, core/ops.def).
void backward_grpo_loss(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
