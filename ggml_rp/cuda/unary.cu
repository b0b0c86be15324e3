// SCALE (and its soft-cap form), SILU, SILU_BACK, SIGMOID, SOFTPLUS, SWIGLU, SWIGLU_BACK (SiLU, clamped SiLU, GELU-tanh): grid-stride element-wise kernels.
#include "ggml_rp/cuda/unary.cuh"

#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/node_kernel.cuh"
#include "ggml_rp/ops/unary_math.h"

namespace rp::cuda {

namespace {

enum class UnaryOp {
    Scale, Softcap, Silu, SiluBack, Sigmoid, Softplus, Swiglu, SwigluBackGate, SwigluBackUp, SwigluOai, SwigluOaiBackGate, SwigluOaiBackUp, Geglu, GegluBackGate, GegluBackUp
};

// s: SCALE's factor, or the clamped SwiGLU's alpha (s2: its limit).
template <UnaryOp Op>
__global__ void __launch_bounds__(kElemThreads) unary_kernel(const float * a, const float * b, const float * c, float s, float s2, float * out,
                                                             int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        float r;
        if constexpr (Op == UnaryOp::Scale) r = a[i] * s;
        else if constexpr (Op == UnaryOp::Softcap) r = s2 * tanhf(a[i] * s / s2);
        else if constexpr (Op == UnaryOp::Silu) r = silu_f(a[i]);
        else if constexpr (Op == UnaryOp::SiluBack) r = b[i] * silu_grad_f(a[i]);
        else if constexpr (Op == UnaryOp::Sigmoid) r = sigmoid_f(a[i]);
        else if constexpr (Op == UnaryOp::Softplus) r = softplus_f(a[i]);
        else if constexpr (Op == UnaryOp::Swiglu) r = silu_f(a[i]) * b[i];
        else if constexpr (Op == UnaryOp::SwigluBackGate) r = c[i] * b[i] * silu_grad_f(a[i]);
        else if constexpr (Op == UnaryOp::SwigluBackUp) r = c[i] * silu_f(a[i]);
        else if constexpr (Op == UnaryOp::SwigluOai) r = swiglu_oai_f(a[i], b[i], s, s2);
        else if constexpr (Op == UnaryOp::SwigluOaiBackGate) r = swiglu_oai_dgate(a[i], b[i], c[i], s, s2);
        else if constexpr (Op == UnaryOp::SwigluOaiBackUp) r = swiglu_oai_dup(a[i], b[i], c[i], s, s2);
        else if constexpr (Op == UnaryOp::Geglu) r = gelu_tanh_f(a[i]) * b[i];
        else if constexpr (Op == UnaryOp::GegluBackGate) r = c[i] * b[i] * gelu_tanh_grad_f(a[i]);
        else r = c[i] * gelu_tanh_f(a[i]);
        out[i] = r;
    }
}

template <UnaryOp Op>
void launch(const char * name, const float * a, const float * b, const float * c, float s, float * out, int64_t n,
            cudaStream_t stream, float s2 = 0.0f) {
    require(n >= 0, name, "negative element count " + std::to_string(n));
    if (n == 0) return;
    unary_kernel<Op><<<static_cast<unsigned>(elementwise_grid(n)), kElemThreads, 0, stream>>>(a, b, c, s, s2, out, n);
    check_launch(name);
}

} // namespace

void scale(const float * x, float s, float * y, int64_t n, cudaStream_t st, float cap) {
    if (cap > 0.0f) return launch<UnaryOp::Softcap>("softcap", x, nullptr, nullptr, s, y, n, st, cap);
    launch<UnaryOp::Scale>("scale", x, nullptr, nullptr, s, y, n, st);
}
void silu_fwd(const float * x, float * y, int64_t n, cudaStream_t st) {
    launch<UnaryOp::Silu>("silu", x, nullptr, nullptr, 0.0f, y, n, st);
}
void sigmoid_fwd(const float * x, float * y, int64_t n, cudaStream_t st) {
    launch<UnaryOp::Sigmoid>("sigmoid", x, nullptr, nullptr, 0.0f, y, n, st);
}
void softplus_fwd(const float * x, float * y, int64_t n, cudaStream_t st) {
    launch<UnaryOp::Softplus>("softplus", x, nullptr, nullptr, 0.0f, y, n, st);
}
void silu_bwd(const float * x, const float * dy, float * dx, int64_t n, cudaStream_t st) {
    launch<UnaryOp::SiluBack>("silu_back", x, dy, nullptr, 0.0f, dx, n, st);
}
void swiglu_fwd(const float * g, const float * u, float * y, int64_t n, cudaStream_t st) {
    launch<UnaryOp::Swiglu>("swiglu", g, u, nullptr, 0.0f, y, n, st);
}
void swiglu_bwd(const float * g, const float * u, const float * dy, float * out, int which, int64_t n,
                cudaStream_t st) {
    require(which == 0 || which == 1, "swiglu_back", "which must be 0 (gate) or 1 (up), got " + std::to_string(which));
    if (which == 0) launch<UnaryOp::SwigluBackGate>("swiglu_back", g, u, dy, 0.0f, out, n, st);
    else launch<UnaryOp::SwigluBackUp>("swiglu_back", g, u, dy, 0.0f, out, n, st);
}

void swiglu_oai_fwd(const float * g, const float * u, float alpha, float limit, float * y, int64_t n, cudaStream_t st) {
    launch<UnaryOp::SwigluOai>("swiglu_oai", g, u, nullptr, alpha, y, n, st, limit);
}
void swiglu_oai_bwd(const float * g, const float * u, const float * dy, float alpha, float limit, float * out, int which, int64_t n,
                    cudaStream_t st) {
    require(which == 0 || which == 1, "swiglu_oai_back", "which must be 0 (gate) or 1 (up), got " + std::to_string(which));
    if (which == 0) launch<UnaryOp::SwigluOaiBackGate>("swiglu_oai_back", g, u, dy, alpha, out, n, st, limit);
    else launch<UnaryOp::SwigluOaiBackUp>("swiglu_oai_back", g, u, dy, alpha, out, n, st, limit);
}

void geglu_fwd(const float * g, const float * u, float * y, int64_t n, cudaStream_t st) {
    launch<UnaryOp::Geglu>("geglu", g, u, nullptr, 0.0f, y, n, st);
}
void geglu_bwd(const float * g, const float * u, const float * dy, float * out, int which, int64_t n, cudaStream_t st) {
    require(which == 0 || which == 1, "geglu_back", "which must be 0 (gate) or 1 (up), got " + std::to_string(which));
    if (which == 0) launch<UnaryOp::GegluBackGate>("geglu_back", g, u, dy, 0.0f, out, n, st);
    else launch<UnaryOp::GegluBackUp>("geglu_back", g, u, dy, 0.0f, out, n, st);
}

// ---- node entries ----
namespace {
void run_scale(Tensor * n, const NodeRun & r) {
    scale(in<float>(n->src[0]), n->param_f32(0), out<float>(n), n->nelements(), r.stream, n->param_f32(1));
}
void run_silu(Tensor * n, const NodeRun & r) { silu_fwd(in<float>(n->src[0]), out<float>(n), n->nelements(), r.stream); }
void run_sigmoid(Tensor * n, const NodeRun & r) { sigmoid_fwd(in<float>(n->src[0]), out<float>(n), n->nelements(), r.stream); }
void run_softplus(Tensor * n, const NodeRun & r) { softplus_fwd(in<float>(n->src[0]), out<float>(n), n->nelements(), r.stream); }
void run_silu_back(Tensor * n, const NodeRun & r) {
    silu_bwd(in<float>(n->src[0]), in<float>(n->src[1]), out<float>(n), n->nelements(), r.stream);
}
void run_swiglu(Tensor * n, const NodeRun & r) {
    require(n->param_i32(0) != static_cast<int32_t>(GluKind::GeluTanhFp16), "geglu",
            "llama.cpp's fp16 GELU table is a CPU inference form (no CUDA kernel)");
    if (n->param_i32(0) == static_cast<int32_t>(GluKind::SiluOai))
        return swiglu_oai_fwd(in<float>(n->src[0]), in<float>(n->src[1]), n->param_f32(1), n->param_f32(2), out<float>(n), n->nelements(), r.stream);
    if (n->param_i32(0) == static_cast<int32_t>(GluKind::GeluTanh))
        return geglu_fwd(in<float>(n->src[0]), in<float>(n->src[1]), out<float>(n), n->nelements(), r.stream);
    swiglu_fwd(in<float>(n->src[0]), in<float>(n->src[1]), out<float>(n), n->nelements(), r.stream);
}
void run_swiglu_back(Tensor * n, const NodeRun & r) {
    if (n->param_i32(1) == static_cast<int32_t>(GluKind::GeluTanh))
        return geglu_bwd(in<float>(n->src[0]), in<float>(n->src[1]), in<float>(n->src[2]), out<float>(n), n->param_i32(0), n->nelements(),
                         r.stream);
    if (n->param_i32(1) == static_cast<int32_t>(GluKind::SiluOai))
        return swiglu_oai_bwd(in<float>(n->src[0]), in<float>(n->src[1]), in<float>(n->src[2]), n->param_f32(2), n->param_f32(3), out<float>(n),
                              n->param_i32(0), n->nelements(), r.stream);
    swiglu_bwd(in<float>(n->src[0]), in<float>(n->src[1]), in<float>(n->src[2]), out<float>(n), n->param_i32(0),
               n->nelements(), r.stream);
}
const RegisterNodeKernels kRegister{{Op::SCALE, run_scale}, {Op::SILU, run_silu}, {Op::SILU_BACK, run_silu_back},
                                    {Op::SWIGLU, run_swiglu}, {Op::SWIGLU_BACK, run_swiglu_back}, {Op::SIGMOID, run_sigmoid},
                                    {Op::SOFTPLUS, run_softplus}};
} // namespace

} // namespace rp::cuda
