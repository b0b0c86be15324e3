#include <algorithm>
#include "reference.h"

#include <cmath>

namespace ref {

DT permute(const DT & x, int a0, int a1, int a2, int a3) {
    const int a[4] = {a0, a1, a2, a3};
    std::array<int64_t, 4> ne{};
    for (int i = 0; i < 4; ++i) ne[static_cast<size_t>(a[i])] = x.ne[static_cast<size_t>(i)];
    DT y(ne);
    for (int64_t i3 = 0; i3 < x.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < x.ne[2]; ++i2)
    for (int64_t i1 = 0; i1 < x.ne[1]; ++i1)
    for (int64_t i0 = 0; i0 < x.ne[0]; ++i0) {
        const int64_t s[4] = {i0, i1, i2, i3};
        int64_t d[4];
        for (int i = 0; i < 4; ++i) d[a[i]] = s[i];
        y(d[0], d[1], d[2], d[3]) = x(i0, i1, i2, i3);
    }
    return y;
}

namespace {

template <typename F>
DT broadcast(const DT & a, const DT & b, F f) {
    DT y(a.ne);
    for (int64_t i3 = 0; i3 < a.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < a.ne[2]; ++i2)
    for (int64_t i1 = 0; i1 < a.ne[1]; ++i1)
    for (int64_t i0 = 0; i0 < a.ne[0]; ++i0)
        y(i0, i1, i2, i3) = f(a(i0, i1, i2, i3), b(i0 % b.ne[0], i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]));
    return y;
}

template <typename F>
DT map(const DT & x, F f) {
    DT y(x.ne);
    for (size_t i = 0; i < x.v.size(); ++i) y.v[i] = f(x.v[i]);
    return y;
}

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

} // namespace

DT add(const DT & a, const DT & b) { return broadcast(a, b, [](double x, double y) { return x + y; }); }
DT mul(const DT & a, const DT & b) { return broadcast(a, b, [](double x, double y) { return x * y; }); }
DT scale(const DT & x, double s) { return map(x, [s](double v) { return v * s; }); }
DT silu(const DT & x) { return map(x, [](double v) { return v * sig(v); }); }

DT swiglu(const DT & g, const DT & u) {
    DT y(g.ne);
    for (size_t i = 0; i < g.v.size(); ++i) y.v[i] = g.v[i] * sig(g.v[i]) * u.v[i];
    return y;
}

DT swiglu_oai(const DT & g, const DT & u, double alpha, double limit) {
    DT y(g.ne);
    for (size_t i = 0; i < g.v.size(); ++i) {
        const double x = std::min(g.v[i], limit), up = std::clamp(u.v[i], -limit, limit);
        y.v[i] = x / (1 + std::exp(-alpha * x)) * (up + 1);
    }
    return y;
}

DT geglu(const DT & g, const DT & u) {
    const double c = std::sqrt(2.0 / M_PI);
    DT y(g.ne);
    for (size_t i = 0; i < g.v.size(); ++i) {
        const double x = g.v[i];
        y.v[i] = 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x))) * u.v[i];
    }
    return y;
}

DT softmax(const DT & x) {
    DT y(x.ne);
    const int64_t n0 = x.ne[0], rows = x.size() / n0;
    for (int64_t r = 0; r < rows; ++r) {
        double mx = -INFINITY, s = 0.0;
        for (int64_t i = 0; i < n0; ++i) mx = std::fmax(mx, x.v[static_cast<size_t>(r * n0 + i)]);
        for (int64_t i = 0; i < n0; ++i) s += std::exp(x.v[static_cast<size_t>(r * n0 + i)] - mx);
        for (int64_t i = 0; i < n0; ++i)
            y.v[static_cast<size_t>(r * n0 + i)] = std::exp(x.v[static_cast<size_t>(r * n0 + i)] - mx) / s;
    }
    return y;
}

DT sum(const DT & x) {
    DT y({1, 1, 1, 1});
    for (double v : x.v) y.v[0] += v;
    return y;
}

DT mean(const DT & x) {
    DT y = sum(x);
    y.v[0] /= static_cast<double>(x.size());
    return y;
}

DT repeat(const DT & x, std::array<int64_t, 4> ne) {
    DT y(ne);
    for (int64_t i3 = 0; i3 < ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < ne[2]; ++i2)
    for (int64_t i1 = 0; i1 < ne[1]; ++i1)
    for (int64_t i0 = 0; i0 < ne[0]; ++i0)
        y(i0, i1, i2, i3) = x(i0 % x.ne[0], i1 % x.ne[1], i2 % x.ne[2], i3 % x.ne[3]);
    return y;
}

DT sum_to(const DT & x, std::array<int64_t, 4> ne) {
    DT y(ne);
    for (int64_t i3 = 0; i3 < x.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < x.ne[2]; ++i2)
    for (int64_t i1 = 0; i1 < x.ne[1]; ++i1)
    for (int64_t i0 = 0; i0 < x.ne[0]; ++i0)
        y(i0 % ne[0], i1 % ne[1], i2 % ne[2], i3 % ne[3]) += x(i0, i1, i2, i3);
    return y;
}

DT rms_norm(const DT & x, const DT * w, double eps) {
    DT y(x.ne);
    const int64_t n0 = x.ne[0], rows = x.size() / n0;
    for (int64_t r = 0; r < rows; ++r) {
        double ss = 0.0;
        for (int64_t i = 0; i < n0; ++i) ss += x.v[static_cast<size_t>(r * n0 + i)] * x.v[static_cast<size_t>(r * n0 + i)];
        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n0) + eps);
        for (int64_t i = 0; i < n0; ++i)
            y.v[static_cast<size_t>(r * n0 + i)] = x.v[static_cast<size_t>(r * n0 + i)] * inv * (w ? w->v[static_cast<size_t>(i)] : 1.0);
    }
    return y;
}

DT rope_yarn(const DT & x, const std::vector<int32_t> & pos, int n_rot, int mode, double base, double fscale, double ext_factor,
             double attn_factor, double beta_fast, double beta_slow, int n_ctx_orig, const std::vector<double> * ff) {
    // The dimension (pair index x 2) whose wavelength rotates beta times in n_ctx_orig tokens.
    auto corr_dim = [&](double beta) { return n_rot * std::log(n_ctx_orig / (beta * 2 * M_PI)) / (2 * std::log(base)); };
    const double low = std::max(0.0, std::floor(corr_dim(beta_fast)));
    const double high = std::min(n_rot - 1.0, std::ceil(corr_dim(beta_slow)));
    const double mscale = attn_factor * (ext_factor != 0 ? 1 + 0.1 * std::log(1 / fscale) : 1.0);
    DT y = x;
    for (int64_t i3 = 0; i3 < x.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < x.ne[2]; ++i2) {
        const int64_t pi = static_cast<int64_t>(pos.size()) == x.ne[2] ? i2 : i2 + i3 * x.ne[2];
        const double p = pos[static_cast<size_t>(pi)];
        for (int64_t i1 = 0; i1 < x.ne[1]; ++i1)
            for (int i = 0; i < n_rot / 2; ++i) {
                const double extrap = p * std::pow(base, -2.0 * i / n_rot) / (ff ? (*ff)[static_cast<size_t>(i)] : 1.0),
                             interp = fscale * extrap;
                const double ramp = 1 - std::min(1.0, std::max(0.0, (i - low) / std::max(0.001, high - low)));
                const double mix = ramp * ext_factor;
                const double theta = interp * (1 - mix) + extrap * mix;
                const int64_t a = mode == 2 ? i : 2 * i;
                const int64_t b = mode == 2 ? i + n_rot / 2 : 2 * i + 1;
                const double x0 = x(a, i1, i2, i3), x1 = x(b, i1, i2, i3);
                y(a, i1, i2, i3) = mscale * (x0 * std::cos(theta) - x1 * std::sin(theta));
                y(b, i1, i2, i3) = mscale * (x0 * std::sin(theta) + x1 * std::cos(theta));
            }
    }
    return y;
}

DT rope(const DT & x, const std::vector<int32_t> & pos, int n_rot, int mode, double base, double fscale) {
    return rope_yarn(x, pos, n_rot, mode, base, fscale, 0.0, 1.0, 32.0, 1.0, 0);  // no YaRN: the interpolated angle, scale 1
}

DT get_rows(const DT & table, const std::vector<int32_t> & ids, int64_t T, int64_t B) {
    DT y({table.ne[0], T, B, 1});
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
            for (int64_t c = 0; c < table.ne[0]; ++c) y(c, t, b) = table(c, ids[static_cast<size_t>(t + b * T)]);
    return y;
}

DT mul_mat(const DT & W, const DT & X) {
    const int64_t K = W.ne[0], N = W.ne[1];
    DT y({N, X.ne[1], X.ne[2], X.ne[3]});
    const int64_t r2 = X.ne[2] / W.ne[2], r3 = X.ne[3] / W.ne[3];
    for (int64_t i3 = 0; i3 < X.ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < X.ne[2]; ++i2)
    for (int64_t t = 0; t < X.ne[1]; ++t)
    for (int64_t n = 0; n < N; ++n) {
        double s = 0.0;
        for (int64_t k = 0; k < K; ++k) s += W(k, n, i2 / r2, i3 / r3) * X(k, t, i2, i3);
        y(n, t, i2, i3) = s;
    }
    return y;
}

DT attention(const DT & q, const DT & k, const DT & v, double scale, const std::vector<int32_t> & key_start, const DT * sinks,
             int64_t window, double softcap) {
    const int64_t D = q.ne[0], Hq = q.ne[1], Tq = q.ne[2], B = q.ne[3], Hkv = k.ne[1], Tk = k.ne[2];
    DT o(q.ne);
    std::vector<double> p(static_cast<size_t>(Tk));
    for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
    for (int64_t t = 0; t < Tq; ++t) {
        const int64_t hk = h / (Hq / Hkv);
        const int64_t last = t + (Tk - Tq);
        int64_t first = key_start.empty() ? 0 : key_start[static_cast<size_t>(b * Tq + t)];
        if (window > 0) first = std::max<int64_t>(first, last - window + 1);
        first = std::clamp<int64_t>(first, 0, last);
        double mx = -INFINITY;
        for (int64_t j = first; j <= last; ++j) {
            double s = 0.0;
            for (int64_t d = 0; d < D; ++d) s += q(d, h, t, b) * k(d, hk, j, b);
            p[static_cast<size_t>(j)] = softcap > 0 ? softcap * std::tanh(s * scale / softcap) : s * scale;
            mx = std::fmax(mx, p[static_cast<size_t>(j)]);
        }
        if (sinks) mx = std::fmax(mx, (*sinks)(h, 0, 0, 0));
        double z = sinks ? std::exp((*sinks)(h, 0, 0, 0) - mx) : 0.0;
        for (int64_t j = first; j <= last; ++j) { p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx); z += p[static_cast<size_t>(j)]; }
        for (int64_t d = 0; d < D; ++d) {
            double s = 0.0;
            for (int64_t j = first; j <= last; ++j) s += p[static_cast<size_t>(j)] * v(d, hk, j, b);
            o(d, h, t, b) = s / z;
        }
    }
    return o;
}

DT lm_head_ce(const DT & h, const DT & W, const std::vector<int32_t> & labels, double loss_scale, double softcap) {
    const int64_t C = h.ne[0], T = h.ne[1], V = W.ne[1];
    DT y({1, 1, 1, 1});
    std::vector<double> logit(static_cast<size_t>(V));
    for (int64_t t = 0; t < T; ++t) {
        const int32_t lab = labels[static_cast<size_t>(t)];
        if (lab < 0) continue;
        double mx = -INFINITY;
        for (int64_t n = 0; n < V; ++n) {
            double s = 0.0;
            for (int64_t c = 0; c < C; ++c) s += W(c, n) * h(c, t);
            if (softcap > 0) s = softcap * std::tanh(s / softcap);
            logit[static_cast<size_t>(n)] = s;
            mx = std::fmax(mx, s);
        }
        double z = 0.0;
        for (double l : logit) z += std::exp(l - mx);
        const double log_softmax = logit[static_cast<size_t>(lab)] - mx - std::log(z);
        y.v[0] += loss_scale * -log_softmax;
    }
    return y;
}

DT sigmoid(const DT & x) { return map(x, [](double v) { return sig(v); }); }

DT softplus(const DT & x) { return map(x, [](double v) { return std::log1p(std::exp(v)); }); }

DT l2_norm(const DT & x, double eps) {
    DT y(x.ne);
    const int64_t n0 = x.ne[0], rows = x.size() / n0;
    for (int64_t r = 0; r < rows; ++r) {
        double ss = 0.0;
        for (int64_t i = 0; i < n0; ++i) ss += x.v[static_cast<size_t>(r * n0 + i)] * x.v[static_cast<size_t>(r * n0 + i)];
        const double inv = 1.0 / std::max(std::sqrt(ss), eps);
        for (int64_t i = 0; i < n0; ++i) y.v[static_cast<size_t>(r * n0 + i)] = x.v[static_cast<size_t>(r * n0 + i)] * inv;
    }
    return y;
}

DT ssm_conv(const DT & x, const DT & w, const DT * prefix, const std::vector<int32_t> & seg_start) {
    const int64_t C = x.ne[0], T = x.ne[1], B = x.ne[2], K = w.ne[0];
    DT y(x.ne);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
            const int64_t start = seg_start.empty() ? 0 : seg_start[static_cast<size_t>(t + T * b)];
            for (int64_t c = 0; c < C; ++c) {
                double acc = 0.0;
                for (int64_t j = 0; j < K; ++j) {
                    const int64_t tau = t + j - (K - 1);
                    double xv = 0.0;
                    if (tau >= 0) xv = tau >= start ? x(c, tau, b) : 0.0;
                    else if (prefix) xv = (*prefix)(c, tau + K - 1, b);
                    acc += w(j, c) * xv;
                }
                y(c, t, b) = acc;
            }
        }
    return y;
}

DT delta_net(const DT & q, const DT & k, const DT & v, const DT & g, const DT & beta, double scale, const DT * state0,
             const std::vector<int32_t> & seg_start, DT * out_state) {
    const int64_t Dk = q.ne[0], Hk = q.ne[1], T = q.ne[2], B = q.ne[3], Dv = v.ne[0], Hv = v.ne[1];
    DT o(v.ne);
    if (out_state) *out_state = DT({Dk, Dv, Hv, B});
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hv; ++h) {
            const int64_t hk = h % Hk;
            std::vector<double> S(static_cast<size_t>(Dk * Dv), 0.0);  // S[i + Dk * j]
            if (state0)
                for (int64_t j = 0; j < Dv; ++j)
                    for (int64_t i = 0; i < Dk; ++i) S[static_cast<size_t>(i + Dk * j)] = (*state0)(i, j, h, b);
            for (int64_t t = 0; t < T; ++t) {
                if (!seg_start.empty() && t > 0 && seg_start[static_cast<size_t>(t + T * b)] == t) std::fill(S.begin(), S.end(), 0.0);
                const double a = std::exp(g.v[static_cast<size_t>(h + Hv * (t + T * b))]);
                const double bt = beta.v[static_cast<size_t>(h + Hv * (t + T * b))];
                for (double & e : S) e *= a;
                for (int64_t j = 0; j < Dv; ++j) {
                    double u = 0.0;
                    for (int64_t i = 0; i < Dk; ++i) u += S[static_cast<size_t>(i + Dk * j)] * k(i, hk, t, b);
                    const double d = bt * (v(j, h, t, b) - u);
                    for (int64_t i = 0; i < Dk; ++i) S[static_cast<size_t>(i + Dk * j)] += k(i, hk, t, b) * d;
                }
                for (int64_t j = 0; j < Dv; ++j) {
                    double acc = 0.0;
                    for (int64_t i = 0; i < Dk; ++i) acc += S[static_cast<size_t>(i + Dk * j)] * q(i, hk, t, b);
                    o(j, h, t, b) = scale * acc;
                }
            }
            if (out_state)
                for (int64_t j = 0; j < Dv; ++j)
                    for (int64_t i = 0; i < Dk; ++i) (*out_state)(i, j, h, b) = S[static_cast<size_t>(i + Dk * j)];
        }
    return o;
}

} // namespace ref
