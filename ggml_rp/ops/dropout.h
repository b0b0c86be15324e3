// Dropout with a regenerable mask (LoRA dropout: y = W x + s * B(A(dropout(x)))).
//   y_i = keep_i ? x_i * scale : 0,   keep_i = rng_uniform(key, counter_offset + i) >= p,   scale = 1 / (1 - p)
// where i = i0 + ne0 * (i1 + ne1 * (i2 + ne2 * i3)) is the element's logical flat index, so a strided or
// permuted x gets the same mask as its contiguous copy, and scale is rounded to float once (dropout_scale:
// both backends multiply by the same float, as PyTorch's dropout does).
//
// The mask is a pure function of (key, counter_offset + i) (ggml_rp/core/counter_rng.h): nothing is stored,
// the backward regenerates it (dx = dropout(dy) with the same p, key and offset), and a recompute on another
// device gets the same bits. Build the key with rng_key(seed, step, layer, micro-batch, ...); use
// counter_offset to make a sequence's mask independent of how the batch is split: give the micro-batch that
// starts at token t the offset t * (elements per token) under one key that does not name the micro-batch.
#pragma once

#include "ggml_rp/core/context.h"
#include "ggml_rp/core/counter_rng.h"  // rng_key, for callers building keys

#include <cstdint>

namespace rp {

// p in [0, 1) (throws rp::Error naming p otherwise); p == 0 returns x itself (no node). x: f32, any strides.
Tensor * dropout(Context & ctx, Tensor * x, float p, uint64_t key, uint64_t counter_offset = 0);

// The parameters of a DROPOUT node (op_params: p, then key and counter_offset as low, high 32-bit halves).
struct DropoutParams {
    float p = 0.0f;
    float scale = 1.0f;  // dropout_scale(p) (ggml_rp/ops/dropout_math.h), not stored
    uint64_t key = 0;
    uint64_t counter_offset = 0;
};
DropoutParams dropout_params(const Tensor * node);

class Backward;
namespace rules {
// The backward rule of DROPOUT (the op table's, core/ops.def).
void backward_dropout(Backward & b, Tensor * node);
} // namespace rules

} // namespace rp
