// Embedding lookup: out[:, t] = table[:, ids[t]].
// table: [C, V] of any dequantizable type (f32, f16, bf16, Q4_0 .. Q6_K; rows of whole blocks);
// ids: i32 [T] or [T, B], every id in [0, V) (checked when the graph runs); out: f32 [C, T, B].
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

Tensor * get_rows(Context & ctx, Tensor * table, Tensor * ids);

// The scatter-add backward: d table[:, v] = sum of dy[:, t] over tokens t with ids[t] == v, summed in token
// order (deterministic: each table row is owned by one thread, no atomics). With into != nullptr the result
// is added in place into `into` (f32 [C, V]) and the node is a view of it; otherwise it is a fresh tensor
// shaped like `table` (zero where no token points).
Tensor * get_rows_back(Context & ctx, Tensor * into, Tensor * dy, Tensor * ids, const Tensor * table);

class Backward;
namespace rules {
// The backward rule of GET_ROWS (the op table's, core/ops.def).
void backward_get_rows(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
