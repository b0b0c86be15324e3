#include "ggml_rp/ops/get_rows.h"

#include "ggml_rp/core/quant.h"
#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/copy.h"
#include "ggml_rp/ops/op_util.h"
#include "ggml_rp/ops/view.h"

#include <string>

namespace rp {

namespace {

void check_ids(const char * op, const Tensor * ids) {
    detail::require(ids && ids->type == DType::I32 && ids->ne[2] == 1 && ids->ne[3] == 1, op,
                    "ids " + describe(ids) + " must be i32 [T] or [T, B]");
}

} // namespace

Tensor * get_rows(Context & ctx, Tensor * table, Tensor * ids) {
    detail::require(table && table->ne[2] == 1 && table->ne[3] == 1, "get_rows", "table " + describe(table) + " must be 2-D [C, V]");
    detail::require(can_dequantize(table->type) && table->rows_contiguous(), "get_rows",
                    "table " + describe(table) + " must have contiguous rows of a dequantizable type");
    check_ids("get_rows", ids);
    const int64_t ne[4] = {table->ne[0], ids->ne[0], ids->ne[1], 1};
    return detail::new_node(ctx, Op::GET_ROWS, DType::F32, ne, {table, ids});
}

Tensor * get_rows_back(Context & ctx, Tensor * into, Tensor * dy, Tensor * ids, const Tensor * table) {
    check_ids("get_rows_back", ids);
    detail::require_f32("get_rows_back", dy, "dy");
    detail::require(dy->ne[0] == table->ne[0] && dy->ne[1] == ids->ne[0] && dy->ne[2] == ids->ne[1] && dy->ne[3] == 1,
                    "get_rows_back", "dy " + describe(dy) + " does not match ids " + describe(ids) + " and table " + describe(table));
    const int64_t ne[4] = {table->ne[0], table->ne[1], 1, 1};
    Tensor * t = detail::accumulating_node(ctx, Op::GET_ROWS_BACK, into, ne);
    t->src[0] = dy;
    t->src[1] = ids;
    t->src[2] = into;
    return t;
}

Tensor * segment_sum(Context & ctx, Tensor * x, Tensor * ids, int64_t n_segments) {
    detail::require(x && ids && x->ne[0] == ids->ne[0] && x->ne[1] == ids->ne[1] && x->ne[2] == 1 && x->ne[3] == 1, "segment_sum",
                    "x " + describe(x) + " and ids " + describe(ids) + " must have the same shape [T] or [T, B]");
    detail::require(n_segments >= 1, "segment_sum", "n_segments " + std::to_string(n_segments) + " must be at least 1");
    detail::require_f32("segment_sum", x, "x");
    check_ids("segment_sum", ids);
    const int64_t ne[4] = {n_segments, 1, 1, 1};
    return detail::new_node(ctx, Op::SEGMENT_SUM, DType::F32, ne, {x, ids});
}

namespace rules {

void backward_get_rows(Backward & b, Tensor * node) {
    Tensor * table = node->src[0];
    Tensor * ids = node->src[1];
    if (!b.needs(table)) return;
    Tensor * dy = b.grad(node);
    b.accumulate(table, [&](Tensor * into) { return get_rows_back(b.ctx, into, dy, ids, table); });
}

void backward_segment_sum(Backward & b, Tensor * node) {
    Tensor * x = node->src[0];
    Tensor * ids = node->src[1];
    if (!b.needs(x)) return;
    Tensor * table = reshape(b.ctx, cont_if_needed(b.ctx, b.grad(node)), 1, node->ne[0]);  // [1, n_segments]
    b.add(x, reshape(b.ctx, get_rows(b.ctx, table, ids), x->ne[0], x->ne[1]));
}

} // namespace rules

} // namespace rp
