// Reductions and broadcasts (f32, any strides).
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

// Sum / mean of all elements -> [1]. Accumulated in double, in a fixed order.
Tensor * sum(Context & ctx, Tensor * x);
Tensor * mean(Context & ctx, Tensor * x);
// x repeated to the shape of `like` (every x.ne[i] divides like.ne[i]).
Tensor * repeat(Context & ctx, Tensor * x, const Tensor * like);
// The reverse: x summed over its repeats down to the shape of `like` (every like.ne[i] divides x.ne[i]):
// out[j] = sum of x[i] over all i with i_d % like.ne[d] == j_d. Bias gradients, broadcast backward.
Tensor * sum_to(Context & ctx, Tensor * x, const Tensor * like);

class Backward;
namespace rules {
// The backward rule of SUM, MEAN, REPEAT, SUM_TO (the op table's, core/ops.def).
void backward_reduce(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
