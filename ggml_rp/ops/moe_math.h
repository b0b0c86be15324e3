// The per-token router math of the mixture-of-experts ops (ops/moe.h), shared by the CPU kernels
// (cpu/moe.cpp) and the CUDA kernels (cuda/moe.cu) so both select the same experts and compute the same bits.
//
// For one token with router logits l[0..E):
//   p = softmax(l)                                  (max-subtracted, expf, summed in expert order, divided)
//   selected = the k experts with the largest p, in descending order of p; equal p: the lower expert first
//   (llama.cpp sorts the probabilities with std::sort, whose insertion sort keeps equal ones in index order
//   for up to 16 experts)
//   w_s = p[selected_s] / max(sum_s p[selected_s], kMoeMinWeightSum) when normalized (qwen3moe's
//   norm_topk_prob), else p[selected_s]; then times `scale` (llama.cpp's expert_weights_scale; 0 means 1).
// The selection has no gradient; the weights' gradient flows to the logits through the softmax.
//
// Load balancing (Switch Transformer's auxiliary loss, optional): over the T tokens of one graph,
//   L_aux = aux · T · sum_e f_e P_e,   f_e = (pairs routed to e) / (T k) (no gradient),   P_e = mean_t p[t, e]
// so dL_aux / dp[t, e] = aux · f_e: the backward adds it to every token's dp before the softmax's Jacobian.
// aux = coefficient · n_expert · loss_scale, the scale of the main loss, so L_aux sums per token like it.
#pragma once

#include "ggml_rp/core/host_device.h"

#include <cmath>
#include <cstdint>

namespace rp {

// llama.cpp clamps the sum of the selected probabilities to the smallest normal f16 before dividing.
constexpr float kMoeMinWeightSum = 6.103515625e-5f;

struct MoeParams {
    int32_t k = 1;           // experts per token
    bool normalize = true;   // divide by the selected probabilities' sum
    float scale = 0.0f;      // 0 or 1: none
    float aux = 0.0f;        // load-balancing gradient scale (0: none); see above
};

// p[e] = softmax(l)[e] over E logits.
RP_HD inline void moe_softmax(const float * l, int64_t E, float * p) {
    float mx = l[0];
    for (int64_t e = 1; e < E; ++e) mx = l[e] > mx ? l[e] : mx;
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
        p[e] = expf(l[e] - mx);
        sum += p[e];
    }
    const float inv = 1.0f / sum;
    for (int64_t e = 0; e < E; ++e) p[e] *= inv;
}

// The k largest of p (E entries), descending, ties to the lower index: k passes of an arg-max that skips the
// experts already taken. O(k E), fine for the few experts a token uses. NaN probabilities are never
// "larger", so a NaN row selects the lowest unused indices (the loss goes non-finite anyway).
RP_HD inline void moe_select(const float * p, int64_t E, int32_t k, int32_t * ids) {
    for (int32_t s = 0; s < k; ++s) {
        int32_t best = -1;
        for (int64_t e = 0; e < E; ++e) {
            bool taken = false;
            for (int32_t j = 0; j < s; ++j) taken = taken || ids[j] == e;
            if (taken) continue;
            if (best < 0 || p[e] > p[best]) best = static_cast<int32_t>(e);
        }
        ids[s] = best;
    }
}

// The selected experts' weights from p.
RP_HD inline void moe_weights_of(const float * p, const int32_t * ids, const MoeParams & mp, float * w) {
    float sum = 0.0f;
    for (int32_t s = 0; s < mp.k; ++s) sum += p[ids[s]];
    const float div = mp.normalize ? (sum > kMoeMinWeightSum ? sum : kMoeMinWeightSum) : 1.0f;
    const float sc = mp.scale != 0.0f ? mp.scale : 1.0f;
    for (int32_t s = 0; s < mp.k; ++s) w[s] = p[ids[s]] / div * sc;
}

// dl[e] (E entries, overwritten) from dw (k entries), given p = softmax(l) and the selection. `dp` is E floats
// of scratch. With normalization and an unclamped sum S: dp_s = (g_s - sum_j g_j w'_j) / S, w' = p / S,
// g = dw * scale; then dl = p * (dp - <p, dp>). share (E floats, used when mp.aux != 0): f_e of the graph.
RP_HD inline void moe_weights_grad(const float * p, const int32_t * ids, const float * dw, const MoeParams & mp, int64_t E,
                                   float * dp, float * dl, const float * share = nullptr) {
    const float sc = mp.scale != 0.0f ? mp.scale : 1.0f;
    for (int64_t e = 0; e < E; ++e) dp[e] = mp.aux != 0.0f && share ? mp.aux * share[e] : 0.0f;
    if (mp.normalize) {
        float sum = 0.0f;
        for (int32_t s = 0; s < mp.k; ++s) sum += p[ids[s]];
        const bool clamped = !(sum > kMoeMinWeightSum);
        const float div = clamped ? kMoeMinWeightSum : sum;
        float gw = 0.0f;  // sum_j g_j p_j / div
        for (int32_t s = 0; s < mp.k; ++s) gw += dw[s] * sc * (p[ids[s]] / div);
        for (int32_t s = 0; s < mp.k; ++s) dp[ids[s]] += (dw[s] * sc - (clamped ? 0.0f : gw)) / div;
    } else {
        for (int32_t s = 0; s < mp.k; ++s) dp[ids[s]] += dw[s] * sc;
    }
    float dot = 0.0f;
    for (int64_t e = 0; e < E; ++e) dot += p[e] * dp[e];
    for (int64_t e = 0; e < E; ++e) dl[e] = p[e] * (dp[e] - dot);
}

} // namespace rp
