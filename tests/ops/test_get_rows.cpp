// get_rows (any dequantizable table) and its deterministic scatter-add backward.
#include "harness.h"

#include <gtest/gtest.h>

using namespace optest;
using rp::Context;
using rp::Tensor;
using TV = std::vector<Tensor *>;
using R = RefInputs;

namespace {

Input ids_input(std::vector<int32_t> ids, int64_t T, int64_t B) {
    Input in{"ids", {T, B, 1, 1}, rp::DType::I32, false};
    in.ints = std::move(ids);
    return in;
}

} // namespace

TEST(OpGetRows, F32TableWithRepeatedIds) {
    // Ids repeat (row 3 three times, row 0 twice): their gradients are summed.
    check_op({"get_rows [17,11] ids[7]", {{"table", {17, 11, 1, 1}}, ids_input({3, 0, 3, 10, 5, 3, 0}, 7, 1)},
              [](Context & c, const TV & in) { return rp::get_rows(c, in[0], in[1]); },
              [](const R & v) { return ref::get_rows(v[0], ints_from(v[1]), 7, 1); }});
}

TEST(OpGetRows, BatchedIdsAndSizeOne) {
    check_op({"get_rows [3,5] ids[4,2]", {{"table", {3, 5, 1, 1}}, ids_input({4, 4, 1, 0, 2, 4, 1, 1}, 4, 2)},
              [](Context & c, const TV & in) { return rp::get_rows(c, in[0], in[1]); },
              [](const R & v) { return ref::get_rows(v[0], ints_from(v[1]), 4, 2); }});
    check_op({"get_rows [1,1] ids[1]", {{"table", {1, 1, 1, 1}}, ids_input({0}, 1, 1)},
              [](Context & c, const TV & in) { return rp::get_rows(c, in[0], in[1]); },
              [](const R & v) { return ref::get_rows(v[0], ints_from(v[1]), 1, 1); }});
}

TEST(OpGetRows, QuantizedAndHalfTables) {
    for (rp::DType t : {rp::DType::F16, rp::DType::BF16, rp::DType::Q8_0, rp::DType::Q4_0, rp::DType::Q5_1}) {
        Input table{"table", {64, 9, 1, 1}, t, false};
        check_op({std::string("get_rows ") + rp::dtype_name(t), {table, ids_input({8, 0, 4, 4, 1}, 5, 1)},
                  [](Context & c, const TV & in) { return rp::get_rows(c, in[0], in[1]); },
                  [](const R & v) { return ref::get_rows(v[0], ints_from(v[1]), 5, 1); }});
    }
    Input table{"table", {256, 4, 1, 1}, rp::DType::Q4_K, false};
    check_op({"get_rows q4_k", {table, ids_input({3, 1}, 2, 1)},
              [](Context & c, const TV & in) { return rp::get_rows(c, in[0], in[1]); },
              [](const R & v) { return ref::get_rows(v[0], ints_from(v[1]), 2, 1); }});
}

TEST(OpGetRows, BackwardIntoParamAccumulatesOnlyTouchedRows) {
    // The param's grad starts non-zero: rows no token points at keep their value, touched rows add.
    Context ctx;
    Tensor * table = ctx.new_tensor(rp::DType::F32, 2, 4);
    ctx.alloc_data(table);
    rp::tensor_set_f32(table, std::vector<float>(8, 0.5f));
    Tensor * ids = ctx.new_tensor(rp::DType::I32, 3);
    ctx.alloc_data(ids);
    rp::tensor_set_i32(ids, {2, 0, 2});
    rp::set_param(ctx, table);
    ctx.alloc_data(table->grad);
    rp::tensor_set_f32(table->grad, {1, 1, 1, 1, 1, 1, 1, 1});
    Tensor * loss = rp::sum(ctx, rp::get_rows(ctx, table, ids));
    rp::Graph g;
    rp::build_forward(g, loss);
    rp::build_backward(ctx, g, loss, {table});
    rp::CpuBackend be;
    be.allocate(g);
    be.compute(g, 2);
    EXPECT_EQ(rp::tensor_get_f32(table->grad), (std::vector<float>{2, 2, 1, 1, 3, 3, 1, 1}));
    EXPECT_FLOAT_EQ(rp::tensor_get_f32(loss)[0], 3.0f);
}

TEST(OpGetRows, IdOutOfRangeIsAnError) {
    Context ctx;
    Tensor * table = ctx.new_tensor(rp::DType::F32, 2, 4);
    ctx.alloc_data(table);
    Tensor * ids = ctx.new_tensor(rp::DType::I32, 2);
    ctx.alloc_data(ids);
    rp::tensor_set_i32(ids, {1, 4});
    const std::string error = compute_error(rp::get_rows(ctx, table, ids));
    EXPECT_NE(error.find("id 4"), std::string::npos) << error;
}

// segment_sum: the scatter-add of one column as a forward op, its gradient the gather (GET_ROWS_BACK's backward
// rule), against sums written here and finite differences. Segment 3 has no token (0, gradient-free); ids in
// [T, B] as the packed preference head passes them.
TEST(OpSegmentSum, SumsByIdAndItsGradientIsTheGather) {
    const std::vector<int32_t> ids = {0, 0, 1, 1, 1, 2, 4, 4, 4, 4, 5, 5};
    auto sums = [=](const R & v, int64_t n) {
        ref::DT y({n, 1, 1, 1});
        for (size_t t = 0; t < ids.size(); ++t) y(ids[t]) += v[0].v[t];
        return y;
    };
    check_op({"segment_sum [6, 2] -> 6", {{"x", {6, 2, 1, 1}}, ids_input(ids, 6, 2)},
              [](Context & c, const TV & in) { return rp::segment_sum(c, in[0], in[1], 6); },
              [=](const R & v) { return sums(v, 6); }});
    check_op({"segment_sum [12] -> 7", {{"x", {12, 1, 1, 1}}, ids_input(ids, 12, 1)},
              [](Context & c, const TV & in) { return rp::segment_sum(c, in[0], in[1], 7); },
              [=](const R & v) { return sums(v, 7); }});
    Context ctx;
    EXPECT_THROW(rp::segment_sum(ctx, ctx.new_tensor(rp::DType::F32, 5), ctx.new_tensor(rp::DType::I32, 4), 2), rp::Error);
    EXPECT_THROW(rp::segment_sum(ctx, ctx.new_tensor(rp::DType::F32, 4), ctx.new_tensor(rp::DType::I32, 4), 0), rp::Error);
}
