// A naive double-precision reference of the Llama / Qwen2 / Qwen3 / Qwen3-MoE / gpt-oss / Gemma 3 / Mistral 3 / Phi-3 / Qwen3.5
// (dense and MoE) forward pass and the
// mean cross-entropy
// loss, written from the formulas (formats.md §3.4) with plain loops: the independent reference the
// finetune gradients are checked against by central finite differences. Nothing here uses the engine's ops.
#pragma once

#include "models/arch/hparams.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace ft_ref {

struct W {  // a weight in ggml order: ne0 = input dim (contiguous), ne1 = output dim, ne2 experts
    int64_t ne0 = 0, ne1 = 1, ne2 = 1;
    std::vector<double> v;
};

struct RefModel {
    rp::HParams hp;
    bool neox = false;
    std::map<std::string, W> w;  // by GGUF name, effective weights (base + LoRA deltas already added)
    std::string rope_factors;    // the RoPE frequency factors' tensor the run uses (rope_freqs, phi3's short or long); "" none
    // Mixtures of experts: the experts each (sequence, layer, token) selected, recorded by every forward; with
    // replay_routing a forward reuses them, so finite differences see the function with the routing held fixed, the one
    // the analytic gradient differentiates (a step that flips a near-tie would otherwise jump the loss). `seq` names
    // the sequence the next forward runs.
    mutable std::map<std::tuple<int, int, int64_t>, std::vector<int64_t>> routing;
    mutable bool replay_routing = false;
    mutable int seq = 0;

    const W * find(const std::string & n) const {
        auto it = w.find(n);
        return it == w.end() ? nullptr : &it->second;
    }
    const W & at(const std::string & n) const { return w.at(n); }
};

// y[o] = sum_i W[o][i] x[i] (+ b[o]); of expert e's matrix for a stack of experts.
inline void linear(const W & m, const double * x, double * y, const W * b = nullptr, int64_t e = 0) {
    for (int64_t o = 0; o < m.ne1; ++o) {
        double s = b ? b->v[static_cast<size_t>(o)] : 0.0;
        const double * row = &m.v[static_cast<size_t>((e * m.ne1 + o) * m.ne0)];
        for (int64_t i = 0; i < m.ne0; ++i) s += row[i] * x[i];
        y[o] = s;
    }
}

inline void rms_norm(const double * x, double * y, int64_t n, const W & g, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * g.v[static_cast<size_t>(i)];
}

// In place on one head of D values at position pos, with layer il's base and scale (no YaRN), each pair's angle
// divided by its frequency factor (ff, optional), cos and sin times rope.scaling.attn_factor; a query head also
// times the attention temperature log(floor(pos / floor) + 1) * scale + 1 (mistral3).
inline void rope(double * x, int64_t pos, const rp::HParams & hp, bool neox, int il, bool query = false, const W * ff = nullptr) {
    const double temp = (query && hp.attn_temp_scale != 0.0f
                             ? std::log(std::floor(static_cast<double>(pos) / hp.attn_temp_floor) + 1.0) * hp.attn_temp_scale + 1.0
                             : 1.0) *
                        (hp.rope_ext_factor == 0.0f ? hp.rope_attn_factor : 1.0);
    const int64_t n_rot = hp.n_rot;
    const rp::RopeParams rp_l = hp.rope(static_cast<uint32_t>(il));
    for (int64_t i = 0; i < n_rot / 2; ++i) {
        const double theta = static_cast<double>(pos) * std::pow(static_cast<double>(rp_l.freq_base),
                                                                 -2.0 * static_cast<double>(i) / static_cast<double>(n_rot)) *
                             static_cast<double>(rp_l.freq_scale) / (ff ? ff->v[static_cast<size_t>(i)] : 1.0);
        const int64_t a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
        const double x0 = x[a], x1 = x[b], c = std::cos(theta) * temp, s = std::sin(theta) * temp;
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

inline std::string blk(int il, const char * n) { return "blk." + std::to_string(il) + "." + n; }

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// qwen35's Gated DeltaNet mixer of layer il over the T positions of x [T][n_embd] (the layer's input): its output
// before the residual, [T][n_embd]. The convolution's channels q | k | v and the gate z projected from the normed
// input, a causal depthwise convolution (kernel K, zeros before the sequence) and SiLU, q and k L2-normalised per
// head, beta = sigmoid, the decay g = A softplus(alpha + dt_bias); per value head h (key head h % Hk) the state
// S [Dk][Dv]: S = exp(g) S, S += k (beta (v - S^T k))^T, o = S^T q / sqrt(Dk); then RMSNorm(o) * w * silu(z) per
// head and the output projection.
inline std::vector<double> delta_net_mixer(const RefModel & m, int il, const std::vector<double> & x, int64_t T) {
    const rp::HParams & hp = m.hp;
    const int64_t C = hp.n_embd, Dk = hp.ssm_d_state, Hk = hp.ssm_n_group, Hv = hp.ssm_dt_rank, Dv = hp.ssm_head_v(), K = hp.ssm_d_conv;
    const int64_t KD = Dk * Hk, VD = Dv * Hv, CD = 2 * KD + VD;
    const double eps = hp.rms_eps;
    auto at = [](std::vector<double> & v, int64_t i) -> double & { return v[static_cast<size_t>(i)]; };
    std::vector<double> n1(static_cast<size_t>(C)), qkv(static_cast<size_t>(T * CD)), z(static_cast<size_t>(T * VD)),
        beta(static_cast<size_t>(T * Hv)), g(static_cast<size_t>(T * Hv)), tmp(static_cast<size_t>(Hv));
    const W & A = m.at(blk(il, "ssm_a"));
    const W & dt = m.at(blk(il, "ssm_dt.bias"));
    for (int64_t t = 0; t < T; ++t) {
        rms_norm(&x[static_cast<size_t>(t * C)], n1.data(), C, m.at(blk(il, "attn_norm.weight")), eps);
        linear(m.at(blk(il, "attn_qkv.weight")), n1.data(), &at(qkv, t * CD));
        linear(m.at(blk(il, "attn_gate.weight")), n1.data(), &at(z, t * VD));
        linear(m.at(blk(il, "ssm_beta.weight")), n1.data(), tmp.data());
        for (int64_t h = 0; h < Hv; ++h) at(beta, t * Hv + h) = sigmoid(at(tmp, h));
        linear(m.at(blk(il, "ssm_alpha.weight")), n1.data(), tmp.data());
        for (int64_t h = 0; h < Hv; ++h) at(g, t * Hv + h) = A.v[static_cast<size_t>(h)] * std::log1p(std::exp(at(tmp, h) + dt.v[static_cast<size_t>(h)]));
    }
    const W & cw = m.at(blk(il, "ssm_conv1d.weight"));  // [K, CD]: tap j of channel c at j + K c
    std::vector<double> conv(static_cast<size_t>(T * CD));
    for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < CD; ++c) {
            double s = 0;
            for (int64_t j = 0; j < K; ++j)
                if (t + j - (K - 1) >= 0) s += cw.v[static_cast<size_t>(j + K * c)] * at(qkv, (t + j - (K - 1)) * CD + c);
            at(conv, t * CD + c) = s * sigmoid(s);
        }
    for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < 2 * Hk; ++h) {  // q heads, then k heads
            double * r = &at(conv, t * CD + h * Dk);
            double ss = 0;
            for (int64_t i = 0; i < Dk; ++i) ss += r[i] * r[i];
            const double inv = 1.0 / std::max(std::sqrt(ss), eps);
            for (int64_t i = 0; i < Dk; ++i) r[i] *= inv;
        }
    std::vector<double> o(static_cast<size_t>(T * VD)), S(static_cast<size_t>(Dk * Dv));
    for (int64_t h = 0; h < Hv; ++h) {
        const int64_t hk = h % Hk;
        std::fill(S.begin(), S.end(), 0.0);
        for (int64_t t = 0; t < T; ++t) {
            const double * q = &at(conv, t * CD + hk * Dk);
            const double * k = &at(conv, t * CD + KD + hk * Dk);
            const double * v = &at(conv, t * CD + 2 * KD + h * Dv);
            const double a = std::exp(at(g, t * Hv + h)), b = at(beta, t * Hv + h);
            for (double & e : S) e *= a;
            for (int64_t j = 0; j < Dv; ++j) {
                double u = 0;
                for (int64_t i = 0; i < Dk; ++i) u += S[static_cast<size_t>(i * Dv + j)] * k[i];
                const double d = b * (v[j] - u);
                for (int64_t i = 0; i < Dk; ++i) S[static_cast<size_t>(i * Dv + j)] += k[i] * d;
            }
            for (int64_t j = 0; j < Dv; ++j) {
                double s = 0;
                for (int64_t i = 0; i < Dk; ++i) s += S[static_cast<size_t>(i * Dv + j)] * q[i];
                at(o, t * VD + h * Dv + j) = s / std::sqrt(static_cast<double>(Dk));
            }
        }
    }
    std::vector<double> out(static_cast<size_t>(T * C)), gated(static_cast<size_t>(VD));
    const W & nw = m.at(blk(il, "ssm_norm.weight"));
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < Hv; ++h) {
            rms_norm(&at(o, t * VD + h * Dv), &gated[static_cast<size_t>(h * Dv)], Dv, nw, eps);
            for (int64_t j = 0; j < Dv; ++j) {
                const double zz = at(z, t * VD + h * Dv + j);
                gated[static_cast<size_t>(h * Dv + j)] *= zz * sigmoid(zz);
            }
        }
        linear(m.at(blk(il, "ssm_out.weight")), gated.data(), &at(out, t * C));
    }
    return out;
}

// One decoder layer over T positions: x [T][n_embd] in place. aux (optional, MoE): adds the layer's
// load-balancing sum T * sum_e f_e P_e over these T tokens (ops/moe_math.h; f_e the share of the (token,
// slot) pairs routed to e, P_e the mean router probability).
inline void layer(const RefModel & m, int il, std::vector<double> & x, int64_t T, double * aux = nullptr) {
    const rp::HParams & hp = m.hp;
    const int64_t C = hp.n_embd, D = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv, F = hp.n_ff;
    const double eps = hp.rms_eps;
    const W * ff = m.rope_factors.empty() ? nullptr : &m.at(m.rope_factors);
    const bool recurrent = hp.is_recurrent(static_cast<uint32_t>(il));
    const std::vector<double> mixer = recurrent ? delta_net_mixer(m, il, x, T) : std::vector<double>{};
    std::vector<double> n1(static_cast<size_t>(C)), q(static_cast<size_t>(T * Hq * D)), k(static_cast<size_t>(T * Hkv * D)),
        v(static_cast<size_t>(T * Hkv * D)), gate(hp.arch->attn_output_gate ? static_cast<size_t>(T * Hq * D) : 0);
    for (int64_t t = 0; t < T && !recurrent; ++t) {
        rms_norm(&x[static_cast<size_t>(t * C)], n1.data(), C, m.at(blk(il, "attn_norm.weight")), eps);
        if (const W * qkv = m.find(blk(il, "attn_qkv.weight"))) {  // phi3: q, k, v rows of one matrix
            std::vector<double> y(static_cast<size_t>(qkv->ne1));
            linear(*qkv, n1.data(), y.data());
            std::copy(y.begin(), y.begin() + Hq * D, &q[static_cast<size_t>(t * Hq * D)]);
            std::copy(y.begin() + Hq * D, y.begin() + (Hq + Hkv) * D, &k[static_cast<size_t>(t * Hkv * D)]);
            std::copy(y.begin() + (Hq + Hkv) * D, y.end(), &v[static_cast<size_t>(t * Hkv * D)]);
        } else if (hp.arch->attn_output_gate) {  // qwen35: per head, the query's rows then its output gate's
            std::vector<double> y(static_cast<size_t>(2 * Hq * D));
            linear(m.at(blk(il, "attn_q.weight")), n1.data(), y.data());
            for (int64_t h = 0; h < Hq; ++h)
                for (int64_t i = 0; i < D; ++i) {
                    q[static_cast<size_t>((t * Hq + h) * D + i)] = y[static_cast<size_t>(h * 2 * D + i)];
                    gate[static_cast<size_t>((t * Hq + h) * D + i)] = y[static_cast<size_t>(h * 2 * D + D + i)];
                }
            linear(m.at(blk(il, "attn_k.weight")), n1.data(), &k[static_cast<size_t>(t * Hkv * D)]);
            linear(m.at(blk(il, "attn_v.weight")), n1.data(), &v[static_cast<size_t>(t * Hkv * D)]);
        } else {
            linear(m.at(blk(il, "attn_q.weight")), n1.data(), &q[static_cast<size_t>(t * Hq * D)], m.find(blk(il, "attn_q.bias")));
            linear(m.at(blk(il, "attn_k.weight")), n1.data(), &k[static_cast<size_t>(t * Hkv * D)], m.find(blk(il, "attn_k.bias")));
            linear(m.at(blk(il, "attn_v.weight")), n1.data(), &v[static_cast<size_t>(t * Hkv * D)], m.find(blk(il, "attn_v.bias")));
        }
        for (int64_t h = 0; h < Hq; ++h) {
            double * qh = &q[static_cast<size_t>((t * Hq + h) * D)];
            if (const W * g = m.find(blk(il, "attn_q_norm.weight"))) {
                std::vector<double> tmp(qh, qh + D);
                rms_norm(tmp.data(), qh, D, *g, eps);
            }
            rope(qh, t, hp, m.neox, il, true, ff);
        }
        for (int64_t h = 0; h < Hkv; ++h) {
            double * kh = &k[static_cast<size_t>((t * Hkv + h) * D)];
            if (const W * g = m.find(blk(il, "attn_k_norm.weight"))) {
                std::vector<double> tmp(kh, kh + D);
                rms_norm(tmp.data(), kh, D, *g, eps);
            }
            rope(kh, t, hp, m.neox, il, false, ff);
        }
    }
    // Causal GQA attention: query head h reads kv head h / (Hq / Hkv); gpt-oss: keys within the layer's window,
    // and each head's sink logit in the denominator.
    std::vector<double> o(static_cast<size_t>(T * Hq * D), 0.0), p(static_cast<size_t>(T));
    const double sc = hp.attn_scale;  // 1/sqrt(D), gemma3's 27B aside
    const W * sinks = m.find(blk(il, "attn_sinks.weight"));
    for (int64_t t = 0; t < T && !recurrent; ++t)
        for (int64_t h = 0; h < Hq; ++h) {
            const int64_t hk = h / (Hq / Hkv);
            const int64_t first = hp.is_swa(static_cast<uint32_t>(il)) ? std::max<int64_t>(0, t - hp.n_swa + 1) : 0;
            const double * qh = &q[static_cast<size_t>((t * Hq + h) * D)];
            double mx = sinks ? sinks->v[static_cast<size_t>(h)] : -1e300;
            for (int64_t s = first; s <= t; ++s) {
                const double * kh = &k[static_cast<size_t>((s * Hkv + hk) * D)];
                double d = 0;
                for (int64_t i = 0; i < D; ++i) d += qh[i] * kh[i];
                p[static_cast<size_t>(s)] = hp.attn_softcap > 0 ? hp.attn_softcap * std::tanh(d * sc / hp.attn_softcap) : d * sc;  // gemma2's cap
                mx = std::max(mx, p[static_cast<size_t>(s)]);
            }
            double z = sinks ? std::exp(sinks->v[static_cast<size_t>(h)] - mx) : 0.0;
            for (int64_t s = first; s <= t; ++s) z += (p[static_cast<size_t>(s)] = std::exp(p[static_cast<size_t>(s)] - mx));
            double * oh = &o[static_cast<size_t>((t * Hq + h) * D)];
            for (int64_t s = first; s <= t; ++s) {
                const double * vh = &v[static_cast<size_t>((s * Hkv + hk) * D)];
                for (int64_t i = 0; i < D; ++i) oh[i] += p[static_cast<size_t>(s)] / z * vh[i];
            }
            if (!gate.empty())  // qwen35: times sigmoid(gate)
                for (int64_t i = 0; i < D; ++i) oh[i] *= sigmoid(gate[static_cast<size_t>((t * Hq + h) * D + i)]);
        }
    std::vector<double> a(static_cast<size_t>(C)), n2(static_cast<size_t>(C)), g(static_cast<size_t>(F)), u(static_cast<size_t>(F));
    std::vector<double> p_sum, routed;  // MoE: sum_t p[t, e] and the pairs routed to e
    for (int64_t t = 0; t < T; ++t) {
        double * xt = &x[static_cast<size_t>(t * C)];
        if (recurrent) std::copy(mixer.begin() + t * C, mixer.begin() + (t + 1) * C, a.begin());
        else linear(m.at(blk(il, "attn_output.weight")), &o[static_cast<size_t>(t * Hq * D)], a.data(), m.find(blk(il, "attn_output.bias")));
        if (hp.arch->post_norms) {  // gemma3: the attention's output normalised before the residual
            const std::vector<double> tmp = a;
            rms_norm(tmp.data(), a.data(), C, m.at(blk(il, "post_attention_norm.weight")), eps);
        }
        for (int64_t i = 0; i < C; ++i) xt[i] += a[static_cast<size_t>(i)];
        const W * ffn_norm = m.find(blk(il, "ffn_norm.weight"));
        rms_norm(xt, n2.data(), C, ffn_norm ? *ffn_norm : m.at(blk(il, "post_attention_norm.weight")), eps);
        if (const W * router = m.find(blk(il, "ffn_gate_inp.weight"))) {  // qwen3moe, gpt-oss
            // softmax over the experts, the k most probable (ties: the lower index), renormalised, each a SwiGLU
            // (gpt-oss: biased router and experts, the clamped SwiGLU)
            const int64_t E = router->ne1, n_used = hp.n_expert_used, FX = hp.n_ff_exp;
            std::vector<double> prob(static_cast<size_t>(E)), ge(static_cast<size_t>(FX)), ue(static_cast<size_t>(FX)),
                de(static_cast<size_t>(C));
            linear(*router, n2.data(), prob.data(), m.find(blk(il, "ffn_gate_inp.bias")));
            const W * bg = m.find(blk(il, "ffn_gate_exps.bias"));
            const W * bu = m.find(blk(il, "ffn_up_exps.bias"));
            const W * bd = m.find(blk(il, "ffn_down_exps.bias"));
            auto add_bias = [](std::vector<double> & y, const W * b, int64_t e) {  // b [n, E]: column e
                if (b)
                    for (size_t i = 0; i < y.size(); ++i) y[i] += b->v[static_cast<size_t>(e) * y.size() + i];
            };
            double mx = -1e300, z = 0;
            for (double l : prob) mx = std::max(mx, l);
            for (double & l : prob) z += (l = std::exp(l - mx));
            for (double & l : prob) l /= z;
            std::vector<int64_t> sel;
            const auto key = std::make_tuple(m.seq, il, t);
            if (m.replay_routing && m.routing.count(key)) {
                sel = m.routing.at(key);
            } else {
                for (int64_t s = 0; s < n_used; ++s) {
                    int64_t best = -1;
                    for (int64_t e = 0; e < E; ++e)
                        if (std::find(sel.begin(), sel.end(), e) == sel.end() && (best < 0 || prob[static_cast<size_t>(e)] > prob[static_cast<size_t>(best)]))
                            best = e;
                    sel.push_back(best);
                }
                m.routing[key] = sel;
            }
            if (p_sum.empty()) p_sum.assign(static_cast<size_t>(E), 0.0), routed.assign(static_cast<size_t>(E), 0.0);
            for (int64_t e = 0; e < E; ++e) p_sum[static_cast<size_t>(e)] += prob[static_cast<size_t>(e)];
            for (int64_t e : sel) routed[static_cast<size_t>(e)] += 1.0;
            double sum = 0;
            for (int64_t e : sel) sum += prob[static_cast<size_t>(e)];
            const double div = hp.expert_weights_norm ? std::max(sum, 6.103515625e-5) : 1.0;
            const double wscale = hp.expert_weights_scale != 0 ? hp.expert_weights_scale : 1.0;
            for (int64_t e : sel) {
                linear(m.at(blk(il, "ffn_gate_exps.weight")), n2.data(), ge.data(), nullptr, e);
                linear(m.at(blk(il, "ffn_up_exps.weight")), n2.data(), ue.data(), nullptr, e);
                add_bias(ge, bg, e);
                add_bias(ue, bu, e);
                for (int64_t i = 0; i < FX; ++i) {
                    double & gi = ge[static_cast<size_t>(i)];
                    const double ui = ue[static_cast<size_t>(i)];
                    if (hp.arch->swiglu_oai) {  // x = min(g, 7), y = clamp(u, -7, 7): x sigmoid(1.702 x) (y + 1)
                        const double xg = std::min(gi, 7.0), yu = std::clamp(ui, -7.0, 7.0);
                        gi = xg / (1.0 + std::exp(-1.702 * xg)) * (yu + 1.0);
                    } else {
                        gi = gi / (1.0 + std::exp(-gi)) * ui;
                    }
                }
                linear(m.at(blk(il, "ffn_down_exps.weight")), ge.data(), de.data(), nullptr, e);
                add_bias(de, bd, e);
                const double we = prob[static_cast<size_t>(e)] / div * wscale;
                for (int64_t i = 0; i < C; ++i) xt[i] += we * de[static_cast<size_t>(i)];
            }
            if (const W * sg = m.find(blk(il, "ffn_gate_shexp.weight"))) {  // qwen35moe: the shared expert, gated per token
                const int64_t FS = sg->ne1;
                std::vector<double> gs(static_cast<size_t>(FS)), us(static_cast<size_t>(FS)), ds(static_cast<size_t>(C));
                linear(*sg, n2.data(), gs.data());
                linear(m.at(blk(il, "ffn_up_shexp.weight")), n2.data(), us.data());
                for (int64_t i = 0; i < FS; ++i) gs[static_cast<size_t>(i)] = gs[static_cast<size_t>(i)] * sigmoid(gs[static_cast<size_t>(i)]) * us[static_cast<size_t>(i)];
                linear(m.at(blk(il, "ffn_down_shexp.weight")), gs.data(), ds.data());
                const W & sgate = m.at(blk(il, "ffn_gate_inp_shexp.weight"));
                double logit = 0;
                for (int64_t i = 0; i < C; ++i) logit += sgate.v[static_cast<size_t>(i)] * n2[static_cast<size_t>(i)];
                for (int64_t i = 0; i < C; ++i) xt[i] += sigmoid(logit) * ds[static_cast<size_t>(i)];
            }
            continue;
        }
        if (m.find(blk(il, "ffn_gate.weight"))) {
            linear(m.at(blk(il, "ffn_gate.weight")), n2.data(), g.data());
            linear(m.at(blk(il, "ffn_up.weight")), n2.data(), u.data());
        } else {  // phi3: the gate's rows, then the up rows, of one matrix
            std::vector<double> y(static_cast<size_t>(2 * F));
            linear(m.at(blk(il, "ffn_up.weight")), n2.data(), y.data());
            std::copy(y.begin(), y.begin() + F, g.begin());
            std::copy(y.begin() + F, y.end(), u.begin());
        }
        for (int64_t i = 0; i < F; ++i) {
            const double gi = g[static_cast<size_t>(i)];
            const double act = hp.arch->glu == rp::GluKind::GeluTanh  // gemma3: GELU, tanh approximation
                                   ? 0.5 * gi * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (gi + 0.044715 * gi * gi * gi)))
                                   : gi / (1.0 + std::exp(-gi));
            g[static_cast<size_t>(i)] = act * u[static_cast<size_t>(i)];
        }
        linear(m.at(blk(il, "ffn_down.weight")), g.data(), a.data());
        if (hp.arch->post_norms) {  // gemma3: the feed-forward's output normalised before the residual
            const std::vector<double> tmp = a;
            rms_norm(tmp.data(), a.data(), C, m.at(blk(il, "post_ffw_norm.weight")), eps);
        }
        for (int64_t i = 0; i < C; ++i) xt[i] += a[static_cast<size_t>(i)];
    }
    if (aux && !p_sum.empty()) {  // T * sum_e (routed_e / (T k)) * (p_sum_e / T)
        const double Tk = static_cast<double>(T * hp.n_expert_used);
        for (size_t e = 0; e < p_sum.size(); ++e) *aux += routed[e] / Tk * p_sum[e];
    }
}

// The layer inputs of a forward pass, so a perturbation of layer l can restart there: xs[l] = input of
// layer l ([T][n_embd]), xs[n_layer] = input of the final norm.
inline std::vector<std::vector<double>> forward_states(const RefModel & m, const std::vector<int32_t> & ids, int first = 0,
                                                       std::vector<std::vector<double>> xs = {}, double * aux = nullptr) {
    const int64_t C = m.hp.n_embd, T = static_cast<int64_t>(ids.size()), L = m.hp.n_layer;
    xs.resize(static_cast<size_t>(L + 1));
    if (first == 0) {
        const W & e = m.at("token_embd.weight");
        xs[0].assign(static_cast<size_t>(T * C), 0.0);
        for (int64_t t = 0; t < T; ++t)
            for (int64_t i = 0; i < C; ++i)
                xs[0][static_cast<size_t>(t * C + i)] = e.v[static_cast<size_t>(ids[static_cast<size_t>(t)] * C + i)] * m.hp.embd_scale;
    }
    for (int64_t l = first; l < L; ++l) {
        xs[static_cast<size_t>(l + 1)] = xs[static_cast<size_t>(l)];
        layer(m, static_cast<int>(l), xs[static_cast<size_t>(l + 1)], T, aux);
    }
    return xs;
}

// sum over unmasked t of (logsumexp(logits_t) - logits_t[label_t]).
inline double ce_sum(const RefModel & m, const std::vector<double> & x, const std::vector<int32_t> & labels) {
    const int64_t C = m.hp.n_embd, T = static_cast<int64_t>(labels.size());
    const W & head = m.find("output.weight") ? m.at("output.weight") : m.at("token_embd.weight");
    std::vector<double> h(static_cast<size_t>(C)), logits(static_cast<size_t>(head.ne1));
    double sum = 0;
    for (int64_t t = 0; t < T; ++t) {
        if (labels[static_cast<size_t>(t)] < 0) continue;
        rms_norm(&x[static_cast<size_t>(t * C)], h.data(), C, m.at("output_norm.weight"), m.hp.rms_eps);
        linear(head, h.data(), logits.data());
        if (m.hp.final_softcap > 0)  // gemma2
            for (double & l : logits) l = m.hp.final_softcap * std::tanh(l / m.hp.final_softcap);
        double mx = -1e300;
        for (double l : logits) mx = std::max(mx, l);
        double z = 0;
        for (double l : logits) z += std::exp(l - mx);
        sum += mx + std::log(z) - logits[static_cast<size_t>(labels[static_cast<size_t>(t)])];
    }
    return sum;
}

} // namespace ft_ref
