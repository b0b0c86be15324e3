// Views: tensors that reuse another tensor's memory with a new shape, strides or offset. No computation;
// they become nodes of op VIEW so that autodiff can route gradients back through them.
#pragma once

#include "ggml_rp/core/context.h"

namespace rp {

// Same elements, new shape (nelements must match). x must be contiguous (use cont() first).
Tensor * reshape(Context & ctx, Tensor * x, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, int64_t ne3 = 1);

// An arbitrary window of x: shape ne, byte strides nb (nb[0] = type size), byte offset from x's first
// element. For windows of contiguous tensors; checked to stay inside x.
Tensor * view(Context & ctx, Tensor * x, const int64_t ne[4], const size_t nb[4], size_t offset);

// Axis i of x becomes axis a_i of the result (ggml's convention): permute(x, 1, 0, 2, 3) is a transpose.
Tensor * permute(Context & ctx, Tensor * x, int a0, int a1, int a2, int a3);
// Swaps axes 0 and 1.
Tensor * transpose(Context & ctx, Tensor * x);

// x itself (same memory and shape), but ordered after `dep`: consumers of the result run after dep. Used to
// read a buffer that an op wrote as a side effect (e.g. lm_head_ce_back accumulating dW).
Tensor * after(Context & ctx, Tensor * x, Tensor * dep);

// A contiguous f32 view of the second outputs that node x writes after its main result (its aux bytes),
// starting `aux_offset` bytes into them: attention's logsumexp, attention_back's dk and dv. Gradients do not
// flow through it.
Tensor * aux_view(Context & ctx, Tensor * x, const int64_t ne[4], size_t aux_offset);

// Moves window v (a view, or a node computed into one: copy_into) of a built graph along its root, for a
// graph replayed at another position: v starts `offset` bytes into the root and, when rows >= 0, its axis 2
// has `rows` rows (nb[3] follows, as for a window of rows, unless axis 3 has several entries: the windows of
// several sequences of one cache stay the cache's sequence stride apart). Checked to stay inside the root; data is set by the
// next allocate (CpuBackend points views at their roots). The KV cache's write at row n_past and its read over
// rows [0, n_past + T) move this way between the tokens of a generation (models/arch/inference.cpp).
void move_window(Tensor * v, size_t offset, int64_t rows = -1);

class Backward;
namespace rules {
// The backward rule of VIEW (reshape, permute, view, after) (the op table's, core/ops.def).
void backward_view(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
