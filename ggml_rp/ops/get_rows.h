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

// Sums by segment (SEGMENT_SUM): out[s] = the sum of x[t] over the t with ids[t] == s, in t order (zero where no
// id points); x f32 [N] or [T, B], ids i32 of the same shape, every id in [0, n_segments) (checked when the graph
// runs) -> f32 [n_segments]. The scatter-add above with one column, as a forward op (deterministic), whose
// gradient is the gather dx[t] = dout[ids[t]]. (Preference training sums each packed answer's token log-probabilities.)
Tensor * segment_sum(Context & ctx, Tensor * x, Tensor * ids, int64_t n_segments);

class Backward;
namespace rules {
// The backward rule of GET_ROWS (the op table's, core/ops.def).
void backward_get_rows(Backward & b, Tensor * node);
// The backward rule of SEGMENT_SUM: the gather of its gradient.
void backward_segment_sum(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
