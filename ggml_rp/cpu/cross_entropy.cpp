// Fused LM head + cross-entropy, chunked over the vocabulary.
//
// Pass 1, chunk by chunk: logits L = W_chunk^T h ([chunk x T], via matmul_fwd; Gemma 2: soft-capped, cap tanh(L /
// cap), and G below times 1 - tanh^2), per token an online max m, sum s of exp(L - m) and the same sum without the
// label (1 - p_label = that / s), and the logit of the label when it falls in the chunk. lse = m + log(s).
// Pass 1 is skipped when the caller has what a forward call saved (lse_in, rest_in: LM_HEAD_CE_BACK reads
// LM_HEAD_CE's). With unit_dh_out, pass 1 also forms the unit gradients online (logsumexp_pass), and a backward
// given them (unit_dh_in) scales them instead of running pass 2 for dh.
// Pass 2 (only when a gradient is asked for), chunk by chunk again: recompute L, G = (softmax - onehot) * loss_scale
// (times token_scale[t] when given; at the label -(1 - p_label) from pass 1, not 1 - a rounded p) for unmasked
// tokens (0 for ignored ones), then dh (+)= W_chunk G (matmul_bwd_x) and dW_chunk += h G^T (matmul_bwd_w). Chunks
// run in order and every GEMM is deterministic, so the result is bit-identical for any number of threads. Peak
// extra memory: two chunk x T float tiles.
#include "ggml_rp/cpu/cross_entropy.h"

#include "ggml_rp/core/quant.h"
#include "ggml_rp/cpu/gemm.h"
#include "ggml_rp/cpu/vec_math.h"
#include "base/error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace rp::cpu {

namespace {

// Gemma 2's soft-capping of a chunk's logits in place (nothing without a cap).
void cap_logits(std::vector<float> & L, int64_t n, float cap) {
    if (cap <= 0.0f) return;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n > 4096)
#endif
    for (int64_t i = 0; i < n; ++i) L[size_t(i)] = cap * std::tanh(L[size_t(i)] / cap);
}

// Pass 1: every token's logsumexp into lse (float, as pass 2 reads it); returns the loss. L: the chunk tile.
// With unit_dh ([C, T]) the same pass also forms each token's unit gradient d(lse - label logit)/dh:
//   unit_dh = (sum_{v != y} E_v d_v W_v - S_other d_y W_y) / S,   E_v = exp(l_v - m), S = sum_v E_v,
//   S_other = sum_{v != y} E_v (= (1 - p_y) S), d = 1 - tanh^2 of the capped logit (1 without a cap).
// Per chunk the tile G = E * d with the label's entry 0 goes through one matmul_bwd_x into unit_dh, after each
// token's running sum is brought to the chunk's new maximum (times exp(m_old - m_new), as S is). The label's
// row is added at the end with S_other, summed in double apart from the label: no 1 - p cancellation.
double logsumexp_pass(const LmHeadCEShape & s, const float * h, const void * W, gguf::TensorType wtype,
                      size_t w_row_bytes, const int32_t * labels, float loss_scale, std::vector<float> & L,
                      std::vector<float> & lse, std::vector<float> & rest, float * token_loss, float * unit_dh) {
    const int64_t C = s.C, V = s.V, T = s.T;
    const int64_t chunk = std::min(s.chunk, V);
    const char * wbytes = static_cast<const char *>(W);
    const bool grad = unit_dh != nullptr;
    const bool capped = s.softcap > 0.0f;
    std::vector<float> m(size_t(T), -std::numeric_limits<float>::infinity());
    std::vector<double> sum(size_t(T), 0.0);
    std::vector<float> label_logit(size_t(T), 0.0f);
    // S_other (every token: 1 - p_label = S_other / S, what the gradient's label entry is); the gradient's state:
    // each token's rescale of this chunk, the label logit's d, and with a cap the tile G apart from L (d is read
    // from the capped logits before they become E; without a cap G is L).
    std::vector<double> other(size_t(T), 0.0);
    std::vector<float> rescale(grad ? size_t(T) : 0, 1.0f);
    std::vector<float> label_d(grad ? size_t(T) : 0, 1.0f);
    std::vector<float> G(grad && capped ? L.size() : 0);
    for (int64_t v0 = 0; v0 < V; v0 += chunk) {
        const int64_t nv = std::min(chunk, V - v0);
        const char * wchunk = wbytes + v0 * w_row_bytes;
        matmul_fwd(C, nv, T, wchunk, wtype, w_row_bytes, h, C, L.data(), nv, false);
        cap_logits(L, nv * T, s.softcap);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && nv * T > 4096)
#endif
        for (int64_t t = 0; t < T; ++t) {
            float * col = L.data() + t * nv;
            const float mx = max_of(col, nv, m[size_t(t)]);
            const int32_t y = labels[t];
            const bool has_label = y >= v0 && y < v0 + nv;
            if (has_label) label_logit[size_t(t)] = col[y - v0];
            float * g = grad ? (capped ? G.data() + t * nv : col) : nullptr;
            if (grad && capped) {
                for (int64_t j = 0; j < nv; ++j) {
                    const float th = col[j] / s.softcap;
                    g[j] = 1.0f - th * th;
                }
                if (has_label) label_d[size_t(t)] = g[y - v0];
            }
            // exp in place (the column is not needed again in this pass), then an ordered sum in double.
            exp_affine(col, col, nv, 1.0f, mx);
            double cs = 0.0;
            for (int64_t j = 0; j < nv; ++j) cs += col[j];
            const float mold = m[size_t(t)];
            sum[size_t(t)] = (mold == mx ? sum[size_t(t)] : sum[size_t(t)] * std::exp(double(mold) - double(mx))) + cs;
            m[size_t(t)] = mx;
            const double r = mold == mx ? 1.0 : std::exp(double(mold) - double(mx));
            other[size_t(t)] = other[size_t(t)] * r + (has_label ? cs - double(col[y - v0]) : cs);
            if (!grad) continue;
            if (y < 0) {  // masked: no gradient
                std::fill(g, g + nv, 0.0f);
                continue;
            }
            rescale[size_t(t)] = float(r);
            if (capped)
                for (int64_t j = 0; j < nv; ++j) g[j] *= col[j];
            if (has_label) g[y - v0] = 0.0f;
        }
        if (!grad) continue;
        if (v0 > 0) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && C * T > 4096)
#endif
            for (int64_t t = 0; t < T; ++t) {
                const float r = rescale[size_t(t)];
                if (labels[t] < 0 || r == 1.0f) continue;
                float * u = unit_dh + t * C;
                for (int64_t c = 0; c < C; ++c) u[c] *= r;
            }
        }
        matmul_bwd_x(C, nv, T, wchunk, wtype, w_row_bytes, capped ? G.data() : L.data(), nv, unit_dh, C, v0 > 0);
    }
    double loss = 0.0;
    for (int64_t t = 0; t < T; ++t) {
        const double l = double(m[size_t(t)]) + std::log(sum[size_t(t)]);
        lse[size_t(t)] = float(l);
        const double tl = labels[t] >= 0 ? double(loss_scale) * (l - double(label_logit[size_t(t)])) : 0.0;
        if (token_loss) token_loss[t] = float(tl);
        rest[size_t(t)] = labels[t] >= 0 ? float(other[size_t(t)] / sum[size_t(t)]) : 0.0f;
        loss += tl;
    }
    if (!grad) return loss;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && C * T > 4096)
#endif
    for (int64_t t = 0; t < T; ++t) {
        float * u = unit_dh + t * C;
        const int32_t y = labels[t];
        if (y < 0) {
            std::fill(u, u + C, 0.0f);
            continue;
        }
        const float inv = float(1.0 / sum[size_t(t)]);
        const float label_coef = rest[size_t(t)] * label_d[size_t(t)];
        std::vector<float> wy(static_cast<size_t>(C));
        dequantize_row(wtype, wbytes + y * w_row_bytes, wy.data(), C);
        for (int64_t c = 0; c < C; ++c) u[c] = u[c] * inv - label_coef * wy[size_t(c)];
    }
    return loss;
}

} // namespace

double lm_head_ce(const LmHeadCEShape & s, const float * h, const void * W, gguf::TensorType wtype, size_t w_row_bytes,
                  const int32_t * labels, float loss_scale, float * dh, float * dW, int64_t dw_row, const LmHeadCEAux & aux) {
    if (s.C < 1 || s.V < 1 || s.T < 0 || s.chunk < 1)
        throw Error("lm_head_ce: bad shape C=" + std::to_string(s.C) + " V=" + std::to_string(s.V) + " T=" +
                    std::to_string(s.T) + " chunk=" + std::to_string(s.chunk));
    if (dW && dw_row < s.C)
        throw Error("lm_head_ce: dW row stride " + std::to_string(dw_row) + " is smaller than C=" +
                    std::to_string(s.C));
    for (int64_t t = 0; t < s.T; ++t)
        if (labels[t] < -1 || labels[t] >= s.V)
            throw Error("lm_head_ce: label " + std::to_string(labels[t]) + " of token " + std::to_string(t) +
                        " is outside [0, " + std::to_string(s.V) + ") and not -1 (ignored)");
    const int64_t C = s.C, V = s.V, T = s.T;
    const int64_t chunk = std::min(s.chunk, V);
    const char * wbytes = static_cast<const char *>(W);
    std::vector<float> L(size_t(chunk * std::max<int64_t>(T, 1)));   // column t at L + t*nv

    if (!aux.lse_in != !aux.rest_in) throw Error("lm_head_ce: lse_in and rest_in come together (both a forward call's)");
    std::vector<float> lse(static_cast<size_t>(T)), rest(static_cast<size_t>(T));
    double loss = 0.0;
    if (aux.lse_in) {
        std::copy(aux.lse_in, aux.lse_in + T, lse.begin());
        std::copy(aux.rest_in, aux.rest_in + T, rest.begin());
    } else {
        loss = logsumexp_pass(s, h, W, wtype, w_row_bytes, labels, loss_scale, L, lse, rest, aux.token_loss, aux.unit_dh_out);
    }
    if (aux.lse_out) std::copy(lse.begin(), lse.end(), aux.lse_out);
    if (aux.rest_out) std::copy(rest.begin(), rest.end(), aux.rest_out);
    if (dh && aux.unit_dh_in) {  // the forward formed dh: scale it
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && C * T > 4096)
#endif
        for (int64_t t = 0; t < T; ++t) {
            const float sc = aux.token_scale ? loss_scale * aux.token_scale[t] : loss_scale;
            const float * u = aux.unit_dh_in + t * C;
            float * d = dh + t * C;
            for (int64_t c = 0; c < C; ++c) d[c] = u[c] * sc;
        }
        dh = nullptr;  // pass 2, if any, is for dW only
    }
    if (!dh && !dW) return loss;

    // ---- pass 2: gradients ------------------------------------------------------------------------------------
    std::vector<float> G(L.size());
    for (int64_t v0 = 0; v0 < V; v0 += chunk) {
        const int64_t nv = std::min(chunk, V - v0);
        const char * wchunk = wbytes + v0 * w_row_bytes;
        matmul_fwd(C, nv, T, wchunk, wtype, w_row_bytes, h, C, L.data(), nv, false);
        cap_logits(L, nv * T, s.softcap);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && nv * T > 4096)
#endif
        for (int64_t t = 0; t < T; ++t) {
            const float * col = L.data() + t * nv;
            float * g = G.data() + t * nv;
            const int32_t y = labels[t];
            if (y < 0) {
                std::fill(g, g + nv, 0.0f);
                continue;
            }
            const float l = lse[size_t(t)];
            exp_affine(col, g, nv, 1.0f, l);
            // p - 1 at the label: minus the other tokens' probabilities, summed apart (pass 1), not 1 - a rounded
            // p: a token the model is sure of keeps its small gradient's relative accuracy
            if (y >= v0 && y < v0 + nv) g[y - v0] = -rest[size_t(t)];
            const float sc = aux.token_scale ? loss_scale * aux.token_scale[t] : loss_scale;
            for (int64_t j = 0; j < nv; ++j) g[j] *= sc;
            if (s.softcap > 0.0f)  // through the cap: times 1 - tanh^2 of the capped logit
                for (int64_t j = 0; j < nv; ++j) {
                    const float th = col[j] / s.softcap;
                    g[j] *= 1.0f - th * th;
                }
        }
        if (dh) matmul_bwd_x(C, nv, T, wchunk, wtype, w_row_bytes, G.data(), nv, dh, C, v0 > 0);
        if (dW) matmul_bwd_w(C, nv, T, h, C, G.data(), nv, dW + v0 * dw_row, dw_row, true);
    }
    return loss;
}

} // namespace rp::cpu
