// GGUF block types: byte layouts, and the math of ONE block, shared by the CPU code (quant.cpp) and the CUDA
// kernels (cuda/dequant.cu). formats.md §2.4 (layouts) and §2.5 (formulas) are the specification.
//
// Two forms of every dequantizer, computing bit-identical values:
//   dequantize_block_<t>(b, y)  writes the block's elements in the loop order of ggml's dequantize_row_<t>
//                               (fast on a CPU: the scales are decoded once per sub-block);
//   dequant_elem_<t>(b, e)      returns element e alone (what a GPU thread computes: one thread per output
//                               element, so the stores are coalesced).
// Both evaluate each value with the same float operations in the same order as ggml (e.g. Q4_K:
// (d*sc)*q - dmin*m), via mul_rn/add_rn/sub_rn below, which forbid fused multiply-adds in device code.
// So the CPU, the GPU and ggml's reference dequantizer agree bit for bit.
//
// Quantizers (quantize_block_<t>) follow ggml's quantize_row_<t>_ref: round to nearest, no importance matrix.
// llama-quantize uses exactly these for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 when no imatrix is given; the K types'
// quantizers (host only) are in quantize_k.h.
//
// Blocks are read through the structs, so a block pointer must be 2-byte aligned (every block size is even,
// and GGUF tensor data is 32-byte aligned).
#pragma once

#include "ggml_rp/core/fp16.h"

#include <cmath>
#include <cstdint>

namespace rp {

constexpr int QK4_0 = 32;
constexpr int QK4_1 = 32;
constexpr int QK5_0 = 32;
constexpr int QK5_1 = 32;
constexpr int QK8_0 = 32;
constexpr int QK_K = 256;
constexpr int QK_MXFP4 = 32;
constexpr int K_SCALE_SIZE = 12;

// f16 fields are raw IEEE binary16 bits.
struct block_q4_0 {
    uint16_t d;
    uint8_t qs[QK4_0 / 2];  // element j in the low nibble of qs[j], element j+16 in the high nibble
};
struct block_q4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[QK4_1 / 2];
};
struct block_q5_0 {
    uint16_t d;
    uint8_t qh[4];          // fifth bits, a little-endian u32: bit e belongs to element e
    uint8_t qs[QK5_0 / 2];
};
struct block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
};
struct block_q8_0 {
    uint16_t d;
    int8_t qs[QK8_0];
};
struct block_q2_K {
    uint8_t scales[QK_K / 16];  // low nibble: scale, high nibble: min, per sub-block of 16
    uint8_t qs[QK_K / 4];
    uint16_t d;
    uint16_t dmin;
};
struct block_q3_K {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[K_SCALE_SIZE];  // sixteen 6-bit signed scales (offset 32)
    uint16_t d;
};
struct block_q4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];  // eight 6-bit scales and eight 6-bit mins
    uint8_t qs[QK_K / 2];
};
struct block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
struct block_q6_K {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
};

// MXFP4 (OCP microscaling: gpt-oss's expert weights): 4-bit E2M1 floats, one E8M0 power-of-two scale per 32.
// ggml stores the E2M1 values doubled (the integers 0 1 2 3 4 6 8 12, sign in bit 3) and halves the scale.
struct block_mxfp4 {
    uint8_t e;                  // E8M0: the scale is 2^(e - 127); ggml's value is 2^(e - 128) x the doubled E2M1
    uint8_t qs[QK_MXFP4 / 2];   // element j in the low nibble of qs[j], element j+16 in the high nibble
};
static_assert(sizeof(block_mxfp4) == 17, "mxfp4 block size");
static_assert(sizeof(block_q4_0) == 18, "q4_0 block size");
static_assert(sizeof(block_q4_1) == 20, "q4_1 block size");
static_assert(sizeof(block_q5_0) == 22, "q5_0 block size");
static_assert(sizeof(block_q5_1) == 24, "q5_1 block size");
static_assert(sizeof(block_q8_0) == 34, "q8_0 block size");
static_assert(sizeof(block_q2_K) == 84, "q2_k block size");
static_assert(sizeof(block_q3_K) == 110, "q3_k block size");
static_assert(sizeof(block_q4_K) == 144, "q4_k block size");
static_assert(sizeof(block_q5_K) == 176, "q5_k block size");
static_assert(sizeof(block_q6_K) == 210, "q6_k block size");

// ---- float operations that are never contracted into an fma (nvcc fuses a*b+c by default) --------------

RP_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
RP_HD inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
RP_HD inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

// ---- shared helpers -----------------------------------------------------------------------------------

// ggml's nearest_int: round to nearest, ties to even, for |v| < 2^22 — adding 1.5 * 2^23 leaves the integer
// in the low 22 mantissa bits (faster than lrintf and identical for the values the quantizers see).
RP_HD inline int nearest_int(float v) {
    return static_cast<int>(f32_bits(v + 12582912.f) & 0x007fffff) - 0x00400000;
}

RP_HD inline uint32_t load_le32(const uint8_t * p) {
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
           static_cast<uint32_t>(p[3]) << 24;
}

// Q4_K / Q5_K: 6-bit scale and min of sub-block i (0..7) from the 12 packed bytes.
RP_HD inline void k4_scale_min(int i, const uint8_t * q, int & sc, int & m) {
    if (i < 4) {
        sc = q[i] & 63;
        m = q[i + 4] & 63;
    } else {
        sc = (q[i + 4] & 0xF) | ((q[i - 4] >> 6) << 4);
        m = (q[i + 4] >> 4) | ((q[i] >> 6) << 4);
    }
}

// Q3_K: signed scale of sub-block s (0..15), in [-32, 31].
RP_HD inline int q3k_scale(int s, const uint8_t * scales) {
    const int low4 = s < 8 ? (scales[s] & 0xF) : (scales[s - 8] >> 4);
    const int high2 = (scales[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
    return low4 + 16 * high2 - 32;
}

// The same values four sub-blocks to a little-endian word, one byte each (the vector kernels' form):
// Q4_K / Q5_K: sc[0] holds the scales of sub-blocks 0..3, sc[1] those of 4..7; m likewise the mins.
RP_HD inline void k4_scales_mins_packed(const uint8_t * q, uint32_t sc[2], uint32_t m[2]) {
    const uint32_t u0 = load_le32(q), u1 = load_le32(q + 4), u2 = load_le32(q + 8);
    sc[0] = u0 & 0x3F3F3F3Fu;
    sc[1] = (u2 & 0x0F0F0F0Fu) | (((u0 >> 6) & 0x03030303u) << 4);
    m[0] = u1 & 0x3F3F3F3Fu;
    m[1] = ((u2 >> 4) & 0x0F0F0F0Fu) | (((u1 >> 6) & 0x03030303u) << 4);
}

// Q3_K: q3k_scale(s) + 32 (unsigned, 0..63) of sub-blocks 4w .. 4w+3 in word w: low 4 bits from bytes 0..7,
// high 2 bits from bytes 8..11.
RP_HD inline void q3k_scales_packed(const uint8_t * scales, uint32_t w[4]) {
    const uint32_t w0 = load_le32(scales), w1 = load_le32(scales + 4), w2 = load_le32(scales + 8);
    w[0] = (w0 & 0x0F0F0F0Fu) | ((w2 & 0x03030303u) << 4);
    w[1] = (w1 & 0x0F0F0F0Fu) | (((w2 >> 2) & 0x03030303u) << 4);
    w[2] = ((w0 >> 4) & 0x0F0F0F0Fu) | (((w2 >> 4) & 0x03030303u) << 4);
    w[3] = ((w1 >> 4) & 0x0F0F0F0Fu) | (((w2 >> 6) & 0x03030303u) << 4);
}

// ---- dequantize one whole block ------------------------------------------------------------------------

RP_HD inline void dequantize_block_q4_0(const block_q4_0 & b, float * y) {
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
        y[j] = mul_rn(static_cast<float>((b.qs[j] & 0xF) - 8), d);
        y[j + QK4_0 / 2] = mul_rn(static_cast<float>((b.qs[j] >> 4) - 8), d);
    }
}

RP_HD inline void dequantize_block_q4_1(const block_q4_1 & b, float * y) {
    const float d = fp16_to_fp32(b.d);
    const float m = fp16_to_fp32(b.m);
    for (int j = 0; j < QK4_1 / 2; ++j) {
        y[j] = add_rn(mul_rn(static_cast<float>(b.qs[j] & 0xF), d), m);
        y[j + QK4_1 / 2] = add_rn(mul_rn(static_cast<float>(b.qs[j] >> 4), d), m);
    }
}

RP_HD inline void dequantize_block_q5_0(const block_q5_0 & b, float * y) {
    const float d = fp16_to_fp32(b.d);
    const uint32_t qh = load_le32(b.qh);
    for (int j = 0; j < QK5_0 / 2; ++j) {
        const int x0 = ((b.qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16;
        const int x1 = ((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
        y[j] = mul_rn(static_cast<float>(x0), d);
        y[j + QK5_0 / 2] = mul_rn(static_cast<float>(x1), d);
    }
}

RP_HD inline void dequantize_block_q5_1(const block_q5_1 & b, float * y) {
    const float d = fp16_to_fp32(b.d);
    const float m = fp16_to_fp32(b.m);
    const uint32_t qh = load_le32(b.qh);
    for (int j = 0; j < QK5_1 / 2; ++j) {
        const int x0 = (b.qs[j] & 0xF) | (((qh >> j) & 1) << 4);
        const int x1 = (b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        y[j] = add_rn(mul_rn(static_cast<float>(x0), d), m);
        y[j + QK5_1 / 2] = add_rn(mul_rn(static_cast<float>(x1), d), m);
    }
}

RP_HD inline void dequantize_block_q8_0(const block_q8_0 & b, float * y) {
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < QK8_0; ++j) y[j] = mul_rn(static_cast<float>(b.qs[j]), d);
}

RP_HD inline void dequantize_block_q2_K(const block_q2_K & b, float * y) {
    const float d = fp16_to_fp32(b.d);
    const float dmin = fp16_to_fp32(b.dmin);
    for (int n = 0; n < 2; ++n) {
        const uint8_t * q = b.qs + 32 * n;
        for (int j = 0; j < 4; ++j) {
            for (int half = 0; half < 2; ++half) {  // sub-block s = 8n + 2j + half: bytes q[16*half ..]
                const uint8_t sc = b.scales[8 * n + 2 * j + half];
                const float dl = mul_rn(d, static_cast<float>(sc & 0xF));
                const float ml = mul_rn(dmin, static_cast<float>(sc >> 4));
                for (int l = 0; l < 16; ++l)
                    *y++ = sub_rn(mul_rn(dl, static_cast<float>((q[16 * half + l] >> (2 * j)) & 3)), ml);
            }
        }
    }
}

RP_HD inline void dequantize_block_q3_K(const block_q3_K & b, float * y) {
    const float d = fp16_to_fp32(b.d);
    for (int n = 0; n < 2; ++n) {
        const uint8_t * q = b.qs + 32 * n;
        for (int j = 0; j < 4; ++j) {
            const int hbit = 4 * n + j;
            for (int half = 0; half < 2; ++half) {
                const float dl = mul_rn(d, static_cast<float>(q3k_scale(8 * n + 2 * j + half, b.scales)));
                for (int l = 16 * half; l < 16 * half + 16; ++l) {
                    const int qv = ((q[l] >> (2 * j)) & 3) - (((b.hmask[l] >> hbit) & 1) ? 0 : 4);
                    *y++ = mul_rn(dl, static_cast<float>(qv));
                }
            }
        }
    }
}

RP_HD inline void dequantize_block_q4_K(const block_q4_K & b, float * y) {
    const float d = fp16_to_fp32(b.d);
    const float dmin = fp16_to_fp32(b.dmin);
    for (int c = 0; c < 4; ++c) {
        const uint8_t * q = b.qs + 32 * c;
        int sc, m;
        k4_scale_min(2 * c, b.scales, sc, m);
        const float d1 = mul_rn(d, static_cast<float>(sc)), m1 = mul_rn(dmin, static_cast<float>(m));
        k4_scale_min(2 * c + 1, b.scales, sc, m);
        const float d2 = mul_rn(d, static_cast<float>(sc)), m2 = mul_rn(dmin, static_cast<float>(m));
        for (int l = 0; l < 32; ++l) *y++ = sub_rn(mul_rn(d1, static_cast<float>(q[l] & 0xF)), m1);
        for (int l = 0; l < 32; ++l) *y++ = sub_rn(mul_rn(d2, static_cast<float>(q[l] >> 4)), m2);
    }
}

RP_HD inline void dequantize_block_q5_K(const block_q5_K & b, float * y) {
    const float d = fp16_to_fp32(b.d);
    const float dmin = fp16_to_fp32(b.dmin);
    for (int c = 0; c < 4; ++c) {
        const uint8_t * q = b.qs + 32 * c;
        int sc, m;
        k4_scale_min(2 * c, b.scales, sc, m);
        const float d1 = mul_rn(d, static_cast<float>(sc)), m1 = mul_rn(dmin, static_cast<float>(m));
        k4_scale_min(2 * c + 1, b.scales, sc, m);
        const float d2 = mul_rn(d, static_cast<float>(sc)), m2 = mul_rn(dmin, static_cast<float>(m));
        for (int l = 0; l < 32; ++l) {
            const int qv = (q[l] & 0xF) | (((b.qh[l] >> (2 * c)) & 1) << 4);
            *y++ = sub_rn(mul_rn(d1, static_cast<float>(qv)), m1);
        }
        for (int l = 0; l < 32; ++l) {
            const int qv = (q[l] >> 4) | (((b.qh[l] >> (2 * c + 1)) & 1) << 4);
            *y++ = sub_rn(mul_rn(d2, static_cast<float>(qv)), m2);
        }
    }
}

RP_HD inline void dequantize_block_q6_K(const block_q6_K & b, float * y) {
    const float d = fp16_to_fp32(b.d);
    for (int n = 0; n < 2; ++n) {
        const uint8_t * ql = b.ql + 64 * n;
        const uint8_t * qh = b.qh + 32 * n;
        const int8_t * sc = b.scales + 8 * n;
        float * yn = y + 128 * n;
        for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            yn[l + 0] = mul_rn(mul_rn(d, static_cast<float>(sc[is + 0])), static_cast<float>(q1));
            yn[l + 32] = mul_rn(mul_rn(d, static_cast<float>(sc[is + 2])), static_cast<float>(q2));
            yn[l + 64] = mul_rn(mul_rn(d, static_cast<float>(sc[is + 4])), static_cast<float>(q3));
            yn[l + 96] = mul_rn(mul_rn(d, static_cast<float>(sc[is + 6])), static_cast<float>(q4));
        }
    }
}

// ---- dequantize one element (e in 0..block_size-1) ---------------------------------------------------

RP_HD inline float dequant_elem_q4_0(const block_q4_0 & b, int e) {
    const int byte = b.qs[e & 15];
    const int q = e < 16 ? (byte & 0xF) : (byte >> 4);
    return mul_rn(static_cast<float>(q - 8), fp16_to_fp32(b.d));
}

RP_HD inline float dequant_elem_q4_1(const block_q4_1 & b, int e) {
    const int byte = b.qs[e & 15];
    const int q = e < 16 ? (byte & 0xF) : (byte >> 4);
    return add_rn(mul_rn(static_cast<float>(q), fp16_to_fp32(b.d)), fp16_to_fp32(b.m));
}

RP_HD inline float dequant_elem_q5_0(const block_q5_0 & b, int e) {
    const int byte = b.qs[e & 15];
    const int q = (e < 16 ? (byte & 0xF) : (byte >> 4)) | static_cast<int>((load_le32(b.qh) >> e) & 1) << 4;
    return mul_rn(static_cast<float>(q - 16), fp16_to_fp32(b.d));
}

RP_HD inline float dequant_elem_q5_1(const block_q5_1 & b, int e) {
    const int byte = b.qs[e & 15];
    const int q = (e < 16 ? (byte & 0xF) : (byte >> 4)) | static_cast<int>((load_le32(b.qh) >> e) & 1) << 4;
    return add_rn(mul_rn(static_cast<float>(q), fp16_to_fp32(b.d)), fp16_to_fp32(b.m));
}

RP_HD inline float dequant_elem_q8_0(const block_q8_0 & b, int e) {
    return mul_rn(static_cast<float>(b.qs[e]), fp16_to_fp32(b.d));
}

// Q2_K / Q3_K: e = 128n + 32j + t; byte qs[32n + t], bits 2j; sub-block s = 8n + 2j + [t >= 16] = e / 16.
RP_HD inline float dequant_elem_q2_K(const block_q2_K & b, int e) {
    const int n = e >> 7, j = (e >> 5) & 3, t = e & 31;
    const uint8_t sc = b.scales[e >> 4];
    const float dl = mul_rn(fp16_to_fp32(b.d), static_cast<float>(sc & 0xF));
    const float ml = mul_rn(fp16_to_fp32(b.dmin), static_cast<float>(sc >> 4));
    return sub_rn(mul_rn(dl, static_cast<float>((b.qs[32 * n + t] >> (2 * j)) & 3)), ml);
}

RP_HD inline float dequant_elem_q3_K(const block_q3_K & b, int e) {
    const int n = e >> 7, j = (e >> 5) & 3, t = e & 31;
    const float dl = mul_rn(fp16_to_fp32(b.d), static_cast<float>(q3k_scale(e >> 4, b.scales)));
    const int qv = ((b.qs[32 * n + t] >> (2 * j)) & 3) - (((b.hmask[t] >> (4 * n + j)) & 1) ? 0 : 4);
    return mul_rn(dl, static_cast<float>(qv));
}

// Q4_K / Q5_K: chunk c = e / 64 uses bytes qs[32c ..]; sub-block i = e / 32 (low nibble when i is even).
RP_HD inline float dequant_elem_q4_K(const block_q4_K & b, int e) {
    const int i = e >> 5, t = e & 31;
    int sc, m;
    k4_scale_min(i, b.scales, sc, m);
    const int byte = b.qs[32 * (i >> 1) + t];
    const int q = (i & 1) ? (byte >> 4) : (byte & 0xF);
    const float dl = mul_rn(fp16_to_fp32(b.d), static_cast<float>(sc));
    const float ml = mul_rn(fp16_to_fp32(b.dmin), static_cast<float>(m));
    return sub_rn(mul_rn(dl, static_cast<float>(q)), ml);
}

RP_HD inline float dequant_elem_q5_K(const block_q5_K & b, int e) {
    const int i = e >> 5, t = e & 31;
    int sc, m;
    k4_scale_min(i, b.scales, sc, m);
    const int byte = b.qs[32 * (i >> 1) + t];
    const int q = ((i & 1) ? (byte >> 4) : (byte & 0xF)) | (((b.qh[t] >> i) & 1) << 4);
    const float dl = mul_rn(fp16_to_fp32(b.d), static_cast<float>(sc));
    const float ml = mul_rn(fp16_to_fp32(b.dmin), static_cast<float>(m));
    return sub_rn(mul_rn(dl, static_cast<float>(q)), ml);
}

// Q6_K: e = 128n + 32r + l; r selects (ql byte 64n + l or 64n + 32 + l, low or high nibble) and qh bits 2r.
RP_HD inline float dequant_elem_q6_K(const block_q6_K & b, int e) {
    const int n = e >> 7, r = (e >> 5) & 3, l = e & 31;
    const int byte = b.ql[64 * n + 32 * (r & 1) + l];
    const int q = ((r < 2) ? (byte & 0xF) : (byte >> 4)) | (((b.qh[32 * n + l] >> (2 * r)) & 3) << 4);
    const float ds = mul_rn(fp16_to_fp32(b.d), static_cast<float>(b.scales[e >> 4]));
    return mul_rn(ds, static_cast<float>(q - 32));
}

// ---- quantize one block (ggml's quantize_row_<t>_ref) ----------------------------------------------------
// ggml converts x*id + 8.5 etc. to int8 by truncation; here the same truncation is applied to a value first
// clamped to the valid range, which gives the same bytes for every finite input and no undefined behaviour for
// inf / nan.

RP_HD inline int trunc_clamp(float v, int hi) {
    return static_cast<int>(fminf(fmaxf(v, 0.0f), static_cast<float>(hi)));
}

// Q8_0: d = amax / 127, q = round(x / d) (half away from zero).
RP_HD inline void quantize_block_q8_0(const float * x, block_q8_0 & y) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y.d = fp32_to_fp16(d);
    for (int j = 0; j < QK8_0; ++j)
        y.qs[j] = static_cast<int8_t>(fminf(fmaxf(roundf(mul_rn(x[j], id)), -127.0f), 127.0f));
}

// Signed value of largest magnitude (the first one on ties), as ggml's Q4_0 / Q5_0 scale uses it.
RP_HD inline float signed_absmax(const float * x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; ++j) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

// Q4_0: d = max / -8, q = min(15, trunc(x / d + 8.5)).
RP_HD inline void quantize_block_q4_0(const float * x, block_q4_0 & y) {
    const float d = signed_absmax(x, QK4_0) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y.d = fp32_to_fp16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
        const int q0 = trunc_clamp(add_rn(mul_rn(x[j], id), 8.5f), 15);
        const int q1 = trunc_clamp(add_rn(mul_rn(x[j + QK4_0 / 2], id), 8.5f), 15);
        y.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
}

// Min and max of a block (ggml's Q4_1 / Q5_1 scan).
RP_HD inline void block_min_max(const float * x, int n, float & mn, float & mx) {
    mn = 3.402823466e+38f;
    mx = -3.402823466e+38f;
    for (int j = 0; j < n; ++j) {
        if (x[j] < mn) mn = x[j];
        if (x[j] > mx) mx = x[j];
    }
}

// Q4_1: d = (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5)).
RP_HD inline void quantize_block_q4_1(const float * x, block_q4_1 & y) {
    float mn, mx;
    block_min_max(x, QK4_1, mn, mx);
    const float d = (mx - mn) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y.d = fp32_to_fp16(d);
    y.m = fp32_to_fp16(mn);
    for (int j = 0; j < QK4_1 / 2; ++j) {
        const int q0 = trunc_clamp(add_rn(mul_rn(sub_rn(x[j], mn), id), 0.5f), 15);
        const int q1 = trunc_clamp(add_rn(mul_rn(sub_rn(x[j + QK4_1 / 2], mn), id), 0.5f), 15);
        y.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
}

// Q5_0: d = max / -16, q = min(31, trunc(x / d + 16.5)); bit 4 of element e goes to bit e of qh.
RP_HD inline void quantize_block_q5_0(const float * x, block_q5_0 & y) {
    const float d = signed_absmax(x, QK5_0) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y.d = fp32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_0 / 2; ++j) {
        const int q0 = trunc_clamp(add_rn(mul_rn(x[j], id), 16.5f), 31);
        const int q1 = trunc_clamp(add_rn(mul_rn(x[j + QK5_0 / 2], id), 16.5f), 31);
        y.qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
        qh |= static_cast<uint32_t>(q0 >> 4) << j;
        qh |= static_cast<uint32_t>(q1 >> 4) << (j + QK5_0 / 2);
    }
    for (int k = 0; k < 4; ++k) y.qh[k] = static_cast<uint8_t>(qh >> (8 * k));
}

// Q5_1: d = (max - min) / 31, m = min, q = trunc((x - min) / d + 0.5).
RP_HD inline void quantize_block_q5_1(const float * x, block_q5_1 & y) {
    float mn, mx;
    block_min_max(x, QK5_1, mn, mx);
    const float d = (mx - mn) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y.d = fp32_to_fp16(d);
    y.m = fp32_to_fp16(mn);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_1 / 2; ++j) {
        const int q0 = trunc_clamp(add_rn(mul_rn(sub_rn(x[j], mn), id), 0.5f), 31);
        const int q1 = trunc_clamp(add_rn(mul_rn(sub_rn(x[j + QK5_1 / 2], mn), id), 0.5f), 31);
        y.qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
        qh |= static_cast<uint32_t>(q0 >> 4) << j;
        qh |= static_cast<uint32_t>(q1 >> 4) << (j + QK5_1 / 2);
    }
    for (int k = 0; k < 4; ++k) y.qh[k] = static_cast<uint8_t>(qh >> (8 * k));
}

// ---- MXFP4 -------------------------------------------------------------------------------------------

// ggml's kvalues_mxfp4: twice the E2M1 value of a 4-bit code (0, 1, 2, 3, 4, 6, 8, 12; code 8 is +0).
RP_HD inline int mxfp4_value(int q) {
    const int m = q & 7;
    const int v = m < 5 ? m : m == 5 ? 6 : m == 6 ? 8 : 12;
    return q & 8 ? -v : v;
}

// ggml_e8m0_to_fp32_half: 2^(e - 128), e = 0 and 1 as the subnormals 2^-128 and 2^-127.
RP_HD inline float e8m0_to_fp32_half(uint8_t e) {
    return f32_from_bits(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
}

RP_HD inline void dequantize_block_mxfp4(const block_mxfp4 & b, float * y) {
    const float d = e8m0_to_fp32_half(b.e);
    for (int j = 0; j < QK_MXFP4 / 2; ++j) {
        y[j] = mul_rn(static_cast<float>(mxfp4_value(b.qs[j] & 0xF)), d);
        y[j + QK_MXFP4 / 2] = mul_rn(static_cast<float>(mxfp4_value(b.qs[j] >> 4)), d);
    }
}

RP_HD inline float dequant_elem_mxfp4(const block_mxfp4 & b, int e) {
    const int byte = b.qs[e & 15];
    return mul_rn(static_cast<float>(mxfp4_value(e < 16 ? byte & 0xF : byte >> 4)), e8m0_to_fp32_half(b.e));
}

// ggml's best_index_mxfp4: the first code of least |code x d - v|.
RP_HD inline int mxfp4_nearest(float v, float d) {
    int index = 0;
    float err = fabsf(sub_rn(mul_rn(static_cast<float>(mxfp4_value(0)), d), v));
    for (int q = 1; q < 16; ++q) {
        const float e = fabsf(sub_rn(mul_rn(static_cast<float>(mxfp4_value(q)), d), v));
        if (e < err) index = q, err = e;
    }
    return index;
}

// ggml's quantize_row_mxfp4_ref: e = floor(log2 amax) - 2 + 127 (0 for an all-zero block), each value its
// nearest code. (A block whose amax is below 2^-125 gets e's low 8 bits, as ggml's float-to-uint8 cast does on
// x86.)
RP_HD inline void quantize_block_mxfp4(const float * x, block_mxfp4 & y) {
    float amax = 0.0f;
    for (int j = 0; j < QK_MXFP4; ++j) amax = fmaxf(amax, fabsf(x[j]));
    const uint8_t e = amax > 0.0f ? static_cast<uint8_t>(static_cast<int>(floorf(log2f(amax)) - 2.0f + 127.0f)) : 0;
    const float d = e8m0_to_fp32_half(e);
    y.e = e;
    for (int j = 0; j < QK_MXFP4 / 2; ++j)
        y.qs[j] = static_cast<uint8_t>(mxfp4_nearest(x[j], d) | (mxfp4_nearest(x[j + QK_MXFP4 / 2], d) << 4));
}

} // namespace rp
