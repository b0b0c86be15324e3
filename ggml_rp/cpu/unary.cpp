// SCALE (and its soft-cap form), SILU, SILU_BACK, SIGMOID, SOFTPLUS, SWIGLU, SWIGLU_BACK (SiLU, gpt-oss's clamped form, GELU-tanh and llama.cpp's fp16 GELU
// table): element-wise over same-shaped strided sources.
#include "ggml_rp/core/fp16.h"
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/strided.h"
#include "ggml_rp/cpu/vec_math.h"
#include "ggml_rp/ops/unary_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace rp::cpu {

namespace {

// out[i] = f(src0[i], src1[i], src2[i], e[i]) for the first NSrc sources (all with the node's shape), where
// e[i] = vec_exp(-src0[i]) when NegExp (the SiLU family), else 0. On contiguous rows e is computed a piece
// of the row at a time in vectors (exp_affine: GCC leaves exp scalar in a loop) and f runs in a plain loop
// that vectorizes; strided rows compute the same values one at a time.
template <int NSrc, bool NegExp = false, typename F>
void elementwise(Tensor * n, F f) {
    const int64_t ne0 = n->ne[0], nr = n->nrows();
    constexpr int64_t kPiece = 512;
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const char * s[3] = {nullptr, nullptr, nullptr};
        size_t snb[3] = {0, 0, 0};
        for (int k = 0; k < NSrc; ++k) { s[k] = row_ptr(n->src[k], ri); snb[k] = n->src[k]->nb[0]; }
        char * d = row_ptr(n, ri);
        const size_t dnb = n->nb[0];
        bool packed = dnb == sizeof(float);
        for (int k = 0; k < NSrc; ++k) packed = packed && snb[k] == sizeof(float);
        if (packed) {
            float * dp = reinterpret_cast<float *>(d);
            const float * p0 = reinterpret_cast<const float *>(s[0]);
            const float * p1 = NSrc > 1 ? reinterpret_cast<const float *>(s[1]) : p0;
            const float * p2 = NSrc > 2 ? reinterpret_cast<const float *>(s[2]) : p0;
            if constexpr (NegExp) {
                float e[kPiece];
                for (int64_t i0 = 0; i0 < ne0; i0 += kPiece) {
                    const int64_t m = std::min(kPiece, ne0 - i0);
                    exp_affine(p0 + i0, e, m, -1.0f, 0.0f);   // vec_exp(fma(x, -1, -0)) = vec_exp(-x)
#pragma omp simd
                    for (int64_t i = 0; i < m; ++i)
                        dp[i0 + i] = f(p0[i0 + i], NSrc > 1 ? p1[i0 + i] : 0.0f, NSrc > 2 ? p2[i0 + i] : 0.0f, e[i]);
                }
            } else {
#pragma omp simd
                for (int64_t i = 0; i < ne0; ++i) dp[i] = f(p0[i], NSrc > 1 ? p1[i] : 0.0f, NSrc > 2 ? p2[i] : 0.0f, 0.0f);
            }
            continue;
        }
        for (int64_t i = 0; i < ne0; ++i) {
            const float x0 = at(s[0], snb[0], i);
            const float x1 = NSrc > 1 ? at(s[1], snb[1], i) : 0.0f;
            const float x2 = NSrc > 2 ? at(s[2], snb[2], i) : 0.0f;
            at(d, dnb, i) = f(x0, x1, x2, NegExp ? vec_exp(-x0) : 0.0f);
        }
    }
}

} // namespace

void scale(Tensor * n) {
    const float s = n->param_f32(0), cap = n->param_f32(1);
    if (cap > 0.0f) return elementwise<1>(n, [s, cap](float x, float, float, float) { return cap * std::tanh(x * s / cap); });
    elementwise<1>(n, [s](float x, float, float, float) { return x * s; });
}

void silu(Tensor * n) { elementwise<1, true>(n, [](float x, float, float, float e) { return silu_of(x, e); }); }

void sigmoid(Tensor * n) { elementwise<1, true>(n, [](float, float, float, float e) { return sigmoid_of(e); }); }

void softplus(Tensor * n) { elementwise<1>(n, [](float x, float, float, float) { return softplus_f(x); }); }

void silu_back(Tensor * n) { elementwise<2, true>(n, [](float x, float dy, float, float e) { return dy * silu_grad_of(x, e); }); }

namespace {

// ggml's GELU table (GGML_GELU_FP16): entry h = fp16(gelu(fp16 value h)), gelu in f32 with the same formula.
const uint16_t * gelu_fp16_table() {
    static const std::vector<uint16_t> table = [] {
        std::vector<uint16_t> t(1 << 16);
        for (uint32_t h = 0; h < t.size(); ++h) t[h] = fp32_to_fp16(gelu_tanh_f(fp16_to_fp32(static_cast<uint16_t>(h))));
        return t;
    }();
    return table.data();
}

} // namespace

void swiglu(Tensor * n) {
    if (n->param_i32(0) == static_cast<int32_t>(GluKind::SiluOai)) {  // gpt-oss's clamped form
        const float alpha = n->param_f32(1), limit = n->param_f32(2);
        return elementwise<2>(n, [alpha, limit](float g, float u, float, float) { return swiglu_oai_f(g, u, alpha, limit); });
    }
    if (n->param_i32(0) == static_cast<int32_t>(GluKind::GeluTanh))
        return elementwise<2>(n, [](float g, float u, float, float) { return gelu_tanh_f(g) * u; });
    if (n->param_i32(0) == static_cast<int32_t>(GluKind::GeluTanhFp16)) {
        const uint16_t * table = gelu_fp16_table();
        return elementwise<2>(n, [table](float g, float u, float, float) {
            if (g <= -10.0f) return 0.0f;
            if (g >= 10.0f) return g * u;
            return fp16_to_fp32(table[fp32_to_fp16(g)]) * u;
        });
    }
    elementwise<2, true>(n, [](float g, float u, float, float e) { return silu_of(g, e) * u; });
}

void swiglu_back(Tensor * n) {
    if (n->param_i32(1) == static_cast<int32_t>(GluKind::GeluTanh)) {
        if (n->param_i32(0) == 0) return elementwise<3>(n, [](float g, float u, float dy, float) { return dy * u * gelu_tanh_grad_f(g); });
        return elementwise<3>(n, [](float g, float, float dy, float) { return dy * gelu_tanh_f(g); });
    }
    if (n->param_i32(1) == static_cast<int32_t>(GluKind::SiluOai)) {
        const float alpha = n->param_f32(2), limit = n->param_f32(3);
        if (n->param_i32(0) == 0)
            return elementwise<3>(n, [alpha, limit](float g, float u, float dy, float) { return swiglu_oai_dgate(g, u, dy, alpha, limit); });
        return elementwise<3>(n, [alpha, limit](float g, float u, float dy, float) { return swiglu_oai_dup(g, u, dy, alpha, limit); });
    }
    if (n->param_i32(0) == 0)
        elementwise<3, true>(n, [](float g, float u, float dy, float e) { return dy * u * silu_grad_of(g, e); });
    else
        elementwise<3, true>(n, [](float g, float, float dy, float e) { return dy * silu_of(g, e); });
}

const RegisterKernels kRegister{{Op::SCALE, scale},   {Op::SILU, silu},     {Op::SILU_BACK, silu_back},
                                {Op::SWIGLU, swiglu}, {Op::SWIGLU_BACK, swiglu_back}, {Op::SIGMOID, sigmoid},
                                {Op::SOFTPLUS, softplus}};

} // namespace rp::cpu
