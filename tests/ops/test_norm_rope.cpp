// rms_norm and rope: forward vs the double reference, backward vs finite differences, determinism.
#include "harness.h"

#include <tuple>

#include <gtest/gtest.h>

#include <cmath>

using namespace optest;
using rp::Context;
using rp::Tensor;
using TV = std::vector<Tensor *>;
using R = RefInputs;

TEST(OpNorm, RmsNormWithWeight) {
    check_op({"rms_norm [17,3] w", {{"x", {17, 3, 1, 1}}, {"w", {17, 1, 1, 1}}},
              [](Context & c, const TV & in) { return rp::rms_norm(c, in[0], in[1], 1e-5f); },
              [](const R & v) { return ref::rms_norm(v[0], &v[1], static_cast<double>(1e-5f)); }});
    check_op({"rms_norm [127,2,2] w", {{"x", {127, 2, 2, 1}}, {"w", {127, 1, 1, 1}}},
              [](Context & c, const TV & in) { return rp::rms_norm(c, in[0], in[1], 1e-6f); },
              [](const R & v) { return ref::rms_norm(v[0], &v[1], static_cast<double>(1e-6f)); }});
}

TEST(OpNorm, RmsNormNoWeight) {
    check_op({"rms_norm [3,5]", {{"x", {3, 5, 1, 1}}},
              [](Context & c, const TV & in) { return rp::rms_norm(c, in[0], nullptr, 1e-5f); },
              [](const R & v) { return ref::rms_norm(v[0], nullptr, static_cast<double>(1e-5f)); }});
    // One element per row: y = x / sqrt(x^2 + eps); a large eps keeps the derivative well conditioned.
    check_op({"rms_norm [1,4] eps 0.5", {{"x", {1, 4, 1, 1}}},
              [](Context & c, const TV & in) { return rp::rms_norm(c, in[0], nullptr, 0.5f); },
              [](const R & v) { return ref::rms_norm(v[0], nullptr, 0.5); }});
}

TEST(OpNorm, RmsNormTransposedInput) {
    check_op({"rms_norm transposed [4,17]^T w", {{"x_t", {4, 17, 1, 1}}, {"w", {17, 1, 1, 1}}},
              [](Context & c, const TV & in) { return rp::rms_norm(c, rp::transpose(c, in[0]), in[1], 1e-5f); },
              [](const R & v) { return ref::rms_norm(ref::permute(v[0], 1, 0, 2, 3), &v[1], static_cast<double>(1e-5f)); }});
}

namespace {

Input positions(std::vector<int32_t> p) {
    Input in{"pos", {static_cast<int64_t>(p.size()), 1, 1, 1}, rp::DType::I32, false};
    in.ints = std::move(p);
    return in;
}

Case rope_case(std::string name, std::array<int64_t, 4> ne, std::vector<int32_t> pos, int n_rot, rp::RopeMode mode,
               float base, float fscale) {
    rp::RopeParams p;
    p.n_rot = n_rot;
    p.mode = mode;
    p.freq_base = base;
    p.freq_scale = fscale;
    return {name, {{"x", ne}, positions(pos)},
            [p](Context & c, const TV & in) { return rp::rope(c, in[0], in[1], p); },
            [p](const R & v) {
                return ref::rope(v[0], ints_from(v[1]), p.n_rot, static_cast<int>(p.mode), p.freq_base, p.freq_scale);
            }};
}

} // namespace

TEST(OpRope, Normal) {
    check_op(rope_case("rope normal [8,3,5]", {8, 3, 5, 1}, {0, 1, 7, 42, 100}, 8, rp::RopeMode::Normal, 10000.0f, 1.0f));
}

TEST(OpRope, NeoxPartialScaled) {
    check_op(rope_case("rope neox n_rot 6 of 10, scale 0.5", {10, 2, 4, 1}, {3, 0, 17, 9}, 6, rp::RopeMode::Neox,
                       1000000.0f, 0.5f));
}

TEST(OpRope, PerSequencePositions) {
    check_op(rope_case("rope neox [4,2,3,2] pos per seq", {4, 2, 3, 2}, {0, 1, 2, 5, 6, 7}, 4, rp::RopeMode::Neox,
                       10000.0f, 1.0f));
    check_op(rope_case("rope normal [4,1,3,2] shared pos", {4, 1, 3, 2}, {2, 3, 4}, 2, rp::RopeMode::Normal, 10000.0f, 1.0f));
}

TEST(OpRope, LargePositionsForward) {
    // The angle is computed in double: still exact to float precision at position 100000.
    check_op(rope_case("rope normal large pos", {16, 1, 3, 1}, {4096, 65535, 100000}, 16, rp::RopeMode::Normal,
                       10000.0f, 1.0f));
}

// YaRN (ggml's rope_ext): gpt-oss's setting (NEOX, base 150000, 32x extension of a 4096 context) and a
// partial-strength one (NORMAL, ext_factor 0.5, attn_factor 0.9); forward vs the double reference, backward
// vs finite differences.
TEST(OpRope, Yarn) {
    for (const auto & [mode, base, fscale, ext, attn, n_ctx] : {std::tuple<rp::RopeMode, float, float, float, float, int>{
                                                                    rp::RopeMode::Neox, 150000.0f, 1.0f / 32, 1.0f, 1.0f, 4096},
                                                                {rp::RopeMode::Normal, 10000.0f, 0.25f, 0.5f, 0.9f, 2048}}) {
        rp::RopeParams p;
        p.n_rot = 16, p.mode = mode, p.freq_base = base, p.freq_scale = fscale;
        p.ext_factor = ext, p.attn_factor = attn, p.beta_fast = 32.0f, p.beta_slow = 1.0f, p.n_ctx_orig = n_ctx;
        check_op({"rope yarn " + std::to_string(static_cast<int>(mode)), {{"x", {16, 2, 5, 1}}, positions({0, 3, 100, 5000, 90000})},
                  [p](Context & c, const TV & in) { return rp::rope(c, in[0], in[1], p); },
                  [p](const R & v) {
                      return ref::rope_yarn(v[0], ints_from(v[1]), p.n_rot, static_cast<int>(p.mode), p.freq_base, p.freq_scale, p.ext_factor,
                                            p.attn_factor, p.beta_fast, p.beta_slow, p.n_ctx_orig);
                  }});
    }
    rp::Context ctx;
    rp::Tensor * x = ctx.new_tensor(rp::DType::F32, 8, 1, 2);
    rp::Tensor * pos = ctx.new_tensor(rp::DType::I32, 2);
    rp::RopeParams p;
    p.n_rot = 8;
    p.ext_factor = 1.0f;  // without the training context
    EXPECT_THROW(rp::rope(ctx, x, pos, p), rp::Error);
}

// Attention temperature tuning (Mistral 3, Llama 4): the rotation times log(floor((pos + offset) / floor) + 1) *
// scale + 1 per token (a double reference of its own), with and without YaRN; backward vs finite differences.
TEST(OpRope, AttentionTemperature) {
    for (const float ext : {0.0f, 1.0f}) {
        rp::RopeParams p;
        p.n_rot = 8, p.mode = rp::RopeMode::Normal, p.freq_base = 1e6f, p.freq_scale = ext > 0 ? 1.0f / 16 : 1.0f;
        p.ext_factor = ext, p.n_ctx_orig = 16, p.attn_factor = ext > 0 ? 1.0f / (1.0f + 0.1f * std::log(16.0f)) : 1.0f;
        p.temp_scale = 0.1f, p.temp_floor = 16, p.temp_offset = ext > 0 ? 1.0f : 0.0f;
        const std::vector<int32_t> pos = {0, 15, 16, 40, 1000};
        check_op({"rope temperature ext " + std::to_string(ext), {{"x", {8, 2, 5, 1}}, positions(pos)},
                  [p](Context & c, const TV & in) { return rp::rope(c, in[0], in[1], p); },
                  [p](const R & v) {
                      const std::vector<int32_t> ps = ints_from(v[1]);
                      ref::DT y = ref::rope_yarn(v[0], ps, p.n_rot, static_cast<int>(p.mode), p.freq_base, p.freq_scale, p.ext_factor,
                                                 p.attn_factor, p.beta_fast, p.beta_slow, p.n_ctx_orig);
                      for (int64_t t = 0; t < y.ne[2]; ++t) {
                          const double f = std::log(std::floor((ps[static_cast<size_t>(t)] + double(p.temp_offset)) / p.temp_floor) + 1.0) *
                                               double(p.temp_scale) + 1.0;
                          for (int64_t h = 0; h < y.ne[1]; ++h)
                              for (int64_t d = 0; d < y.ne[0]; ++d) y.v[y.idx(d, h, t, 0)] *= f;
                      }
                      return y;
                  }});
    }
    rp::Context ctx;
    rp::Tensor * x = ctx.new_tensor(rp::DType::F32, 8, 1, 2);
    rp::Tensor * pos = ctx.new_tensor(rp::DType::I32, 2);
    rp::RopeParams p;
    p.n_rot = 8;
    p.temp_scale = 0.1f;  // without the floor
    EXPECT_THROW(rp::rope(ctx, x, pos, p), rp::Error);
}

// Frequency factors (Llama 3's rope_freqs, LongRoPE): pair i's angle divided by ff[i], with and without YaRN;
// the factors get no gradient. A table of too few factors is refused.
TEST(OpRope, FreqFactors) {
    for (const float ext : {0.0f, 1.0f}) {
        rp::RopeParams p;
        p.n_rot = 8, p.mode = ext > 0 ? rp::RopeMode::Neox : rp::RopeMode::Normal, p.freq_base = 5e5f;
        p.freq_scale = ext > 0 ? 0.25f : 1.0f, p.ext_factor = ext, p.n_ctx_orig = 64;
        Input ff{"ff", {4, 1, 1, 1}, rp::DType::F32, false};
        ff.lo = 1.0f, ff.hi = 8.0f;  // Llama 3's run from 1 (high frequencies) to its factor 8 (low)
        check_op({"rope freq factors ext " + std::to_string(ext), {{"x", {10, 2, 5, 1}}, positions({0, 3, 100, 5000, 90000}), ff},
                  [p](Context & c, const TV & in) { return rp::rope(c, in[0], in[1], p, in[2]); },
                  [p](const R & v) {
                      const std::vector<double> f(v[2].v.begin(), v[2].v.end());
                      return ref::rope_yarn(v[0], ints_from(v[1]), p.n_rot, static_cast<int>(p.mode), p.freq_base, p.freq_scale, p.ext_factor,
                                            p.attn_factor, p.beta_fast, p.beta_slow, p.n_ctx_orig, &f);
                  }});
    }
    rp::Context ctx;
    rp::Tensor * x = ctx.new_tensor(rp::DType::F32, 8, 1, 2);
    rp::Tensor * pos = ctx.new_tensor(rp::DType::I32, 2);
    rp::Tensor * few = ctx.new_tensor(rp::DType::F32, 3);
    rp::RopeParams p;
    p.n_rot = 8;
    EXPECT_THROW(rp::rope(ctx, x, pos, p, few), rp::Error);
}

TEST(OpRope, PermutedInput) {
    rp::RopeParams p;
    p.n_rot = 8;
    p.mode = rp::RopeMode::Neox;
    // x leaf [D=8, T=5, H=3] permuted to [D, H, T].
    check_op({"rope neox permuted input", {{"x", {8, 5, 3, 1}}, positions({4, 3, 2, 1, 0})},
              [p](Context & c, const TV & in) { return rp::rope(c, rp::permute(c, in[0], 0, 2, 1, 3), in[1], p); },
              [p](const R & v) { return ref::rope(ref::permute(v[0], 0, 2, 1, 3), ints_from(v[1]), 8, 2, 10000.0, 1.0); }});
}

TEST(OpRope, Errors) {
    Context ctx;
    Tensor * x = ctx.new_tensor(rp::DType::F32, 8, 2, 5);
    Tensor * pos = ctx.new_tensor(rp::DType::I32, 4);
    rp::RopeParams p;
    p.n_rot = 8;
    EXPECT_THROW(rp::rope(ctx, x, pos, p), rp::Error);  // 4 positions for 5 tokens
    Tensor * pos5 = ctx.new_tensor(rp::DType::I32, 5);
    p.n_rot = 7;
    EXPECT_THROW(rp::rope(ctx, x, pos5, p), rp::Error);  // odd n_rot
    p.n_rot = 10;
    EXPECT_THROW(rp::rope(ctx, x, pos5, p), rp::Error);  // n_rot > head_dim
}
