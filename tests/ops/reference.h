// Naive double-precision reference forwards of every op, written from the formulas (independent of the
// kernels): loops over elements in the plainest order, everything in double.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ref {

// A dense double tensor in ggml order (i0 fastest).
struct DT {
    std::array<int64_t, 4> ne{1, 1, 1, 1};
    std::vector<double> v;

    DT() = default;
    explicit DT(std::array<int64_t, 4> n) : ne(n), v(static_cast<size_t>(n[0] * n[1] * n[2] * n[3]), 0.0) {}
    DT(std::array<int64_t, 4> n, std::vector<double> vals) : ne(n), v(std::move(vals)) {}
    int64_t size() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    size_t idx(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
        return static_cast<size_t>(i0 + ne[0] * (i1 + ne[1] * (i2 + ne[2] * i3)));
    }
    double & operator()(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) { return v[idx(i0, i1, i2, i3)]; }
    double operator()(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const { return v[idx(i0, i1, i2, i3)]; }
};

// Axis i of x becomes axis a[i] of the result (ggml's permute convention).
DT permute(const DT & x, int a0, int a1, int a2, int a3);

DT add(const DT & a, const DT & b);  // b broadcast over a
DT mul(const DT & a, const DT & b);
DT scale(const DT & x, double s);
DT silu(const DT & x);
DT swiglu(const DT & g, const DT & u);
// gpt-oss's clamped SwiGLU: min(g, limit) sigmoid(alpha min(g, limit)) (clamp(u, -limit, limit) + 1).
DT swiglu_oai(const DT & g, const DT & u, double alpha, double limit);
// Gemma's GeGLU: gelu(g) u with GELU's tanh approximation 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
DT geglu(const DT & g, const DT & u);
DT softmax(const DT & x);  // rows over ne[0]
DT sum(const DT & x);
DT mean(const DT & x);
DT repeat(const DT & x, std::array<int64_t, 4> ne);
DT sum_to(const DT & x, std::array<int64_t, 4> ne);
DT rms_norm(const DT & x, const DT * w, double eps);
// mode 0 normal (pairs 2i, 2i+1), 2 neox (pairs i, i + n_rot/2)
DT rope(const DT & x, const std::vector<int32_t> & pos, int n_rot, int mode, double base, double fscale);
// ggml's rope_ext with YaRN (ext_factor > 0): the angle mixed between interpolation and extrapolation by a
// ramp over the correction dimensions, cos and sin scaled by attn_factor (1 + 0.1 ln(1 / fscale)).
// ff (optional, n_rot / 2 values): each pair's angle divided by ff[i] before the mix (ggml's freq factors).
DT rope_yarn(const DT & x, const std::vector<int32_t> & pos, int n_rot, int mode, double base, double fscale, double ext_factor,
             double attn_factor, double beta_fast, double beta_slow, int n_ctx_orig, const std::vector<double> * ff = nullptr);
DT get_rows(const DT & table, const std::vector<int32_t> & ids, int64_t T, int64_t B);
DT mul_mat(const DT & W, const DT & X);
// key_start (optional, [Tq * B]): query t of sequence b sees keys from key_start[t + b*Tq] (clamped into
// [0, t + Tk - Tq]) to t + Tk - Tq.
// sinks: [Hq] logits in every row's denominator (no value); window > 0: keys j > t + (Tk - Tq) - window only.
DT attention(const DT & q, const DT & k, const DT & v, double scale, const std::vector<int32_t> & key_start = {},
             const DT * sinks = nullptr, int64_t window = 0, double softcap = 0);
// Fused LM head + CE: sum_t loss_scale * (logsumexp(logits_t) - logits_t[label]) over labels != -1.
DT lm_head_ce(const DT & h, const DT & W, const std::vector<int32_t> & labels, double loss_scale, double softcap = 0);

DT sigmoid(const DT & x);
DT softplus(const DT & x);  // log(1 + exp(x))
DT l2_norm(const DT & x, double eps);  // rows over ne[0]: x / max(|x|, eps)
// Causal depthwise convolution: x [C, T, B], w [K, C] -> y[c, t, b] = sum_j w[j, c] x[c, t + j - (K-1), b], x before
// the sequence from prefix [C, K-1, B] (nullptr: 0) and before the token's example (seg_start [T*B], optional) 0.
DT ssm_conv(const DT & x, const DT & w, const DT * prefix = nullptr, const std::vector<int32_t> & seg_start = {});
// The gated delta rule as a matrix recurrence per sequence and value head h (key head h % Hk), S [Dk, Dv]:
// S = exp(g_t) S; S += k_t (beta_t (v_t - S^T k_t))^T; o_t = scale S^T q_t. S starts at state0 (nullptr: 0) and
// at 0 on each example's first token (seg_start). out_state (optional) gets the final S [Dk, Dv, Hv, B].
DT delta_net(const DT & q, const DT & k, const DT & v, const DT & g, const DT & beta, double scale, const DT * state0 = nullptr,
             const std::vector<int32_t> & seg_start = {}, DT * out_state = nullptr);

} // namespace ref
