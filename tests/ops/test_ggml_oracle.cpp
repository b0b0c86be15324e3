// Ops against ggml's own kernels on llama.cpp's CPU backend (rp-oracle rope / swiglu-oai).
//
// rope with YaRN against ggml_rope_ext, with
// gpt-oss's setting (NEOX, base 150000, 32x extension of a 4096 context) and a llama-style NORMAL one at
// partial strength. ggml computes each angle in float, multiplying by the frequency ratio pair after pair, so
// its angle for pair i at position p is off by up to ~p x i x 2.4e-7 rad; the bound below allows that and
// nothing more (a wrong ramp, scale or mix is off by 1e-2 or more at these positions).
#include "ggml_rp/core/fp16.h"
#include "ggml_rp/ggml_rp.h"
#include "tests/ops/harness.h"
#include "tests/common/temp_dir.h"
#include "tests/oracle/oracle_run.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

void compare_with_ggml(const rp::RopeParams & p, const std::vector<int32_t> & pos, const std::vector<float> & freq_factors = {}) {
    const int64_t D = 64, H = 2, T = static_cast<int64_t>(pos.size());
    std::mt19937 rng(11);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(D * H * T));
    for (float & v : x) v = n(rng);
    rp_test::TempDir d;
    rp::oracle::write_f32(d.file("x.f32"), x);
    const std::string tokens = rp::oracle::id_list(pos);
    std::string rope;
    char buf[256];
    std::snprintf(buf, sizeof buf, "%d,%d,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%d", p.n_rot, static_cast<int>(p.mode), p.freq_base, p.freq_scale,
                  p.ext_factor, p.attn_factor, p.beta_fast, p.beta_slow, p.n_ctx_orig);
    rope = buf;
    std::string ff_list;
    for (float v : freq_factors) {
        std::snprintf(buf, sizeof buf, "%s%.9g", ff_list.empty() ? "" : ",", v);
        ff_list += buf;
    }
    const auto res = rp::oracle::run("rope " + rp::oracle::quote(d.file("x.f32")) + " --row 64 --heads 2 --tokens " + rp::oracle::quote(tokens) +
                                     " --rope " + rope + (ff_list.empty() ? "" : " --params " + ff_list) + " --out " +
                                     rp::oracle::quote(d.file("y.f32")));
    ASSERT_EQ(res.status, 0);
    const std::vector<float> want = rp::oracle::read_f32(d.file("y.f32"));
    ASSERT_EQ(want.size(), x.size()) << "rp-oracle wrote another count of values";

    rp::Context ctx;
    rp::Tensor * xt = ctx.new_tensor(rp::DType::F32, D, H, T);
    rp::Tensor * pt = ctx.new_tensor(rp::DType::I32, T);
    ctx.alloc_data(xt);
    ctx.alloc_data(pt);
    rp::tensor_set_f32(xt, x);
    for (int64_t t = 0; t < T; ++t) pt->data_as<int32_t>()[t] = pos[static_cast<size_t>(t)];
    rp::Tensor * ff = nullptr;
    if (!freq_factors.empty()) {
        ff = ctx.new_tensor(rp::DType::F32, static_cast<int64_t>(freq_factors.size()));
        ctx.alloc_data(ff);
        rp::tensor_set_f32(ff, freq_factors);
    }
    const std::vector<float> got = optest::compute(rp::rope(ctx, xt, pt, p, ff));
    double worst = 0;
    for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < D * H; ++k) {
            const size_t i = static_cast<size_t>(t * D * H + k);
            const double bound = 1e-5 + 4.0 * 1.35 * pos[static_cast<size_t>(t)] * (D / 2) * 2.4e-7;  // |x| < 4, the YaRN scale <= 1.35
            const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
            worst = std::max(worst, e);
            ASSERT_LE(e, bound) << "position " << pos[static_cast<size_t>(t)] << " element " << k << ": " << got[i] << " vs ggml's " << want[i];
        }
    std::printf("[rope vs ggml] mode %d ext %g: max |ours - ggml| %.3g\n", static_cast<int>(p.mode), p.ext_factor, worst);
}

} // namespace

TEST(OpGgmlOracle, YarnEqualsGgmlsRopeExt) {
    RP_REQUIRE_ORACLE();
    rp::RopeParams gpt_oss;
    gpt_oss.n_rot = 64, gpt_oss.mode = rp::RopeMode::Neox, gpt_oss.freq_base = 150000.0f, gpt_oss.freq_scale = 1.0f / 32;
    gpt_oss.ext_factor = 1.0f, gpt_oss.attn_factor = 1.0f, gpt_oss.beta_fast = 32.0f, gpt_oss.beta_slow = 1.0f, gpt_oss.n_ctx_orig = 4096;
    compare_with_ggml(gpt_oss, {0, 1, 2, 5, 13, 31, 64, 200});
    rp::RopeParams partial = gpt_oss;
    partial.mode = rp::RopeMode::Normal, partial.freq_base = 10000.0f, partial.freq_scale = 0.25f, partial.ext_factor = 0.5f;
    partial.attn_factor = 0.9f, partial.n_ctx_orig = 2048;
    compare_with_ggml(partial, {0, 1, 3, 7, 50, 120});
    rp::RopeParams plain = gpt_oss;  // and without YaRN: the angles alone
    plain.ext_factor = 0.0f, plain.freq_scale = 1.0f;
    compare_with_ggml(plain, {0, 1, 4, 100});
}

// Freq factors (ggml_rope_ext's c): Llama 3.1's rope_freqs (base 500000, factor 8, low / high frequency factors 1
// and 4 over an 8192-token context, as llama.cpp's converter computes them), plain and under YaRN.
TEST(OpGgmlOracle, FreqFactorsEqualGgmlsRopeExt) {
    RP_REQUIRE_ORACLE();
    rp::RopeParams llama31;
    llama31.n_rot = 64, llama31.mode = rp::RopeMode::Normal, llama31.freq_base = 500000.0f;
    std::vector<float> ff;
    for (int i = 0; i < 32; ++i) {
        const double freq = 1.0 / std::pow(500000.0, 2.0 * i / 64), wavelen = 2 * M_PI / freq;
        const double low_wavelen = 8192 / 1.0, high_wavelen = 8192 / 4.0;
        if (wavelen < high_wavelen) ff.push_back(1.0f);
        else if (wavelen > low_wavelen) ff.push_back(8.0f);
        else {
            const double smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0);
            ff.push_back(static_cast<float>(1.0 / ((1 - smooth) / 8.0 + smooth)));
        }
    }
    compare_with_ggml(llama31, {0, 1, 7, 300, 5000, 100000}, ff);
    rp::RopeParams yarn = llama31;
    yarn.mode = rp::RopeMode::Neox, yarn.freq_scale = 0.25f, yarn.ext_factor = 1.0f, yarn.n_ctx_orig = 4096;
    compare_with_ggml(yarn, {0, 3, 90, 9000}, ff);
}

// gpt-oss's clamped SwiGLU against ggml_swiglu_oai, at its alpha 1.702 and limit 7 (and a limit of 2), on
// values that cross both clamps.
TEST(OpGgmlOracle, ClampedSwigluEqualsGgmlsSwigluOai) {
    RP_REQUIRE_ORACLE();
    const int64_t N = 96, rows = 3;
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-12.0f, 12.0f);
    std::vector<float> gu(static_cast<size_t>(2 * N * rows));
    for (float & v : gu) v = u(rng);
    for (const float limit : {7.0f, 2.0f}) {
        rp_test::TempDir d;
        rp::oracle::write_f32(d.file("in.f32"), gu);
        char params[64];
        std::snprintf(params, sizeof params, "1.702,%g", static_cast<double>(limit));
        const auto res = rp::oracle::run("swiglu-oai " + rp::oracle::quote(d.file("in.f32")) + " --row 96 --params " + params + " --out " +
                                         rp::oracle::quote(d.file("out.f32")));
        ASSERT_EQ(res.status, 0);
        const std::vector<float> want = rp::oracle::read_f32(d.file("out.f32"));
        ASSERT_EQ(want.size(), static_cast<size_t>(N * rows));

        rp::Context ctx;
        rp::Tensor * g = ctx.new_tensor(rp::DType::F32, N, rows);
        rp::Tensor * up = ctx.new_tensor(rp::DType::F32, N, rows);
        ctx.alloc_data(g);
        ctx.alloc_data(up);
        rp::tensor_set_f32(g, std::vector<float>(gu.begin(), gu.begin() + N * rows));
        rp::tensor_set_f32(up, std::vector<float>(gu.begin() + N * rows, gu.end()));
        const std::vector<float> got = optest::compute(rp::swiglu_oai(ctx, g, up, 1.702f, limit));
        double worst = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
            worst = std::max(worst, e / std::max(1.0, std::fabs(static_cast<double>(want[i]))));
            ASSERT_LE(e, 1e-6 * std::max(1.0, std::fabs(static_cast<double>(want[i])))) << i << ": " << got[i] << " vs ggml's " << want[i];
        }
        std::printf("[swiglu_oai vs ggml] limit %g: max relative difference %.3g\n", static_cast<double>(limit), worst);
    }
}

// Gemma's GeGLU against ggml_geglu_split, the op llama.cpp's build_ffn runs for it, on gates across the
// tanh's saturation and past ggml's +-10 cut-offs.
TEST(OpGgmlOracle, GegluAgainstGgmlsGegluSplit) {
    RP_REQUIRE_ORACLE();
    const int64_t N = 128, rows = 4;
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-12.0f, 12.0f);
    std::vector<float> gu(static_cast<size_t>(2 * N * rows));
    for (float & v : gu) v = u(rng);
    rp_test::TempDir d;
    rp::oracle::write_f32(d.file("in.f32"), gu);
    const auto res = rp::oracle::run("geglu " + rp::oracle::quote(d.file("in.f32")) + " --row 128 --out " + rp::oracle::quote(d.file("out.f32")));
    ASSERT_EQ(res.status, 0);
    const std::vector<float> want = rp::oracle::read_f32(d.file("out.f32"));
    ASSERT_EQ(want.size(), static_cast<size_t>(N * rows));

    rp::Context ctx;
    rp::Tensor * g = ctx.new_tensor(rp::DType::F32, N, rows);
    rp::Tensor * up = ctx.new_tensor(rp::DType::F32, N, rows);
    ctx.alloc_data(g);
    ctx.alloc_data(up);
    rp::tensor_set_f32(g, std::vector<float>(gu.begin(), gu.begin() + N * rows));
    rp::tensor_set_f32(up, std::vector<float>(gu.begin() + N * rows, gu.end()));
    const std::vector<float> got = optest::compute(rp::geglu(ctx, g, up));
    // Our fp16-table kernel (what InferenceSession runs, ops/unary.h) gives ggml's bits on every input.
    const std::vector<float> got_table = optest::compute(rp::geglu(ctx, g, up, true));
    size_t table_equal = 0;
    for (size_t i = 0; i < got_table.size(); ++i) table_equal += got_table[i] == want[i];
    EXPECT_EQ(table_equal, got_table.size()) << "our fp16-table GeGLU differs from ggml's";
    // ggml's CPU kernel reads GELU from a table over the fp16 values (GGML_GELU_FP16): gelu(fp16(x)) rounded to
    // fp16, times up; 0 below -10, x above 10. Modelled here, it gives ggml's bits; our exact GELU is within the
    // two fp16 roundings (2^-11 each, relative) of it.
    double worst = 0;
    int emulated_equal = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const float x = gu[i], y = gu[i + static_cast<size_t>(N * rows)];
        const float table = x <= -10.0f ? 0.0f
                          : x >= 10.0f  ? x * y
                                        : rp::fp16_to_fp32(rp::fp32_to_fp16(rp::gelu_tanh_f(rp::fp16_to_fp32(rp::fp32_to_fp16(x))))) * y;
        emulated_equal += table == want[i];
        const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
        const double bound = 2.0 * 0x1p-11 * std::fabs(static_cast<double>(want[i])) +
                             0x1p-11 * std::fabs(static_cast<double>(x)) * 1.13 * std::fabs(static_cast<double>(y)) + 1e-6;
        EXPECT_LE(e, bound) << i << ": gate " << x << " up " << y << ": ours " << got[i] << " vs ggml's " << want[i];
        worst = std::max(worst, e / std::max(1.0, std::fabs(static_cast<double>(want[i]))));
    }
    EXPECT_EQ(emulated_equal, static_cast<int>(got.size())) << "ggml's GeGLU is not the fp16 table this test models";
    std::printf("[geglu vs ggml] exact GELU: max relative difference %.3g; the fp16-table model equals ggml on %d of %zu, our "
                "table kernel on %zu\n", worst, emulated_equal, got.size(), table_equal);
}
