// SSM_CONV, SSM_CONV_BACK, DELTA_NET, DELTA_NET_BACK (ops/delta_net.h): contiguous f32 operands.
//
// The delta rule runs the value columns of the state (which never mix) in groups of 8 side by side, each column
// with its own accumulator chains, so the chains hide each other's latency and each token's key and query are
// loaded once per group; the forward advances all of a head's columns (Dv x Dk floats, in L2) through a block of
// 64 tokens before the next, so the block's keys and queries stay in cache. The backward recomputes each group's
// states over a chunk from the chunk's saved state, through the same function as the forward (the same bits),
// then walks the chunk backwards, the group's columns again side by side. Every sum has a fixed order and a
// column's bits do not depend on its group; the threads split (sequence, head) pairs. (rp-bench ops --only
// delta-net: forward 1.7-1.9x, backward 1.45x faster than one column at a time; see bench/bench_ops.cpp.)
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/strided.h"
#include "ggml_rp/ops/delta_net_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace rp::cpu {

namespace {

// ---- ssm_conv ----

// Of SSM_CONV (its output is x's shape) and SSM_CONV_BACK (dx: its output; dw: x, its source).
ConvDims conv_shape(const Tensor * n) {
    const Tensor * x = n->src[0] ? n->src[0] : n;
    return {x->ne[0], x->ne[1], x->ne[2], n->src[1]->ne[0]};
}

void ssm_conv(Tensor * n) {
    const ConvDims s = conv_shape(n);
    const float * x = n->src[0]->data_as<float>();
    const float * w = n->src[1]->data_as<float>();
    const float * prefix = n->src[2] ? n->src[2]->data_as<float>() : nullptr;
    const int32_t * seg = n->src[3] ? n->src[3]->data_as<int32_t>() : nullptr;
    float * y = n->data_as<float>();
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < s.T * s.B; ++r) {
        const int64_t t = r % s.T, b = r / s.T, start = example_start(seg, t, s.T, b);
        for (int64_t c = 0; c < s.C; ++c) {
            float acc = 0.0f;
            for (int64_t j = 0; j < s.K; ++j) acc += w[j + s.K * c] * conv_input(x, prefix, s, c, t + j - (s.K - 1), b, start);
            y[c + s.C * r] = acc;
        }
    }
    // The new conv state: the last K-1 inputs of [prefix | x].
    float * state = reinterpret_cast<float *>(reinterpret_cast<char *>(n->data) + n->nbytes());
    for (int64_t b = 0; b < s.B; ++b)
        for (int64_t i = 0; i < s.K - 1; ++i)
            for (int64_t c = 0; c < s.C; ++c)
                state[c + s.C * (i + (s.K - 1) * b)] = conv_input(x, prefix, s, c, s.T - (s.K - 1) + i, b, 0);
}

void ssm_conv_back(Tensor * n) {
    const ConvDims s = conv_shape(n);
    const float * w = n->src[1]->data_as<float>();
    const float * dy = n->src[2]->data_as<float>();
    const int32_t * seg = n->src[4] ? n->src[4]->data_as<int32_t>() : nullptr;
    float * out = n->data_as<float>();
    if (n->param_i32(0) == 0) {
        // dx[c, tau] = sum_j w[j, c] dy[c, t] over the tokens t = tau + (K-1) - j that read x[tau] (same example).
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
        for (int64_t r = 0; r < s.T * s.B; ++r) {
            const int64_t tau = r % s.T, b = r / s.T;
            for (int64_t c = 0; c < s.C; ++c) {
                float acc = 0.0f;
                for (int64_t j = 0; j < s.K; ++j) {
                    const int64_t t = tau + (s.K - 1) - j;
                    if (t >= s.T || tau < example_start(seg, t, s.T, b)) continue;
                    acc += w[j + s.K * c] * dy[c + s.C * (t + s.T * b)];
                }
                out[c + s.C * r] = acc;
            }
        }
        return;
    }
    // dw[j, c] = sum over (b, t) of dy[c, t, b] x[c, t + j - (K-1), b], in the order b, t.
    const float * x = n->src[0]->data_as<float>();
    const float * prefix = n->src[3] ? n->src[3]->data_as<float>() : nullptr;
#pragma omp parallel for schedule(static) if (s.C * s.K * s.T * s.B >= min_parallel_elements())
    for (int64_t c = 0; c < s.C; ++c)
        for (int64_t j = 0; j < s.K; ++j) {
            float acc = 0.0f;
            for (int64_t b = 0; b < s.B; ++b)
                for (int64_t t = 0; t < s.T; ++t)
                    acc += dy[c + s.C * (t + s.T * b)] * conv_input(x, prefix, s, c, t + j - (s.K - 1), b, example_start(seg, t, s.T, b));
            out[j + s.K * c] = acc;
        }
}

// ---- delta_net ----

struct NetShape {
    int64_t Dk, Hk, Dv, Hv, T, B, chunk, n_chunks;
    size_t state_floats() const { return static_cast<size_t>(Dk * Dv * Hv * B); }
    // Offsets of token t of sequence b: q/k of key head hk, v/o of value head h, g/beta of value head h.
    size_t qk(int64_t hk, int64_t t, int64_t b) const { return static_cast<size_t>(Dk * (hk + Hk * (t + T * b))); }
    size_t vo(int64_t j, int64_t h, int64_t t, int64_t b) const { return static_cast<size_t>(j + Dv * (h + Hv * (t + T * b))); }
    size_t gb(int64_t h, int64_t t, int64_t b) const { return static_cast<size_t>(h + Hv * (t + T * b)); }
    // Column j of head h of sequence b in a state [Dk, Dv, Hv, B].
    size_t col(int64_t j, int64_t h, int64_t b) const { return static_cast<size_t>(Dk * (j + Dv * (h + Hv * b))); }
};

NetShape net_shape(const Tensor * o) {
    const Tensor * q = o->src[0];
    const Tensor * v = o->src[2];
    NetShape s{q->ne[0], q->ne[1], v->ne[0], v->ne[1], q->ne[2], q->ne[3], o->param_i32(1), 0};
    s.n_chunks = (s.T + s.chunk - 1) / s.chunk;
    return s;
}

// 8 floats as one value (GCC's vector extension). A dot product over a column keeps element i in lane i % 8 (one
// accumulator), sums the lanes in a fixed tree, then adds the tail (Dk % 8 elements) in order.
// (Loads and stores as float vectors of float alignment, not memcpy: a memcpy may alias any object, so the
// compiler would reload every column pointer after each store.)
typedef float F8 __attribute__((vector_size(32)));
typedef float F8u __attribute__((vector_size(32), aligned(4)));
inline F8 load8(const float * p) { return *reinterpret_cast<const F8u *>(p); }
inline void store8(float * p, F8 x) { *reinterpret_cast<F8u *>(p) = x; }
inline float tree8(F8 x) { return ((x[0] + x[4]) + (x[2] + x[6])) + ((x[1] + x[5]) + (x[3] + x[7])); }

// Columns a kernel advances token by token side by side: their steps are independent, so the core overlaps one
// column's dot-product chain with the next's (one column alone waits on its chain), and each token's k and q are read
// once per 8 columns. Every column's arithmetic is the same in any grouping.
constexpr int64_t kColumns = 8;

// f(std::integral_constant<int, n>{}) for a group of n (1 .. kColumns) columns: the kernels below take the count
// at compile time (their accumulators live in registers).
template <class F>
void with_group(int64_t n, F && f) {
    switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
    }
}
constexpr int64_t kTokenBlock = 64;  // the forward's tokens per pass over the head's columns

// One token's update of N state columns (Dk floats each, N <= kColumns) side by side: for column c, decay by a,
// then the delta rule for its value v[c], from the column from[c] into s[c] (the same column, or the state before,
// which the backward's recompute keeps), in two passes, s written once:
//   u = (a from) . k (the column's prediction of v);   s = a from + beta (v - u) k, and with q, out[c] = s . q.
// The columns never mix: each has its own accumulator chains, so a column's bits do not depend on N or on its
// neighbours, and N chains side by side hide each other's latency (one column alone waits on its chain); each
// block of k and q is loaded once for the N columns. The forward and the backward's recompute both call it: the
// same bits.
template <int N>
[[gnu::noinline]] void columns_step(float * const * s, const float * const * from, const float * k, float a, float beta, const float * v,
                                    int64_t Dk, const float * q, float * out) {
    const int64_t tail = Dk - Dk % 8;
    F8 lu[N] = {};
    for (int64_t i = 0; i < tail; i += 8) {
        const F8 kv = load8(k + i);
        for (int c = 0; c < N; ++c) lu[c] += (load8(from[c] + i) * a) * kv;
    }
    float d[N];
    for (int c = 0; c < N; ++c) {
        for (int64_t i = tail; i < Dk; ++i) s[c][i] = from[c][i] * a;
        float u = tree8(lu[c]);
        for (int64_t i = tail; i < Dk; ++i) u += s[c][i] * k[i];
        d[c] = beta * (v[c] - u);
    }
    F8 lo[N] = {};
    for (int64_t i = 0; i < tail; i += 8) {
        const F8 kv = load8(k + i), qv = q ? load8(q + i) : F8{};
        for (int c = 0; c < N; ++c) {
            const F8 x = load8(from[c] + i) * a + d[c] * kv;
            store8(s[c] + i, x);
            if (q) lo[c] += x * qv;
        }
    }
    for (int c = 0; c < N; ++c) {
        for (int64_t i = tail; i < Dk; ++i) s[c][i] += d[c] * k[i];
        if (q) {
            float o = tree8(lo[c]);
            for (int64_t i = tail; i < Dk; ++i) o += s[c][i] * q[i];
            out[c] = o;
        }
    }
}


void delta_net(Tensor * n) {
    const NetShape s = net_shape(n);
    const float * q = n->src[0]->data_as<float>();
    const float * k = n->src[1]->data_as<float>();
    const float * v = n->src[2]->data_as<float>();
    const float * g = n->src[3]->data_as<float>();
    const float * beta = n->src[4]->data_as<float>();
    const float * state0 = n->src[5] ? n->src[5]->data_as<float>() : nullptr;
    const int32_t * seg = n->src[6] ? n->src[6]->data_as<int32_t>() : nullptr;
    const float scale = n->param_f32(0);
    float * o = n->data_as<float>();
    float * states = reinterpret_cast<float *>(reinterpret_cast<char *>(n->data) + n->nbytes());
    const size_t sf = s.state_floats();
#pragma omp parallel for schedule(static) if (s.B * s.Hv > 1 && n->nelements() * s.Dk >= min_parallel_elements())
    for (int64_t bh = 0; bh < s.B * s.Hv; ++bh) {
        const int64_t h = bh % s.Hv, b = bh / s.Hv, hk = h % s.Hk;
        const size_t Dk = static_cast<size_t>(s.Dk);
        // Every column of the head's state (Dv x Dk floats, in L2) advances through a block of kTokenBlock tokens
        // before the next block, so the block's keys and queries stay in cache for all the column groups.
        std::vector<float> cols(static_cast<size_t>(s.Dv) * Dk), decay(static_cast<size_t>(s.T)), zero(Dk, 0.0f);
        for (int64_t t = 0; t < s.T; ++t) decay[static_cast<size_t>(t)] = std::exp(g[s.gb(h, t, b)]);  // once, not per column
        for (int64_t j = 0; j < s.Dv; ++j) {
            float * c = cols.data() + Dk * static_cast<size_t>(j);
            if (state0) std::memcpy(c, state0 + s.col(j, h, b), sizeof(float) * Dk);
            else std::fill(c, c + Dk, 0.0f);
        }
        for (int64_t tb = 0; tb < s.T; tb += kTokenBlock)
            for (int64_t j0 = 0; j0 < s.Dv; j0 += kColumns) {
                const int64_t nj = std::min(kColumns, s.Dv - j0);
                float * col[kColumns];
                for (int64_t jj = 0; jj < nj; ++jj) col[jj] = cols.data() + Dk * static_cast<size_t>(j0 + jj);
                for (int64_t t = tb; t < std::min(s.T, tb + kTokenBlock); ++t) {
                    const float * kt = k + s.qk(hk, t, b);
                    const float * qt = q + s.qk(hk, t, b);
                    const float a = decay[static_cast<size_t>(t)], bt = beta[s.gb(h, t, b)];
                    const bool reset = state_restarts(seg, t, s.T, b);
                    const float * from[kColumns];
                    for (int64_t jj = 0; jj < nj; ++jj) {
                        if (t % s.chunk == 0)
                            std::memcpy(states + sf * static_cast<size_t>(t / s.chunk) + s.col(j0 + jj, h, b), col[jj], sizeof(float) * Dk);
                        from[jj] = reset ? zero.data() : col[jj];
                    }
                    float out[kColumns];
                    with_group(nj, [&](auto N) { columns_step<N>(col, from, kt, a, bt, v + s.vo(j0, h, t, b), s.Dk, qt, out); });
                    for (int64_t jj = 0; jj < nj; ++jj) o[s.vo(j0 + jj, h, t, b)] = scale * out[jj];
                }
            }
        for (int64_t j = 0; j < s.Dv; ++j)
            std::memcpy(states + sf * static_cast<size_t>(s.n_chunks) + s.col(j, h, b), cols.data() + Dk * static_cast<size_t>(j), sizeof(float) * Dk);
    }
}

// One token of N state columns walked back side by side (delta_net_back), in two passes over the columns; for
// column c (value v[c], output gradient times scale dot_o[c]):
//   o = scale snew . q           ds += dot_o q, dq += dot_o snew; dd = ds . k
//   snew = stilde + d k          (d = beta (v - u), u = stilde . k, stilde = a sprev)
//   dk += d ds + du stilde       du = -beta dd; dsv = ds + du k; da += dsv . sprev; ds = a dsv (0 at a restart)
// Each column has its own accumulator chains (dot products as columns_step's); dq and dk take the columns' terms
// in column order, element by element, so the bits do not depend on N. Adds the token's dbeta and da terms (in
// column order) and writes dv[c].
struct WalkColumns {
    float * ds[kColumns];           // the state gradient of each column (updated)
    const float * sprev[kColumns];  // the state before the token (zeros at a restart)
    const float * snew[kColumns];   // the state after it
    const float * v;                // the token's values and output gradients, column c at [c]
    const float * dout;
    float * dv;
};

template <int N>
[[gnu::noinline]] void walk_columns(const WalkColumns & w, float * __restrict dq, float * __restrict dk, const float * __restrict q,
                                    const float * __restrict k, float a, float beta, float scale, bool reset, int64_t Dk, float * dbeta, float * da) {
    const int64_t tail = Dk - Dk % 8;
    float dot_o[N];
    for (int c = 0; c < N; ++c) dot_o[c] = w.dout[c] * scale;
    F8 lu[N] = {}, ld[N] = {};
    for (int64_t i = 0; i < tail; i += 8) {
        const F8 kv = load8(k + i), qv = load8(q + i);
        F8 dqv = load8(dq + i);
        for (int c = 0; c < N; ++c) {
            lu[c] += (load8(w.sprev[c] + i) * a) * kv;
            const F8 dsn = load8(w.ds[c] + i) + dot_o[c] * qv;
            store8(w.ds[c] + i, dsn);
            dqv += dot_o[c] * load8(w.snew[c] + i);
            ld[c] += dsn * kv;
        }
        store8(dq + i, dqv);
    }
    float d[N], du[N];
    for (int c = 0; c < N; ++c) {
        float u = tree8(lu[c]), dd = tree8(ld[c]);
        for (int64_t i = tail; i < Dk; ++i) u += w.sprev[c][i] * a * k[i];
        for (int64_t i = tail; i < Dk; ++i) {
            w.ds[c][i] += dot_o[c] * q[i];
            dq[i] += dot_o[c] * w.snew[c][i];
        }
        for (int64_t i = tail; i < Dk; ++i) dd += w.ds[c][i] * k[i];
        d[c] = beta * (w.v[c] - u);
        du[c] = -beta * dd;
        *dbeta += dd * (w.v[c] - u);
        w.dv[c] = beta * dd;
    }
    F8 la[N] = {};
    for (int64_t i = 0; i < tail; i += 8) {
        const F8 kv = load8(k + i);
        F8 dkv = load8(dk + i);
        for (int c = 0; c < N; ++c) {
            const F8 sp = load8(w.sprev[c] + i), dsi = load8(w.ds[c] + i);
            dkv += d[c] * dsi;
            dkv += du[c] * (sp * a);
            const F8 dsv = dsi + du[c] * kv;
            la[c] += dsv * sp;
            store8(w.ds[c] + i, reset ? F8{} : a * dsv);  // (0 at a restart)
        }
        store8(dk + i, dkv);
    }
    for (int c = 0; c < N; ++c) {
        float dac = tree8(la[c]);
        for (int64_t i = tail; i < Dk; ++i) {
            const float sp = w.sprev[c][i], dsi = w.ds[c][i];
            dk[i] += d[c] * dsi;
            dk[i] += du[c] * (sp * a);
            const float dsv = dsi + du[c] * k[i];
            dac += dsv * sp;
            w.ds[c][i] = reset ? 0.0f : a * dsv;
        }
        *da += dac;
    }
}

// Sources: q, k, v, g, beta, state0, seg_start, the forward's saved chunk states, dout. Output dq, aux dk, dv, dg,
// dbeta, dstate0. One thread owns a (sequence, key head) pair and every value head that reads it, so the sums
// over value heads and columns into dq and dk need no atomics: per token, value heads in order, columns in order.
void delta_net_back(Tensor * n) {
    const NetShape s = net_shape(n);  // (the node has the forward's sources and chunk)
    const float * q = n->src[0]->data_as<float>();
    const float * k = n->src[1]->data_as<float>();
    const float * v = n->src[2]->data_as<float>();
    const float * g = n->src[3]->data_as<float>();
    const float * beta = n->src[4]->data_as<float>();
    const bool has_state0 = n->src[5] != nullptr;
    const int32_t * seg = n->src[6] ? n->src[6]->data_as<int32_t>() : nullptr;
    const float * states = n->src[7]->data_as<float>();
    const float * dout = n->src[8]->data_as<float>();
    const float scale = n->param_f32(0);
    const size_t sf = s.state_floats();
    float * dq = n->data_as<float>();
    float * dk = reinterpret_cast<float *>(reinterpret_cast<char *>(n->data) + n->nbytes());
    float * dv = dk + s.Dk * s.Hk * s.T * s.B;
    float * dg = dv + s.Dv * s.Hv * s.T * s.B;
    float * dbeta = dg + s.Hv * s.T * s.B;
    float * dstate0 = has_state0 ? dbeta + s.Hv * s.T * s.B : nullptr;
    const size_t Dk = static_cast<size_t>(s.Dk);
#pragma omp parallel for schedule(static) if (s.B * s.Hk > 1 && n->src[8]->nelements() * s.Dk >= min_parallel_elements())
    for (int64_t bk = 0; bk < s.B * s.Hk; ++bk) {
        const int64_t hk = bk % s.Hk, b = bk / s.Hk;
        for (int64_t t = 0; t < s.T; ++t) {
            std::fill(dq + s.qk(hk, t, b), dq + s.qk(hk, t, b) + Dk, 0.0f);
            std::fill(dk + s.qk(hk, t, b), dk + s.qk(hk, t, b) + Dk, 0.0f);
        }
        const size_t hist_len = (static_cast<size_t>(std::min(s.chunk, s.T)) + 1) * Dk;  // one column's states over a chunk
        std::vector<float> hist(hist_len * static_cast<size_t>(kColumns)), zero(Dk, 0.0f);
        std::vector<float> ds(Dk * static_cast<size_t>(s.Dv));  // the state's gradient, column by column
        std::vector<float> da(static_cast<size_t>(s.chunk));
        std::vector<float> decay(static_cast<size_t>(s.T));
        for (int64_t h = hk; h < s.Hv; h += s.Hk) {
            for (int64_t t = 0; t < s.T; ++t) decay[static_cast<size_t>(t)] = std::exp(g[s.gb(h, t, b)]);  // the forward's values
            std::fill(ds.begin(), ds.end(), 0.0f);
            for (int64_t t = 0; t < s.T; ++t) dbeta[s.gb(h, t, b)] = 0.0f;
            for (int64_t c = s.n_chunks - 1; c >= 0; --c) {
                const int64_t t0 = c * s.chunk, t1 = std::min(s.T, t0 + s.chunk);
                std::fill(da.begin(), da.end(), 0.0f);
                for (int64_t j0 = 0; j0 < s.Dv; j0 += kColumns) {
                    const int64_t nj = std::min(kColumns, s.Dv - j0);
                    // hist of column jj: its state after token t0 + i - 1 at i (i = 0: the saved state before t0).
                    for (int64_t jj = 0; jj < nj; ++jj)
                        std::memcpy(hist.data() + hist_len * static_cast<size_t>(jj), states + sf * static_cast<size_t>(c) + s.col(j0 + jj, h, b),
                                    sizeof(float) * Dk);
                    for (int64_t t = t0; t < t1; ++t) {
                        const float * kt = k + s.qk(hk, t, b);
                        const float a = decay[static_cast<size_t>(t)], bt = beta[s.gb(h, t, b)];
                        const bool reset = state_restarts(seg, t, s.T, b);
                        float * next[kColumns];
                        const float * from[kColumns];
                        for (int64_t jj = 0; jj < nj; ++jj) {
                            next[jj] = hist.data() + hist_len * static_cast<size_t>(jj) + Dk * static_cast<size_t>(t - t0 + 1);
                            from[jj] = reset ? zero.data() : next[jj] - Dk;
                        }
                        with_group(nj, [&](auto N) { columns_step<N>(next, from, kt, a, bt, v + s.vo(j0, h, t, b), s.Dk, nullptr, nullptr); });
                    }
                    for (int64_t t = t1 - 1; t >= t0; --t) {
                        const float * kt = k + s.qk(hk, t, b);
                        const float * qt = q + s.qk(hk, t, b);
                        const float a = decay[static_cast<size_t>(t)], bt = beta[s.gb(h, t, b)];
                        const bool reset = state_restarts(seg, t, s.T, b);
                        float * dqt = dq + s.qk(hk, t, b);
                        float * dkt = dk + s.qk(hk, t, b);
                        WalkColumns w;
                        for (int64_t jj = 0; jj < nj; ++jj) {
                            w.ds[jj] = ds.data() + Dk * static_cast<size_t>(j0 + jj);
                            w.snew[jj] = hist.data() + hist_len * static_cast<size_t>(jj) + Dk * static_cast<size_t>(t - t0 + 1);
                            w.sprev[jj] = reset ? zero.data() : w.snew[jj] - Dk;
                        }
                        w.v = v + s.vo(j0, h, t, b);
                        w.dout = dout + s.vo(j0, h, t, b);
                        w.dv = dv + s.vo(j0, h, t, b);
                        with_group(nj, [&](auto N) {
                            walk_columns<N>(w, dqt, dkt, qt, kt, a, bt, scale, reset, s.Dk, dbeta + s.gb(h, t, b), &da[static_cast<size_t>(t - t0)]);
                        });
                    }
                }
                for (int64_t t = t0; t < t1; ++t) dg[s.gb(h, t, b)] = decay[static_cast<size_t>(t)] * da[static_cast<size_t>(t - t0)];
            }
            if (dstate0)
                for (int64_t j = 0; j < s.Dv; ++j) std::memcpy(dstate0 + s.col(j, h, b), ds.data() + Dk * static_cast<size_t>(j), sizeof(float) * Dk);
        }
    }
}

} // namespace

const RegisterKernels kRegister{{Op::SSM_CONV, ssm_conv},
                                {Op::SSM_CONV_BACK, ssm_conv_back},
                                {Op::DELTA_NET, delta_net},
                                {Op::DELTA_NET_BACK, delta_net_back}};

} // namespace rp::cpu
