// Independent references for the quantization tests, written from formats.md §2.4-2.6 only: blocks are raw
// bytes read at the documented offsets, f16 is decoded with ldexp, and every element is computed on its own
// from its formula in double precision. Nothing here includes or mirrors ggml_rp/core/quant_block.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace qref {

// ---- f16 / bf16 from their definitions -------------------------------------------------------------------

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
inline double f16(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    else if (e == 0) v = std::ldexp(static_cast<double>(m), -24);
    else v = std::ldexp(static_cast<double>(1024 + m), e - 25);
    return s ? -v : v;
}

// Value of a binary32 bit pattern from its fields; exponent field 255 with mantissa 0 is read as 2^128 (the
// value just past the largest finite float, which is where round-to-nearest goes to infinity).
inline double f32_fields(uint32_t u) {
    const int s = u >> 31, e = (u >> 23) & 255;
    const uint32_t m = u & 0x7FFFFF;
    const double v = e == 0 ? std::ldexp(static_cast<double>(m), -149)
                            : std::ldexp(static_cast<double>(m | 0x800000), e - 150);
    return s ? -v : v;
}

inline uint32_t bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t rd16(const uint8_t * p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
inline void wr16(uint8_t * p, uint16_t v) { p[0] = static_cast<uint8_t>(v); p[1] = static_cast<uint8_t>(v >> 8); }
inline int lo(uint8_t b) { return b & 15; }
inline int hi(uint8_t b) { return b >> 4; }
inline int bit(uint32_t x, int k) { return (x >> k) & 1; }

// ---- block dequantization, one element at a time, from formats.md §2.5 ------------------------------------
// p points at one block's bytes; returns element e. Layout offsets are those of the §2.4 table.

inline double q4_0(const uint8_t * p, int e) {  // 0-1 d, 2-17 qs
    const double d = f16(rd16(p));
    const uint8_t * qs = p + 2;
    return e < 16 ? d * (lo(qs[e]) - 8) : d * (hi(qs[e - 16]) - 8);
}

inline double q4_1(const uint8_t * p, int e) {  // 0-1 d, 2-3 m, 4-19 qs
    const double d = f16(rd16(p)), m = f16(rd16(p + 2));
    const uint8_t * qs = p + 4;
    return e < 16 ? d * lo(qs[e]) + m : d * hi(qs[e - 16]) + m;
}

inline double q5_0(const uint8_t * p, int e) {  // 0-1 d, 2-5 qh, 6-21 qs
    const double d = f16(rd16(p));
    const uint32_t h = p[2] | p[3] << 8 | p[4] << 16 | static_cast<uint32_t>(p[5]) << 24;
    const uint8_t * qs = p + 6;
    if (e < 16) return d * (lo(qs[e]) + 16 * bit(h, e) - 16);
    return d * (hi(qs[e - 16]) + 16 * bit(h, e) - 16);
}

inline double q5_1(const uint8_t * p, int e) {  // 0-1 d, 2-3 m, 4-7 qh, 8-23 qs
    const double d = f16(rd16(p)), m = f16(rd16(p + 2));
    const uint32_t h = p[4] | p[5] << 8 | p[6] << 16 | static_cast<uint32_t>(p[7]) << 24;
    const uint8_t * qs = p + 8;
    const int q = e < 16 ? lo(qs[e]) + 16 * bit(h, e) : hi(qs[e - 16]) + 16 * bit(h, e);
    return d * q + m;
}

inline double q8_0(const uint8_t * p, int e) {  // 0-1 d, 2-33 qs int8
    return f16(rd16(p)) * static_cast<int8_t>(p[2 + e]);
}

inline double q2_k(const uint8_t * p, int e) {  // 0-15 scales, 16-79 qs, 80-81 d, 82-83 dmin
    const uint8_t * scales = p, * qs = p + 16;
    const double d = f16(rd16(p + 80)), dmin = f16(rd16(p + 82));
    const int n = e / 128, j = (e % 128) / 32, t = e % 32;
    const int q = (qs[32 * n + t] >> (2 * j)) & 3;
    const int s = 8 * n + 2 * j + (t >= 16 ? 1 : 0);
    return d * lo(scales[s]) * q - dmin * hi(scales[s]);
}

inline double q3_k(const uint8_t * p, int e) {  // 0-31 hmask, 32-95 qs, 96-107 scales, 108-109 d
    const uint8_t * hmask = p, * qs = p + 32, * scales = p + 96;
    const double d = f16(rd16(p + 108));
    const int n = e / 128, j = (e % 128) / 32, t = e % 32;
    const int s = 8 * n + 2 * j + (t >= 16 ? 1 : 0);
    const int low4 = s < 8 ? lo(scales[s]) : hi(scales[s - 8]);
    const int high2 = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    const int sc = low4 + 16 * high2 - 32;
    const int q2 = (qs[32 * n + t] >> (2 * j)) & 3;
    const int q = q2 - (bit(hmask[t], 4 * n + j) ? 0 : 4);
    return d * sc * q;
}

// Q4_K / Q5_K 6-bit scale and min of sub-block i, from the §2.5 text.
inline void k4_sm(const uint8_t * scales, int i, int & sc, int & m) {
    if (i < 4) {
        sc = scales[i] & 63;
        m = scales[i + 4] & 63;
    } else {
        sc = lo(scales[i + 4]) + 16 * (scales[i - 4] >> 6);
        m = hi(scales[i + 4]) + 16 * (scales[i] >> 6);
    }
}

inline double q4_k(const uint8_t * p, int e) {  // 0-1 d, 2-3 dmin, 4-15 scales, 16-143 qs
    const double d = f16(rd16(p)), dmin = f16(rd16(p + 2));
    const uint8_t * scales = p + 4, * qs = p + 16;
    const int c = e / 64, r = e % 64;  // element 64c + t (low nibble) or 64c + 32 + t (high nibble)
    int sc, m;
    if (r < 32) {
        k4_sm(scales, 2 * c, sc, m);
        return d * sc * lo(qs[32 * c + r]) - dmin * m;
    }
    k4_sm(scales, 2 * c + 1, sc, m);
    return d * sc * hi(qs[32 * c + r - 32]) - dmin * m;
}

inline double q5_k(const uint8_t * p, int e) {  // 0-1 d, 2-3 dmin, 4-15 scales, 16-47 qh, 48-175 qs
    const double d = f16(rd16(p)), dmin = f16(rd16(p + 2));
    const uint8_t * scales = p + 4, * qh = p + 16, * qs = p + 48;
    const int c = e / 64, r = e % 64;
    int sc, m;
    if (r < 32) {
        k4_sm(scales, 2 * c, sc, m);
        return d * sc * (lo(qs[32 * c + r]) + 16 * bit(qh[r], 2 * c)) - dmin * m;
    }
    const int t = r - 32;
    k4_sm(scales, 2 * c + 1, sc, m);
    return d * sc * (hi(qs[32 * c + t]) + 16 * bit(qh[t], 2 * c + 1)) - dmin * m;
}

inline double q6_k(const uint8_t * p, int e) {  // 0-127 ql, 128-191 qh, 192-207 scales int8, 208-209 d
    const uint8_t * ql = p, * qh = p + 128;
    const int8_t * scales = reinterpret_cast<const int8_t *>(p + 192);
    const double d = f16(rd16(p + 208));
    const int n = e / 128, r = e % 128, l = r % 32;
    const int H = qh[32 * n + l];
    int q;
    switch (r / 32) {
    case 0: q = lo(ql[64 * n + l]) | ((H >> 0) & 3) << 4; break;
    case 1: q = lo(ql[64 * n + 32 + l]) | ((H >> 2) & 3) << 4; break;
    case 2: q = hi(ql[64 * n + l]) | ((H >> 4) & 3) << 4; break;
    default: q = hi(ql[64 * n + 32 + l]) | ((H >> 6) & 3) << 4; break;
    }
    return d * scales[e / 16] * (q - 32);
}

// ---- the types under test ----------------------------------------------------------------------------

struct BlockType {
    const char * name;
    uint32_t id;                      // GGUF type id (formats.md §2.1)
    int block_size;
    int type_size;
    double (*ref)(const uint8_t *, int);
    std::vector<int> f16_offsets;     // where the block's f16 scales live (to make them sane when random)
};

inline const std::vector<BlockType> & block_types() {
    static const std::vector<BlockType> t = {
        {"q4_0", 2, 32, 18, q4_0, {0}},        {"q4_1", 3, 32, 20, q4_1, {0, 2}},
        {"q5_0", 6, 32, 22, q5_0, {0}},        {"q5_1", 7, 32, 24, q5_1, {0, 2}},
        {"q8_0", 8, 32, 34, q8_0, {0}},        {"q2_k", 10, 256, 84, q2_k, {80, 82}},
        {"q3_k", 11, 256, 110, q3_k, {108}},   {"q4_k", 12, 256, 144, q4_k, {0, 2}},
        {"q5_k", 13, 256, 176, q5_k, {0, 2}},  {"q6_k", 14, 256, 210, q6_k, {208}},
    };
    return t;
}

// A random finite f16 of either sign, any exponent including subnormals (never inf or nan).
inline uint16_t random_f16(std::mt19937 & rng) {
    uint16_t h;
    do h = static_cast<uint16_t>(rng()); while (((h >> 10) & 31) == 31);
    return h;
}

// `nblocks` blocks of random bytes with random finite f16 scales.
inline std::vector<uint8_t> random_blocks(const BlockType & bt, int nblocks, std::mt19937 & rng) {
    std::vector<uint8_t> v(static_cast<size_t>(nblocks) * bt.type_size);
    for (auto & b : v) b = static_cast<uint8_t>(rng());
    for (int i = 0; i < nblocks; ++i)
        for (int off : bt.f16_offsets) wr16(v.data() + static_cast<size_t>(i) * bt.type_size + off, random_f16(rng));
    return v;
}

} // namespace qref
