// Softmax over ne[0] (each row sums to 1), f32, any strides.
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

Tensor * softmax(Context & ctx, Tensor * x);
// dx = y * (dy - sum(dy * y)) per row, from the forward output y.
Tensor * softmax_back(Context & ctx, Tensor * y, Tensor * dy);

class Backward;
namespace rules {
// The backward rule of SOFTMAX (the op table's, core/ops.def).
void backward_softmax(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
