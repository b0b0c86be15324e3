// Launch configuration of the CUDA kernels as pure host functions: grid and block sizes, tile shapes and
// shared-memory bytes of the attention kernels, workspace bytes of the GEMM-based ops. No CUDA header here,
// so the CPU tests (tests/cuda) check every rule on a machine without a GPU, and the .cu files use the very
// same functions to launch.
#pragma once

#include "gguf/types.h"

#include <cstddef>
#include <cstdint>

namespace rp::cuda {

inline constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// ---- element-wise kernels: grid-stride loops --------------------------------------------------------------

inline constexpr int kElemThreads = 256;
// Grid x is capped so that the count fits every GPU's limits comfortably; the grid-stride loop does the rest.
inline constexpr int64_t kMaxGrid = 65535;

// Blocks of kElemThreads for n elements (0 for n <= 0: launch nothing).
inline constexpr int64_t elementwise_grid(int64_t n) {
    if (n <= 0) return 0;
    const int64_t g = ceil_div(n, kElemThreads);
    return g < kMaxGrid ? g : kMaxGrid;
}

// ---- row kernels (rms_norm, softmax, get_rows, the cross-entropy chunk): one block per row ---------------

// Threads for a row of ne0 elements: the smallest power of two >= ne0, clamped to [32, 1024]. A multiple of
// the warp size, as the block reductions need; never more threads than useful.
inline constexpr int kRowMaxThreads = 1024;  // the __launch_bounds__ of the row kernels
inline constexpr int row_threads(int64_t ne0) {
    int t = 32;
    while (t < kRowMaxThreads && t < ne0) t *= 2;
    return t;
}

// ---- attention: tiles of BQ queries x BK keys, head dim padded to DP (a multiple of 16, the MMA shape) ------

inline constexpr int kAttnThreads = 128;   // 4 warps
inline constexpr int64_t kAttnMaxHeadDim = 256;

inline constexpr int64_t attn_padded_head_dim(int64_t D) { return round_up(D, 16); }

// Which kernel an attention tile shape serves.
enum class AttnKernel { Forward, BackwardKV, BackwardQ };

struct AttnTiles {
    int64_t bq = 0;     // queries per tile (0: no tile shape fits the shared-memory limit)
    int64_t bk = 0;     // keys per tile
    int64_t dp = 0;     // padded head dim
    int64_t kp = 0;     // row pitch of the key and value tiles (attn_kv_pitch)
    size_t smem = 0;    // dynamic shared memory bytes of the kernel
};

// Row pitch, in elements, of the key and value tiles in shared memory. The f32 kernels read K and V column by
// column (S = Q K^T, dP = dO V^T: lane j of a warp reads row j), so with a pitch of dp (a multiple of 16) a
// warp's 32 reads would hit one bank; dp + 1 spreads them over all 32. The wmma path loads 16 x 16 fragments
// and needs a pitch that is a multiple of 8 elements: it keeps dp.
inline constexpr int64_t attn_kv_pitch(int64_t dp, size_t elem) { return elem == 4 ? dp + 1 : dp; }

// Sections of shared memory are 128-byte aligned (MMA loads need 32 bytes).
inline constexpr size_t smem_section(size_t bytes) { return (bytes + 127) / 128 * 128; }

// Shared memory of one kernel for a tile shape; elem = bytes of the input element type (4, or 2 for f16/bf16).
// The layouts listed here are the ones attention.cu carves, in the same order.
inline constexpr size_t attn_smem_bytes(AttnKernel k, int64_t bq, int64_t bk, int64_t dp, size_t elem) {
    const size_t q = smem_section(size_t(bq * dp) * elem);    // a [bq x dp] tile of inputs
    const size_t kv = smem_section(size_t(bk * attn_kv_pitch(dp, elem)) * elem);   // a [bk x dp] key / value tile
    const size_t sf = smem_section(size_t(bq * bk) * 4);      // scores / probabilities in f32
    // Probabilities in the input type (the MMA operand); with f32 inputs they overwrite the f32 scores in place.
    const size_t sh = elem == 4 ? 0 : smem_section(size_t(bq * bk) * elem);
    const size_t row = smem_section(size_t(bq) * 4);          // one float per query row
    switch (k) {
    case AttnKernel::Forward:     // Q, K, V, S, P, O(f32), m, l, alpha
        return q + 2 * kv + sf + sh + smem_section(size_t(bq * dp) * 4) + 3 * row;
    case AttnKernel::BackwardKV:  // K, V, Q, dO, S, dP, P, dS, dK(f32), dV(f32), lse, Di
        return 2 * kv + 2 * q + 2 * sf + 2 * sh + 2 * smem_section(size_t(bk * dp) * 4) + 2 * row;
    case AttnKernel::BackwardQ:   // Q, dO, K, V, S, dP, dS, dQ(f32), lse, Di
        return 2 * q + 2 * kv + 2 * sf + sh + smem_section(size_t(bq * dp) * 4) + 2 * row;
    }
    return 0;
}

// The largest tile shape (in the fixed order of preference below) whose dynamic shared memory, next to the
// kernel's static shared memory (static_smem, cudaFuncAttributes::sharedSizeBytes), fits smem_limit bytes (the
// device's opt-in maximum per block). D must be in [1, 256]; returns bq = 0 when nothing fits or D is out of
// range (the caller throws, naming the shape).
inline constexpr AttnTiles attention_tiles(AttnKernel k, int64_t D, size_t elem, size_t smem_limit, size_t static_smem = 0) {
    AttnTiles t;
    if (D < 1 || D > kAttnMaxHeadDim || (elem != 2 && elem != 4)) return t;
    constexpr int64_t cand[][2] = {{64, 64}, {64, 32}, {32, 32}, {32, 16}, {16, 16}};
    const int64_t dp = attn_padded_head_dim(D);
    for (const auto & c : cand) {
        const size_t s = attn_smem_bytes(k, c[0], c[1], dp, elem);
        if (s + static_smem <= smem_limit) {
            t.bq = c[0];
            t.bk = c[1];
            t.dp = dp;
            t.kp = attn_kv_pitch(dp, elem);
            t.smem = s;
            return t;
        }
    }
    return t;
}

// ---- GEMM-based ops: workspace bytes (the caller owns the scratch buffer) ---------------------------------

// Scratch of rp::cuda::matmul_fwd / matmul_bwd_x for a weight of type wtype with K inputs, N outputs and T
// tokens: nothing for f32; the activations converted to the weight's half type (the larger of the two sides,
// K*T or N*T) for f16/bf16, after a 256-byte header for f16 (the power-of-two scale of half_scale.h and the
// GEMM's alpha / beta, read by cuBLAS from device memory); the dequantized f32 weight (K*N floats) for the
// block types. 256-byte aligned.
inline constexpr size_t kHalfScaleHeader = 256;
// A quantized weight is dequantized tile by tile (whole rows of K elements, at most this many f32 bytes a
// tile, at least one row) and each tile multiplied at once: the scratch is one tile, not the matrix.
inline constexpr size_t kDequantTileBytes = size_t(16) << 20;
inline constexpr int64_t dequant_tile_rows(int64_t K, int64_t N) {
    int64_t r = int64_t(kDequantTileBytes / size_t(K > 0 ? K * 4 : 4));
    if (r < 1) r = 1;
    return r < N ? r : N;
}

inline constexpr size_t matmul_workspace_bytes(int64_t K, int64_t N, int64_t T, gguf::TensorType wtype) {
    using TT = gguf::TensorType;
    size_t b = 0;
    if (wtype == TT::F32) b = 0;
    else if (wtype == TT::F16) b = kHalfScaleHeader + size_t((K > N ? K : N) * T) * 2;
    else if (wtype == TT::BF16) b = size_t((K > N ? K : N) * T) * 2;
    else b = size_t(K * dequant_tile_rows(K, N)) * 4;
    return (b + 255) / 256 * 256;
}

// Vocabulary rows per chunk of the fused LM head + cross-entropy so that the chunk's f32 logits
// (chunk x T floats) stay within budget_bytes: at least 1, at most V, a multiple of 256 when that is possible
// (cuBLAS tiles), never 0.
inline constexpr int64_t ce_chunk_rows(int64_t V, int64_t T, size_t budget_bytes) {
    if (V <= 0) return 1;
    const int64_t per_row = (T > 0 ? T : 1) * 4;
    int64_t c = int64_t(budget_bytes) / per_row;
    if (c >= 256) c = c / 256 * 256;
    if (c < 1) c = 1;
    return c < V ? c : V;
}

// Scratch of rp::cuda::lm_head_ce: the chunk's logits/gradient tile (at least C x T: the label rows the
// gradient formed in the forward gathers at its end), the GEMM scratch of one chunk, and the per-token running
// max, label logit, logsumexp (2), 1 - p_label, rescale, label derivative, gathered ids, sum, loss and the sum
// without the label (double). Every section 256-byte aligned.
inline constexpr size_t lm_head_ce_workspace_bytes(int64_t C, int64_t V, int64_t T, int64_t chunk,
                                                   gguf::TensorType wtype) {
    const int64_t nv = chunk < V ? chunk : V;
    auto al = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t tile = al(size_t((nv > C ? nv : C) * T) * 4);
    const size_t gemm = matmul_workspace_bytes(C, nv, T, wtype);
    const size_t tok = al(size_t(T) * 4) * 8 + al(size_t(T) * 8) * 3;
    return tile + gemm + tok;
}

// Scratch of rp::cuda::lm_head_ce_range (a streamed head's range of nv rows): the tile as lm_head_ce's (at least
// C x T: the label rows of the range are gathered through it), the GEMM scratch of one chunk, each token's rescale
// and local label id.
inline constexpr size_t lm_head_ce_range_workspace_bytes(int64_t C, int64_t nv, int64_t T, int64_t chunk, gguf::TensorType wtype) {
    const int64_t n = chunk < nv ? chunk : nv;
    auto al = [](size_t b) { return (b + 255) / 256 * 256; };
    return al(size_t((n > C ? n : C) * T) * 4) + matmul_workspace_bytes(C, n, T, wtype) + al(size_t(T) * 4) * 2;
}
// Scratch of rp::cuda::lm_head_ce_finish: each token's logsumexp, 1 - p_label, 1 / sum and label coefficient, and
// its loss (double).
inline constexpr size_t lm_head_ce_finish_workspace_bytes(int64_t T) {
    auto al = [](size_t b) { return (b + 255) / 256 * 256; };
    return al(size_t(T) * 4) * 4 + al(size_t(T) * 8);
}

// Scratch of the grouped expert matmuls (cuda/moe.cu) for W [K, N, E], n = k * T (token, slot) pairs:
//   the routing (per-expert starts, the pairs in expert-then-token order), two gathered f32 panels of
//   max(K, N) x n, one per-pair panel of K x n (MUL_MAT_ID_BACK_X with shared slots), the per-expert GEMM's own
//   scratch (at most n columns).
struct MoeScratch {
    size_t starts, pairs, panel_in, panel_out, per_pair, gemm;
    size_t total() const { return starts + pairs + panel_in + panel_out + per_pair + gemm; }
};
inline constexpr MoeScratch moe_matmul_scratch(int64_t K, int64_t N, int64_t E, int64_t n, gguf::TensorType wtype) {
    auto al = [](size_t b) { return (b + 255) / 256 * 256; };
    const int64_t wide = K > N ? K : N;
    return {al(size_t(E + 1) * 4), al(size_t(n > 0 ? n : 1) * 4), al(size_t(wide * n) * 4), al(size_t(wide * n) * 4),
            al(size_t(K * n) * 4), matmul_workspace_bytes(K, N, n, wtype)};
}
// The router kernels' scratch: the probabilities (and for the backward their gradient), E floats per token;
// the backward also the experts' shares of the pairs (the load-balancing gradient), E floats.
inline constexpr size_t moe_router_scratch(int64_t E, int64_t T, bool backward) {
    return (size_t(E * T) * 4 * (backward ? 2 : 1) + (backward ? size_t(E) * 4 : 0) + 255) / 256 * 256;
}

// Scratch of rp::cuda::get_rows_back: the next-token-with-the-same-id link and the owner flag, per token.
inline constexpr size_t get_rows_back_workspace_bytes(int64_t n_ids) {
    return size_t(round_up(n_ids > 0 ? n_ids : 1, 64)) * 4 * 2;
}

} // namespace rp::cuda

namespace rp::cuda {

// Grid of an attention kernel: x = query tiles (Forward, BackwardQ) or key tiles (BackwardKV), y = heads (query
// heads, or kv heads for BackwardKV), z = sequences. Each block owns its output rows (no atomics).
struct Grid3 {
    int64_t x = 0, y = 0, z = 0;
};
inline constexpr Grid3 attention_grid(AttnKernel k, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t B,
                                      const AttnTiles & t) {
    Grid3 g;
    if (t.bq <= 0) return g;
    g.x = k == AttnKernel::BackwardKV ? ceil_div(Tk, t.bk) : ceil_div(Tq, t.bq);
    g.y = k == AttnKernel::BackwardKV ? Hkv : Hq;
    g.z = B;
    return g;
}

// Scratch of rp::cuda::attention_bwd: D_i = rowsum(dO_i * O_i), one float per (query, head, sequence).
inline constexpr size_t attention_bwd_workspace_bytes(int64_t Hq, int64_t Tq, int64_t B) {
    return size_t(Hq * Tq * B > 0 ? Hq * Tq * B : 1) * 4;
}

// The delta rule (cuda/delta_net.cu): a state column's Dk elements spread over a warp's lanes, at most
// kDeltaMaxPerLane each.
inline constexpr int64_t kDeltaMaxPerLane = 8;
inline constexpr int64_t kDeltaMaxDk = 32 * kDeltaMaxPerLane;
// Its backward: one block of kDeltaWarps warps per (sequence, value head); each warp walks its columns back through
// a chunk of c = min(chunk, T) tokens with the column's recomputed states ((c + 1) Dk floats) and its partial
// gradients of q and k (c Dk each), beta and the decay (c each); the block keeps the head's state gradient (Dk Dv).
// dq and dk come per value head first (Dk Hv T B each), then summed over the heads that share a key head.
inline constexpr int kDeltaWarps = 4;
inline constexpr size_t delta_net_bwd_block_floats(int64_t Dk, int64_t Dv, int64_t c) {
    return size_t(kDeltaWarps) * size_t((c + 1) * Dk + 2 * c * Dk + 2 * c) + size_t(Dk * Dv);
}
inline constexpr size_t delta_net_bwd_workspace_bytes(int64_t Dk, int64_t Dv, int64_t Hv, int64_t T, int64_t B, int64_t chunk) {
    const int64_t c = chunk < T ? chunk : T;
    return (size_t(B * Hv) * delta_net_bwd_block_floats(Dk, Dv, c) + 2 * size_t(Dk * Hv * T * B)) * 4;
}

} // namespace rp::cuda
