// Quantized weights times many tokens in integer arithmetic (gemm_int8.h: the numerics and the layout).
#include "ggml_rp/cpu/gemm_int8.h"

#include "ggml_rp/cpu/matvec_dot.h"
#include "ggml_rp/cpu/parallel_tasks.h"
#include "ggml_rp/cpu/simd_bytes.h"
#include "ggml_rp/core/quant_block.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

// (GCC 12 warns of the 512-bit intrinsics' own undefined upper halves, _mm512_undefined_*, once inlined: a false
// positive of its headers, as in matvec_dot.cpp.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace rp::cpu {

using gguf::TensorType;

namespace {

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define RP_INT8_GEMM 512
// 16 rows a vector; a panel of R = 3 vectors (48 rows) times C = 4 tokens a call: 12 int32 and 12 float accumulators
// (measured against 2 x 4, 2 x 6, 4 x 3 and 1 x 8 on a 2-core Xeon: 3-15% faster).
struct Isa {
    static constexpr int L = 16, R = 3, C = 4;
    static constexpr bool kSignedQ8 = false;   // Q8_0 as q + 128: vpdpbusd's sums are exact in int32
    using VI = __m512i;
    using VF = __m512;
    static VI zero() { return _mm512_setzero_si512(); }
    static VI set1(int32_t v) { return _mm512_set1_epi32(v); }
    static VI load(const uint8_t * p) { return _mm512_loadu_si512(p); }
    // acc + per 32-bit lane the sum of its 4 products u_i x_i (u unsigned, x the 4 signed bytes of x4).
    static VI dot(VI acc, VI u, int32_t x4) { return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(x4)); }
    static VF cvt(VI v) { return _mm512_cvtepi32_ps(v); }
    static VF zerof() { return _mm512_setzero_ps(); }
    static VF loadf(const float * p) { return _mm512_loadu_ps(p); }
    static VF set1f(float v) { return _mm512_set1_ps(v); }
    static VF mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
    static VF fma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
    static VF fnma(VF a, VF b, VF c) { return _mm512_fnmadd_ps(a, b, c); }
    static void storef(float * p, VF v) { _mm512_storeu_ps(p, v); }
};
#elif defined(__AVX2__) && defined(__FMA__)
// The 256-bit kernels' vector operations.
struct Lanes256 {
    using VI = __m256i;
    using VF = __m256;
    static VI zero() { return _mm256_setzero_si256(); }
    static VI set1(int32_t v) { return _mm256_set1_epi32(v); }
    static VI load(const uint8_t * p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)); }
    static VF cvt(VI v) { return _mm256_cvtepi32_ps(v); }
    static VF zerof() { return _mm256_setzero_ps(); }
    static VF loadf(const float * p) { return _mm256_loadu_ps(p); }
    static VF set1f(float v) { return _mm256_set1_ps(v); }
    static VF mul(VF a, VF b) { return _mm256_mul_ps(a, b); }
    static VF fma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
    static VF fnma(VF a, VF b, VF c) { return _mm256_fnmadd_ps(a, b, c); }
    static void storef(float * p, VF v) { _mm256_storeu_ps(p, v); }
};
#if defined(__AVXVNNI__)
#define RP_INT8_GEMM 257   // (AVX-VNNI: vpdpbusd on 256 bits, as the AVX-512 path; Intel's desktop CPUs since 2021)
// 8 rows a vector; R = 2 vectors (16 rows) times C = 3 tokens a call: 6 int32 and 6 float accumulators of 16 ymm.
struct Isa : Lanes256 {
    static constexpr int L = 8, R = 2, C = 3;
    static constexpr bool kSignedQ8 = false;
    static VI dot(VI acc, VI u, int32_t x4) { return _mm256_dpbusd_avx_epi32(acc, u, _mm256_set1_epi32(x4)); }
};
#else
#define RP_INT8_GEMM 256
// 8 rows a vector; R = 2 vectors (16 rows) times C = 2 tokens a call (16 ymm registers; 1 x 3, 1 x 4, 1 x 6 and
// 3 x 2 measured the same or slower).
struct Isa : Lanes256 {
    static constexpr int L = 8, R = 2, C = 2;
    // vpmaddubsw adds two products in int16 with saturation: exact for unsigned operands up to 128 (every K-quant's
    // q), not for Q8_0's q + 128, which therefore stays signed: |q| times x with q's sign.
    static constexpr bool kSignedQ8 = true;
    static VI dot(VI acc, VI u, int32_t x4) { return dot_bytes(acc, u, _mm256_set1_epi32(x4)); }
    static VI dot_bytes(VI acc, VI u, VI x) {
        return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
    }
};
#endif
#endif

#if defined(RP_INT8_GEMM)

constexpr int P = Isa::L * Isa::R;   // rows per panel
constexpr int64_t kTokensPerPass = 512;  // tokens quantized at a time (bounds the columns' scratch to 512 K bytes)
constexpr int64_t kChunk = 1024;          // reduction elements per pass over the tokens (48 KiB of a 48-row panel)

// How a type is factored: sub-blocks of G elements, w = s (q - offset) - m with q the panel's unsigned byte, at most
// umax (Q8_0 on AVX2: its signed byte, |q| <= 127); mins: m is not 0.
struct Form {
    int G;
    int offset;
    bool mins;
    int umax;
};

constexpr Form form_of(TensorType t) {
    switch (t) {
    case TensorType::Q8_0: return Isa::kSignedQ8 ? Form{32, 0, false, 127} : Form{32, 128, false, 255};
    case TensorType::Q4_0: return {32, 8, false, 15};
    case TensorType::Q5_0: return {32, 16, false, 31};
    case TensorType::Q4_1: return {32, 0, true, 15};   // w = d q + m: m's negative as the min
    case TensorType::Q5_1: return {32, 0, true, 31};
    case TensorType::MXFP4: return {32, 12, false, 24};  // the doubled E2M1 value + 12
    case TensorType::Q2_K: return {16, 0, true, 3};
    case TensorType::Q3_K: return {16, 4, false, 7};     // q + 4 * (the high bit)
    case TensorType::Q4_K: return {32, 0, true, 15};
    case TensorType::Q5_K: return {32, 0, true, 31};
    case TensorType::Q6_K: return {16, 32, false, 63};
    default: return {0, 0, false, 0};
    }
}

inline int32_t load4(const int8_t * p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

using namespace simd;

// One row's K elements as the panel's bytes (element order), its sub-blocks' s and m (the row dots' factoring:
// s = d * float(sc), m = dmin * float(min)).
void decode_row(TensorType t, const void * row, int64_t K, uint8_t * u, float * s, float * m) {
    switch (t) {
    case TensorType::Q8_0: {
        const block_q8_0 * b = static_cast<const block_q8_0 *>(row);
        for (int64_t i = 0; i < K / 32; ++i) {
            s[i] = fp16_to_fp32(b[i].d);
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b[i].qs));
            store256(u + 32 * i, Isa::kSignedQ8 ? q : _mm256_xor_si256(q, _mm256_set1_epi8(char(0x80))));   // q + 128
        }
        return;
    }
    case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1: case TensorType::MXFP4: {
        // blocks of 32: element j in the low nibble of qs[j] (j < 16) or the high nibble of qs[j - 16]
        const size_t bytes = gguf::type_traits(uint32_t(t))->type_size;
        const __m128i m4 = _mm_set1_epi8(0x0F);
        const __m256i mx = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,   // value + 12
                                            12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
        for (int64_t i = 0; i < K / 32; ++i) {
            const uint8_t * blk = static_cast<const uint8_t *>(row) + size_t(i) * bytes;
            const uint8_t * qs = nullptr;
            uint32_t qh = 0;
            switch (t) {
            case TensorType::Q4_0: {
                const block_q4_0 & b = *reinterpret_cast<const block_q4_0 *>(blk);
                s[i] = fp16_to_fp32(b.d), qs = b.qs;
                break;
            }
            case TensorType::Q4_1: {
                const block_q4_1 & b = *reinterpret_cast<const block_q4_1 *>(blk);
                s[i] = fp16_to_fp32(b.d), m[i] = -fp16_to_fp32(b.m), qs = b.qs;
                break;
            }
            case TensorType::Q5_0: {
                const block_q5_0 & b = *reinterpret_cast<const block_q5_0 *>(blk);
                s[i] = fp16_to_fp32(b.d), qs = b.qs, qh = load_le32(b.qh);
                break;
            }
            case TensorType::Q5_1: {
                const block_q5_1 & b = *reinterpret_cast<const block_q5_1 *>(blk);
                s[i] = fp16_to_fp32(b.d), m[i] = -fp16_to_fp32(b.m), qs = b.qs, qh = load_le32(b.qh);
                break;
            }
            default: {
                const block_mxfp4 & b = *reinterpret_cast<const block_mxfp4 *>(blk);
                s[i] = e8m0_to_fp32_half(b.e), qs = b.qs;
            }
            }
            const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i *>(qs));
            __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
            if (t == TensorType::Q5_0 || t == TensorType::Q5_1) v = _mm256_or_si256(v, bit_bytes(qh, 0x10));
            if (t == TensorType::MXFP4) v = _mm256_shuffle_epi8(mx, v);
            store256(u + 32 * i, v);
        }
        return;
    }
    case TensorType::Q2_K: case TensorType::Q3_K: {
        // e = 128n + 32j + t: bits 2j of qs[32n + t]; Q3_K's third bit is bit 4n + j of hmask[t]
        const bool three = t == TensorType::Q3_K;
        for (int64_t sb = 0; sb < K / QK_K; ++sb) {
            const uint8_t *qs, *hm = nullptr;
            if (three) {
                const block_q3_K & b = static_cast<const block_q3_K *>(row)[sb];
                const float df = fp16_to_fp32(b.d);
                for (int j = 0; j < 16; ++j) s[16 * sb + j] = df * float(q3k_scale(j, b.scales));
                qs = b.qs, hm = b.hmask;
            } else {
                const block_q2_K & b = static_cast<const block_q2_K *>(row)[sb];
                const float df = fp16_to_fp32(b.d), mf = fp16_to_fp32(b.dmin);
                for (int j = 0; j < 16; ++j) {
                    s[16 * sb + j] = df * float(b.scales[j] & 0xF);
                    m[16 * sb + j] = mf * float(b.scales[j] >> 4);
                }
                qs = b.qs;
            }
            uint8_t * o = u + QK_K * sb;
            const __m256i h = three ? load256(hm) : _mm256_setzero_si256();
            for (int n = 0; n < 2; ++n) {
                const __m256i q = load256(qs + 32 * n);
                for (int j = 0; j < 4; ++j) {
                    __m256i v = bits(q, 2 * j, 3, 0);
                    if (three) v = _mm256_or_si256(v, bits(h, 4 * n + j, 1, 2));
                    store256(o + 128 * n + 32 * j, v);
                }
            }
        }
        return;
    }
    case TensorType::Q4_K: case TensorType::Q5_K: {
        const bool five = t == TensorType::Q5_K;
        for (int64_t sb = 0; sb < K / QK_K; ++sb) {
            const uint8_t *scales, *qs, *qh = nullptr;
            uint16_t d, dmin;
            if (five) {
                const block_q5_K & b = static_cast<const block_q5_K *>(row)[sb];
                scales = b.scales, qs = b.qs, qh = b.qh, d = b.d, dmin = b.dmin;
            } else {
                const block_q4_K & b = static_cast<const block_q4_K *>(row)[sb];
                scales = b.scales, qs = b.qs, d = b.d, dmin = b.dmin;
            }
            const float df = fp16_to_fp32(d), mf = fp16_to_fp32(dmin);
            for (int j = 0; j < 8; ++j) {
                int sc, mn;
                k4_scale_min(j, scales, sc, mn);
                s[8 * sb + j] = df * float(sc);
                m[8 * sb + j] = mf * float(mn);
            }
            uint8_t * o = u + QK_K * sb;
            const __m256i h = five ? load256(qh) : _mm256_setzero_si256();
            for (int c = 0; c < 4; ++c) {   // elements 64c + l: low nibble of qs[32c + l]; 64c + 32 + l: high nibble
                const __m256i q = load256(qs + 32 * c);
                __m256i lo = low4(q), hi = high4(q);
                if (five) {
                    lo = _mm256_or_si256(lo, bits(h, 2 * c, 1, 4));
                    hi = _mm256_or_si256(hi, bits(h, 2 * c + 1, 1, 4));
                }
                store256(o + 64 * c, lo);
                store256(o + 64 * c + 32, hi);
            }
        }
        return;
    }
    case TensorType::Q6_K: {
        for (int64_t sb = 0; sb < K / QK_K; ++sb) {
            const block_q6_K & b = static_cast<const block_q6_K *>(row)[sb];
            const float df = fp16_to_fp32(b.d);
            for (int j = 0; j < 16; ++j) s[16 * sb + j] = df * float(b.scales[j]);
            uint8_t * o = u + QK_K * sb;
            for (int n = 0; n < 2; ++n) {   // elements 128n + 32r + l (rp::dequant_elem_q6_K's layout)
                const __m256i a = load256(b.ql + 64 * n), c = load256(b.ql + 64 * n + 32), h = load256(b.qh + 32 * n);
                store256(o + 128 * n, _mm256_or_si256(low4(a), bits(h, 0, 3, 4)));
                store256(o + 128 * n + 32, _mm256_or_si256(low4(c), bits(h, 2, 3, 4)));
                store256(o + 128 * n + 64, _mm256_or_si256(high4(a), bits(h, 4, 3, 4)));
                store256(o + 128 * n + 96, _mm256_or_si256(high4(c), bits(h, 6, 3, 4)));
            }
        }
        return;
    }
    default: assert(false && "decode_row: a type int8_matmul_supports refuses");
    }
}

// Rows [n0, n0 + P) of W (zeros past N) as [k / 4][row][4] bytes (K / 4 runs of P rows' 4 bytes: the sub-blocks
// one after the other), s and m as [sub-block][row]. Eight rows at a time are decoded in element order, then each
// 32 elements' 8 x 8 dwords are transposed in registers into 8 runs of the 8 rows' dwords.
struct Panel {
    std::vector<uint8_t> u;
    std::vector<float> s, m;
    std::vector<uint8_t> rows_u;       // 8 rows' bytes in element order
    std::vector<float> row_s, row_m;
};

void decode_panel(TensorType t, const Form & f, const char * W, size_t row_bytes, int64_t K, int64_t N, int64_t n0, Panel & p) {
    const int64_t ng = K / f.G;
    p.u.resize(size_t(K * P));
    p.s.resize(size_t(ng * P));
    p.m.resize(f.mins ? size_t(ng * P) : 0);
    p.rows_u.resize(size_t(8 * K));
    p.row_s.resize(size_t(ng));
    p.row_m.resize(size_t(ng));
    for (int r0 = 0; r0 < P; r0 += 8) {
        for (int i = 0; i < 8; ++i) {
            const int r = r0 + i;
            uint8_t * u = p.rows_u.data() + i * K;
            if (n0 + r < N) {
                decode_row(t, W + (n0 + r) * row_bytes, K, u, p.row_s.data(), p.row_m.data());
            } else {  // padding rows: zero weights (their outputs are not stored)
                std::memset(u, f.offset, size_t(K));
                std::fill(p.row_s.begin(), p.row_s.end(), 0.0f);
                std::fill(p.row_m.begin(), p.row_m.end(), 0.0f);
            }
            for (int64_t g = 0; g < ng; ++g) {
                p.s[size_t(g * P + r)] = p.row_s[size_t(g)];
                if (f.mins) p.m[size_t(g * P + r)] = p.row_m[size_t(g)];
            }
        }
        for (int64_t k0 = 0; k0 < K; k0 += 32) {
            __m256i a[8];
            for (int i = 0; i < 8; ++i) a[i] = load256(p.rows_u.data() + i * K + k0);
            transpose8x8(a);
            for (int j = 0; j < 8; ++j) store256(p.u.data() + ((k0 / 4 + j) * P + r0) * 4, a[j]);
        }
    }
}

// The quantized tokens of one pass: each token's int8 column (quantize_column: q, d, dsum32) and, for offset
// types, -offset * sum q' per sub-block (exact in int32).
struct Tokens {
    std::vector<DotColumn> col;
    std::vector<std::vector<int32_t>> corr;
};

// The longest run of steps (a divisor of a sub-block's `steps`, at most `bound`) whose pair sums add up in int16.
template <int steps, int bound>
constexpr int int16_run() {
    for (int d = steps; d > 1; --d)
        if (steps % d == 0 && d <= bound) return d;
    return 1;
}

// Panel rows times tokens xs[0 .. NC), sub-blocks [g0, g1): out[c][row] for P rows, each output's chain going on
// from what out holds (first: from 0).
template <int NC, int G, int UMAX, bool SIGNED, bool OFFSET, bool MINS>
void panel_kernel(const Panel & p, int64_t g0, int64_t g1, const DotColumn * const * xs, const int32_t * const * corr, float * const * out,
                  bool first) {
    using VI = Isa::VI;
    using VF = Isa::VF;
    constexpr int R = Isa::R, L = Isa::L;
    VF acc[R][NC];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < NC; ++c) acc[r][c] = first ? Isa::zerof() : Isa::loadf(out[c] + r * L);
    for (int64_t g = g0; g < g1; ++g) {
        VI sum[R][NC];
        for (int c = 0; c < NC; ++c) {
            const VI init = OFFSET ? Isa::set1(corr[c][g]) : Isa::zero();
            for (int r = 0; r < R; ++r) sum[r][c] = init;
        }
        const uint8_t * ug = p.u.data() + g * G * P;
#if RP_INT8_GEMM == 256
        if constexpr (!SIGNED) {
            // vpmaddubsw's pair sums of S16 steps added in int16 (exact: S16 * 2 * UMAX * 127 < 2^15), then widened
            // by one vpmaddwd: a third of the instructions of widening every step.
            constexpr int S16 = int16_run<G / 4, 32767 / (2 * UMAX * 127)>();
            for (int k0 = 0; k0 < G / 4; k0 += S16) {
                VI h[R][NC];
#pragma GCC unroll 8
                for (int k4 = k0; k4 < k0 + S16; ++k4) {
                    VI w[R];
                    for (int r = 0; r < R; ++r) w[r] = Isa::load(ug + (k4 * P + r * L) * 4);
                    for (int c = 0; c < NC; ++c) {
                        const VI x = _mm256_set1_epi32(load4(xs[c]->q.data() + g * G + 4 * k4));
                        for (int r = 0; r < R; ++r) {
                            const VI pr = _mm256_maddubs_epi16(w[r], x);
                            h[r][c] = k4 == k0 ? pr : _mm256_add_epi16(h[r][c], pr);
                        }
                    }
                }
                for (int c = 0; c < NC; ++c)
                    for (int r = 0; r < R; ++r) sum[r][c] = _mm256_add_epi32(sum[r][c], _mm256_madd_epi16(h[r][c], _mm256_set1_epi16(1)));
            }
        } else
#endif
        {
#pragma GCC unroll 8
        for (int k4 = 0; k4 < G / 4; ++k4) {
            VI w[R];
            for (int r = 0; r < R; ++r) w[r] = Isa::load(ug + (k4 * P + r * L) * 4);
            if constexpr (SIGNED) {
#if RP_INT8_GEMM == 256
                VI wa[R];
                for (int r = 0; r < R; ++r) wa[r] = _mm256_abs_epi8(w[r]);
                for (int c = 0; c < NC; ++c) {
                    const VI x = _mm256_set1_epi32(load4(xs[c]->q.data() + g * G + 4 * k4));
                    for (int r = 0; r < R; ++r) sum[r][c] = Isa::dot_bytes(sum[r][c], wa[r], _mm256_sign_epi8(x, w[r]));
                }
#endif
            } else {
                for (int c = 0; c < NC; ++c) {
                    const int32_t x4 = load4(xs[c]->q.data() + g * G + 4 * k4);
                    for (int r = 0; r < R; ++r) sum[r][c] = Isa::dot(sum[r][c], w[r], x4);
                }
            }
        }
        }
        VF sv[R], mv[R];
        for (int r = 0; r < R; ++r) {
            sv[r] = Isa::loadf(p.s.data() + g * P + r * L);
            if constexpr (MINS) mv[r] = Isa::loadf(p.m.data() + g * P + r * L);
        }
        for (int c = 0; c < NC; ++c) {
            const VF dx = Isa::set1f(xs[c]->d[size_t(g * G / 32)]);
            for (int r = 0; r < R; ++r) acc[r][c] = Isa::fma(Isa::cvt(sum[r][c]), Isa::mul(sv[r], dx), acc[r][c]);
            if constexpr (MINS) {
                const VF ms = Isa::set1f(G == 16 ? xs[c]->dsum16[size_t(g)] : xs[c]->dsum32[size_t(g)]);
                for (int r = 0; r < R; ++r) acc[r][c] = Isa::fnma(mv[r], ms, acc[r][c]);
            }
        }
    }
    for (int c = 0; c < NC; ++c)
        for (int r = 0; r < R; ++r) Isa::storef(out[c] + r * L, acc[r][c]);
}

using KernelFn = void (*)(const Panel &, int64_t, int64_t, const DotColumn * const *, const int32_t * const *, float * const *, bool);

// The kernel for nc tokens (1 .. Isa::C) as a compile-time count. UMAX: the largest unsigned quant of the type.
template <int G, int UMAX, bool SIGNED, bool OFFSET, bool MINS, int NC = Isa::C>
KernelFn kernel_for(int nc) {
    if constexpr (NC == 1) {
        return &panel_kernel<1, G, UMAX, SIGNED, OFFSET, MINS>;
    } else {
        return nc >= NC ? &panel_kernel<NC, G, UMAX, SIGNED, OFFSET, MINS> : kernel_for<G, UMAX, SIGNED, OFFSET, MINS, NC - 1>(nc);
    }
}

template <TensorType T>
KernelFn kernel_of(int nc) {
    constexpr Form f = form_of(T);
    return kernel_for<f.G, f.umax, T == TensorType::Q8_0 && Isa::kSignedQ8, f.offset != 0, f.mins>(nc);
}

KernelFn kernel_for(TensorType t, int nc) {
    switch (t) {
    case TensorType::Q8_0: return kernel_of<TensorType::Q8_0>(nc);
    case TensorType::Q4_0: return kernel_of<TensorType::Q4_0>(nc);
    case TensorType::Q5_0: return kernel_of<TensorType::Q5_0>(nc);
    case TensorType::Q4_1: return kernel_of<TensorType::Q4_1>(nc);
    case TensorType::Q5_1: return kernel_of<TensorType::Q5_1>(nc);
    case TensorType::MXFP4: return kernel_of<TensorType::MXFP4>(nc);
    case TensorType::Q2_K: return kernel_of<TensorType::Q2_K>(nc);
    case TensorType::Q3_K: return kernel_of<TensorType::Q3_K>(nc);
    case TensorType::Q4_K: return kernel_of<TensorType::Q4_K>(nc);
    case TensorType::Q5_K: return kernel_of<TensorType::Q5_K>(nc);
    case TensorType::Q6_K: return kernel_of<TensorType::Q6_K>(nc);
    default: return nullptr;
    }
}

#endif  // RP_INT8_GEMM

} // namespace

bool int8_matmul_supports(TensorType t, int64_t K) {
#if defined(RP_INT8_GEMM)
    return form_of(t).G > 0 && K > 0 && K % gguf::type_traits(uint32_t(t))->block_size == 0;
#else
    (void)t, (void)K;
    return false;
#endif
}

void int8_matmul_fwd(int64_t K, int64_t N, int64_t T, const void * W, TensorType t, size_t w_row_bytes,
                     const float * X, int64_t x_col, float * Y, int64_t y_col, bool accumulate, bool parallel) {
    assert(int8_matmul_supports(t, K));
#if defined(RP_INT8_GEMM)
    const Form f = form_of(t);
    const int64_t ng = K / f.G;
    const char * w = static_cast<const char *>(W);
    static thread_local Tokens scratch;
    Tokens & tok = scratch;   // (the calling thread's; the lambdas below run on other threads)
    const int64_t npanels = (N + P - 1) / P;
    for (int64_t t0 = 0; t0 < T; t0 += kTokensPerPass) {
        const int64_t nt = std::min(kTokensPerPass, T - t0);
        if (tok.col.size() < size_t(nt)) {
            tok.col.resize(size_t(nt));
            tok.corr.resize(size_t(nt));
        }
        for_tasks(nt, parallel && nt * K > (1 << 16), [&](int64_t i) {
            DotColumn & c = tok.col[size_t(i)];
            quantize_column(X + (t0 + i) * x_col, K, c);
            std::vector<int32_t> & corr = tok.corr[size_t(i)];
            corr.assign(size_t(ng), 0);
            if (f.offset != 0)
                for (int64_t g = 0; g < ng; ++g) {
                    int32_t s = 0;
                    for (int j = 0; j < f.G; ++j) s += c.q[size_t(g * f.G + j)];
                    corr[size_t(g)] = -f.offset * s;
                }
        });
        for_tasks(npanels, parallel && double(N) * double(K) * double(nt) > 1e6, [&](int64_t pi) {
            static thread_local Panel panel;
            static thread_local std::vector<float> acc;   // [token][P]: the outputs' chains between chunks of K
            const int64_t n0 = pi * P;
            decode_panel(t, f, w, w_row_bytes, K, N, n0, panel);
            acc.resize(size_t(nt * P));
            const int64_t rows = std::min<int64_t>(P, N - n0);
            // The reduction in chunks of kChunk elements, every token through a chunk before the next: the chunk's
            // part of the panel (32 KiB) stays in L1 for all of them.
            const int64_t gc = std::max<int64_t>(1, kChunk / f.G);
            for (int64_t g0 = 0; g0 < ng; g0 += gc) {
                const int64_t g1 = std::min(ng, g0 + gc);
                for (int64_t c0 = 0; c0 < nt; c0 += Isa::C) {
                    const int nc = int(std::min<int64_t>(Isa::C, nt - c0));
                    const DotColumn * xs[Isa::C];
                    const int32_t * corr[Isa::C];
                    float * out[Isa::C];
                    for (int c = 0; c < nc; ++c) {
                        xs[c] = &tok.col[size_t(c0 + c)];
                        corr[c] = tok.corr[size_t(c0 + c)].data();
                        out[c] = acc.data() + (c0 + c) * P;
                    }
                    kernel_for(t, nc)(panel, g0, g1, xs, corr, out, g0 == 0);
                }
            }
            for (int64_t c = 0; c < nt; ++c) {
                float * y = Y + (t0 + c) * y_col + n0;
                const float * a = acc.data() + c * P;
                if (accumulate)
                    for (int64_t r = 0; r < rows; ++r) y[r] += a[r];
                else
                    std::memcpy(y, a, sizeof(float) * size_t(rows));
            }
        });
    }
#else
    (void)K, (void)N, (void)T, (void)W, (void)t, (void)w_row_bytes, (void)X, (void)x_col, (void)Y, (void)y_col,
        (void)accumulate, (void)parallel;
#endif
}

} // namespace rp::cpu
