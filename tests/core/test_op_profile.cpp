// The CPU op profile (ggml_rp/cpu/op_profile.h): off, nothing is counted; on, every node CpuBackend::compute
// runs is one call of its op, whatever the op; the table names the ops, longest first, and the caller's time
// outside the graphs.
#include "ggml_rp/ggml_rp.h"
#include "ggml_rp/cpu/op_profile.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

TEST(OpProfile, CountsEveryNodeOnlyWhileOn) {
    rp::Context ctx;
    rp::Tensor * w = ctx.new_tensor(rp::DType::F32, 64, 32);
    rp::Tensor * x = ctx.new_tensor(rp::DType::F32, 64, 8);
    ctx.alloc_data(w);
    ctx.alloc_data(x);
    rp::tensor_set_f32(w, std::vector<float>(64 * 32, 0.01f));
    rp::tensor_set_f32(x, std::vector<float>(64 * 8, 0.5f));
    rp::Tensor * y = rp::mul_mat(ctx, w, x);     // [32, 8]
    rp::Tensor * z = rp::add(ctx, rp::silu(ctx, y), y);
    rp::Tensor * s = rp::sum(ctx, rp::mul_mat(ctx, w, rp::silu(ctx, x)));
    z->flags |= rp::kFlagOutput;
    s->flags |= rp::kFlagOutput;
    rp::Graph g;
    rp::build_forward(g, z);
    rp::build_forward(g, s);
    rp::CpuBackend be;
    be.allocate(g);

    rp::cpu::reset_op_profile();
    be.compute(g, 1);
    EXPECT_TRUE(rp::cpu::op_profile().empty());  // off by default

    rp::cpu::set_op_profiling(true);
    be.compute(g, 1);
    be.compute(g, 1);
    rp::cpu::set_op_profiling(false);
    be.compute(g, 1);
    const std::vector<rp::cpu::OpTime> rows = rp::cpu::op_profile();
    auto calls = [&](rp::Op op) {
        for (const rp::cpu::OpTime & r : rows)
            if (r.op == op) return r.calls;
        return int64_t(0);
    };
    EXPECT_EQ(calls(rp::Op::MUL_MAT), 4);
    EXPECT_EQ(calls(rp::Op::SILU), 4);
    EXPECT_EQ(calls(rp::Op::ADD), 2);
    EXPECT_EQ(calls(rp::Op::SUM), 2);
    EXPECT_EQ(rows.size(), 4u);
    for (size_t i = 1; i < rows.size(); ++i) EXPECT_GE(rows[i - 1].seconds, rows[i].seconds);

    const std::string table = rp::cpu::format_op_profile(rows, 1.0);
    for (const char * name : {"MUL_MAT", "SILU", "ADD", "SUM", "(outside graphs)", "share"})
        EXPECT_NE(table.find(name), std::string::npos) << name << "\n" << table;
    EXPECT_EQ(rp::cpu::format_op_profile(rows).find("outside"), std::string::npos);
    rp::cpu::reset_op_profile();
    EXPECT_TRUE(rp::cpu::op_profile().empty());
}
