// The host-only rules of the CUDA device and backend, checked on any machine (no GPU, no CUDA needed):
// logical devices spread over GPUs (ggml_rp/cuda/logical_devices.h), the memory check of make_cuda_devices,
// the process-wide registry of pinned host ranges, and the backend's node checks and scratch sizes
// (ggml_rp/cuda/backend_plan.h) against values worked out by hand from launch.h's rules.
#include "ggml_rp/ggml_rp.h"
#include "ggml_rp/cuda/backend_plan.h"
#include "ggml_rp/cuda/logical_devices.h"
#include "base/error.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace rp::cuda;

namespace {

// The message of the rp::Error that f throws ("" when it throws none).
template <class F>
std::string error_of(F f) {
    try {
        f();
    } catch (const rp::Error & e) {
        return e.what();
    }
    return "";
}

bool has(const std::string & s, const std::string & part) { return s.find(part) != std::string::npos; }

} // namespace

TEST(CudaLogicalDevices, RoundRobinOverThePhysicalGpus) {
    EXPECT_EQ(logical_device_ordinals(1, 1), (std::vector<int>{0}));
    EXPECT_EQ(logical_device_ordinals(4, 1), (std::vector<int>{0, 0, 0, 0}));
    EXPECT_EQ(logical_device_ordinals(5, 2), (std::vector<int>{0, 1, 0, 1, 0}));
    EXPECT_EQ(logical_device_ordinals(3, 8), (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(physical_ordinal(7, 3), 1);
    EXPECT_EQ(logical_device_name(3), "cuda:3");
    EXPECT_TRUE(has(error_of([] { logical_device_ordinals(2, 0); }), "no GPU"));
    EXPECT_TRUE(has(error_of([] { logical_device_ordinals(0, 1); }), "0 logical devices"));
    EXPECT_TRUE(has(error_of([] { physical_ordinal(-1, 1); }), "negative"));
}

TEST(CudaLogicalDevices, CapsPlacedOnOneGpuMustFitItsFreeMemory) {
    const size_t GiB = size_t(1) << 30;
    const std::vector<GpuInfo> one = {{"NVIDIA H200", 139 * GiB}};
    // 4 x 34 GiB = 136 GiB fit in 139 GiB; 4 x 35 GiB = 140 GiB do not.
    EXPECT_NO_THROW(check_logical_memory(logical_device_ordinals(4, 1), 34 * GiB, one));
    const std::string msg = error_of([&] { check_logical_memory(logical_device_ordinals(4, 1), 35 * GiB, one); });
    EXPECT_TRUE(has(msg, "GPU 0 (NVIDIA H200)")) << msg;
    EXPECT_TRUE(has(msg, "4 logical devices")) << msg;
    EXPECT_TRUE(has(msg, "37580963840 bytes")) << msg;   // 35 GiB each
    EXPECT_TRUE(has(msg, "149250113536 bytes")) << msg;  // 139 GiB free
    // Two GPUs: 5 logical devices put 3 on GPU 0 and 2 on GPU 1; only GPU 0 is too small for 3 x 30 GiB.
    // Each logical device also takes its cuBLAS workspace (blas.cuh): 4 x (34 GiB + 32 MiB) > 136 GiB.
    const std::vector<GpuInfo> exact = {{"NVIDIA H200", 136 * GiB, 0}}, with_ws = {{"NVIDIA H200", 136 * GiB, 32 << 20}};
    EXPECT_NO_THROW(check_logical_memory(logical_device_ordinals(4, 1), 34 * GiB, exact));
    const std::string ws_msg = error_of([&] { check_logical_memory(logical_device_ordinals(4, 1), 34 * GiB, with_ws); });
    EXPECT_NE(ws_msg.find("cuBLAS workspace"), std::string::npos) << ws_msg;
    const std::vector<GpuInfo> two = {{"A", 80 * GiB}, {"B", 80 * GiB}};
    EXPECT_NO_THROW(check_logical_memory(logical_device_ordinals(5, 2), 26 * GiB, two));
    const std::string msg2 = error_of([&] { check_logical_memory(logical_device_ordinals(5, 2), 30 * GiB, two); });
    EXPECT_TRUE(has(msg2, "GPU 0 (A): 3 logical devices")) << msg2;
    // No overflow for absurd caps.
    EXPECT_FALSE(error_of([&] { check_logical_memory({0, 0}, SIZE_MAX / 2 + 1, one); }).empty());
    EXPECT_TRUE(has(error_of([&] { check_logical_memory({0}, 0, one); }), "above 0 bytes"));
    EXPECT_TRUE(has(error_of([&] { check_logical_memory({1}, 1, one); }), "only 1 GPUs"));
}

// Mixed memory (issue #37): each logical device its own cap; 0 takes an equal share of what its GPU's free memory
// leaves after the given caps, the cuBLAS workspaces and the reserve (max(256 MiB, 2% of the free memory)), in
// whole MiB; the caps then go through the same check.
TEST(CudaLogicalDevices, EachDeviceItsOwnCapOrItsShareOfTheFreeMemory) {
    const size_t GiB = size_t(1) << 30, MiB = size_t(1) << 20;
    const std::vector<GpuInfo> one = {{"NVIDIA H200", 100 * GiB}};
    EXPECT_NO_THROW(check_logical_memory({0, 0}, std::vector<size_t>{60 * GiB, 40 * GiB}, one));
    const std::string msg = error_of([&] { check_logical_memory({0, 0}, std::vector<size_t>{61 * GiB, 40 * GiB}, one); });
    EXPECT_TRUE(has(msg, "2 logical devices of 61.00 GiB (65498251264 bytes), 40.00 GiB (42949672960 bytes) do not fit")) << msg;
    EXPECT_TRUE(has(error_of([&] { check_logical_memory({0, 0}, std::vector<size_t>{GiB}, one); }), "1 memory caps for 2")) << msg;
    EXPECT_TRUE(has(error_of([&] { check_logical_memory({0, 0}, std::vector<size_t>{GiB, 0}, one); }), "above 0 bytes"));

    // Free 100 GiB: the reserve is 2 GiB. Two shares: 49 GiB each; beside a 30 GiB cap: 68 GiB.
    EXPECT_EQ(resolve_logical_memory({0, 0}, {0, 0}, one), (std::vector<size_t>{49 * GiB, 49 * GiB}));
    EXPECT_EQ(resolve_logical_memory({0, 0}, {30 * GiB, 0}, one), (std::vector<size_t>{30 * GiB, 68 * GiB}));
    // With a 32 MiB workspace per device and an odd share: rounded down to whole MiB.
    const std::vector<GpuInfo> ws = {{"A", 100 * GiB, 32 * MiB}};
    EXPECT_EQ(resolve_logical_memory({0, 0, 0}, {0, 0, 0}, ws),
              (std::vector<size_t>(3, (100 * GiB - 3 * 32 * MiB - 2 * GiB) / 3 / MiB * MiB)));
    // Two GPUs, four logical devices (0 and 2 on GPU 0, 1 and 3 on GPU 1); 4 GiB free: a 256 MiB reserve.
    const std::vector<GpuInfo> two = {{"A", 100 * GiB}, {"B", 4 * GiB}};
    EXPECT_EQ(resolve_logical_memory({0, 1, 0, 1}, {0, 0, 24 * GiB, 0}, two),
              (std::vector<size_t>{74 * GiB, 1920 * MiB, 24 * GiB, 1920 * MiB}));
    const std::vector<size_t> caps = resolve_logical_memory({0, 1, 0, 1}, {0, 0, 24 * GiB, 0}, two);
    EXPECT_NO_THROW(check_logical_memory({0, 1, 0, 1}, caps, two));
    // Nothing left beside the given caps: the GPU named.
    const std::string none = error_of([&] { resolve_logical_memory({1, 1}, {4 * GiB, 0}, two); });
    EXPECT_TRUE(has(none, "GPU 1 (B)")) << none;
    EXPECT_TRUE(has(none, "leaves nothing for 1 logical device")) << none;
}

TEST(CudaLogicalDevices, HostRegistryPinsOnceAndUnpinsWithTheLastHolder) {
    HostRegistry reg;
    int pins = 0, unpins = 0;
    auto pin = [&] { ++pins; };
    auto unpin = [&] { ++unpins; };
    std::vector<char> a(4096), b(8192);
    reg.add(0, a.data(), a.size(), "cuda:0", pin);
    reg.add(1, a.data(), a.size(), "cuda:1", pin);  // a second logical device: a reference, no second pin
    EXPECT_EQ(pins, 1);
    EXPECT_EQ(reg.holders(a.data()), 2u);
    EXPECT_TRUE(has(error_of([&] { reg.add(0, a.data(), a.size(), "cuda:0", pin); }), "cuda:0: host range registered twice"));
    EXPECT_TRUE(has(error_of([&] { reg.add(2, a.data(), 100, "cuda:2", pin); }), "another device"));
    reg.remove(0, a.data(), "cuda:0", unpin);
    EXPECT_EQ(unpins, 0);
    EXPECT_TRUE(has(error_of([&] { reg.remove(0, a.data(), "cuda:0", unpin); }), "not registered"));
    reg.remove(1, a.data(), "cuda:1", unpin);
    EXPECT_EQ(unpins, 1);
    EXPECT_EQ(reg.holders(a.data()), 0u);
    // A failing pin records nothing, so a retry pins again.
    EXPECT_THROW(reg.add(0, b.data(), b.size(), "cuda:0", [] { throw rp::Error("cudaHostRegister: invalid argument"); }),
                 rp::Error);
    EXPECT_EQ(reg.holders(b.data()), 0u);
    reg.add(0, b.data(), b.size(), "cuda:0", pin);
    EXPECT_EQ(pins, 2);
    reg.remove(0, b.data(), "cuda:0", unpin);
    EXPECT_EQ(unpins, 2);
}

TEST(CudaBackendPlan, EveryCpuOpHasACudaPath) {
    for (int i = 0; i < static_cast<int>(rp::Op::COUNT); ++i) {
        const auto op = static_cast<rp::Op>(i);
        EXPECT_TRUE(cuda_has_op(op)) << rp::op_name(op);
    }
    EXPECT_FALSE(cuda_has_op(rp::Op::COUNT));
    EXPECT_TRUE(reports_bad_index(rp::Op::GET_ROWS));
    EXPECT_TRUE(reports_bad_index(rp::Op::LM_HEAD_CE_BACK));
    EXPECT_FALSE(reports_bad_index(rp::Op::MUL_MAT));
}

TEST(CudaBackendPlan, StridedOperandsArePackedOthersRefusedByName) {
    rp::Context ctx;
    rp::Tensor * x = ctx.new_tensor(rp::DType::F32, 8, 4);
    x->name = "x";
    rp::Tensor * xt = rp::transpose(ctx, x);
    // Element-wise kernels read packed memory: a transposed f32 operand is packed through scratch
    // (8 * 4 floats = 128 bytes, one 256-byte section); packed operands need none.
    rp::Tensor * act = rp::silu(ctx, xt);
    EXPECT_NO_THROW(check_cuda_node(act));
    EXPECT_EQ(node_pack_bytes(act), 256u);
    EXPECT_EQ(node_scratch_bytes(act), 256u);
    EXPECT_EQ(node_pack_bytes(rp::silu(ctx, x)), 0u);
    // Both operands of a binary op strided: two sections.
    rp::Tensor * y = ctx.new_tensor(rp::DType::F32, 100, 30);
    rp::Tensor * yt = rp::transpose(ctx, y);
    EXPECT_EQ(node_pack_bytes(rp::add(ctx, yt, yt)), 2 * align256(100 * 30 * 4));
    // CPY, SUM_TO and the GEMMs read strides themselves.
    EXPECT_EQ(node_pack_bytes(rp::cont(ctx, xt)), 0u);
    EXPECT_EQ(node_pack_bytes(rp::sum_to(ctx, xt, ctx.new_tensor(rp::DType::F32, 1, 8))), 0u);
    rp::Tensor * W = ctx.new_tensor(rp::DType::F16, 8, 16);
    EXPECT_NO_THROW(check_cuda_node(rp::mul_mat(ctx, W, x)));
    EXPECT_EQ(node_pack_bytes(rp::mul_mat(ctx, W, x)), 0u);

    // A strided operand that is not a float type cannot be packed.
    rp::Tensor * ids = ctx.new_tensor(rp::DType::I32, 4, 8);
    rp::Tensor * odd = rp::silu(ctx, x);
    odd->src[0] = rp::transpose(ctx, ids);
    std::string msg = error_of([&] { check_cuda_node(odd); });
    EXPECT_TRUE(has(msg, "SILU")) << msg;
    EXPECT_TRUE(has(msg, "not a float type")) << msg;
    // Strided ids of an embedding lookup are refused, naming the op and the tensor.
    rp::Tensor * table = ctx.new_tensor(rp::DType::F32, 8, 50);
    rp::Tensor * lookup = rp::get_rows(ctx, table, ctx.new_tensor(rp::DType::I32, 4));
    rp::Tensor * strided_ids = rp::transpose(ctx, ids);
    strided_ids->name = "token ids";
    lookup->src[1] = strided_ids;
    msg = error_of([&] { check_cuda_node(lookup); });
    EXPECT_TRUE(has(msg, "GET_ROWS")) << msg;
    EXPECT_TRUE(has(msg, "token ids")) << msg;
    EXPECT_TRUE(has(msg, "not contiguous")) << msg;
    // An op without a CUDA path.
    rp::Tensor * fake = rp::silu(ctx, x);
    fake->op = rp::Op::COUNT;
    EXPECT_TRUE(has(error_of([&] { check_cuda_node(fake); }), "no CUDA kernel"));
}

// Scratch sizes by hand from launch.h's rules.
TEST(CudaBackendPlan, WorkspaceOfEachNode) {
    rp::Context ctx;
    rp::Tensor * x = ctx.new_tensor(rp::DType::F32, 64, 10);  // K = 64, T = 10
    // f32 weight: no scratch; f16 [64 -> 96]: the 256-byte scale header (cuda/half_scale.h), then
    // max(K, N) * T * 2 = 96 * 10 * 2 = 1920: 2176 -> 2304.
    EXPECT_EQ(node_workspace_bytes(rp::mul_mat(ctx, ctx.new_tensor(rp::DType::F32, 64, 96), x)), 0u);
    rp::Tensor * w16 = ctx.new_tensor(rp::DType::F16, 64, 96);
    EXPECT_EQ(node_workspace_bytes(rp::mul_mat(ctx, w16, x)), 2304u);
    // q8_0 [64 -> 96]: the dequantized weight, 64 * 96 * 4 = 24576 (already 256-aligned).
    EXPECT_EQ(node_workspace_bytes(rp::mul_mat(ctx, ctx.new_tensor(rp::DType::Q8_0, 64, 96), x)), 24576u);
    rp::Tensor * dy = ctx.new_tensor(rp::DType::F32, 96, 10);
    EXPECT_EQ(node_workspace_bytes(rp::mul_mat_back_x(ctx, w16, dy, x)), 2304u);
    // get_rows_back of 10 ids: round_up(10, 64) * 4 * 2 = 512.
    rp::Tensor * table = ctx.new_tensor(rp::DType::F32, 64, 50);
    rp::Tensor * ids = ctx.new_tensor(rp::DType::I32, 10);
    EXPECT_EQ(node_workspace_bytes(rp::get_rows_back(ctx, nullptr, x, ids, table)), 512u);
    // attention backward, Hq = 4, Tq = 10, B = 2: 80 floats = 320 bytes.
    rp::Tensor * q = ctx.new_tensor(rp::DType::F32, 16, 4, 10, 2);
    rp::Tensor * k = ctx.new_tensor(rp::DType::F32, 16, 2, 10, 2);
    rp::Tensor * o = rp::attention(ctx, q, k, ctx.new_tensor(rp::DType::F32, 16, 2, 10, 2), 0.25f);
    EXPECT_EQ(node_workspace_bytes(o), 0u);
    EXPECT_EQ(node_workspace_bytes(rp::attention_back(ctx, o, ctx.new_tensor(rp::DType::F32, 16, 4, 10, 2)).dq), 320u);
    // With bf16 as the accelerated type (ops/attention.h), the f32 inputs are cast into scratch after the
    // kernel's own workspace (aligned: 320 -> 512): q 1280 elements * 2 = 2560, k and v 640 * 2 = 1280 each,
    // dout 2560 (every size already 256-aligned).
    rp::Tensor * ob = rp::attention(ctx, q, k, ctx.new_tensor(rp::DType::F32, 16, 2, 10, 2), 0.25f, rp::DType::BF16);
    EXPECT_EQ(node_workspace_bytes(ob), 2560u + 1280u + 1280u);
    EXPECT_EQ(node_workspace_bytes(rp::attention_back(ctx, ob, ctx.new_tensor(rp::DType::F32, 16, 4, 10, 2)).dq),
              512u + 2560u + 1280u + 1280u + 2560u);
    // LM head + CE, C = 64, V = 50, T = 10, chunk 16, f32 head: tile max(16, C = 64)*10*4 = 2560, no GEMM
    // scratch, per token 8 * (40 -> 256) + 3 * (80 -> 256) = 2816; total 5376.
    rp::Tensor * labels = ctx.new_tensor(rp::DType::I32, 10);
    rp::Tensor * ce = rp::lm_head_ce(ctx, x, table, labels, 0.1f, 16);
    EXPECT_EQ(node_workspace_bytes(ce), 5376u);
    EXPECT_EQ(node_workspace_bytes(rp::silu(ctx, x)), 0u);
}

// Gated DeltaNet's nodes (ops/delta_net.h): the backward's scratch by launch.h's rule, worked out by hand; the node
// checks accept the builders' layouts and refuse a key head wider than a warp's 8 elements a lane, naming it.
TEST(CudaBackendPlan, DeltaNetScratchAndChecks) {
    rp::Context ctx;
    // Dk = 16, Hk = 1, Dv = 8, Hv = 2, T = 10, B = 1, chunk 4: per block kDeltaWarps (4) x ((4 + 1) 16 + 2 x 4 x 16 + 2 x 4)
    // = 4 x 216 = 864, plus the head's state gradient 16 x 8 = 128: 992 floats; 2 blocks; dq and dk per value head
    // 2 x 16 x 2 x 10 = 640 floats. (2 x 992 + 640) x 4 = 10496 bytes.
    rp::Tensor * q = ctx.new_tensor(rp::DType::F32, 16, 1, 10, 1);
    rp::Tensor * v = ctx.new_tensor(rp::DType::F32, 8, 2, 10, 1);
    rp::Tensor * g = ctx.new_tensor(rp::DType::F32, 2, 10);
    rp::Tensor * o = rp::delta_net(ctx, q, q, v, g, g, 0.25f, nullptr, nullptr, 4);
    EXPECT_EQ(node_workspace_bytes(o), 0u);
    const rp::DeltaNetGrads gr = rp::delta_net_back(ctx, o, ctx.new_tensor(rp::DType::F32, 8, 2, 10, 1));
    EXPECT_EQ(node_workspace_bytes(gr.dq), 10496u);
    EXPECT_EQ(error_of([&] { check_cuda_node(o); }), "");
    EXPECT_EQ(error_of([&] { check_cuda_node(gr.dq); }), "");
    rp::Tensor * x = ctx.new_tensor(rp::DType::F32, 6, 10, 1);
    rp::Tensor * y = rp::ssm_conv(ctx, x, ctx.new_tensor(rp::DType::F32, 4, 6), nullptr, ctx.new_tensor(rp::DType::I32, 10));
    EXPECT_EQ(error_of([&] { check_cuda_node(y); }), "");
    EXPECT_EQ(error_of([&] { check_cuda_node(rp::ssm_conv_back(ctx, y, ctx.new_tensor(rp::DType::F32, 6, 10, 1), 1)); }), "");
    rp::Tensor * wide = ctx.new_tensor(rp::DType::F32, 257, 1, 10, 1);
    rp::Tensor * vw = ctx.new_tensor(rp::DType::F32, 8, 1, 10, 1);
    rp::Tensor * gw = ctx.new_tensor(rp::DType::F32, 1, 10);
    EXPECT_TRUE(has(error_of([&] { check_cuda_node(rp::delta_net(ctx, wide, wide, vw, gw, gw, 1.0f)); }), "a key head of 257 > 256"));
}

#if defined(RP_HAVE_CUDA)
#include "ggml_rp/cuda/node_kernel.cuh"

// Every op family registered its node entries (cuda/node_kernel.cuh): a registration exactly for the ops the
// op table says the CUDA backend runs (and none for NONE / VIEW, which compute nothing). Needs no GPU.
TEST(CudaNodeKernels, RegistrationsMatchTheOpTable) {
    for (int i = 0; i < static_cast<int>(rp::Op::COUNT); ++i) {
        const rp::Op op = static_cast<rp::Op>(i);
        const bool computes = op != rp::Op::NONE && op != rp::Op::VIEW;
        EXPECT_EQ(rp::cuda::node_kernel(op) != nullptr, computes && rp::op_desc(op).cuda.kernel) << rp::op_name(op);
    }
    EXPECT_EQ(rp::cuda::node_kernel(rp::Op::COUNT), nullptr);
}
#endif
