// The loss of a micro-batch of preference pairs (DPO, IPO, SimPO, ORPO) or KTO examples from their answers' log-probabilities
// (kernels: rp::cpu's and rp::cuda's preference_loss, the per-pair math in ops/preference_math.h).
//
//   logps f32 [B], B even: the policy's summed log-probability of each answer's tokens; answers 2k (chosen)
//         and 2k + 1 (rejected) are pair k. (From lm_head_token_nll: minus the per-sequence sums.)
//   seq   f32 [kSequenceValues = 4, B]: per answer b, its reference log-probability (ignored by SimPO and ORPO),
//         its token count (>= 1; SimPO, IPO and ORPO normalise by it; 0 in both answers of an empty slot of a
//         packed micro-batch: skipped), the weight w_b of its own NLL term and its kind (KTO: +1 a desirable
//         example, -1 an undesirable one, 0 a KL sequence; see preference_math.h).
//   loss = loss_scale * sum_k pair_loss(k) - sum_b w_b logps_b                              -> f32 [1]
// (KTO: k runs over the examples, each with its KL sequence after it; the loss is per example.)
// Pass loss_scale = 1 / (pairs in the whole batch) for a mean that does not depend on the micro-batch split;
// ORPO's NLL term (TRL: the cross-entropy of the chosen answers, averaged over the batch's chosen tokens) is
// w = 1 / (chosen tokens in the batch) on chosen answers, 0 on rejected ones. The loss is computed in double
// in a fixed order and rounded once. Backward: d logps_b = dloss * (loss_scale * d pair_loss / d logps_b - w_b).
#pragma once

#include "ggml_rp/core/context.h"
#include "ggml_rp/core/graph.h"
#include "ggml_rp/ops/preference_math.h"

namespace rp {

Tensor * preference_loss(Context & ctx, Tensor * logps, Tensor * seq, const PreferenceParams & p, float loss_scale);

// d loss / d logps (f32 [B]) for dloss, an f32 scalar.
Tensor * preference_loss_back(Context & ctx, Tensor * loss, Tensor * dloss);

// The parameters of a PREFERENCE_LOSS or PREFERENCE_LOSS_BACK node, and its loss scale.
PreferenceParams preference_params(const Tensor * node);
float preference_loss_scale(const Tensor * node);
// Sets loss_scale on every PREFERENCE_LOSS(_BACK) node of g: a graph replayed for another batch.
void set_preference_loss_scale(const Graph & g, float loss_scale);

class Backward;
namespace rules {
// The backward rule of PREFERENCE_LOSS (the op table's, core/ops.def).
void backward_preference_loss(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
