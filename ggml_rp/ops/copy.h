// Copies: cont (a contiguous copy of a strided view), cast (f32 <-> f16 <-> bf16, e.g. for KV caches), fill.
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

// A contiguous copy of x (same type; x may be any strided f32/f16/bf16 view).
Tensor * cont(Context & ctx, Tensor * x);
// x when it is already contiguous, else cont(x).
Tensor * cont_if_needed(Context & ctx, Tensor * x);
// A contiguous copy of x converted to `type` (f32, f16 or bf16; round to nearest even).
Tensor * cast(Context & ctx, Tensor * x, DType type);
// src copied into `window`, a view of another tensor's memory (a KV cache's rows): the node is that window, so
// the copy lands in the viewed tensor (converted to its type). Readers of the viewed tensor order themselves after
// it with after(). No gradient flows into a window written this way.
Tensor * copy_into(Context & ctx, Tensor * window, Tensor * src);
// An f32 tensor shaped like `like`, every element `value`.
Tensor * fill(Context & ctx, const Tensor * like, float value);
Tensor * fill(Context & ctx, const int64_t ne[4], float value);
// The same, ordered after `dep` (its only source, which the fill does not read): a graph schedules it once dep's
// subgraph has run, so a zero buffer a later node adds into takes no memory across that subgraph's peak.
Tensor * fill_after(Context & ctx, const Tensor * like, float value, Tensor * dep);

class Backward;
namespace rules {
// The backward rule of CPY (the op table's, core/ops.def).
void backward_copy(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
