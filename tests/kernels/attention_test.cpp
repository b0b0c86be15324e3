// attention_fwd / attention_bwd against a naive double-precision softmax attention written here: outputs and
// logsumexp directly; gradients against central finite differences of the double reference (and, for the
// larger shapes, against the closed-form double backward, itself checked against finite differences).
#include "ggml_rp/cpu/attention.h"
#include "ggml_rp/cpu/gemm.h"
#include "ggml_rp/cpu/vec_math.h"
#include "base/error.h"
#include "kernels_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace kt;
using rp::cpu::AttentionShape;

std::string describe(const AttentionShape & s) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "D=%lld Hq=%lld Hkv=%lld Tq=%lld Tk=%lld B=%lld", (long long)s.D, (long long)s.Hq,
                  (long long)s.Hkv, (long long)s.Tq, (long long)s.Tk, (long long)s.B);
    return buf;
}

AttentionShape make_shape(int64_t D, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t B) {
    return {D, Hq, Hkv, Tq, Tk, B, float(1.0 / std::sqrt(double(D)))};
}

struct Inputs {
    std::vector<float> q, k, v;
};
Inputs make_inputs(const AttentionShape & s, Rng & rng, float amp = 1.0f) {
    return {random_floats(size_t(s.D * s.Hq * s.Tq * s.B), rng, amp),
            random_floats(size_t(s.D * s.Hkv * s.Tk * s.B), rng, amp),
            random_floats(size_t(s.D * s.Hkv * s.Tk * s.B), rng, amp)};
}

size_t qi(const AttentionShape & s, int64_t b, int64_t t, int64_t h) { return size_t(((b * s.Tq + t) * s.Hq + h) * s.D); }
size_t ki(const AttentionShape & s, int64_t b, int64_t j, int64_t h) { return size_t(((b * s.Tk + j) * s.Hkv + h) * s.D); }

// Naive causal softmax attention in double: o [D, Hq, Tq, B], lse [Hq, Tq, B].
// When bounds is given, it receives per output element [o..., lse...] a first-order bound of the float error:
// score errors of a D-term float dot product ((D+2) u scale sum|q k|), exp error (vec_exp: 3e-7) and
// roundings of the T-term sums, propagated through softmax.
void reference_forward(const AttentionShape & s, const std::vector<double> & q, const std::vector<double> & k,
                       const std::vector<double> & v, std::vector<double> & o, std::vector<double> & lse,
                       std::vector<double> * bounds = nullptr) {
    o.assign(size_t(s.D * s.Hq * s.Tq * s.B), 0.0);
    lse.assign(size_t(s.Hq * s.Tq * s.B), 0.0);
    const double u = std::ldexp(1.0, -24);
    if (bounds) bounds->assign(o.size() + lse.size(), 0.0);
    const int64_t G = s.Hq / s.Hkv;
    std::vector<double> sc(size_t(s.Tk));
    for (int64_t b = 0; b < s.B; ++b)
        for (int64_t t = 0; t < s.Tq; ++t)
            for (int64_t h = 0; h < s.Hq; ++h) {
                const int64_t nvis = t + (s.Tk - s.Tq) + 1;
                double mx = -std::numeric_limits<double>::infinity(), abs_dot = 0.0;
                for (int64_t j = 0; j < nvis; ++j) {
                    double d = 0.0, a = 0.0;
                    for (int64_t e = 0; e < s.D; ++e) {
                        d += q[qi(s, b, t, h) + e] * k[ki(s, b, j, h / G) + e];
                        a += std::fabs(q[qi(s, b, t, h) + e] * k[ki(s, b, j, h / G) + e]);
                    }
                    sc[size_t(j)] = d * double(s.scale);
                    mx = std::max(mx, sc[size_t(j)]);
                    abs_dot = std::max(abs_dot, a);
                }
                double l = 0.0;
                for (int64_t j = 0; j < nvis; ++j) l += std::exp(sc[size_t(j)] - mx);
                for (int64_t j = 0; j < nvis; ++j) {
                    const double p = std::exp(sc[size_t(j)] - mx) / l;
                    for (int64_t e = 0; e < s.D; ++e) o[qi(s, b, t, h) + e] += p * v[ki(s, b, j, h / G) + e];
                }
                const size_t r = size_t((b * s.Tq + t) * s.Hq + h);
                lse[r] = mx + std::log(l);
                if (bounds) {
                    const double ds = double(s.D + 2) * u * double(s.scale) * abs_dot + 2 * u * std::fabs(mx);
                    const double dp = 2 * ds + 2 * 3e-7 + double(nvis + 4) * u;   // relative, on each p_j
                    (*bounds)[o.size() + r] = ds + double(nvis + 4) * u + 3e-7 + 2 * u * std::fabs(lse[r]);
                    for (int64_t e = 0; e < s.D; ++e) {
                        double pv = 0.0;
                        for (int64_t j = 0; j < nvis; ++j)
                            pv += std::exp(sc[size_t(j)] - mx) / l * std::fabs(v[ki(s, b, j, h / G) + e]);
                        (*bounds)[qi(s, b, t, h) + e] = (dp + double(nvis + 4) * u) * pv + 1e-30;
                    }
                }
            }
}

std::vector<double> to_double(const std::vector<float> & x) { return std::vector<double>(x.begin(), x.end()); }

// Closed-form double backward of L = sum(dout * o): the textbook softmax-attention gradient.
void reference_backward(const AttentionShape & s, const std::vector<double> & q, const std::vector<double> & k,
                        const std::vector<double> & v, const std::vector<double> & dout, std::vector<double> & dq,
                        std::vector<double> & dk, std::vector<double> & dv) {
    dq.assign(q.size(), 0.0);
    dk.assign(k.size(), 0.0);
    dv.assign(v.size(), 0.0);
    const int64_t G = s.Hq / s.Hkv;
    std::vector<double> p(size_t(s.Tk)), dp(size_t(s.Tk));
    for (int64_t b = 0; b < s.B; ++b)
        for (int64_t t = 0; t < s.Tq; ++t)
            for (int64_t h = 0; h < s.Hq; ++h) {
                const int64_t hk = h / G, nvis = t + (s.Tk - s.Tq) + 1;
                double mx = -std::numeric_limits<double>::infinity();
                for (int64_t j = 0; j < nvis; ++j) {
                    double d = 0.0;
                    for (int64_t e = 0; e < s.D; ++e) d += q[qi(s, b, t, h) + e] * k[ki(s, b, j, hk) + e];
                    p[size_t(j)] = d * double(s.scale);
                    mx = std::max(mx, p[size_t(j)]);
                }
                double l = 0.0;
                for (int64_t j = 0; j < nvis; ++j) l += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
                double Di = 0.0;
                for (int64_t j = 0; j < nvis; ++j) {
                    p[size_t(j)] /= l;
                    double d = 0.0;
                    for (int64_t e = 0; e < s.D; ++e) d += dout[qi(s, b, t, h) + e] * v[ki(s, b, j, hk) + e];
                    dp[size_t(j)] = d;
                    Di += p[size_t(j)] * d;
                }
                for (int64_t j = 0; j < nvis; ++j) {
                    const double ds = p[size_t(j)] * (dp[size_t(j)] - Di) * double(s.scale);
                    for (int64_t e = 0; e < s.D; ++e) {
                        dv[ki(s, b, j, hk) + e] += p[size_t(j)] * dout[qi(s, b, t, h) + e];
                        dq[qi(s, b, t, h) + e] += ds * k[ki(s, b, j, hk) + e];
                        dk[ki(s, b, j, hk) + e] += ds * q[qi(s, b, t, h) + e];
                    }
                }
            }
}

double max_abs(const std::vector<double> & x) {
    double m = 0.0;
    for (double v : x) m = std::max(m, std::fabs(v));
    return m;
}

// max |got - ref| / max |ref|
double rel_max_error(const std::vector<float> & got, const std::vector<double> & ref) {
    double e = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) e = std::max(e, std::fabs(double(got[i]) - ref[i]));
    return e / std::max(max_abs(ref), 1e-300);
}

void check_forward(const AttentionShape & s, uint64_t seed) {
    Rng rng(seed);
    const Inputs in = make_inputs(s, rng, 2.0f);   // amplitude 2: peaked softmax rows
    std::vector<float> o(in.q.size()), lse(size_t(s.Hq * s.Tq * s.B));
    rp::cpu::attention_fwd(s, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data());
    std::vector<double> ro, rl, bound;
    reference_forward(s, to_double(in.q), to_double(in.k), to_double(in.v), ro, rl, &bound);
    double eo = 0.0, el = 0.0, ratio = 0.0;
    for (size_t i = 0; i < ro.size() + rl.size(); ++i) {
        const bool is_o = i < ro.size();
        const double err = is_o ? std::fabs(double(o[i]) - ro[i]) : std::fabs(double(lse[i - ro.size()]) - rl[i - ro.size()]);
        (is_o ? eo : el) = std::max(is_o ? eo : el, err);
        ratio = std::max(ratio, err / bound[i]);
        if (!(err <= bound[i])) {
            ADD_FAILURE() << describe(s) << (is_o ? ": o[" : ": lse[") << (is_o ? i : i - ro.size()) << "] error "
                          << err << " above its bound " << bound[i];
            return;
        }
    }
    std::printf("  attention_fwd %s: max |o - ref| %.2e, max |lse - ref| %.2e, worst error/bound %.3f\n",
                describe(s).c_str(), eo, el, ratio);
}

TEST(Attention, ForwardMatchesNaiveDouble) {
    check_forward(make_shape(8, 4, 4, 300, 300, 2), 1);     // group 1, T up to 300
    check_forward(make_shape(48, 4, 2, 100, 250, 1), 2);    // group 2, Tq < Tk (KV-cache offset)
    check_forward(make_shape(64, 8, 2, 130, 130, 1), 3);    // group 4
    check_forward(make_shape(128, 2, 1, 65, 300, 1), 4);    // group 2, Tq < Tk
    check_forward(make_shape(256, 4, 1, 129, 129, 1), 5);   // group 4, largest head_dim
    check_forward(make_shape(64, 4, 4, 1, 200, 2), 6);      // one query (decoding)
    // the small-head kernels (attention_blocks.h) at head_dim 16, odd row and key counts; 24 and 32 (GEMM)
    check_forward(make_shape(16, 4, 2, 77, 141, 1), 8);
    check_forward(make_shape(24, 2, 1, 130, 130, 2), 9);
    check_forward(make_shape(32, 4, 4, 3, 67, 1), 10);
    check_forward(make_shape(128, 2, 2, 64, 64, 1), 7);     // exactly one block
}

// Float gradients of L = sum(dout * o) against central differences of the double reference.
struct GradCase {
    AttentionShape s;
    int64_t samples;   // 0: every element; else that many random elements per input (plus first and last)
};

double fd_check(const GradCase & c, uint64_t seed) {
    const AttentionShape & s = c.s;
    Rng rng(seed);
    const Inputs in = make_inputs(s, rng);
    const std::vector<float> dout = random_floats(in.q.size(), rng);
    std::vector<float> o(in.q.size()), lse(size_t(s.Hq * s.Tq * s.B));
    rp::cpu::attention_fwd(s, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data());
    std::vector<float> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
    rp::cpu::attention_bwd(s, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), dout.data(), dq.data(),
                           dk.data(), dv.data());

    std::vector<double> x[3] = {to_double(in.q), to_double(in.k), to_double(in.v)};
    const std::vector<double> dd = to_double(dout);
    auto loss = [&]() {
        std::vector<double> ro, rl;
        reference_forward(s, x[0], x[1], x[2], ro, rl);
        double L = 0.0;
        for (size_t i = 0; i < ro.size(); ++i) L += dd[i] * ro[i];
        return L;
    };
    const std::vector<float> * got[3] = {&dq, &dk, &dv};
    const char * names[3] = {"dq", "dk", "dv"};
    double worst = 0.0;
    const double eps = 1e-3;
    for (int a = 0; a < 3; ++a) {
        const size_t n = x[a].size();
        std::vector<size_t> idx;
        if (c.samples == 0) {
            for (size_t i = 0; i < n; ++i) idx.push_back(i);
        } else {
            idx = {0, n - 1};
            for (int64_t i = 0; i < c.samples; ++i) idx.push_back(size_t(rng.below(int64_t(n))));
        }
        std::vector<double> fd, g;
        for (size_t i : idx) {
            const double x0 = x[a][i];
            x[a][i] = x0 + eps;
            const double lp = loss();
            x[a][i] = x0 - eps;
            const double lm = loss();
            x[a][i] = x0;
            fd.push_back((lp - lm) / (2 * eps));
            g.push_back((*got[a])[i]);
        }
        double e = 0.0;
        for (size_t i = 0; i < fd.size(); ++i) e = std::max(e, std::fabs(g[i] - fd[i]));
        e /= std::max(max_abs(fd), 1e-300);
        std::printf("  attention_bwd %s %s vs finite differences (%zu elements): rel max error %.2e\n",
                    describe(s).c_str(), names[a], idx.size(), e);
        worst = std::max(worst, e);
    }
    return worst;
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
    const GradCase cases[] = {
        {make_shape(8, 4, 2, 9, 9, 2), 0},       // group 2, two sequences, every element
        {make_shape(8, 2, 1, 70, 70, 1), 0},     // crosses the 64-query and 64-key blocks
        {make_shape(16, 4, 1, 5, 67, 1), 0},     // group 4, Tq < Tk over two key blocks
        {make_shape(48, 2, 2, 20, 30, 1), 150},  // group 1, sampled
    };
    uint64_t seed = 40;
    for (const GradCase & c : cases) EXPECT_LT(fd_check(c, ++seed), 1e-3) << describe(c.s);
}

// The closed-form double backward agrees with finite differences (so it can stand in for them below).
TEST(Attention, ReferenceBackwardMatchesFiniteDifferences) {
    const AttentionShape s = make_shape(8, 4, 2, 6, 11, 1);
    Rng rng(50);
    const Inputs in = make_inputs(s, rng);
    std::vector<double> x[3] = {to_double(in.q), to_double(in.k), to_double(in.v)};
    const std::vector<double> dd = to_double(random_floats(in.q.size(), rng));
    std::vector<double> g[3];
    reference_backward(s, x[0], x[1], x[2], dd, g[0], g[1], g[2]);
    const double eps = 1e-4;
    for (int a = 0; a < 3; ++a)
        for (size_t i = 0; i < x[a].size(); ++i) {
            auto loss = [&]() {
                std::vector<double> ro, rl;
                reference_forward(s, x[0], x[1], x[2], ro, rl);
                double L = 0.0;
                for (size_t j = 0; j < ro.size(); ++j) L += dd[j] * ro[j];
                return L;
            };
            const double x0 = x[a][i];
            x[a][i] = x0 + eps;
            const double lp = loss();
            x[a][i] = x0 - eps;
            const double lm = loss();
            x[a][i] = x0;
            ASSERT_NEAR(g[a][i], (lp - lm) / (2 * eps), 1e-7) << "input " << a << " element " << i;
        }
}

// Larger shapes (every head_dim, group size and the KV offset): float gradients against the double backward.
TEST(Attention, BackwardMatchesDoubleReferenceLarge) {
    const AttentionShape shapes[] = {
        make_shape(64, 4, 1, 150, 150, 1),   // group 4
        make_shape(128, 2, 1, 70, 200, 1),   // group 2, Tq < Tk
        make_shape(256, 2, 2, 130, 130, 1),  // group 1
        make_shape(48, 4, 2, 100, 300, 1),   // T up to 300
        make_shape(8, 8, 4, 256, 256, 1),    // stories260K's heads (the small-head kernels)
        make_shape(16, 4, 2, 71, 135, 2),    // odd rows and keys (small-head kernels)
        make_shape(32, 4, 4, 150, 150, 1),
    };
    uint64_t seed = 60;
    for (const AttentionShape & s : shapes) {
        Rng rng(++seed);
        const Inputs in = make_inputs(s, rng, 2.0f);
        const std::vector<float> dout = random_floats(in.q.size(), rng);
        std::vector<float> o(in.q.size()), lse(size_t(s.Hq * s.Tq * s.B));
        rp::cpu::attention_fwd(s, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data());
        std::vector<float> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
        rp::cpu::attention_bwd(s, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), dout.data(), dq.data(),
                               dk.data(), dv.data());
        std::vector<double> rq, rk, rv;
        reference_backward(s, to_double(in.q), to_double(in.k), to_double(in.v), to_double(dout), rq, rk, rv);
        const double eq = rel_max_error(dq, rq), ek = rel_max_error(dk, rk), ev = rel_max_error(dv, rv);
        std::printf("  attention_bwd %s vs double backward: rel max error dq %.2e dk %.2e dv %.2e\n",
                    describe(s).c_str(), eq, ek, ev);
        EXPECT_LT(std::max({eq, ek, ev}), 1e-4) << describe(s);
    }
}

// Forward and backward outputs for one shape, with the threads given (and key_start: packed documents).
std::vector<std::vector<float>> run_attention(const AttentionShape & s, uint64_t seed, int threads, const int32_t * key_start = nullptr) {
    Rng rng(seed);
    const Inputs in = make_inputs(s, rng);
    const std::vector<float> dout = random_floats(in.q.size(), rng);
    ScopedThreads th(threads);
    std::vector<float> o(in.q.size()), lse(size_t(s.Hq * s.Tq * s.B));
    std::vector<float> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
    rp::cpu::attention_fwd(s, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), key_start);
    rp::cpu::attention_bwd(s, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                           dv.data(), key_start);
    return {o, lse, dq, dk, dv};
}

// The small-head kernels' vector tiles against their scalar form (what a build without AVX2 runs): the same
// bits, for every head_dim they take, with row and key counts that leave partial tiles.
TEST(Attention, SmallHeadVectorTilesAreTheScalarForm) {
    for (const AttentionShape & s : {make_shape(8, 8, 4, 131, 131, 1), make_shape(16, 2, 1, 70, 93, 2), make_shape(8, 3, 3, 45, 45, 1),
                                     make_shape(16, 2, 2, 1, 100, 1)}) {
        const auto simd = run_attention(s, 80, 2);
        rp::cpu::set_gemm_backend(rp::cpu::GemmBackend::Portable);
        const auto scalar = run_attention(s, 80, 2);
        rp::cpu::set_gemm_backend(rp::cpu::GemmBackend::Auto);
        for (size_t i = 0; i < simd.size(); ++i) EXPECT_TRUE(bit_equal(simd[i], scalar[i])) << describe(s) << " output " << i;
    }
}

// The backward's second pass reads the dS blocks its first pass kept, or recomputes them: the same bits, with
// the causal diagonal, a KV offset (Tq < Tk), groups and packed documents.
TEST(Attention, KeptAndRecomputedDsGiveTheSameBits) {
    for (const AttentionShape & s : {make_shape(8, 8, 4, 200, 200, 2), make_shape(64, 4, 2, 70, 150, 1), make_shape(16, 2, 2, 129, 129, 1)}) {
        const auto kept = run_attention(s, 85, 2);
        rp::cpu::set_attention_kept_ds_bytes(0);
        const auto recomputed = run_attention(s, 85, 2);
        rp::cpu::set_attention_kept_ds_bytes(size_t(32) << 20);
        for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(bit_equal(kept[i], recomputed[i])) << describe(s) << " output " << i;
    }
    // Packed: documents of 3, 90 (crossing key blocks 64 and 128) and 107 tokens in each of 2 sequences.
    const AttentionShape s = make_shape(8, 4, 2, 200, 200, 2);
    std::vector<int32_t> ks;
    for (int b = 0; b < 2; ++b)
        for (int t = 0; t < 200; ++t) ks.push_back(t < 3 ? 0 : t < 93 ? 3 : 93);
    const auto kept = run_attention(s, 86, 2, ks.data());
    rp::cpu::set_attention_kept_ds_bytes(0);
    const auto recomputed = run_attention(s, 86, 2, ks.data());
    rp::cpu::set_attention_kept_ds_bytes(size_t(32) << 20);
    for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(bit_equal(kept[i], recomputed[i])) << "packed output " << i;
}

TEST(Attention, DeterministicAcrossThreadCounts) {
    for (const AttentionShape & s : {make_shape(64, 8, 2, 200, 260, 2), make_shape(8, 8, 4, 200, 260, 2)}) {
        const auto one = run_attention(s, 70, 1), two = run_attention(s, 70, 2);
        for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(bit_equal(one[i], two[i])) << describe(s) << " output " << i;
    }
}

TEST(Attention, BadShapesThrow) {
    std::vector<float> buf(1 << 12);
    float * p = buf.data();
    EXPECT_THROW(rp::cpu::attention_fwd(make_shape(8, 3, 2, 4, 4, 1), p, p, p, p, p), rp::Error);    // 3 % 2
    EXPECT_THROW(rp::cpu::attention_fwd(make_shape(8, 2, 2, 5, 4, 1), p, p, p, p, p), rp::Error);    // Tk < Tq
    EXPECT_THROW(rp::cpu::attention_fwd(make_shape(300, 1, 1, 2, 2, 1), p, p, p, p, p), rp::Error);  // D > 256
    EXPECT_THROW(rp::cpu::attention_bwd(make_shape(8, 2, 4, 4, 4, 1), p, p, p, p, p, p, p, p, p), rp::Error);
}

TEST(VecExp, MatchesStdExp) {
    double worst = 0.0;
    for (double x = -87.0; x <= 88.0; x += 0.00137) {
        const float xf = float(x);
        const double want = std::exp(double(xf));
        worst = std::max(worst, std::fabs(double(rp::cpu::vec_exp(xf)) - want) / want);
    }
    std::printf("  vec_exp max relative error %.2e\n", worst);
    EXPECT_LT(worst, 3e-7);
    EXPECT_EQ(rp::cpu::vec_exp(-std::numeric_limits<float>::infinity()), 0.0f);
    EXPECT_EQ(rp::cpu::vec_exp(-100.0f), 0.0f);
    EXPECT_EQ(rp::cpu::vec_exp(0.0f), 1.0f);
}

// The row form (8-lane vectors where the build has AVX2, a scalar tail) gives vec_exp(fma(x, mul, -sub))'s bits
// for every element, whichever lanes take it: ordinary values, the clamps, -inf, +inf and NaN, odd lengths.
// exp_affine_sum writes exp_affine's values and sums them in its documented order; max_of is the max.
TEST(VecExp, SumAndMaxInTheirDocumentedOrder) {
    Rng rng(90);
    for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(64), size_t(131)}) {
        std::vector<float> x = random_floats(n, rng), y(n), want(n);
        for (float & v : x) v *= 6.0f;
        const float sum = rp::cpu::exp_affine_sum(x.data(), y.data(), int64_t(n), 0.35355339f, 1.25f);
        rp::cpu::exp_affine(x.data(), want.data(), int64_t(n), 0.35355339f, 1.25f);
        EXPECT_TRUE(bit_equal(y, want)) << n;
        float lanes[8] = {};
        size_t j = 0;
        for (; j + 8 <= n; j += 8)
            for (size_t l = 0; l < 8; ++l) lanes[l] += want[j + l];
        float s = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
        for (; j < n; ++j) s += want[j];
        EXPECT_EQ(std::bit_cast<uint32_t>(sum), std::bit_cast<uint32_t>(s)) << n;
        const float init = -3.0f;
        float mx = init;
        for (float v : x) mx = std::max(mx, v);
        EXPECT_EQ(rp::cpu::max_of(x.data(), int64_t(n), init), mx) << n;
    }
    const float nan_row[9] = {1.0f, std::numeric_limits<float>::quiet_NaN(), 5.0f, -2.0f, 0.0f, 3.0f, 4.0f, 2.0f,
                              std::numeric_limits<float>::quiet_NaN()};
    EXPECT_EQ(rp::cpu::max_of(nan_row, 9, -1.0f), 5.0f);   // NaNs are skipped, in the lanes and the tail
}

TEST(VecExp, RowFormIsTheScalarBitForBit) {
    std::vector<float> x;
    for (double v = -120.0; v <= 120.0; v += 0.0731) x.push_back(float(v));
    for (float v : {-std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN(), -87.0f, 88.0f, -0.0f, 1e-30f, -86.99999f})
        x.push_back(v);
    for (float mul : {1.0f, 0.35355339f})
        for (float sub : {0.0f, 3.25f, -1.5f})
            for (size_t n : {x.size(), size_t(1), size_t(7), size_t(9), size_t(17)}) {
                std::vector<float> y(n);
                rp::cpu::exp_affine(x.data() + (x.size() - n), y.data(), int64_t(n), mul, sub);
                for (size_t j = 0; j < n; ++j) {
                    const float want = rp::cpu::vec_exp(std::fma(x[x.size() - n + j], mul, -sub));
                    ASSERT_TRUE(std::bit_cast<uint32_t>(y[j]) == std::bit_cast<uint32_t>(want) || (std::isnan(y[j]) && std::isnan(want)))
                        << "x=" << x[x.size() - n + j] << " mul=" << mul << " sub=" << sub << ": " << y[j] << " vs " << want;
                }
            }
}

} // namespace
