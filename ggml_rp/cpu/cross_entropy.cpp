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
// extra memory: two chunk x T float tiles, in the kernel's scratch (kernel_scratch.h).
#include "ggml_rp/cpu/cross_entropy.h"

#include "ggml_rp/core/quant.h"
#include "ggml_rp/cpu/gemm.h"
#include "ggml_rp/cpu/kernel_scratch.h"
#include "ggml_rp/cpu/vec_math.h"
#include "base/error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace rp::cpu {

namespace {

// Gemma 2's soft-capping of a chunk's logits in place (nothing without a cap).
void cap_logits(float * L, int64_t n, float cap) {
    if (cap <= 0.0f) return;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n > 4096)
#endif
    for (int64_t i = 0; i < n; ++i) L[i] = cap * std::tanh(L[i] / cap);
}

// A chunk x T tile's floats, and the scratch of the tile L, the tile G (with_g: a pass that forms gradients
// through a soft-cap, or pass 2) and the per-token rescale factors.
size_t tile_floats(const LmHeadCEShape & s, int64_t rows) { return size_t(std::min({s.chunk, s.V, rows}) * std::max<int64_t>(s.T, 1)); }
// The GEMMs' packed operands of one chunk's products (the largest: they run one after the other).
size_t chunk_products_bytes(const LmHeadCEShape & s, int64_t rows) {
    const int64_t nv = std::min({s.chunk, s.V, rows});
    return std::max({matmul_fwd_scratch_bytes(s.C, nv, s.T), matmul_bwd_x_scratch_bytes(s.C, nv, s.T),
                     matmul_bwd_w_scratch_bytes(s.C, nv, s.T)});
}
size_t tiles_bytes(const LmHeadCEShape & s, int64_t rows, bool with_g) {
    return (with_g ? 2 : 1) * scratch_round(tile_floats(s, rows) * sizeof(float)) +
           scratch_round(size_t(std::max<int64_t>(s.T, 1)) * sizeof(float));
}

// The tiles of one pass, carved from a kernel's scratch (G null without with_g); rescale starts at 1 for every token.
struct Tiles {
    float * L;
    float * G;
    float * rescale;
    Tiles(Scratch & sc, const LmHeadCEShape & s, int64_t rows, bool with_g)
        : L(sc.take<float>(tile_floats(s, rows))), G(with_g ? sc.take<float>(tile_floats(s, rows)) : nullptr),
          rescale(sc.take<float>(size_t(std::max<int64_t>(s.T, 1)))) {
        std::fill(rescale, rescale + std::max<int64_t>(s.T, 1), 1.0f);
    }
};

// Pass 1, one chunk [v0, v0 + nv) of the vocabulary (wchunk: its rows) folded into the running state st; L the
// chunk tile, G (with st.unit through a soft-cap) and rescale scratch (rescale 1 for every token before the first
// chunk). With st.unit ([C, T]) the same pass also forms each token's unit gradient d(lse - label logit)/dh:
//   unit_dh = (sum_{v != y} E_v d_v W_v - S_other d_y W_y) / S,   E_v = exp(l_v - m), S = sum_v E_v,
//   S_other = sum_{v != y} E_v (= (1 - p_y) S), d = 1 - tanh^2 of the capped logit (1 without a cap).
// Per chunk the tile G = E * d with the label's entry 0 goes through one matmul_bwd_x into st.unit, after each
// token's running sum is brought to the chunk's new maximum (times exp(m_old - m_new), as S is). The label's
// row is added at the end (finish) with S_other, summed in double apart from the label: no 1 - p cancellation;
// a streamed head keeps that row (st.label_rows) while its range is there.
void fold_chunk(const LmHeadCEShape & s, int64_t v0, int64_t nv, const float * h, const char * wchunk, gguf::TensorType wtype,
                size_t w_row_bytes, const int32_t * labels, const LmHeadCEState & st, const Tiles & tiles) {
    const int64_t C = s.C, T = s.T;
    const bool grad = st.unit != nullptr;
    const bool capped = s.softcap > 0.0f;
    float * L = tiles.L;
    float * G = tiles.G;
    float * rescale = tiles.rescale;
    matmul_fwd(C, nv, T, wchunk, wtype, w_row_bytes, h, C, L, nv, false);
    cap_logits(L, nv * T, s.softcap);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && nv * T > 4096)
#endif
    for (int64_t t = 0; t < T; ++t) {
        float * col = L + t * nv;
        const float mx = max_of(col, nv, st.max[t]);
        const int32_t y = labels[t];
        const bool has_label = y >= v0 && y < v0 + nv;
        if (has_label) st.label_logit[t] = col[y - v0];
        if (has_label && st.label_rows) dequantize_row(wtype, wchunk + (y - v0) * w_row_bytes, st.label_rows + t * C, C);
        float * g = grad ? (capped ? G + t * nv : col) : nullptr;
        if (grad && capped) {
            for (int64_t j = 0; j < nv; ++j) {
                const float th = col[j] / s.softcap;
                g[j] = 1.0f - th * th;
            }
            if (has_label) st.label_d[t] = g[y - v0];
        }
        // exp in place (the column is not needed again in this pass), then an ordered sum in double.
        exp_affine(col, col, nv, 1.0f, mx);
        double cs = 0.0;
        for (int64_t j = 0; j < nv; ++j) cs += col[j];
        const float mold = st.max[t];
        st.sum[t] = (mold == mx ? st.sum[t] : st.sum[t] * std::exp(double(mold) - double(mx))) + cs;
        st.max[t] = mx;
        const double r = mold == mx ? 1.0 : std::exp(double(mold) - double(mx));
        st.other[t] = st.other[t] * r + (has_label ? cs - double(col[y - v0]) : cs);
        if (!grad) continue;
        if (y < 0) {  // masked: no gradient
            std::fill(g, g + nv, 0.0f);
            continue;
        }
        rescale[t] = float(r);
        if (capped)
            for (int64_t j = 0; j < nv; ++j) g[j] *= col[j];
        if (has_label) g[y - v0] = 0.0f;
    }
    if (!grad) return;
    if (v0 > 0) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && C * T > 4096)
#endif
        for (int64_t t = 0; t < T; ++t) {
            const float r = rescale[t];
            if (labels[t] < 0 || r == 1.0f) continue;
            float * u = st.unit + t * C;
            for (int64_t c = 0; c < C; ++c) u[c] *= r;
        }
    }
    matmul_bwd_x(C, nv, T, wchunk, wtype, w_row_bytes, capped ? G : L, nv, st.unit, C, v0 > 0);
}

// Pass 1's end: every token's logsumexp and 1 - p_label, its loss (returned: the sum), and with st.unit the unit
// gradients into unit_dh (which may be st.unit), the label rows read from st.label_rows or else from W.
double finish_state(const LmHeadCEShape & s, const int32_t * labels, float loss_scale, const LmHeadCEState & st, float * lse,
                    float * rest, float * token_loss, float * unit_dh, const char * W, gguf::TensorType wtype, size_t w_row_bytes) {
    const int64_t C = s.C, T = s.T;
    double loss = 0.0;
    for (int64_t t = 0; t < T; ++t) {
        const double l = double(st.max[t]) + std::log(st.sum[t]);
        const float r = labels[t] >= 0 ? float(st.other[t] / st.sum[t]) : 0.0f;
        if (lse) lse[t] = float(l);
        if (rest) rest[t] = r;
        const double tl = labels[t] >= 0 ? double(loss_scale) * (l - double(st.label_logit[t])) : 0.0;
        if (token_loss) token_loss[t] = float(tl);
        loss += tl;
    }
    if (!unit_dh) return loss;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && C * T > 4096)
#endif
    for (int64_t t = 0; t < T; ++t) {
        float * u = unit_dh + t * C;
        const float * acc = st.unit + t * C;
        const int32_t y = labels[t];
        if (y < 0) {
            std::fill(u, u + C, 0.0f);
            continue;
        }
        const float inv = float(1.0 / st.sum[t]);
        const float label_coef = float(st.other[t] / st.sum[t]) * st.label_d[t];
        std::vector<float> row;
        const float * wy = st.label_rows ? st.label_rows + t * C : nullptr;
        if (!wy) {
            row.resize(static_cast<size_t>(C));
            dequantize_row(wtype, W + y * w_row_bytes, row.data(), C);
            wy = row.data();
        }
        for (int64_t c = 0; c < C; ++c) u[c] = acc[c] * inv - label_coef * wy[c];
    }
    return loss;
}

void start_state(const LmHeadCEState & st, int64_t T) {
    std::fill(st.max, st.max + T, -std::numeric_limits<float>::infinity());
    std::fill(st.sum, st.sum + T, 0.0);
    std::fill(st.other, st.other + T, 0.0);
    std::fill(st.label_logit, st.label_logit + T, 0.0f);
    std::fill(st.label_d, st.label_d + T, 1.0f);
}

// The per-token running state of pass 1 (sum, other: double; max, label logit, label d: float).
size_t state_bytes(int64_t T) {
    const size_t n = size_t(std::max<int64_t>(T, 1));
    return 2 * scratch_round(n * sizeof(double)) + 3 * scratch_round(n * sizeof(float));
}

// lm_head_ce's own arrays (its GEMMs take theirs after them): lse, rest, pass 1's state and, for a pass over the
// vocabulary, the tiles.
size_t own_scratch_bytes(const LmHeadCEShape & s, bool tiles, bool with_g) {
    return 2 * scratch_round(size_t(std::max<int64_t>(s.T, 1)) * sizeof(float)) + state_bytes(s.T) + (tiles ? tiles_bytes(s, s.V, with_g) : 0);
}

// Pass 1 over the whole vocabulary: every token's logsumexp into lse (float, as pass 2 reads it) and 1 - p_label
// into rest; returns the loss. With unit_dh ([C, T]) also the unit gradients (fold_chunk). The running state
// comes from sc.
double logsumexp_pass(const LmHeadCEShape & s, const float * h, const void * W, gguf::TensorType wtype,
                      size_t w_row_bytes, const int32_t * labels, float loss_scale, Scratch & sc, const Tiles & tiles,
                      float * lse, float * rest, float * token_loss, float * unit_dh) {
    const int64_t V = s.V, T = s.T;
    const int64_t chunk = std::min(s.chunk, V);
    const char * wbytes = static_cast<const char *>(W);
    const size_t n = size_t(std::max<int64_t>(T, 1));
    double * sum = sc.take<double>(n);
    double * other = sc.take<double>(n);
    float * m = sc.take<float>(n);
    float * label_logit = sc.take<float>(n);
    float * label_d = sc.take<float>(n);
    const LmHeadCEState st{sum, other, m, label_logit, label_d, unit_dh, nullptr};
    start_state(st, T);
    for (int64_t v0 = 0; v0 < V; v0 += chunk)
        fold_chunk(s, v0, std::min(chunk, V - v0), h, wbytes + v0 * w_row_bytes, wtype, w_row_bytes, labels, st, tiles);
    return finish_state(s, labels, loss_scale, st, lse, rest, token_loss, unit_dh, wbytes, wtype, w_row_bytes);
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

    if (!aux.lse_in != !aux.rest_in) throw Error("lm_head_ce: lse_in and rest_in come together (both a forward call's)");
    // The tiles (column t of a chunk's at L + t*nv) only for a pass over the vocabulary: not when only the
    // forward's unit gradients are scaled.
    const bool pass1 = !aux.lse_in, pass2 = dW || (dh && !aux.unit_dh_in);
    const bool with_g = pass2 || (pass1 && aux.unit_dh_out && s.softcap > 0.0f);
    Scratch scratch(own_scratch_bytes(s, pass1 || pass2, with_g));
    const size_t n = size_t(std::max<int64_t>(T, 1));
    float * lse = scratch.take<float>(n);
    float * rest = scratch.take<float>(n);
    std::optional<Tiles> tiles;
    if (pass1 || pass2) tiles.emplace(scratch, s, V, with_g);
    double loss = 0.0;
    if (aux.lse_in) {
        std::copy(aux.lse_in, aux.lse_in + T, lse);
        std::copy(aux.rest_in, aux.rest_in + T, rest);
    } else {
        loss = logsumexp_pass(s, h, W, wtype, w_row_bytes, labels, loss_scale, scratch, *tiles, lse, rest, aux.token_loss, aux.unit_dh_out);
    }
    if (aux.lse_out) std::copy(lse, lse + T, aux.lse_out);
    if (aux.rest_out) std::copy(rest, rest + T, aux.rest_out);
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
    float * L = tiles->L;
    float * G = tiles->G;
    for (int64_t v0 = 0; v0 < V; v0 += chunk) {
        const int64_t nv = std::min(chunk, V - v0);
        const char * wchunk = wbytes + v0 * w_row_bytes;
        matmul_fwd(C, nv, T, wchunk, wtype, w_row_bytes, h, C, L, nv, false);
        cap_logits(L, nv * T, s.softcap);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (T > 1 && nv * T > 4096)
#endif
        for (int64_t t = 0; t < T; ++t) {
            const float * col = L + t * nv;
            float * g = G + t * nv;
            const int32_t y = labels[t];
            if (y < 0) {
                std::fill(g, g + nv, 0.0f);
                continue;
            }
            const float l = lse[t];
            exp_affine(col, g, nv, 1.0f, l);
            // p - 1 at the label: minus the other tokens' probabilities, summed apart (pass 1), not 1 - a rounded
            // p: a token the model is sure of keeps its small gradient's relative accuracy
            if (y >= v0 && y < v0 + nv) g[y - v0] = -rest[t];
            const float sc = aux.token_scale ? loss_scale * aux.token_scale[t] : loss_scale;
            for (int64_t j = 0; j < nv; ++j) g[j] *= sc;
            if (s.softcap > 0.0f)  // through the cap: times 1 - tanh^2 of the capped logit
                for (int64_t j = 0; j < nv; ++j) {
                    const float th = col[j] / s.softcap;
                    g[j] *= 1.0f - th * th;
                }
        }
        if (dh) matmul_bwd_x(C, nv, T, wchunk, wtype, w_row_bytes, G, nv, dh, C, v0 > 0);
        if (dW) matmul_bwd_w(C, nv, T, h, C, G, nv, dW + v0 * dw_row, dw_row, true);
    }
    return loss;
}

size_t lm_head_ce_scratch_bytes(const LmHeadCEShape & s, bool tiles, bool with_g) {
    return own_scratch_bytes(s, tiles, with_g) + (tiles ? chunk_products_bytes(s, s.V) : 0);
}

size_t lm_head_ce_range_scratch_bytes(const LmHeadCEShape & s, int64_t nv, bool forms_grad) {
    return tiles_bytes(s, nv, forms_grad && s.softcap > 0.0f) + chunk_products_bytes(s, nv);
}

void lm_head_ce_range(const LmHeadCEShape & s, int64_t v0, int64_t nv, const float * h, const void * W_range, gguf::TensorType wtype,
                      size_t w_row_bytes, const int32_t * labels, const LmHeadCEState & st) {
    if (s.C < 1 || s.V < 1 || s.T < 0 || s.chunk < 1 || v0 < 0 || nv < 1 || v0 + nv > s.V || v0 % s.chunk != 0)
        throw Error("lm_head_ce_range: bad range [" + std::to_string(v0) + ", " + std::to_string(v0 + nv) + ") of V=" +
                    std::to_string(s.V) + " (chunk " + std::to_string(s.chunk) + ", C=" + std::to_string(s.C) + ", T=" + std::to_string(s.T) + ")");
    if (!st.unit != !st.label_rows) throw Error("lm_head_ce_range: the unit gradients and the label rows come together");
    const int64_t chunk = std::min(s.chunk, s.V);
    if (v0 == 0) start_state(st, s.T);
    const bool with_g = st.unit && s.softcap > 0.0f;
    Scratch sc(tiles_bytes(s, nv, with_g));
    const Tiles tiles(sc, s, nv, with_g);
    const char * wbytes = static_cast<const char *>(W_range);
    for (int64_t j = 0; j < nv; j += chunk)
        fold_chunk(s, v0 + j, std::min(chunk, nv - j), h, wbytes + j * w_row_bytes, wtype, w_row_bytes, labels, st, tiles);
}

double lm_head_ce_finish(const LmHeadCEShape & s, const int32_t * labels, float loss_scale, const LmHeadCEState & st,
                         const LmHeadCEAux & aux) {
    if (aux.unit_dh_out && (!st.unit || !st.label_rows))
        throw Error("lm_head_ce_finish: unit gradients asked of a state that did not form them");
    return finish_state(s, labels, loss_scale, st, aux.lse_out, aux.rest_out, aux.token_loss, aux.unit_dh_out, nullptr,
                        gguf::TensorType::F32, 0);
}

} // namespace rp::cpu
