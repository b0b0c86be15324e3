// MXFP4 (gpt-oss's expert weights; ggml_rp/core/quant_block.h):
//   - the dequantized value of every code at every scale is kvalues[q] x 2^(e - 128), computed here in double;
//   - our quantizer writes ggml's bytes (rp-oracle quantize-rows: ggml_quantize_chunk from llama.cpp's prebuilt
//     libraries) on rows of normal, huge, tiny, zero, power-of-two and tie-breaking values, and our dequantizer
//     gives ggml's to_float of those bytes, bit for bit;
//   - a matrix product with MXFP4 weights equals the product with their dequantized f32 values.
#include "base/error.h"
#include "ggml_rp/core/quant.h"
#include "ggml_rp/core/quant_block.h"
#include "ggml_rp/ggml_rp.h"
#include "gguf/types.h"
#include "tests/common/temp_dir.h"
#include "tests/oracle/oracle_run.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

namespace {

using gguf::TensorType;

// Rows of 64 values (two blocks each) that reach the corners of the format.
std::vector<float> test_rows(int64_t row) {
    std::mt19937 rng(39);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> v;
    auto push_row = [&](auto gen) {
        for (int64_t i = 0; i < row; ++i) v.push_back(gen(i));
    };
    for (float scale : {1.0f, 0.02f, 3e3f, 1e-4f, 7.5f})
        for (int r = 0; r < 8; ++r) push_row([&](int64_t) { return scale * n(rng); });
    push_row([](int64_t) { return 0.0f; });                                            // all zero: e = 0
    push_row([](int64_t i) { return i == 5 ? 4.0f : 0.0f; });                          // one spike, a power of two
    push_row([](int64_t i) { return std::ldexp(1.0f, static_cast<int>(i % 20) - 10); });  // powers of two
    // amax 6 gives e = 127, d = 1/2: 2.5, 3.5 and 5 lie halfway between two codes' values (ties pick the first).
    push_row([](int64_t i) { const float mids[] = {0.5f, 1.5f, 2.5f, 3.5f, 5.0f, 7.0f, -0.5f, -2.5f, -5.0f, -7.0f, 6.0f, -6.0f};
                             return i % 16 == 0 ? 6.0f : mids[i % 12]; });
    push_row([](int64_t i) { return (i % 2 ? -1.0f : 1.0f) * 1e30f; });             // near the top of the range
    push_row([](int64_t i) { return (i % 3 ? 1.0f : -1.0f) * 3e-37f; });            // scale exponents near zero
    return v;
}

} // namespace

TEST(Mxfp4, DequantizedValuesAreTheCodesTimesThePowerOfTwo) {
    const int8_t kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    for (int e = 0; e < 256; ++e) {
        rp::block_mxfp4 b{};
        b.e = static_cast<uint8_t>(e);
        for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
        float y[32];
        rp::dequantize_row(TensorType::MXFP4, &b, y, 32);
        for (int j = 0; j < 32; ++j) {
            const int q = j < 16 ? j : 15 - (j - 16);
            const double want = kvalues[q] * std::ldexp(1.0, e - 128);
            ASSERT_EQ(static_cast<double>(y[j]), static_cast<float>(want)) << "e " << e << " code " << q;
            ASSERT_EQ(rp::dequant_elem_mxfp4(b, j), y[j]) << "the element form";
        }
    }
    EXPECT_TRUE(rp::can_quantize(TensorType::MXFP4));
    EXPECT_EQ(gguf::row_bytes(TensorType::MXFP4, 64), 34u);
}

TEST(Mxfp4, QuantizesAndDequantizesAsGgml) {
    RP_REQUIRE_ORACLE();
    constexpr int64_t kRow = 64;
    const std::vector<float> x = test_rows(kRow);
    const int64_t rows = static_cast<int64_t>(x.size()) / kRow;
    rp_test::TempDir d;
    {
        std::ofstream f(d.file("in.f32"), std::ios::binary);
        f.write(reinterpret_cast<const char *>(x.data()), static_cast<std::streamsize>(x.size() * sizeof(float)));
    }
    const auto res = rp::oracle::run("quantize-rows " + rp::oracle::quote(d.file("in.f32")) + " --ftype mxfp4 --row 64 --out " +
                                     rp::oracle::quote(d.file("out.bin")));
    ASSERT_EQ(res.status, 0);
    std::ifstream f(d.file("out.bin"), std::ios::binary);
    const std::string got((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t qbytes = gguf::row_bytes(TensorType::MXFP4, kRow) * static_cast<size_t>(rows);
    ASSERT_EQ(got.size(), qbytes + x.size() * sizeof(float));

    std::vector<uint8_t> ours(qbytes);
    rp::quantize_rows(TensorType::MXFP4, x.data(), ours.data(), kRow, rows, 1);
    for (int64_t r = 0; r < rows; ++r)
        for (size_t b = 0; b < 34; ++b) {
            const size_t at = static_cast<size_t>(r) * 34 + b;
            ASSERT_EQ(ours[at], static_cast<uint8_t>(got[at])) << "row " << r << " byte " << b << " (byte 0 and 17: the exponents)";
        }
    std::vector<float> back(x.size()), theirs(x.size());
    std::memcpy(theirs.data(), got.data() + qbytes, theirs.size() * sizeof(float));
    for (int64_t r = 0; r < rows; ++r)
        rp::dequantize_row(TensorType::MXFP4, got.data() + r * 34, back.data() + r * kRow, kRow);
    for (size_t i = 0; i < x.size(); ++i) {
        uint32_t a, b;
        std::memcpy(&a, &back[i], 4);
        std::memcpy(&b, &theirs[i], 4);
        ASSERT_EQ(a, b) << "value " << i << ": " << back[i] << " vs ggml's " << theirs[i];
    }
}

TEST(Mxfp4, MatrixProductEqualsTheDequantizedWeights) {
    std::mt19937 rng(5);
    std::normal_distribution<float> n(0.0f, 1.0f);
    const int64_t in = 64, out = 24, T = 5;
    std::vector<float> w(static_cast<size_t>(in * out)), xs(static_cast<size_t>(in * T));
    for (float & v : w) v = n(rng);
    for (float & v : xs) v = n(rng);
    std::vector<uint8_t> wq(gguf::row_bytes(TensorType::MXFP4, in) * out);
    rp::quantize_rows(TensorType::MXFP4, w.data(), wq.data(), in, out, 1);
    std::vector<float> wd(w.size());
    for (int64_t r = 0; r < out; ++r) rp::dequantize_row(TensorType::MXFP4, wq.data() + r * 34, wd.data() + r * in, in);

    auto product = [&](rp::DType type, void * data) {
        rp::Context ctx;
        rp::Tensor * W = ctx.new_tensor(type, in, out);
        W->data = data;
        rp::Tensor * X = ctx.new_tensor(rp::DType::F32, in, T);
        ctx.alloc_data(X);
        rp::tensor_set_f32(X, xs);
        rp::Tensor * y = rp::mul_mat(ctx, W, X);
        y->flags |= rp::kFlagOutput;
        rp::Graph g;
        rp::build_forward(g, y);
        rp::CpuBackend be;
        be.allocate(g);
        be.compute(g, 1);
        return rp::tensor_get_f32(y);
    };
    const std::vector<float> q = product(rp::DType::MXFP4, wq.data()), f = product(rp::DType::F32, wd.data());
    ASSERT_EQ(q.size(), f.size());
    EXPECT_EQ(q, f) << "the weights are decoded to the same f32 values, and the product is the f32 one";
}
