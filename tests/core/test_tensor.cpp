// dtype table, strides, contiguity, views and host data access.
#include "ggml_rp/core/fp16.h"
#include "ggml_rp/ggml_rp.h"

#include <gtest/gtest.h>

using rp::Context;
using rp::DType;
using rp::Tensor;

TEST(CoreDtype, Table) {
    EXPECT_EQ(rp::dtype_type_size(DType::F32), 4u);
    EXPECT_EQ(rp::dtype_block_size(DType::Q4_0), 32);
    EXPECT_EQ(rp::dtype_type_size(DType::Q4_0), 18u);
    EXPECT_EQ(rp::dtype_row_bytes(DType::Q6_K, 512), 420u);
    EXPECT_TRUE(rp::dtype_is_quantized(DType::Q8_0));
    EXPECT_FALSE(rp::dtype_is_quantized(DType::BF16));
    EXPECT_STREQ(rp::dtype_name(DType::Q5_K), "q5_k");
    EXPECT_THROW(rp::dtype_row_bytes(DType::Q4_0, 33), rp::Error);
    EXPECT_THROW(rp::dtype_traits(static_cast<DType>(31)), rp::Error);
}

TEST(CoreTensor, ContiguousStridesAndViews) {
    Context ctx;
    Tensor * t = ctx.new_tensor(DType::F32, 3, 4, 5);
    EXPECT_EQ(t->nb[0], 4u);
    EXPECT_EQ(t->nb[1], 12u);
    EXPECT_EQ(t->nb[2], 48u);
    EXPECT_EQ(t->nb[3], 240u);
    EXPECT_EQ(t->nbytes(), 240u);
    EXPECT_TRUE(t->is_contiguous());

    Tensor * tt = rp::transpose(ctx, t);
    EXPECT_EQ(tt->ne[0], 4);
    EXPECT_EQ(tt->ne[1], 3);
    EXPECT_EQ(tt->nb[0], 12u);
    EXPECT_EQ(tt->nb[1], 4u);
    EXPECT_FALSE(tt->is_contiguous());
    EXPECT_EQ(tt->view_src, t);
    EXPECT_EQ(tt->nbytes(), 240u);

    // permute(2, 0, 1): axis 0 -> 2, 1 -> 0, 2 -> 1.
    Tensor * p = rp::permute(ctx, t, 2, 0, 1, 3);
    EXPECT_EQ(p->ne[0], 4);
    EXPECT_EQ(p->ne[1], 5);
    EXPECT_EQ(p->ne[2], 3);
    EXPECT_EQ(p->nb[2], 4u);

    Tensor * r = rp::reshape(ctx, t, 12, 5);
    EXPECT_TRUE(r->is_contiguous());
    // Views of views keep pointing at the root.
    Tensor * rr = rp::reshape(ctx, r, 60);
    EXPECT_EQ(rr->view_src, t);

    // Moving only size-1 axes keeps a tensor contiguous.
    Tensor * v = ctx.new_tensor(DType::F32, 7, 1, 3);
    EXPECT_TRUE(rp::permute(ctx, v, 0, 2, 1, 3)->is_contiguous());

    Tensor * q = ctx.new_tensor(DType::Q4_0, 64, 3);
    EXPECT_EQ(q->nb[0], 18u);
    EXPECT_EQ(q->nb[1], 36u);
    EXPECT_EQ(q->nbytes(), 108u);
    EXPECT_TRUE(q->is_contiguous());
    EXPECT_THROW(ctx.new_tensor(DType::Q4_0, 40), rp::Error);
    EXPECT_THROW(ctx.new_tensor(DType::F32, int64_t{0}), rp::Error);
}

TEST(CoreTensor, WindowViewOffsetsAndData) {
    Context ctx;
    Tensor * t = ctx.new_tensor(DType::F32, 4, 6);
    ctx.alloc_data(t);
    std::vector<float> v(24);
    for (int i = 0; i < 24; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i);
    rp::tensor_set_f32(t, v);
    const int64_t ne[4] = {2, 3, 1, 1};
    const size_t nb[4] = {4, 32, 96, 96};  // every second row, columns 1..2
    Tensor * w = rp::view(ctx, t, ne, nb, 4 + 16);
    EXPECT_EQ(w->view_offs, 20u);
    EXPECT_EQ(rp::tensor_get_f32(w), (std::vector<float>{5, 6, 13, 14, 21, 22}));
    Tensor * tt = rp::transpose(ctx, t);
    const std::vector<float> tv = rp::tensor_get_f32(tt);
    EXPECT_EQ(tv[1], 4.0f);  // element (0, 1) of the transpose = element (1, 0) of t
    EXPECT_EQ(tv[6], 1.0f);
}

TEST(CoreTensor, HostDataAccess) {
    Context ctx;
    Tensor * h = ctx.new_tensor(DType::F16, 3);
    ctx.alloc_data(h);
    rp::tensor_set_f32(h, {1.0f, 0.1f, -65504.0f});
    const std::vector<float> hv = rp::tensor_get_f32(h);
    EXPECT_EQ(hv[0], 1.0f);
    EXPECT_EQ(hv[1], rp::fp16_to_fp32(rp::fp32_to_fp16(0.1f)));
    EXPECT_EQ(hv[2], -65504.0f);
    Tensor * q = ctx.new_tensor(DType::Q8_0, 32);
    ctx.alloc_data(q);
    std::vector<float> ones(32, 1.0f);
    rp::tensor_set_f32(q, ones);
    for (float x : rp::tensor_get_f32(q)) EXPECT_NEAR(x, 1.0f, 1e-3f);  // 127 * f16(1/127)
    Tensor * i = ctx.new_tensor(DType::I32, 2);
    ctx.alloc_data(i);
    rp::tensor_set_i32(i, {7, -1});
    EXPECT_EQ(rp::tensor_get_i32(i), (std::vector<int32_t>{7, -1}));
    EXPECT_THROW(rp::tensor_set_f32(h, {1.0f}), rp::Error);  // wrong count
    Tensor * nodata = ctx.new_tensor(DType::F32, 2);
    nodata->name = "lonely";
    try {
        rp::tensor_get_f32(nodata);
        FAIL();
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("lonely"), std::string::npos);
    }
}

TEST(CoreTensor, NamesAndDescribe) {
    Context ctx;
    Tensor * a = rp::set_name(ctx.new_tensor(DType::F32, 4, 2), "blk.0.attn_q.weight");
    EXPECT_EQ(rp::describe(a), "'blk.0.attn_q.weight' f32 [4, 2, 1, 1]");
    Tensor * s = rp::silu(ctx, a);
    std::string want = "SILU#";
    want += std::to_string(s->id);
    EXPECT_EQ(rp::display_name(s), want);
    EXPECT_EQ(ctx.find("blk.0.attn_q.weight"), a);
    EXPECT_EQ(ctx.find("nope"), nullptr);
}
