// Helpers of the layer builders (layer.cpp, delta_net_block.cpp): internal to models/arch.
#pragma once

#include "ggml_rp/ops/ops.h"

#include <string>

namespace rp::layer_detail {

// "blk.<il>.<what>": a layer's node names and error prefixes.
inline std::string lname(int il, const char * what) { return "blk." + std::to_string(il) + "." + what; }

// Rows [r0, r0 + n) of every column of a fused projection's output y [R, T, B] (phi3's attn_qkv and gate/up, the
// DeltaNet's q | k | v channels), as a contiguous [n, T, B] (a window of y, whose backward writes the rows' gradient
// back into y's).
inline Tensor * rows_of(Context & ctx, Tensor * y, int64_t r0, int64_t n) {
    const int64_t ne[4] = {n, y->ne[1], y->ne[2], y->ne[3]};
    return cont(ctx, view(ctx, y, ne, y->nb, static_cast<size_t>(r0) * y->nb[0]));
}

} // namespace rp::layer_detail
