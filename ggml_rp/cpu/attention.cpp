// Flash-style causal grouped-query attention on the CPU (FlashAttention-2 algorithm, float accumulation).
//
// Forward, per (sequence, query head, block of BQ queries): walk the visible key blocks of BK keys in order
// (from the block of the first key any of its queries sees: packed sequences skip the earlier documents),
// S = Q K^T * scale (Gemma 2: soft-capped, cap tanh(S / cap); the backward multiplies dS by 1 - tanh^2), keep a running row max m and row sum l of exp(S - m), rescale the output accumulator
// when m grows, add P V. At the end the head's sink logit (if any) joins m and l, O = acc / l and
// lse = m + log(l).
//
// Backward, recomputing P = exp(S*scale - lse) block by block, with D_i = rowsum(dO_i * O_i):
//   pass 1, per (sequence, kv head, key block): over the group's query heads and the query blocks in order,
//           dV += P^T dO,  dS = P * (dO V^T - D),  dK += dS^T Q * scale        (the task owns its dK/dV rows)
//   pass 2, per (sequence, query head, query block): over the key blocks in order, dQ += dS K * scale, with the
//           dS blocks pass 1 kept (up to 32 MiB of them), else recomputed
// and the sinks' gradient dsink_h = -sum_i exp(sink_h - lse_i) D_i over the head's rows, in row order.
// Each output row is owned by one task and reduced in a fixed order, so results do not depend on threads.
//
// The block products are attention_blocks.h's (small head dims: their own kernels; others: gemm_f32_serial).
// Memory beyond inputs and outputs: D (one float per query row and head) and per-thread tiles of a few
// BQ x max(BK, D) floats.
#include "ggml_rp/cpu/attention.h"

#include "ggml_rp/cpu/attention_blocks.h"
#include "ggml_rp/cpu/kernel_scratch.h"
#include "ggml_rp/cpu/vec_math.h"
#include "base/error.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace rp::cpu {

namespace {

constexpr int64_t BQ = 64;   // queries per block
constexpr int64_t BK = 64;   // keys per block

void check_shape(const AttentionShape & s, const char * fn) {
    auto bad = [&](const std::string & why) { throw Error(std::string(fn) + ": " + why); };
    if (s.D < 1 || s.D > 256) bad("head_dim D=" + std::to_string(s.D) + " is outside [1, 256]");
    if (s.Hq < 1 || s.Hkv < 1 || s.Hq % s.Hkv != 0)
        bad("query heads " + std::to_string(s.Hq) + " are not a positive multiple of kv heads " +
            std::to_string(s.Hkv));
    if (s.Tq < 0 || s.Tk < s.Tq)
        bad("Tq=" + std::to_string(s.Tq) + ", Tk=" + std::to_string(s.Tk) + ": need 0 <= Tq <= Tk");
    if (s.B < 0) bad("negative batch " + std::to_string(s.B));
    if (!std::isfinite(s.scale)) bad("scale is not finite");
    if (!(s.softcap >= 0.0f) || !std::isfinite(s.softcap)) bad("softcap is not a finite number >= 0");
    if (s.window < 0) bad("negative window " + std::to_string(s.window));
    if (s.kv_rows != 0 && s.kv_rows < s.Tk)
        bad("kv_rows=" + std::to_string(s.kv_rows) + " is below Tk=" + std::to_string(s.Tk) + ": the sequences' keys would overlap");
}

// Strides and pointers of the [D, H, T, B] layouts (floats), and the mask: query t of sequence b sees keys
// [first(b, t), t + offset], first from key_start and the sliding window.
struct Geometry {
    const AttentionShape & s;
    const int32_t * key_start;  // nullable: [Tq, B]
    int64_t group() const { return s.Hq / s.Hkv; }
    int64_t q_row() const { return s.Hq * s.D; }    // between consecutive queries of one head
    int64_t kv_row() const { return s.Hkv * s.D; }  // between consecutive keys of one head
    int64_t offset() const { return s.Tk - s.Tq; }  // query t sees keys j <= t + offset
    int64_t q_at(int64_t b, int64_t t, int64_t h) const { return ((b * s.Tq + t) * s.Hq + h) * s.D; }
    int64_t kv_at(int64_t b, int64_t j, int64_t h) const { return ((b * s.kv_seq_rows() + j) * s.Hkv + h) * s.D; }
    int64_t row_at(int64_t b, int64_t t, int64_t h) const { return (b * s.Tq + t) * s.Hq + h; }
    // Keys of block [j0, j0+bk) that query t sees: the first `visible` of them (before the causal horizon).
    int64_t visible(int64_t t, int64_t j0, int64_t bk) const {
        return std::clamp<int64_t>(t + offset() - j0 + 1, 0, bk);
    }
    // The first key query t of sequence b sees (0 without key_start or window; clamped so the diagonal is
    // visible).
    int64_t first(int64_t b, int64_t t) const {
        int64_t f = key_start ? key_start[b * s.Tq + t] : 0;
        if (s.window > 0) f = std::max<int64_t>(f, t + offset() - s.window + 1);
        return std::clamp<int64_t>(f, 0, t + offset());
    }
    // Keys of block [j0, j0+bk) before the first one query t sees (they are masked like the future ones).
    int64_t hidden(int64_t b, int64_t t, int64_t j0, int64_t bk) const {
        return std::clamp<int64_t>(first(b, t) - j0, 0, bk);
    }
    // The first key any query of [t0, t0+bq) sees: blocks before it hold no visible key.
    int64_t first_of_block(int64_t b, int64_t t0, int64_t bq) const {
        if (!key_start && s.window <= 0) return 0;
        int64_t lo = first(b, t0);
        for (int64_t i = 1; i < bq; ++i) lo = std::min(lo, first(b, t0 + i));
        return lo;
    }
};

// Runs body(task) for task in [0, n) on the OpenMP threads, each with its own scratch of `scratch_floats`;
// rethrows the first exception after the loop (exceptions must not cross an OpenMP region).
template <class F>
void parallel_tasks(int64_t n, size_t scratch_floats, F body) {
    std::atomic<bool> failed{false};
    std::string err;
#ifdef _OPENMP
#pragma omp parallel if (n > 1)
#endif
    {
        std::vector<float> scratch;
        try {
            scratch.resize(scratch_floats);
        } catch (const std::exception & e) {
            if (!failed.exchange(true)) err = e.what();
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t task = 0; task < n; ++task) {
            if (failed.load(std::memory_order_relaxed)) continue;
            try {
                body(task, scratch.data());
            } catch (const std::exception & e) {
                if (!failed.exchange(true)) err = e.what();
            }
        }
    }
    if (failed) throw Error(err);
}

// P = exp(S*scale - lse) on the visible part of each row, 0 elsewhere (S is [bq x BK], rows t0..). With a soft-cap,
// P = exp(cap tanh(S*scale / cap) - lse), and the tanh values go to `tanh_tile` (0 where P is).
void probabilities(const Geometry & g, float * S, int64_t b, int64_t bq, int64_t bk, int64_t t0, int64_t j0, float scale,
                   const float * lse_rows, float * tanh_tile) {
    const float cap = g.s.softcap;
    for (int64_t i = 0; i < bq; ++i) {
        float * row = S + i * BK;
        const int64_t nv = g.visible(t0 + i, j0, bk), lo = std::min(g.hidden(b, t0 + i, j0, bk), nv);
        const float l = lse_rows[i];
        for (int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
        if (cap > 0.0f) {
            float * t = tanh_tile + i * BK;
            std::fill(t, t + bk, 0.0f);
            for (int64_t j = lo; j < nv; ++j) row[j] = attention_logit(row[j] * scale, cap, t[j]);
            exp_affine(row + lo, row + lo, nv - lo, 1.0f, l);
        } else {
            exp_affine(row + lo, row + lo, nv - lo, scale, l);
        }
        for (int64_t j = nv; j < bk; ++j) row[j] = 0.0f;
    }
}

std::atomic<size_t> g_kept_ds_bytes{size_t(32) << 20};

// The (query block, key block) pairs whose dS the backward keeps: all of them when their blocks take at most
// set_attention_kept_ds_bytes(), else none.
size_t kept_ds_pairs(const AttentionShape & s) {
    const int64_t nkb = (s.Tk + BK - 1) / BK, nqb = (s.Tq + BQ - 1) / BQ;
    const size_t n_pairs = size_t(s.B * s.Hq * nqb * nkb);
    return n_pairs * size_t(BQ * BK) * sizeof(float) <= g_kept_ds_bytes.load(std::memory_order_relaxed) ? n_pairs : 0;
}

size_t drow_count(const AttentionShape & s) { return size_t(std::max<int64_t>(s.B * s.Tq * s.Hq, 1)); }

} // namespace

void set_attention_kept_ds_bytes(size_t bytes) { g_kept_ds_bytes.store(bytes); }

size_t attention_bwd_scratch_bytes(const AttentionShape & s) {
    const size_t kept = kept_ds_pairs(s);
    return scratch_round(drow_count(s) * sizeof(float)) + scratch_round(kept * size_t(BQ * BK) * sizeof(float)) + scratch_round(kept);
}

void attention_fwd(const AttentionShape & s, const float * q, const float * k, const float * v, float * o,
                   float * lse, const int32_t * key_start, const float * sinks) {
    check_shape(s, "attention_fwd");
    const Geometry g{s, key_start};
    const int64_t D = s.D, nqb = (s.Tq + BQ - 1) / BQ;
    const int64_t ntasks = s.B * s.Hq * nqb;
    const AttentionBlocks blocks(D, BK);
    // scratch: S [BQ x BK], acc [BQ x D], m [BQ], l [BQ], the transposed key block
    parallel_tasks(ntasks, size_t(BQ * BK + BQ * D + 2 * BQ + blocks.transposed_floats()), [&](int64_t task, float * scratch) {
        const int64_t qb = task % nqb, h = task / nqb % s.Hq, b = task / nqb / s.Hq;
        const int64_t hk = h / g.group();
        const int64_t t0 = qb * BQ, bq = std::min(BQ, s.Tq - t0);
        float * S = scratch;
        float * acc = S + BQ * BK;
        float * m = acc + BQ * D;
        float * l = m + BQ;
        float * kt = l + BQ;
        std::fill(acc, acc + bq * D, 0.0f);
        std::fill(m, m + bq, -std::numeric_limits<float>::infinity());
        std::fill(l, l + bq, 0.0f);
        const float * qblk = q + g.q_at(b, t0, h);
        const int64_t kend = std::min(s.Tk, t0 + bq + g.offset());   // keys past the last query's horizon
        for (int64_t j0 = g.first_of_block(b, t0, bq) / BK * BK; j0 < kend; j0 += BK) {
            const int64_t bk = std::min(BK, kend - j0);
            blocks.rows_dot(bq, bk, qblk, g.q_row(), blocks.transposed(bk, k + g.kv_at(b, j0, hk), g.kv_row(), kt), g.kv_row(), S);
            for (int64_t i = 0; i < bq; ++i) {
                float * row = S + i * BK;
                const int64_t nv = g.visible(t0 + i, j0, bk), lo = g.hidden(b, t0 + i, j0, bk);
                if (lo >= nv) {   // nothing visible in this block (a packed row's document starts later)
                    std::fill(row, row + bk, 0.0f);
                    continue;
                }
                std::fill(row, row + lo, 0.0f);
                for (int64_t j = lo; j < nv; ++j) row[j] *= s.scale;
                if (s.softcap > 0.0f) {
                    float t;
                    for (int64_t j = lo; j < nv; ++j) row[j] = attention_logit(row[j], s.softcap, t);
                }
                // The first block a row sees anything in makes mx finite; m[i] is -inf only before it.
                const float mx = max_of(row + lo, nv - lo, m[i]);
                const float alpha = vec_exp(m[i] - mx);
                const float sum = exp_affine_sum(row + lo, row + lo, nv - lo, 1.0f, mx);
                for (int64_t j = nv; j < bk; ++j) row[j] = 0.0f;
                l[i] = l[i] * alpha + sum;
                m[i] = mx;
                if (alpha != 1.0f)
                    for (int64_t d = 0; d < D; ++d) acc[i * D + d] *= alpha;
            }
            blocks.accumulate(bq, bk, S, false, v + g.kv_at(b, j0, hk), g.kv_row(), acc);
        }
        if (sinks)  // the sink joins the softmax's max and sum; it carries no value
            for (int64_t i = 0; i < bq; ++i) {
                const float mx = std::max(m[i], sinks[h]);
                const float alpha = vec_exp(m[i] - mx);
                l[i] = l[i] * alpha + vec_exp(sinks[h] - mx);
                m[i] = mx;
                if (alpha != 1.0f)
                    for (int64_t d = 0; d < D; ++d) acc[i * D + d] *= alpha;
            }
        for (int64_t i = 0; i < bq; ++i) {
            float * orow = o + g.q_at(b, t0 + i, h);
            const float inv = 1.0f / l[i];
            for (int64_t d = 0; d < D; ++d) orow[d] = acc[i * D + d] * inv;
            lse[g.row_at(b, t0 + i, h)] = m[i] + std::log(l[i]);
        }
    });
}

void attention_bwd(const AttentionShape & s, const float * q, const float * k, const float * v, const float * o,
                   const float * lse, const float * dout, float * dq, float * dk, float * dv, const int32_t * key_start,
                   const float * sinks, float * dsinks) {
    check_shape(s, "attention_bwd");
    if (s.kv_seq_rows() != s.Tk) throw Error("attention_bwd: kv_rows=" + std::to_string(s.kv_rows) + ": the backward needs contiguous keys");
    const Geometry g{s, key_start};
    const int64_t D = s.D;
    const int64_t nrows = s.B * s.Tq * s.Hq;

    // D_i = rowsum(dO_i * O_i), one per (query, head). Rows are contiguous D-vectors in both layouts.
    Scratch kernel_scratch(attention_bwd_scratch_bytes(s));
    float * Drow = kernel_scratch.take<float>(drow_count(s));
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (nrows * D > (1 << 15))
#endif
    for (int64_t r = 0; r < nrows; ++r) {
        const float * a = dout + r * D;
        const float * b = o + r * D;
        float sum = 0.0f;
        for (int64_t d = 0; d < D; ++d) sum = std::fma(a[d], b[d], sum);
        Drow[size_t(r)] = sum;
    }
    // The sinks' gradient: each row's sink probability exp(sink - lse) times (0 - D_i), the sink having no value.
    if (sinks && dsinks)
        for (int64_t h = 0; h < s.Hq; ++h) {
            double sum = 0.0;
            for (int64_t bt = 0; bt < s.B * s.Tq; ++bt) {
                const int64_t r = bt * s.Hq + h;
                sum -= static_cast<double>(vec_exp(sinks[h] - lse[r])) * Drow[size_t(r)];
            }
            dsinks[h] = static_cast<float>(sum);
        }

    // dS = P * (dP - D) in place in dP, where dP = dO V^T was just computed into it; with a soft-cap, times the
    // tanh's derivative 1 - t^2 (the gradient of the scaled logit before the cap).
    const bool capped = s.softcap > 0.0f;
    auto softmax_grad = [&](float * P, float * dP, const float * tanh_tile, int64_t bq, int64_t bk, int64_t b, int64_t t0, int64_t h) {
        for (int64_t i = 0; i < bq; ++i) {
            const float di = Drow[size_t(g.row_at(b, t0 + i, h))];
            for (int64_t j = 0; j < bk; ++j) dP[i * BK + j] = P[i * BK + j] * (dP[i * BK + j] - di);
            if (capped)
                for (int64_t j = 0; j < bk; ++j) {
                    const float t = tanh_tile[i * BK + j];
                    dP[i * BK + j] *= 1.0f - t * t;
                }
        }
    };
    const size_t tanh_floats = capped ? size_t(BQ * BK) : 0;
    auto lse_of = [&](float * dst, int64_t b, int64_t t0, int64_t bq, int64_t h) {
        for (int64_t i = 0; i < bq; ++i) dst[i] = lse[g.row_at(b, t0 + i, h)];
    };

    // dS of every (query block, key block) pair pass 1 computes, kept for pass 2 when they take at most
    // set_attention_kept_ds_bytes() (32 MiB: sequences up to about a thousand tokens), in the kernel's scratch:
    // pass 2 then only multiplies them by K instead of recomputing S, P and dO V^T (two of the backward's seven
    // block products, and the exps). The kept values are the bits pass 2 would recompute (the same functions on
    // the same inputs: a block's values do not depend on how many of its columns are computed), so the results
    // are the same either way.
    const int64_t nkb = (s.Tk + BK - 1) / BK, nqb = (s.Tq + BQ - 1) / BQ;
    const size_t n_kept = kept_ds_pairs(s);
    const bool keep_ds = n_kept > 0;
    float * ds_blocks = kernel_scratch.take<float>(n_kept * size_t(BQ * BK));
    uint8_t * ds_kept = kernel_scratch.take<uint8_t>(n_kept);
    std::fill(ds_kept, ds_kept + n_kept, uint8_t(0));
    auto pair_of = [&](int64_t b, int64_t h, int64_t qb, int64_t kb) { return size_t(((b * s.Hq + h) * nqb + qb) * nkb + kb); };

    // Pass 1: dK, dV by key-block ownership.
    const AttentionBlocks blocks(D, BK);
    const size_t tr = size_t(blocks.transposed_floats());
    parallel_tasks(s.B * s.Hkv * nkb, size_t(2 * BQ * BK + 2 * BK * D + BQ) + 2 * tr + tanh_floats, [&](int64_t task, float * scratch) {
        const int64_t kb = task % nkb, hk = task / nkb % s.Hkv, b = task / nkb / s.Hkv;
        const int64_t j0 = kb * BK, bk = std::min(BK, s.Tk - j0);
        float * P = scratch;
        float * dP = P + BQ * BK;
        float * dk_acc = dP + BQ * BK;
        float * dv_acc = dk_acc + BK * D;
        float * lrow = dv_acc + BK * D;
        std::fill(dk_acc, dk_acc + bk * D, 0.0f);
        std::fill(dv_acc, dv_acc + bk * D, 0.0f);
        const float * kt = blocks.transposed(bk, k + g.kv_at(b, j0, hk), g.kv_row(), lrow + BQ);
        const float * vt = blocks.transposed(bk, v + g.kv_at(b, j0, hk), g.kv_row(), lrow + BQ + tr);
        float * tanh_tile = lrow + BQ + 2 * tr;
        const int64_t t_first = std::max<int64_t>(0, j0 - g.offset());   // first query that sees key j0
        for (int64_t h = hk * g.group(); h < (hk + 1) * g.group(); ++h) {
            for (int64_t t0 = t_first / BQ * BQ; t0 < s.Tq; t0 += BQ) {
                const int64_t bq = std::min(BQ, s.Tq - t0);
                if (g.first_of_block(b, t0, bq) >= j0 + bk) continue;   // every query's document starts later
                const float * qblk = q + g.q_at(b, t0, h);
                const float * doblk = dout + g.q_at(b, t0, h);
                blocks.rows_dot(bq, bk, qblk, g.q_row(), kt, g.kv_row(), P);
                lse_of(lrow, b, t0, bq, h);
                probabilities(g, P, b, bq, bk, t0, j0, s.scale, lrow, tanh_tile);
                blocks.accumulate(bk, bq, P, true, doblk, g.q_row(), dv_acc);
                blocks.rows_dot(bq, bk, doblk, g.q_row(), vt, g.kv_row(), dP);
                softmax_grad(P, dP, tanh_tile, bq, bk, b, t0, h);
                if (keep_ds) {
                    const size_t pair = pair_of(b, h, t0 / BQ, kb);
                    std::copy(dP, dP + bq * BK, ds_blocks + pair * size_t(BQ * BK));
                    ds_kept[pair] = 1;
                }
                blocks.accumulate(bk, bq, dP, true, qblk, g.q_row(), dk_acc);
            }
        }
        for (int64_t j = 0; j < bk; ++j) {
            float * dkrow = dk + g.kv_at(b, j0 + j, hk);
            float * dvrow = dv + g.kv_at(b, j0 + j, hk);
            for (int64_t d = 0; d < D; ++d) {
                dkrow[d] = dk_acc[j * D + d] * s.scale;
                dvrow[d] = dv_acc[j * D + d];
            }
        }
    });

    // Pass 2: dQ by query-block ownership.
    parallel_tasks(s.B * s.Hq * nqb, size_t(2 * BQ * BK + BQ * D + BQ) + 2 * tr + tanh_floats, [&](int64_t task, float * scratch) {
        const int64_t qb = task % nqb, h = task / nqb % s.Hq, b = task / nqb / s.Hq;
        const int64_t hk = h / g.group();
        const int64_t t0 = qb * BQ, bq = std::min(BQ, s.Tq - t0);
        float * P = scratch;
        float * dP = P + BQ * BK;
        float * dq_acc = dP + BQ * BK;
        float * lrow = dq_acc + BQ * D;
        float * kt = lrow + BQ;
        float * vt = kt + tr;
        float * tanh_tile = vt + tr;
        std::fill(dq_acc, dq_acc + bq * D, 0.0f);
        lse_of(lrow, b, t0, bq, h);
        const float * qblk = q + g.q_at(b, t0, h);
        const float * doblk = dout + g.q_at(b, t0, h);
        const int64_t kend = std::min(s.Tk, t0 + bq + g.offset());
        for (int64_t j0 = g.first_of_block(b, t0, bq) / BK * BK; j0 < kend; j0 += BK) {
            const int64_t bk = std::min(BK, kend - j0);
            const float * kblk = k + g.kv_at(b, j0, hk);
            if (keep_ds && ds_kept[pair_of(b, h, qb, j0 / BK)]) {
                blocks.accumulate(bq, bk, ds_blocks + pair_of(b, h, qb, j0 / BK) * size_t(BQ * BK), false, kblk, g.kv_row(), dq_acc);
                continue;
            }
            blocks.rows_dot(bq, bk, qblk, g.q_row(), blocks.transposed(bk, kblk, g.kv_row(), kt), g.kv_row(), P);
            probabilities(g, P, b, bq, bk, t0, j0, s.scale, lrow, tanh_tile);
            blocks.rows_dot(bq, bk, doblk, g.q_row(), blocks.transposed(bk, v + g.kv_at(b, j0, hk), g.kv_row(), vt), g.kv_row(), dP);
            softmax_grad(P, dP, tanh_tile, bq, bk, b, t0, h);
            blocks.accumulate(bq, bk, dP, false, kblk, g.kv_row(), dq_acc);
        }
        for (int64_t i = 0; i < bq; ++i) {
            float * dqrow = dq + g.q_at(b, t0 + i, h);
            for (int64_t d = 0; d < D; ++d) dqrow[d] = dq_acc[i * D + d] * s.scale;
        }
    });
}

} // namespace rp::cpu
