// CUDA kernels of the element-wise, row, rope and embedding ops against the CPU kernels on the same random
// inputs (NMSE thresholds as ggml's test-backend-ops), odd shapes included. Skipped without a CUDA device.
// The argument checks that run on the host before any launch are tested with or without a device.
#include "cuda_test_util.h"

#if defined(RP_HAVE_CUDA)
#include "ggml_rp/cuda/dropout.cuh"

#include <cstring>

#include "ggml_rp/core/fp16.h"
#include "ggml_rp/core/quant.h"
#include "ggml_rp/cuda/binary.cuh"
#include "ggml_rp/cuda/get_rows.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/norm.cuh"
#include "ggml_rp/cuda/rope.cuh"
#include "ggml_rp/cuda/softmax.cuh"
#include "ggml_rp/cuda/unary.cuh"
#include "ggml_rp/cuda/attention.cuh"
#include "ggml_rp/cuda/cross_entropy.cuh"
#include "ggml_rp/cuda/mul_mat.cuh"

#include <algorithm>
#include <cmath>
#include <cstring>

using cutest::Cpu;
using cutest::Dev;
using cutest::kNmseF32;
using cutest::nmse;
using cutest::rand_vec;

namespace {

// The largest error of an rms_norm backward dx = rs g - (rs^3 sum(g x) / n) x against the exact value (long
// double), in units of the float rounding of its terms: |dx_i - exact_i| / (u * (rs |g_i| + rs^3 sum_j |g_j x_j| / n
// |x_i|)), u = 2^-24. A float kernel that sums, scales and subtracts stays within a few units plus log2(n) for the
// sums, however much the subtraction cancels.
double rms_norm_back_error_units(const std::vector<float> & dx, const std::vector<float> & x, const std::vector<float> & dy,
                                 const std::vector<float> * w, int64_t ne0, float eps) {
    double worst = 0.0;
    for (size_t r = 0; r < x.size() / size_t(ne0); ++r) {
        long double ss = 0, gx = 0, gx_abs = 0;
        for (int64_t i = 0; i < ne0; ++i) {
            const size_t k = r * size_t(ne0) + size_t(i);
            const long double g = (long double)dy[k] * (w ? (*w)[size_t(i)] : 1.0f);
            ss += (long double)x[k] * x[k];
            gx += g * x[k];
            gx_abs += std::fabs(g * x[k]);
        }
        const long double rs = 1.0L / std::sqrt(ss / ne0 + eps);
        for (int64_t i = 0; i < ne0; ++i) {
            const size_t k = r * size_t(ne0) + size_t(i);
            const long double g = (long double)dy[k] * (w ? (*w)[size_t(i)] : 1.0f);
            const long double exact = rs * g - rs * rs * rs * gx / ne0 * x[k];
            const long double terms = rs * std::fabs(g) + rs * rs * rs * gx_abs / ne0 * std::fabs((long double)x[k]);
            worst = std::max(worst, double(std::fabs(dx[k] - exact) / (terms * 0x1p-24L)));
        }
    }
    return worst;
}

} // namespace

TEST(CudaOps, RmsNormForwardBackward) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(1);
    for (int64_t ne0 : {1, 33, 1000, 4099})
        for (bool weight : {false, true}) {
            SCOPED_TRACE("ne0=" + std::to_string(ne0) + " weight=" + std::to_string(weight));
            const int64_t rows = 7;
            const auto x = rand_vec(size_t(ne0 * rows), rng), dy = rand_vec(x.size(), rng);
            const auto w = rand_vec(size_t(ne0), rng, 0.5f, 1.5f);
            const float eps = 1e-6f;
            Cpu c;
            auto * tx = c.f32(x, ne0, rows);
            auto * tw = weight ? c.f32(w, ne0) : nullptr;
            const auto ref = c.run(rp::rms_norm(c.ctx, tx, tw, eps));
            Cpu c2;
            const auto refb = c2.run(rp::rms_norm_back(c2.ctx, c2.f32(x, ne0, rows), weight ? c2.f32(w, ne0) : nullptr,
                                                       c2.f32(dy, ne0, rows), eps));
            Dev<float> dx(x), ddy(dy), dw(w), out(x.size()), grad(x.size());
            rp::cuda::rms_norm_fwd(dx.p, weight ? dw.p : nullptr, out.p, ne0, rows, eps, nullptr);
            rp::cuda::rms_norm_bwd(dx.p, weight ? dw.p : nullptr, ddy.p, grad.p, ne0, rows, eps, nullptr);
            EXPECT_LT(nmse(out.get(), ref), kNmseF32);
            // Both kernels against the exact gradient, in units of their terms' rounding.
            const std::vector<float> gpu = grad.get();
            const double bound = 8.0 + std::log2(double(ne0));
            EXPECT_LT(rms_norm_back_error_units(gpu, x, dy, weight ? &w : nullptr, ne0, eps), bound) << "CUDA";
            EXPECT_LT(rms_norm_back_error_units(refb, x, dy, weight ? &w : nullptr, ne0, eps), bound) << "CPU";
            // Against the CPU kernel by NMSE where the subtraction does not cancel: with one element per row the
            // gradient is rs g eps / (x^2 + eps), about 1e-6 of the terms subtracted, and any two float
            // evaluations differ by their rounding times (x^2 + eps) / eps (the bound above holds for both).
            if (ne0 > 1) {
                EXPECT_LT(nmse(gpu, refb), kNmseF32);
            }
        }
}

TEST(CudaOps, SoftmaxForwardBackward) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(2);
    for (int64_t ne0 : {1, 17, 1025, 5000}) {
        SCOPED_TRACE("ne0=" + std::to_string(ne0));
        const int64_t rows = 5;
        const auto x = rand_vec(size_t(ne0 * rows), rng, -8.0f, 8.0f), dy = rand_vec(x.size(), rng);
        Cpu c;
        const auto y = c.run(rp::softmax(c.ctx, c.f32(x, ne0, rows)));
        Cpu c2;
        const auto refb = c2.run(rp::softmax_back(c2.ctx, c2.f32(y, ne0, rows), c2.f32(dy, ne0, rows)));
        Dev<float> dx(x), dyd(y), ddy(dy), out(x.size()), grad(x.size());
        rp::cuda::softmax_fwd(dx.p, out.p, ne0, rows, nullptr);
        rp::cuda::softmax_bwd(dyd.p, ddy.p, grad.p, ne0, rows, nullptr);
        EXPECT_LT(nmse(out.get(), y), kNmseF32);
        EXPECT_LT(nmse(grad.get(), refb), kNmseF32);
    }
}

TEST(CudaOps, RopeNormalAndNeoxForwardBackward) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(3);
    const int64_t ne[4] = {64, 3, 5, 2};
    const size_t n = size_t(ne[0] * ne[1] * ne[2] * ne[3]);
    for (bool neox : {false, true})
        for (int64_t npos : {ne[2], ne[2] * ne[3]})
            for (bool back : {false, true}) {
                SCOPED_TRACE(std::string(neox ? "neox" : "normal") + " npos=" + std::to_string(npos) +
                             (back ? " back" : ""));
                const auto x = rand_vec(n, rng);
                std::vector<int32_t> pos(static_cast<size_t>(npos));
                for (auto & p : pos) p = static_cast<int32_t>(rng() % 70000);
                rp::RopeParams rp_;
                rp_.n_rot = 48;
                rp_.mode = neox ? rp::RopeMode::Neox : rp::RopeMode::Normal;
                rp_.freq_base = 1000000.0f;
                rp_.freq_scale = 0.5f;
                Cpu c;
                auto * tx = c.f32(x, ne[0], ne[1], ne[2], ne[3]);
                auto * tp = c.i32(pos);
                const auto ref = c.run(back ? rp::rope_back(c.ctx, tx, tp, rp_) : rp::rope(c.ctx, tx, tp, rp_));
                rp::cuda::RopeConfig rc;
                rc.n_rot = 48;
                rc.neox = neox;
                rc.freq_base = 1000000.0f;
                rc.freq_scale = 0.5f;
                Dev<float> dx(x), out(n);
                Dev<int32_t> dp(pos);
                rp::cuda::rope(dx.p, dp.p, npos, out.p, ne, rc, back, nullptr);
                EXPECT_LT(nmse(out.get(), ref), kNmseF32);
            }
}

TEST(CudaOps, UnaryForwardBackward) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(4);
    const int64_t n = 100003;
    const auto a = rand_vec(size_t(n), rng, -6.0f, 6.0f), b = rand_vec(size_t(n), rng), g = rand_vec(size_t(n), rng);
    Dev<float> da(a), db(b), dg(g), out(static_cast<size_t>(n));
    auto cpu = [&](auto build) {
        Cpu c;
        return c.run(build(c, c.f32(a, n), c.f32(b, n), c.f32(g, n)));
    };
    rp::cuda::scale(da.p, -0.37f, out.p, n, nullptr);
    EXPECT_LT(nmse(out.get(), cpu([](Cpu & c, auto * x, auto *, auto *) { return rp::scale(c.ctx, x, -0.37f); })), kNmseF32);
    rp::cuda::scale(da.p, 1.0f, out.p, n, nullptr, 2.0f);  // Gemma 2's soft-cap form: 2 tanh(x / 2)
    EXPECT_LT(nmse(out.get(), cpu([](Cpu & c, auto * x, auto *, auto *) { return rp::softcap(c.ctx, x, 2.0f); })), kNmseF32);
    rp::cuda::silu_fwd(da.p, out.p, n, nullptr);
    EXPECT_LT(nmse(out.get(), cpu([](Cpu & c, auto * x, auto *, auto *) { return rp::silu(c.ctx, x); })), kNmseF32);
    rp::cuda::silu_bwd(da.p, db.p, out.p, n, nullptr);
    EXPECT_LT(nmse(out.get(), cpu([](Cpu & c, auto * x, auto * y, auto *) { return rp::silu_back(c.ctx, x, y); })), kNmseF32);
    rp::cuda::swiglu_fwd(da.p, db.p, out.p, n, nullptr);
    EXPECT_LT(nmse(out.get(), cpu([](Cpu & c, auto * x, auto * y, auto *) { return rp::swiglu(c.ctx, x, y); })), kNmseF32);
    for (int which : {0, 1}) {
        rp::cuda::swiglu_bwd(da.p, db.p, dg.p, out.p, which, n, nullptr);
        EXPECT_LT(nmse(out.get(), cpu([which](Cpu & c, auto * x, auto * y, auto * z) {
                      return rp::swiglu_back(c.ctx, x, y, z, which);
                  })),
                  kNmseF32)
            << "which=" << which;
    }
}

TEST(CudaOps, AddMulWithBroadcast) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(5);
    const int64_t ne[4] = {7, 5, 3, 2};
    const int64_t bshapes[][4] = {{7, 5, 3, 2}, {7, 1, 1, 1}, {7, 1, 3, 1}, {1, 5, 1, 2}, {1, 1, 1, 1}};
    const auto a = rand_vec(size_t(7 * 5 * 3 * 2), rng);
    for (const auto & bne : bshapes)
        for (bool is_mul : {false, true}) {
            SCOPED_TRACE(std::to_string(bne[0]) + "x" + std::to_string(bne[1]) + "x" + std::to_string(bne[2]) + "x" +
                         std::to_string(bne[3]) + (is_mul ? " mul" : " add"));
            const auto b = rand_vec(size_t(bne[0] * bne[1] * bne[2] * bne[3]), rng);
            Cpu c;
            auto * ta = c.f32(a, ne[0], ne[1], ne[2], ne[3]);
            auto * tb = c.f32(b, bne[0], bne[1], bne[2], bne[3]);
            const auto ref = c.run(is_mul ? rp::mul(c.ctx, ta, tb) : rp::add(c.ctx, ta, tb));
            Dev<float> da(a), db(b), out(a.size());
            if (is_mul) rp::cuda::mul(da.p, db.p, out.p, ne, bne, nullptr);
            else rp::cuda::add(da.p, db.p, out.p, ne, bne, nullptr);
            EXPECT_LT(nmse(out.get(), ref), kNmseF32);
        }
}

namespace {

// Table bytes of type t for C x V random values (quantized by the reference quantizer).
std::vector<uint8_t> table_bytes(rp::DType t, int64_t C, int64_t V, std::mt19937 & rng) {
    const auto v = rand_vec(size_t(C * V), rng);
    std::vector<uint8_t> bytes(gguf::row_bytes(t, C) * size_t(V));
    for (int64_t r = 0; r < V; ++r) rp::quantize_row(t, v.data() + r * C, bytes.data() + gguf::row_bytes(t, C) * size_t(r), C);
    return bytes;
}

} // namespace

TEST(CudaOps, GetRowsEveryTableType) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(6);
    const int64_t C = 256, V = 50;
    std::vector<int32_t> ids = {3, 0, 49, 3, 17, 17, 17, 2, 49};
    for (rp::DType t : {rp::DType::F32, rp::DType::F16, rp::DType::BF16, rp::DType::Q8_0, rp::DType::Q4_0, rp::DType::Q4_1,
                        rp::DType::Q5_0, rp::DType::Q5_1}) {
        SCOPED_TRACE(rp::dtype_name(t));
        const auto bytes = table_bytes(t, C, V, rng);
        Cpu c;
        const auto ref = c.run(rp::get_rows(c.ctx, c.raw(t, bytes, C, V), c.i32(ids)));
        Dev<uint8_t> dt(bytes);
        Dev<int32_t> di(ids);
        Dev<float> out(size_t(C) * ids.size());
        Dev<int> bad(1);
        rp::cuda::get_rows(dt.p, t, gguf::row_bytes(t, C), V, C, di.p, int64_t(ids.size()), out.p, bad.p, nullptr);
        const auto got = out.get();
        ASSERT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0);   // same per-element math: same bits
        EXPECT_EQ(bad.get()[0], 0);
    }
}

TEST(CudaOps, GetRowsBackIsDeterministicAndMatchesCpu) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(7);
    const int64_t C = 333, V = 97, T = 1000;
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (auto & i : ids) i = static_cast<int32_t>(rng() % 12 == 0 ? rng() % V : rng() % 5);   // heavy repeats
    const auto dy = rand_vec(size_t(C * T), rng);
    const auto init = rand_vec(size_t(C * V), rng);
    for (bool accumulate : {false, true}) {
        SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
        Cpu c;
        auto * table = c.ctx.new_tensor(rp::DType::F32, C, V);
        auto * into = accumulate ? c.f32(init, C, V) : nullptr;
        const auto ref = c.run(rp::get_rows_back(c.ctx, into, c.f32(dy, C, T), c.i32(ids), table));
        Dev<float> ddy(dy);
        Dev<int32_t> di(ids);
        Dev<uint8_t> ws(rp::cuda::get_rows_back_workspace_bytes(T));
        std::vector<float> first;
        for (int rep = 0; rep < 2; ++rep) {
            Dev<float> out(init);
            rp::cuda::get_rows_back(ddy.p, di.p, T, out.p, C, V, accumulate, ws.p, ws.n, nullptr, nullptr);
            const auto got = out.get();
            EXPECT_LT(nmse(got, ref), kNmseF32);
            if (rep == 0) first = got;
            else ASSERT_EQ(std::memcmp(first.data(), got.data(), got.size() * 4), 0);
        }
    }
}

TEST(CudaOps, BadIdsAreFlaggedNotRead) {
    RP_REQUIRE_GPU();
    const int64_t C = 32, V = 4;
    std::vector<float> table(size_t(C * V), 1.0f);
    std::vector<int32_t> ids = {1, 4, -1};
    Dev<float> dt(table);
    Dev<int32_t> di(ids);
    Dev<float> out(size_t(C) * 3);
    Dev<int> bad(1);
    rp::cuda::get_rows(dt.p, rp::DType::F32, C * 4, V, C, di.p, 3, out.p, bad.p, nullptr);
    const auto got = out.get();
    EXPECT_EQ(got[0], 1.0f);
    EXPECT_TRUE(std::isnan(got[size_t(C)]));
    EXPECT_EQ(bad.get()[0], 1);
}

// Dropout: bit equality, not NMSE (the mask and the scale are the same integer/float operations).
TEST(CudaOps, DropoutMatchesCpuBitForBit) {
    RP_REQUIRE_GPU();
    std::mt19937 rng(5);
    // Offsets at every word of a Philox block, one that wraps around 2^64, sizes below and above a block.
    for (int64_t n : {1, 3, 4, 5, 1000, 4099, 1 << 20})
        for (uint64_t off : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{12345}, ~uint64_t{0} - 5}) {
            SCOPED_TRACE("n=" + std::to_string(n) + " offset=" + std::to_string(off));
            const float p = 0.3f;
            const uint64_t key = rp::rng_key(7, 1, 2);
            const auto x = rand_vec(size_t(n), rng);
            Dev<float> dx(x);
            Dev<float> dy(static_cast<size_t>(n));
            rp::cuda::dropout(dx.p, dy.p, n, p, key, off, nullptr);
            Cpu c;
            rp::Tensor * y = rp::dropout(c.ctx, c.f32(x, n), p, key, off);
            y->flags |= rp::kFlagOutput;
            const auto want = c.run(y);
            const auto got = dy.get();
            ASSERT_EQ(got.size(), want.size());
            EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
            // In place (y aliases x) gives the same bits.
            rp::cuda::dropout(dx.p, dx.p, n, p, key, off, nullptr);
            const auto inplace = dx.get();
            EXPECT_EQ(std::memcmp(inplace.data(), want.data(), inplace.size() * sizeof(float)), 0);
        }
    EXPECT_THROW(rp::cuda::dropout(nullptr, nullptr, 4, 1.0f, 0, 0, nullptr), rp::Error);
}

#endif // RP_HAVE_CUDA

// ---- host-side argument checks: they throw before anything touches a device -----------------------------

#if defined(RP_HAVE_CUDA)
TEST(CudaArgs, BadArgumentsThrowNamingTheProblem) {
    auto msg = [](auto f) {
        try {
            f();
        } catch (const rp::Error & e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    rp::cuda::AttentionShape s{300, 4, 2, 8, 8, 1, 0.1f};
    EXPECT_NE(msg([&] { rp::cuda::attention_fwd(s, rp::DType::BF16, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr); })
                  .find("head_dim D=300"), std::string::npos);
    s = {64, 6, 4, 8, 8, 1, 0.1f};
    EXPECT_NE(msg([&] { rp::cuda::attention_fwd(s, rp::DType::F16, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr); })
                  .find("query heads 6"), std::string::npos);
    s = {64, 4, 2, 9, 8, 1, 0.1f};
    EXPECT_NE(msg([&] { rp::cuda::attention_fwd(s, rp::DType::F32, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr); })
                  .find("Tq=9, Tk=8"), std::string::npos);
    s = {64, 4, 2, 8, 8, 1, 0.1f};
    EXPECT_NE(msg([&] { rp::cuda::attention_fwd(s, rp::DType::Q8_0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr); })
                  .find("q8_0"), std::string::npos);
    EXPECT_NE(msg([&] {
                  rp::cuda::attention_bwd(s, rp::DType::F32, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                          nullptr, nullptr, nullptr, 16, nullptr);
              }).find("workspace"), std::string::npos);
    EXPECT_NE(msg([&] {
                  rp::cuda::matmul_fwd(64, 8, 4, nullptr, rp::DType::IQ2_XXS, 64, nullptr, 64, nullptr, 8, false, nullptr, 0,
                                       nullptr);
              }).find("unsupported weight type iq2_xxs"), std::string::npos);
    EXPECT_NE(msg([&] {
                  rp::cuda::matmul_fwd(64, 8, 4, nullptr, rp::DType::Q8_0, 72, nullptr, 64, nullptr, 8, false, nullptr,
                                       1 << 20, nullptr);
              }).find("contiguous"), std::string::npos);
    EXPECT_NE(msg([&] {
                  rp::cuda::matmul_fwd(64, 8, 4, nullptr, rp::DType::F16, 128, nullptr, 64, nullptr, 8, false, nullptr, 0,
                                       nullptr);
              }).find("workspace"), std::string::npos);
    EXPECT_NE(msg([&] {
                  rp::cuda::lm_head_ce({64, 100, 4, 0}, nullptr, nullptr, rp::DType::F32, 256, nullptr, 1.0f, nullptr,
                                       nullptr, nullptr, 0, nullptr, 0, nullptr, nullptr);
              }).find("chunk=0"), std::string::npos);
    const int64_t ne[4] = {8, 3, 1, 1}, bne[4] = {3, 1, 1, 1};
    EXPECT_NE(msg([&] { rp::cuda::add(nullptr, nullptr, nullptr, ne, bne, nullptr); }).find("does not divide"),
              std::string::npos);
    rp::cuda::RopeConfig rc;
    rc.n_rot = 7;
    const int64_t rne[4] = {8, 1, 4, 1};
    EXPECT_NE(msg([&] { rp::cuda::rope(nullptr, nullptr, 4, nullptr, rne, rc, false, nullptr); }).find("n_rot 7"),
              std::string::npos);
    EXPECT_NE(msg([&] { rp::cuda::swiglu_bwd(nullptr, nullptr, nullptr, nullptr, 2, 8, nullptr); }).find("which"),
              std::string::npos);
    EXPECT_NE(msg([&] {
                  rp::cuda::get_rows_back(nullptr, nullptr, 100, nullptr, 8, 8, false, nullptr, 8, nullptr, nullptr);
              }).find("workspace"), std::string::npos);
}
#else
TEST(CudaOps, BuiltWithoutCuda) { GTEST_SKIP() << "skipped: built without CUDA (RP_CUDA=OFF or no nvcc)"; }
#endif
