// Qwen3.5's linear-attention half of a layer: the Gated DeltaNet block (llama.cpp's build_layer_attn_linear, from
// the formulas of Yang et al. 2024 and the tensors of llama.cpp's qwen35 files).
#include "models/arch/layer.h"

#include "ggml_rp/ops/ops.h"
#include "models/arch/layer_util.h"

#include <cmath>
#include <string>

namespace rp {

using layer_detail::lname;
using layer_detail::rows_of;

Tensor * delta_net_block(Context & ctx, const HParams & hp, const LayerWeights & w, int il, Tensor * x, const TokenPositions & pos,
                         const LoraSet * lora, LayerState * state) {
    const int64_t T = x->ne[1], B = x->ne[2];
    const int64_t Dk = hp.ssm_d_state, Hk = hp.ssm_n_group, Hv = hp.ssm_dt_rank, Dv = hp.ssm_d_inner / Hv;
    const int64_t key_dim = Dk * Hk, value_dim = Dv * Hv;
    if (x->ne[0] != hp.n_embd || x->ne[3] != 1)
        throw Error(lname(il, "input") + ": hidden states " + describe(x) + " must be [n_embd=" + std::to_string(hp.n_embd) + ", T, B]");
    if (state && pos.key_start) throw Error(lname(il, "state") + ": a recurrent state serves one unpacked sequence (no key_start)");

    // Projections of the normed input: the convolution's channels (q, k, v), the delta rule's beta (a sigmoid) and its
    // decay g = A softplus(alpha + dt_bias) (A = -exp(A_log) < 0, as the file holds it); the output gate z below.
    Tensor * n1 = set_name(rms_norm(ctx, x, w.attn_norm, hp.rms_eps), lname(il, "attn_in"));
    Tensor * qkv = build_linear(ctx, w.wqkv, n1, lora);
    Tensor * beta = sigmoid(ctx, build_linear(ctx, w.ssm_beta, n1, lora));
    Tensor * g = mul(ctx, softplus(ctx, add(ctx, build_linear(ctx, w.ssm_alpha, n1, lora), w.ssm_dt)), w.ssm_a);

    // Short causal convolution over time (per channel), then SiLU; q and k L2-normalised per head.
    Tensor * conv = ssm_conv(ctx, qkv, w.ssm_conv1d, state ? state->conv : nullptr, pos.key_start);
    if (state) state->conv_out = ssm_conv_state(ctx, conv);
    conv = silu(ctx, conv);
    Tensor * q = l2_norm(ctx, reshape(ctx, rows_of(ctx, conv, 0, key_dim), Dk, Hk, T, B), hp.rms_eps);
    Tensor * k = l2_norm(ctx, reshape(ctx, rows_of(ctx, conv, key_dim, key_dim), Dk, Hk, T, B), hp.rms_eps);
    Tensor * v = reshape(ctx, rows_of(ctx, conv, 2 * key_dim, value_dim), Dv, Hv, T, B);

    // The gated delta rule, queries scaled by 1/sqrt(Dk).
    Tensor * o = delta_net(ctx, q, k, v, g, beta, 1.0f / std::sqrt(static_cast<float>(Dk)), state ? state->ssm : nullptr, pos.key_start);
    if (state) state->ssm_out = delta_net_state(ctx, o);
    set_name(o, lname(il, "delta_out"));

    // The output gate z, projected here rather than with the others: the backward runs in the reverse order of creation
    // (ops/autodiff.h), so z's projection takes dz as soon as the gated norm gives it, not after the delta rule's
    // backward (dz and z would be held through it).
    Tensor * z = build_linear(ctx, w.ssm_gate, n1, lora);

    // The gated RMSNorm per value head, times silu(z) (one op: a backward keeps o and z, not the normed rows and silu(z));
    // the output projection and the residual.
    Tensor * gated = rms_norm_gated(ctx, o, w.ssm_norm, reshape(ctx, z, Dv, Hv, T, B), hp.rms_eps);
    Tensor * proj = build_linear(ctx, w.ssm_out, reshape(ctx, gated, value_dim, T, B), lora);
    return set_name(add(ctx, x, proj), lname(il, "attn_out"));
}

} // namespace rp
