// The op table (ggml_rp/ops/op_table.h) is complete and consistent: one row per op in enum order, unique
// names that op_name() returns, a CPU kernel registered (cpu/kernel_registry.h) for every op that computes, a backward rule for every forward
// op and none for the backward ops (differentiating those is refused by name), CUDA traits that only name
// sources an op has.
#include "base/error.h"
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/ggml_rp.h"
#include "ggml_rp/ops/op_registry.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace {

bool is_backward_op(rp::Op op) {
    switch (op) {
    case rp::Op::SILU_BACK: case rp::Op::SWIGLU_BACK: case rp::Op::SOFTMAX_BACK: case rp::Op::RMS_NORM_BACK: case rp::Op::L2_NORM_BACK:
    case rp::Op::RMS_NORM_GATED_BACK: case rp::Op::GET_ROWS_BACK: case rp::Op::MUL_MAT_BACK_X: case rp::Op::OUT_PROD:
    case rp::Op::ATTENTION_BACK:
    case rp::Op::LM_HEAD_CE_BACK: case rp::Op::MOE_WEIGHTS_BACK: case rp::Op::MUL_MAT_ID_BACK_X: case rp::Op::OUT_PROD_ID:
    case rp::Op::PREFERENCE_LOSS_BACK: case rp::Op::GRPO_LOSS_BACK: case rp::Op::SSM_CONV_BACK: case rp::Op::DELTA_NET_BACK:
        return true;
    default: return false;
    }
}


} // namespace

TEST(OpTable, OneConsistentRowPerOp) {
    std::set<std::string> names;
    for (int i = 0; i < static_cast<int>(rp::Op::COUNT); ++i) {
        const rp::Op op = static_cast<rp::Op>(i);
        const rp::OpDesc & d = rp::op_desc(op);
        SCOPED_TRACE(d.name);
        EXPECT_EQ(d.op, op);
        ASSERT_NE(d.name, nullptr);
        EXPECT_TRUE(names.insert(d.name).second) << "duplicate name";
        EXPECT_STREQ(rp::op_name(op), d.name);
        ASSERT_NE(d.shape, nullptr);
        EXPECT_GT(std::string(d.shape).size(), 2u);
        const bool computes = op != rp::Op::NONE && op != rp::Op::VIEW;
        EXPECT_EQ(rp::cpu::kernel_for(op) != nullptr, computes) << "a CPU kernel exactly for the ops that compute";
        if (op != rp::Op::NONE) {
            EXPECT_EQ(d.backward == nullptr, is_backward_op(op)) << "backward rule";
        }
        EXPECT_TRUE(d.cuda.kernel) << "every op runs on CUDA today";
        EXPECT_EQ(d.cuda.packed_sources & ~((1u << rp::kMaxSrc) - 1u), 0u) << "traits name sources beyond kMaxSrc";
    }
    EXPECT_STREQ(rp::op_name(rp::Op::COUNT), "?");
    EXPECT_THROW(rp::op_desc(rp::Op::COUNT), rp::Error);
}

TEST(OpTable, DifferentiatingABackwardOpIsRefusedByName) {
    rp::Context ctx;
    rp::Tensor * x = ctx.new_tensor(rp::DType::F32, 4, 3);
    rp::Tensor * dy = ctx.new_tensor(rp::DType::F32, 4, 3);
    ctx.alloc_data(x);
    ctx.alloc_data(dy);
    rp::Tensor * dx = rp::silu_back(ctx, x, dy);
    rp::Tensor * loss = rp::sum(ctx, dx);
    rp::Graph g;
    rp::build_forward(g, loss);
    try {
        rp::build_backward(ctx, g, loss, {x});
        FAIL() << "a backward op was differentiated";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("SILU_BACK"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("no backward rule"), std::string::npos) << e.what();
    }
}

// A backend's registry refuses, before main runs, a second kernel for one op (two families claiming it) and an
// op outside the enum: programming errors that would otherwise pick a kernel by link order.
TEST(OpTableDeathTest, ARegistryAbortsOnASecondKernelForAnOp) {
    auto kernel = [](rp::Tensor *) {};
    using Kernel = void (*)(rp::Tensor *);
    EXPECT_DEATH(
        {
            rp::OpRegistry<Kernel> r;
            r.add({{rp::Op::ADD, kernel}, {rp::Op::ADD, kernel}}, "test");
        },
        "test kernel registered twice or for no op \\(ADD\\)");
    EXPECT_DEATH(
        {
            rp::OpRegistry<Kernel> r;
            r.add({{rp::Op::COUNT, kernel}}, "test");
        },
        "registered twice or for no op");
    rp::OpRegistry<Kernel> ok;
    ok.add({{rp::Op::MUL, kernel}}, "test");
    EXPECT_EQ(ok.find(rp::Op::MUL), static_cast<Kernel>(kernel));
    EXPECT_EQ(ok.find(rp::Op::ADD), nullptr);
    EXPECT_EQ(ok.find(rp::Op::COUNT), nullptr);
}
