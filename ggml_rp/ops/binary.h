// Element-wise binary ops on f32 tensors (any strides). b is broadcast over a: every b.ne[i] must divide
// a.ne[i], and b's element (i0 % b.ne0, i1 % b.ne1, ...) pairs with a's (i0, i1, ...). The result has a's
// shape. A bias [n] added to activations [n, tokens] is the common case.
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

Tensor * add(Context & ctx, Tensor * a, Tensor * b);
Tensor * mul(Context & ctx, Tensor * a, Tensor * b);
// a += b, written into a's memory (a view of a that is ordered after b's producer). For gradient
// accumulation into buffers nobody else reads.
Tensor * add_inplace(Context & ctx, Tensor * a, Tensor * b);

class Backward;
namespace rules {
// The backward rule of ADD, MUL (the op table's, core/ops.def).
void backward_binary(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
