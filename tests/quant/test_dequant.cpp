// Dequantizers against the independent element-by-element references of quant_ref.h (random blocks), and
// against blocks packed by hand from chosen scales / mins / quants (values known without decoding anything).
//
// Comparisons are exact: every product in these formulas (an f16 scale times small integers) needs at most
// 24 significant bits, so it is exact in f32, and a value takes at most one rounded f32 operation (the final
// add/sub). The double-precision reference is exact, and rounding it to f32 once gives the same float.
#include "ggml_rp/core/quant.h"
#include "ggml_rp/core/quant_block.h"
#include "base/error.h"
#include "quant_ref.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace {

using gguf::TensorType;

TensorType tt(const qref::BlockType & bt) { return static_cast<TensorType>(bt.id); }

// dequant_elem_<t> (the GPU's per-element form) for a block at p.
float elem(uint32_t id, const uint8_t * p, int e) {
    switch (id) {
    case 2: return rp::dequant_elem_q4_0(*reinterpret_cast<const rp::block_q4_0 *>(p), e);
    case 3: return rp::dequant_elem_q4_1(*reinterpret_cast<const rp::block_q4_1 *>(p), e);
    case 6: return rp::dequant_elem_q5_0(*reinterpret_cast<const rp::block_q5_0 *>(p), e);
    case 7: return rp::dequant_elem_q5_1(*reinterpret_cast<const rp::block_q5_1 *>(p), e);
    case 8: return rp::dequant_elem_q8_0(*reinterpret_cast<const rp::block_q8_0 *>(p), e);
    case 10: return rp::dequant_elem_q2_K(*reinterpret_cast<const rp::block_q2_K *>(p), e);
    case 11: return rp::dequant_elem_q3_K(*reinterpret_cast<const rp::block_q3_K *>(p), e);
    case 12: return rp::dequant_elem_q4_K(*reinterpret_cast<const rp::block_q4_K *>(p), e);
    case 13: return rp::dequant_elem_q5_K(*reinterpret_cast<const rp::block_q5_K *>(p), e);
    case 14: return rp::dequant_elem_q6_K(*reinterpret_cast<const rp::block_q6_K *>(p), e);
    }
    ADD_FAILURE() << "no element dequantizer for type " << id;
    return 0.0f;
}

} // namespace

// Row dequantization (the CPU path) and the per-element form (the GPU path) both equal the reference on
// random blocks with random finite f16 scales (subnormal ones included).
TEST(Dequant, RandomBlocksMatchFormulas) {
    std::mt19937 rng(42);
    for (const qref::BlockType & bt : qref::block_types()) {
        SCOPED_TRACE(bt.name);
        const int nblocks = bt.block_size == 32 ? 512 : 64;
        const std::vector<uint8_t> q = qref::random_blocks(bt, nblocks, rng);
        const int64_t n = static_cast<int64_t>(nblocks) * bt.block_size;
        ASSERT_TRUE(rp::can_dequantize(tt(bt)));
        std::vector<float> y(static_cast<size_t>(n));
        rp::dequantize_row(tt(bt), q.data(), y.data(), n);
        for (int b = 0; b < nblocks; ++b) {
            const uint8_t * p = q.data() + static_cast<size_t>(b) * bt.type_size;
            for (int e = 0; e < bt.block_size; ++e) {
                const float want = static_cast<float>(bt.ref(p, e));
                ASSERT_EQ(y[static_cast<size_t>(b) * bt.block_size + e], want) << "block " << b << " element " << e;
                ASSERT_EQ(elem(bt.id, p, e), want) << "block " << b << " element " << e;
            }
        }
    }
}

TEST(Dequant, PlainTypes) {
    const uint16_t h[4] = {0x3C00, 0xC000, 0x0001, 0x7BFF};  // 1, -2, 2^-24, 65504
    float y[4];
    rp::dequantize_row(TensorType::F16, h, y, 4);
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], -2.0f);
    EXPECT_EQ(y[2], std::ldexp(1.0f, -24));
    EXPECT_EQ(y[3], 65504.0f);
    const uint16_t b[3] = {0x3F80, 0xC0A0, 0x3EAB};  // 1, -5, 0.333984375
    rp::dequantize_row(TensorType::BF16, b, y, 3);
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], -5.0f);
    EXPECT_EQ(y[2], 0.333984375f);
    const float f[2] = {3.5f, -0.25f};
    rp::dequantize_row(TensorType::F32, f, y, 2);
    EXPECT_EQ(y[0], 3.5f);
    EXPECT_EQ(y[1], -0.25f);
}

TEST(Dequant, BadInputsThrowNamingTheType) {
    std::vector<uint8_t> buf(4096);
    std::vector<float> y(1024);
    auto msg = [&](TensorType t, int64_t n) -> std::string {
        try {
            rp::dequantize_row(t, buf.data(), y.data(), n);
        } catch (const rp::Error & e) {
            return e.what();
        }
        return "";
    };
    EXPECT_NE(msg(TensorType::Q4_0, 33).find("q4_0"), std::string::npos);
    EXPECT_NE(msg(TensorType::Q6_K, 32).find("q6_k"), std::string::npos);
    EXPECT_NE(msg(TensorType::IQ2_XXS, 256).find("iq2_xxs"), std::string::npos);
    EXPECT_NE(msg(TensorType::Q8_K, 256).find("q8_k"), std::string::npos);
    EXPECT_NE(msg(static_cast<TensorType>(4), 32).find("type#4"), std::string::npos);
    EXPECT_NE(msg(static_cast<TensorType>(1000), 32).find("type#1000"), std::string::npos);
    EXPECT_FALSE(rp::can_dequantize(TensorType::Q8_1));
    EXPECT_FALSE(rp::can_dequantize(TensorType::I32));
    EXPECT_THROW(rp::quantize_row(TensorType::IQ2_XXS, y.data(), buf.data(), 256), rp::Error);  // no quantizer
    EXPECT_THROW(rp::quantize_row(TensorType::Q4_K, y.data(), buf.data(), 128), rp::Error);     // half a block
    EXPECT_THROW(rp::quantize_row(TensorType::Q8_0, y.data(), buf.data(), 48), rp::Error);
}

// ---- blocks packed by hand: choose the semantic values, pack them per formats.md §2.4/§2.5, dequantize,
// ---- and compare with value = formula(chosen values), no decoding involved ---------------------------------

namespace {

struct Rand {
    std::mt19937 g{7};
    int operator()(int lo_incl, int hi_incl) { return std::uniform_int_distribution<int>(lo_incl, hi_incl)(g); }
};

// Scales that are exact small binary fractions, so the expected values below are exact in double.
const uint16_t kD = 0x2E00;     // 0.09375
const uint16_t kDmin = 0xA980;  // -0.04296875 (a negative dmin is legal and exercises the sign)

template <int QK>
void expect_block(TensorType t, const std::vector<uint8_t> & blk, const double (&want)[QK]) {
    float y[QK];
    rp::dequantize_row(t, blk.data(), y, QK);
    for (int e = 0; e < QK; ++e) ASSERT_EQ(y[e], static_cast<float>(want[e])) << "element " << e;
}

} // namespace

TEST(DequantHandPacked, Q2_K) {
    Rand r;
    int sc[16], mn[16], q[256];
    for (int s = 0; s < 16; ++s) { sc[s] = r(0, 15); mn[s] = r(0, 15); }
    for (int e = 0; e < 256; ++e) q[e] = r(0, 3);
    std::vector<uint8_t> blk(84, 0);
    for (int s = 0; s < 16; ++s) blk[s] = static_cast<uint8_t>(sc[s] | mn[s] << 4);
    double want[256];
    for (int e = 0; e < 256; ++e) {
        const int n = e / 128, j = (e % 128) / 32, t = e % 32;
        blk[16 + 32 * n + t] |= static_cast<uint8_t>(q[e] << (2 * j));
        const int s = e / 16;  // = 8n + 2j + [t >= 16]
        want[e] = qref::f16(kD) * sc[s] * q[e] - qref::f16(kDmin) * mn[s];
    }
    qref::wr16(&blk[80], kD);
    qref::wr16(&blk[82], kDmin);
    expect_block<256>(TensorType::Q2_K, blk, want);
}

TEST(DequantHandPacked, Q3_K) {
    Rand r;
    int sc[16], q[256];
    for (int s = 0; s < 16; ++s) sc[s] = r(-32, 31);
    sc[0] = -32;
    sc[15] = 31;
    for (int e = 0; e < 256; ++e) q[e] = r(-4, 3);
    std::vector<uint8_t> blk(110, 0);
    for (int s = 0; s < 16; ++s) {
        const int raw = sc[s] + 32;  // 6 bits: low 4 in a nibble, high 2 in bytes 8..11
        if (s < 8) blk[96 + s] |= static_cast<uint8_t>(raw & 15);
        else blk[96 + s - 8] |= static_cast<uint8_t>((raw & 15) << 4);
        blk[96 + 8 + s % 4] |= static_cast<uint8_t>((raw >> 4) << (2 * (s / 4)));
    }
    double want[256];
    for (int e = 0; e < 256; ++e) {
        const int n = e / 128, j = (e % 128) / 32, t = e % 32;
        const int q2 = q[e] >= 0 ? q[e] : q[e] + 4;  // q = q2 - (hmask bit ? 0 : 4)
        blk[32 + 32 * n + t] |= static_cast<uint8_t>(q2 << (2 * j));
        if (q[e] >= 0) blk[t] |= static_cast<uint8_t>(1 << (4 * n + j));
        want[e] = qref::f16(kD) * sc[e / 16] * q[e];
    }
    qref::wr16(&blk[108], kD);
    expect_block<256>(TensorType::Q3_K, blk, want);
}

namespace {

// Q4_K / Q5_K: packs eight 6-bit scales and mins into the 12 scale bytes at p.
void pack_k4_scales(uint8_t * p, const int (&sc)[8], const int (&mn)[8]) {
    for (int i = 0; i < 4; ++i) {
        p[i] = static_cast<uint8_t>(sc[i] | (sc[i + 4] >> 4) << 6);
        p[i + 4] = static_cast<uint8_t>(mn[i] | (mn[i + 4] >> 4) << 6);
        p[i + 8] = static_cast<uint8_t>((sc[i + 4] & 15) | (mn[i + 4] & 15) << 4);
    }
}

} // namespace

TEST(DequantHandPacked, Q4_K) {
    Rand r;
    int sc[8], mn[8], q[256];
    for (int i = 0; i < 8; ++i) { sc[i] = r(0, 63); mn[i] = r(0, 63); }
    sc[7] = 63;
    mn[4] = 63;
    for (int e = 0; e < 256; ++e) q[e] = r(0, 15);
    std::vector<uint8_t> blk(144, 0);
    qref::wr16(&blk[0], kD);
    qref::wr16(&blk[2], kDmin);
    pack_k4_scales(&blk[4], sc, mn);
    double want[256];
    for (int e = 0; e < 256; ++e) {
        const int i = e / 32, c = e / 64, t = e % 32;  // sub-block i: low nibbles when even, high when odd
        blk[16 + 32 * c + t] |= static_cast<uint8_t>(i % 2 == 0 ? q[e] : q[e] << 4);
        want[e] = qref::f16(kD) * sc[i] * q[e] - qref::f16(kDmin) * mn[i];
    }
    expect_block<256>(TensorType::Q4_K, blk, want);
}

TEST(DequantHandPacked, Q5_K) {
    Rand r;
    int sc[8], mn[8], q[256];
    for (int i = 0; i < 8; ++i) { sc[i] = r(0, 63); mn[i] = r(0, 63); }
    for (int e = 0; e < 256; ++e) q[e] = r(0, 31);
    std::vector<uint8_t> blk(176, 0);
    qref::wr16(&blk[0], kD);
    qref::wr16(&blk[2], kDmin);
    pack_k4_scales(&blk[4], sc, mn);
    double want[256];
    for (int e = 0; e < 256; ++e) {
        const int i = e / 32, c = e / 64, t = e % 32;
        blk[48 + 32 * c + t] |= static_cast<uint8_t>(i % 2 == 0 ? (q[e] & 15) : (q[e] & 15) << 4);
        blk[16 + t] |= static_cast<uint8_t>((q[e] >> 4) << i);  // fifth bit: qh[t], bit 2c (+1 for high nibble)
        want[e] = qref::f16(kD) * sc[i] * q[e] - qref::f16(kDmin) * mn[i];
    }
    expect_block<256>(TensorType::Q5_K, blk, want);
}

TEST(DequantHandPacked, Q6_K) {
    Rand r;
    int sc[16], q[256];
    for (int s = 0; s < 16; ++s) sc[s] = r(-128, 127);
    sc[3] = -128;
    for (int e = 0; e < 256; ++e) q[e] = r(0, 63);
    std::vector<uint8_t> blk(210, 0);
    for (int s = 0; s < 16; ++s) blk[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(sc[s]));
    qref::wr16(&blk[208], kD);
    double want[256];
    for (int e = 0; e < 256; ++e) {
        const int n = e / 128, r4 = (e % 128) / 32, l = e % 32;
        const int low = q[e] & 15, high = q[e] >> 4;
        const int qlb = 64 * n + (r4 % 2 == 1 ? 32 : 0) + l;  // quarters 1 and 3 use ql[64n + 32 + l]
        blk[qlb] |= static_cast<uint8_t>(r4 < 2 ? low : low << 4);
        blk[128 + 32 * n + l] |= static_cast<uint8_t>(high << (2 * r4));
        want[e] = qref::f16(kD) * sc[e / 16] * (q[e] - 32);
    }
    expect_block<256>(TensorType::Q6_K, blk, want);
}

TEST(DequantHandPacked, ThirtyTwoBlocks) {
    Rand r;
    int q[32];
    // Q4_0 / Q4_1: element j in the low nibble of qs[j], element j+16 in the high nibble.
    for (int e = 0; e < 32; ++e) q[e] = r(0, 15);
    {
        std::vector<uint8_t> blk(18, 0);
        qref::wr16(&blk[0], kD);
        double want[32];
        for (int e = 0; e < 32; ++e) {
            blk[2 + e % 16] |= static_cast<uint8_t>(e < 16 ? q[e] : q[e] << 4);
            want[e] = qref::f16(kD) * (q[e] - 8);
        }
        expect_block<32>(TensorType::Q4_0, blk, want);
        std::vector<uint8_t> b1(20, 0);
        qref::wr16(&b1[0], kD);
        qref::wr16(&b1[2], kDmin);
        for (int e = 0; e < 32; ++e) {
            b1[4 + e % 16] |= static_cast<uint8_t>(e < 16 ? q[e] : q[e] << 4);
            want[e] = qref::f16(kD) * q[e] + qref::f16(kDmin);
        }
        expect_block<32>(TensorType::Q4_1, b1, want);
    }
    // Q5_0 / Q5_1: bit 4 of element e is bit e of the little-endian qh word.
    for (int e = 0; e < 32; ++e) q[e] = r(0, 31);
    {
        std::vector<uint8_t> blk(22, 0);
        qref::wr16(&blk[0], kD);
        double want[32];
        for (int e = 0; e < 32; ++e) {
            blk[6 + e % 16] |= static_cast<uint8_t>(e < 16 ? (q[e] & 15) : (q[e] & 15) << 4);
            blk[2 + e / 8] |= static_cast<uint8_t>((q[e] >> 4) << (e % 8));
            want[e] = qref::f16(kD) * (q[e] - 16);
        }
        expect_block<32>(TensorType::Q5_0, blk, want);
        std::vector<uint8_t> b1(24, 0);
        qref::wr16(&b1[0], kD);
        qref::wr16(&b1[2], kDmin);
        for (int e = 0; e < 32; ++e) {
            b1[8 + e % 16] |= static_cast<uint8_t>(e < 16 ? (q[e] & 15) : (q[e] & 15) << 4);
            b1[4 + e / 8] |= static_cast<uint8_t>((q[e] >> 4) << (e % 8));
            want[e] = qref::f16(kD) * q[e] + qref::f16(kDmin);
        }
        expect_block<32>(TensorType::Q5_1, b1, want);
    }
    // Q8_0: signed bytes.
    {
        std::vector<uint8_t> blk(34, 0);
        qref::wr16(&blk[0], kD);
        double want[32];
        for (int e = 0; e < 32; ++e) {
            const int v = e == 0 ? -128 : e == 1 ? 127 : r(-128, 127);
            blk[2 + e] = static_cast<uint8_t>(static_cast<int8_t>(v));
            want[e] = qref::f16(kD) * v;
        }
        expect_block<32>(TensorType::Q8_0, blk, want);
    }
}

// The packed forms of the K-quant scales (the vector kernels') hold the values k4_scale_min and q3k_scale
// give, for every byte pattern of random scale blocks.
TEST(KQuantScales, PackedWordsAreTheScalarValues) {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 2000; ++trial) {
        uint8_t q[12];
        for (uint8_t & b : q) b = static_cast<uint8_t>(rng());
        uint32_t sc[2], m[2];
        rp::k4_scales_mins_packed(q, sc, m);
        for (int i = 0; i < 8; ++i) {
            int want_sc = 0, want_m = 0;
            rp::k4_scale_min(i, q, want_sc, want_m);
            ASSERT_EQ(static_cast<int>((sc[i / 4] >> (8 * (i % 4))) & 0xFF), want_sc) << "trial " << trial << " sub-block " << i;
            ASSERT_EQ(static_cast<int>((m[i / 4] >> (8 * (i % 4))) & 0xFF), want_m) << "trial " << trial << " sub-block " << i;
        }
        uint32_t w[4];
        rp::q3k_scales_packed(q, w);
        for (int s16 = 0; s16 < 16; ++s16)
            ASSERT_EQ(static_cast<int>((w[s16 / 4] >> (8 * (s16 % 4))) & 0xFF) - 32, rp::q3k_scale(s16, q)) << "trial " << trial << " sub-block " << s16;
    }
}
