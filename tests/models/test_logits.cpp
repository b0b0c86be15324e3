// Our logits against llama.cpp's, stored in shared/models/reference/ (reference-oracle.md §7, §12).
//
// F32 models must agree up to float summation order. On F16 / BF16 / Q8_0 / Q4_0 files llama.cpp's CPU path
// rounds the activations to the weight's "dot type" before each matmul (formats.md §2.7) while our engine
// multiplies dequantized weights with f32 activations, so the plain comparison allows for that rounding. A
// test-only executor then emulates llama.cpp's activation rounding and must agree much more tightly.
#include "models_test_util.h"

#include "ggml_rp/core/fp16.h"
#include "ggml_rp/core/graph.h"
#include "ggml_rp/cpu/backend.h"
#include "ggml_rp/cpu/gemm.h"
#include "ggml_rp/ops/ops.h"
#include "models/arch/layer.h"
#include "models/arch/lora.h"

#include <gtest/gtest.h>

#include <cstring>

using namespace models_test;

namespace {

// ---- llama.cpp's activation rounding, written from formats.md §2.6-2.7 / reference-oracle.md §7 ----------

enum class DotType { F32, F16, BF16, Q8_0 };

DotType dot_type_of(rp::DType w) {
    switch (w) {
    case rp::DType::F32: return DotType::F32;
    case rp::DType::F16: return DotType::F16;
    case rp::DType::BF16: return DotType::BF16;
    default: return DotType::Q8_0;  // Q4_0, Q8_0 (Q4_1 / Q5_x use Q8_1: the same rounded values)
    }
}

float round_bf16(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even, keep the high 16 bits
    u &= 0xFFFF0000u;
    std::memcpy(&x, &u, 4);
    return x;
}

// ggml's x86 quantize_row_q8_0: d = amax / 127 stored as f16, q = nearest-even(x * 127 / amax).
void round_q8_0(float * x, int64_t n) {
    for (int64_t b = 0; b < n; b += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
        const float d = rp::fp16_to_fp32(rp::fp32_to_fp16(amax / 127.0f));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < 32; ++j) x[b + j] = std::nearbyint(x[b + j] * id) * d;
    }
}

void round_column(float * x, int64_t n, DotType t) {
    switch (t) {
    case DotType::F32: return;
    case DotType::F16:
        for (int64_t i = 0; i < n; ++i) x[i] = rp::fp16_to_fp32(rp::fp32_to_fp16(x[i]));
        return;
    case DotType::BF16:
        for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
        return;
    case DotType::Q8_0: round_q8_0(x, n); return;
    }
}

// Runs g like CpuBackend::compute, except that each matmul with a non-f32 weight first rounds its
// activations the way llama.cpp does.
void compute_emulating_llama(rp::CpuBackend & be, const rp::Graph & g) {
    be.allocate(g);
    for (rp::Tensor * n : g.nodes) {
        const DotType dt = n->op == rp::Op::MUL_MAT ? dot_type_of(n->src[0]->type) : DotType::F32;
        if (dt == DotType::F32) {
            rp::cpu::compute_node(n);
            continue;
        }
        const rp::Tensor * W = n->src[0];
        const int64_t K = W->ne[0], N = W->ne[1], cols = n->src[1]->nrows();
        ASSERT_EQ(W->ne[2] * W->ne[3], 1);
        std::vector<float> x = rp::tensor_get_f32(n->src[1]);
        for (int64_t c = 0; c < cols; ++c) round_column(x.data() + c * K, K, dt);
        ASSERT_TRUE(n->is_contiguous());
        rp::cpu::matmul_fwd(K, N, cols, W->data, W->type, W->nb[1], x.data(), K, n->data_as<float>(), N, false);
    }
}

std::vector<float> forward_emulated(const rp::Model & m, const std::vector<int32_t> & tokens) {
    rp::Context ctx;
    const TokenLeaves in = token_leaves(ctx, tokens);
    rp::Tensor * x = rp::build_embedding(ctx, m, in.ids);
    for (uint32_t il = 0; il < m.hparams().n_layer; ++il) x = rp::build_layer(ctx, m.hparams(), m.layers[il], (int) il, x, in.pos);
    rp::Tensor * logits = rp::build_head_logits(ctx, m, x);
    rp::Graph g;
    rp::build_forward(g, logits);
    rp::CpuBackend be;
    compute_emulating_llama(be, g);
    return rp::tensor_get_f32(logits);
}

struct Variant {
    const char * name;
    const char * model;      // under shared/models/
    const char * reference;  // under shared/models/reference/
    float plain_bound;       // max |d| of our f32-activation logits vs llama.cpp over all 16 x 512 logits
    float emulated_bound;    // the same with llama.cpp's activation rounding emulated
    int emulated_exact;      // leading positions where the emulation agrees within 1e-4 x logit range
};

// Positions 0, 1, ... whose logits all agree within tol, until the first that does not.
int leading_positions_within(const std::vector<float> & a, const std::vector<float> & b, int64_t n_vocab, float tol) {
    const int n_pos = static_cast<int>(a.size() / n_vocab);
    for (int p = 0; p < n_pos; ++p)
        for (int64_t v = 0; v < n_vocab; ++v)
            if (std::fabs(a[p * n_vocab + v] - b[p * n_vocab + v]) > tol) return p;
    return n_pos;
}

float median_abs_diff(const std::vector<float> & a, const std::vector<float> & b) {
    std::vector<float> d(a.size());
    for (size_t i = 0; i < a.size(); ++i) d[i] = std::fabs(a[i] - b[i]);
    std::nth_element(d.begin(), d.begin() + d.size() / 2, d.end());
    return d[d.size() / 2];
}

class StoriesVariant : public ::testing::TestWithParam<Variant> {};

// The emulation reproduces llama.cpp exactly (to f32 summation noise, ~1e-5) until some activation sits within
// that noise of a rounding boundary (an f16 half-ulp or a Q8_0 step) and rounds the other way; from that
// position on, attention spreads the one-ulp change to every later position. So the emulated path is checked
// for the leading positions it reproduces exactly, and for a max bound over all logits.
TEST_P(StoriesVariant, LogitsMatchLlamaCpp) {
    const Variant & v = GetParam();
    auto m = rp::Model::load(model_path(v.model));
    const std::vector<float> ref = read_f32(ref_path(v.reference), 16 * 512);
    ASSERT_EQ(ref.size(), 16u * 512u);
    const float range = value_range(ref), tol = 1e-4f * range;

    const std::vector<float> ours = forward_all(*m, kPrompt1);
    const float d = max_abs_diff(ours, ref);
    std::printf("[ %-5s ] plain: max |d| = %.3g (logit range %.2f, scaled %.3g), median %.3g, exact leading positions %d\n",
                v.name, d, range, d / range, median_abs_diff(ours, ref), leading_positions_within(ours, ref, 512, tol));
    EXPECT_LE(d, v.plain_bound);

    const std::vector<float> emu = forward_emulated(*m, kPrompt1);
    const float de = max_abs_diff(emu, ref);
    const int exact = leading_positions_within(emu, ref, 512, tol);
    std::printf("[ %-5s ] llama.cpp activation rounding emulated: max |d| = %.3g, median %.3g, exact leading positions %d of 16\n",
                v.name, de, median_abs_diff(emu, ref), exact);
    EXPECT_LE(de, v.emulated_bound);
    EXPECT_GE(exact, v.emulated_exact);
}

// Plain bounds: F32 1e-4 x logit range (about 37); the others the tolerances of reference-oracle.md §7.
// Emulated bounds: what the emulation reaches (measured values in the test output), rounded up.
INSTANTIATE_TEST_SUITE_P(
    Stories260K, StoriesVariant,
    ::testing::Values(Variant{"F32", "stories260K.gguf", "stories260K.prompt1.logits.16x512.f32", 3.6e-3f, 3.6e-3f, 16},
                      Variant{"F16", "derived/stories260K-F16.gguf", "stories260K-F16.prompt1.logits.16x512.f32", 0.02f, 0.012f, 2},
                      Variant{"BF16", "derived/stories260K-BF16.gguf", "stories260K-BF16.prompt1.logits.16x512.f32", 0.12f, 3.6e-3f, 16},
                      Variant{"Q8_0", "derived/stories260K-Q8_0.gguf", "stories260K-Q8_0.prompt1.logits.16x512.f32", 0.3f, 0.15f, 12},
                      Variant{"Q4_0", "derived/stories260K-Q4_0.gguf", "stories260K-Q4_0.prompt1.logits.16x512.f32", 4.0f, 0.2f, 3}),
    [](const ::testing::TestParamInfo<Variant> & i) { return std::string(i.param.name); });

TEST(ModelLogits, F32TightlyScaled) {
    auto m = rp::Model::load(stories());
    const std::vector<float> ref = read_f32(ref_path("stories260K.prompt1.logits.16x512.f32"), 16 * 512);
    const std::vector<float> ours = forward_all(*m, kPrompt1);
    EXPECT_LE(max_abs_diff(ours, ref), 1e-4f * value_range(ref));
}

void check_qwen(const char * model, const char * reference) {
    auto m = rp::Model::load(model_path(model));
    const std::vector<float> ref = read_f32(ref_path(reference), 12 * 269);
    ASSERT_EQ(ref.size(), 12u * 269u);
    const std::vector<float> ours = forward_all(*m, kPrompt2);
    const float d = max_abs_diff(ours, ref), range = value_range(ref);
    std::printf("[ %s ] max |d| = %.3g (logit range %.2f, scaled %.3g)\n", model, d, range, d / range);
    EXPECT_LE(d, 1e-4f * range);
}

TEST(ModelLogits, Qwen2Prompt2) { check_qwen("synthetic/tiny-random-qwen2.gguf", "tiny-random-qwen2.prompt2.logits.12x269.f32"); }
TEST(ModelLogits, Qwen3Prompt2TiedHeadQkNorm) {
    check_qwen("synthetic/tiny-random-qwen3.gguf", "tiny-random-qwen3.prompt2.logits.12x269.f32");
}

TEST(ModelLogits, StoriesWithLoraAdapter) {
    auto m = rp::Model::load(stories());
    auto ad = rp::LoraAdapter::load(ref_path("lora/stories260K-lora-r4-a8.gguf"), *m);
    rp::LoraSet lora;
    lora.add(*ad, 1.0f);
    const std::vector<float> ref = read_f32(ref_path("lora/stories260K+lora.prompt1.logits.16x512.f32"), 16 * 512);
    const std::vector<float> ours = forward_all(*m, kPrompt1, &lora);
    const float d = max_abs_diff(ours, ref), range = value_range(ref);
    std::printf("[ lora ] max |d| = %.3g (logit range %.2f, scaled %.3g)\n", d, range, d / range);
    EXPECT_LE(d, 1e-4f * range);
    // The adapter matters: without it the logits differ by up to 3.7 (formats.md §5.6).
    EXPECT_GT(max_abs_diff(forward_all(*m, kPrompt1), ref), 1.0f);
}

TEST(ModelLogits, LoraMergedModelEqualsRuntimeAdapter) {
    // llama-export-lora's merge (W + alpha/r B A, made by llama.cpp) run as a plain model gives the same logits.
    auto merged = rp::Model::load(ref_path("lora/stories260K-lora-r4-a8-merged-by-export-lora.gguf"));
    const std::vector<float> ref = read_f32(ref_path("lora/stories260K+lora.prompt1.logits.16x512.f32"), 16 * 512);
    EXPECT_LE(max_abs_diff(forward_all(*merged, kPrompt1), ref), 1e-4f * value_range(ref));
}

} // namespace
