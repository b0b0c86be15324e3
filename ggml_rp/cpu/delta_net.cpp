// SSM_CONV, SSM_CONV_BACK, DELTA_NET, DELTA_NET_BACK (ops/delta_net.h): contiguous f32 operands.
//
// The delta rule runs one value column of the state at a time (the columns never mix): a column is Dk floats that
// stay in L1 while a chunk of tokens updates it, the chunk's keys and queries in L2. The backward recomputes the
// column's states over a chunk from the chunk's saved state, through the same function as the forward (the same
// bits), then walks the chunk backwards. Every sum has a fixed order; the threads split (sequence, head) pairs.
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/strided.h"
#include "ggml_rp/ops/delta_net_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

// a . b over n floats: 8 lanes (element i into lane i % 8), combined in a fixed tree, then the rest in order.
inline float dot(const float * a, const float * b, int64_t n) {
    float lanes[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l) lanes[l] += a[i + l] * b[i + l];
    float s = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

// One token's update of one state column s (Dk floats) for value v: decay by a, then the delta rule. Returns
// u = (a s) . k (the column's prediction of v). The forward and the backward's recompute both call it: the same bits.
[[gnu::noinline]] float column_step(float * s, const float * k, float a, float beta, float v, int64_t Dk) {
    for (int64_t i = 0; i < Dk; ++i) s[i] *= a;
    const float u = dot(s, k, Dk);
    const float d = beta * (v - u);
    for (int64_t i = 0; i < Dk; ++i) s[i] += d * k[i];
    return u;
}


// Columns a kernel advances token by token side by side: their steps are independent, so the core overlaps one
// column's dot-product chain with the next's (one column alone waits on its chain), and each token's k and q are read
// once per 8 columns. Every column's arithmetic is the same in any grouping.
constexpr int64_t kColumns = 8;

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
        std::vector<float> cols(static_cast<size_t>(kColumns) * Dk), decay(static_cast<size_t>(s.T));
        for (int64_t t = 0; t < s.T; ++t) decay[static_cast<size_t>(t)] = std::exp(g[s.gb(h, t, b)]);  // once, not per column
        for (int64_t j0 = 0; j0 < s.Dv; j0 += kColumns) {
            const int64_t nj = std::min(kColumns, s.Dv - j0);
            for (int64_t jj = 0; jj < nj; ++jj) {
                float * c = cols.data() + Dk * static_cast<size_t>(jj);
                if (state0) std::memcpy(c, state0 + s.col(j0 + jj, h, b), sizeof(float) * Dk);
                else std::fill(c, c + Dk, 0.0f);
            }
            for (int64_t t = 0; t < s.T; ++t) {
                const float * kt = k + s.qk(hk, t, b);
                const float * qt = q + s.qk(hk, t, b);
                const float a = decay[static_cast<size_t>(t)], bt = beta[s.gb(h, t, b)];
                const bool reset = state_restarts(seg, t, s.T, b);
                for (int64_t jj = 0; jj < nj; ++jj) {
                    float * c = cols.data() + Dk * static_cast<size_t>(jj);
                    const int64_t j = j0 + jj;
                    if (t % s.chunk == 0) std::memcpy(states + sf * static_cast<size_t>(t / s.chunk) + s.col(j, h, b), c, sizeof(float) * Dk);
                    if (reset) std::fill(c, c + Dk, 0.0f);
                    column_step(c, kt, a, bt, v[s.vo(j, h, t, b)], s.Dk);
                    o[s.vo(j, h, t, b)] = scale * dot(c, qt, s.Dk);
                }
            }
            for (int64_t jj = 0; jj < nj; ++jj)
                std::memcpy(states + sf * static_cast<size_t>(s.n_chunks) + s.col(j0 + jj, h, b), cols.data() + Dk * static_cast<size_t>(jj),
                            sizeof(float) * Dk);
        }
    }
}

// Sources: q, k, v, g, beta, state0, seg_start, o (its aux: the saved states), dout. Output dq, aux dk, dv, dg,
// dbeta, dstate0. One thread owns a (sequence, key head) pair and every value head that reads it, so the sums
// over value heads and columns into dq and dk need no atomics: per token, value heads in order, columns in order.
void delta_net_back(Tensor * n) {
    const Tensor * o = n->src[7];
    const NetShape s = net_shape(o);
    const float * q = n->src[0]->data_as<float>();
    const float * k = n->src[1]->data_as<float>();
    const float * v = n->src[2]->data_as<float>();
    const float * g = n->src[3]->data_as<float>();
    const float * beta = n->src[4]->data_as<float>();
    const bool has_state0 = n->src[5] != nullptr;
    const int32_t * seg = n->src[6] ? n->src[6]->data_as<int32_t>() : nullptr;
    const float * states = reinterpret_cast<const float *>(static_cast<const char *>(o->data) + o->nbytes());
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
#pragma omp parallel for schedule(static) if (s.B * s.Hk > 1 && o->nelements() * s.Dk >= min_parallel_elements())
    for (int64_t bk = 0; bk < s.B * s.Hk; ++bk) {
        const int64_t hk = bk % s.Hk, b = bk / s.Hk;
        for (int64_t t = 0; t < s.T; ++t) {
            std::fill(dq + s.qk(hk, t, b), dq + s.qk(hk, t, b) + Dk, 0.0f);
            std::fill(dk + s.qk(hk, t, b), dk + s.qk(hk, t, b) + Dk, 0.0f);
        }
        const size_t hist_len = (static_cast<size_t>(std::min(s.chunk, s.T)) + 1) * Dk;  // one column's states over a chunk
        std::vector<float> hist(hist_len * static_cast<size_t>(kColumns)), stilde(Dk), dsv(Dk), zero(Dk, 0.0f);
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
                        for (int64_t jj = 0; jj < nj; ++jj) {
                            float * next = hist.data() + hist_len * static_cast<size_t>(jj) + Dk * static_cast<size_t>(t - t0 + 1);
                            if (reset) std::fill(next, next + Dk, 0.0f);
                            else std::memcpy(next, next - Dk, sizeof(float) * Dk);
                            column_step(next, kt, a, bt, v[s.vo(j0 + jj, h, t, b)], s.Dk);
                        }
                    }
                    for (int64_t t = t1 - 1; t >= t0; --t)
                    for (int64_t jj = 0; jj < nj; ++jj) {
                        const int64_t j = j0 + jj;
                        float * dsj = ds.data() + Dk * static_cast<size_t>(j);
                        const float * kt = k + s.qk(hk, t, b);
                        const float * qt = q + s.qk(hk, t, b);
                        const float * snew = hist.data() + hist_len * static_cast<size_t>(jj) + Dk * static_cast<size_t>(t - t0 + 1);
                        const float * sprev = state_restarts(seg, t, s.T, b) ? zero.data() : snew - Dk;
                        const float a = decay[static_cast<size_t>(t)], bt = beta[s.gb(h, t, b)], vt = v[s.vo(j, h, t, b)];
                        for (size_t i = 0; i < Dk; ++i) stilde[i] = sprev[i] * a;
                        const float u = dot(stilde.data(), kt, s.Dk);
                        const float d = bt * (vt - u);
                        // o = scale snew . q
                        const float dot_o = dout[s.vo(j, h, t, b)] * scale;
                        float * dqt = dq + s.qk(hk, t, b);
                        float * dkt = dk + s.qk(hk, t, b);
                        for (size_t i = 0; i < Dk; ++i) {
                            dsj[i] += dot_o * qt[i];
                            dqt[i] += dot_o * snew[i];
                        }
                        // snew = stilde + d k
                        const float dd = dot(dsj, kt, s.Dk);
                        for (size_t i = 0; i < Dk; ++i) dkt[i] += d * dsj[i];
                        // d = beta (v - u)
                        dbeta[s.gb(h, t, b)] += dd * (vt - u);
                        dv[s.vo(j, h, t, b)] = bt * dd;
                        const float du = -bt * dd;
                        // u = stilde . k; stilde = a sprev
                        for (size_t i = 0; i < Dk; ++i) {
                            dsv[i] = dsj[i] + du * kt[i];
                            dkt[i] += du * stilde[i];
                        }
                        da[static_cast<size_t>(t - t0)] += dot(dsv.data(), sprev, s.Dk);
                        if (state_restarts(seg, t, s.T, b)) std::fill(dsj, dsj + Dk, 0.0f);
                        else
                            for (size_t i = 0; i < Dk; ++i) dsj[i] = a * dsv[i];
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
