// f32 <-> f16 (IEEE binary16) and f32 <-> bf16 conversions, one code path for host and device
// (formats.md §2.6). Pure integer bit manipulation, so the result never depends on the FPU mode, the
// compiler's contraction flags or whether F16C / CUDA intrinsics are there: host and device agree bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#include "ggml_rp/core/host_device.h"

namespace rp {

// Bit casts that are valid in host code (memcpy) and device code (intrinsics).
RP_HD inline uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
    return static_cast<uint32_t>(__float_as_uint(f));
#else
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
#endif
}

RP_HD inline float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
}

// binary16 -> binary32 (exact: every f16 value is representable). NaN payloads are kept (shifted up).
RP_HD inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (mant << 13));      // inf / nan
    if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13)); // normal: rebias 15 -> 127
    if (mant == 0) return f32_from_bits(sign);                                      // +-0
    // Subnormal: mant * 2^-24. Normalize so that bit 10 is the implicit one.
    uint32_t e = 113;  // exponent field of 2^-14, the f16 subnormal scale, as an f32
    while ((mant & 0x400u) == 0) { mant <<= 1; --e; }
    return f32_from_bits(sign | (e << 23) | ((mant & 0x3FFu) << 13));
}

// binary32 -> binary16, round to nearest, ties to even; overflow -> inf; NaN -> quiet NaN (payload kept,
// as F16C's vcvtps2ph does).
RP_HD inline uint16_t fp32_to_fp16(float f) {
    const uint32_t u = f32_bits(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t x = u & 0x7FFFFFFFu;
    if (x > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((x >> 13) & 0x3FFu));  // nan
    if (x >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 (incl. inf) -> inf
    if (x >= 0x38800000u) {                                              // >= 2^-14: normal f16
        const uint32_t m = x & 0x7FFFFFu;
        uint32_t h = (((x >> 23) - 112u) << 10) | (m >> 13);
        const uint32_t rem = m & 0x1FFFu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;          // a carry into the exponent is right
        return static_cast<uint16_t>(sign | h);
    }
    if (x <= 0x33000000u) return static_cast<uint16_t>(sign);            // <= 2^-25 (a tie with 0) -> +-0
    // Subnormal f16: round(value / 2^-24). value = m * 2^(e - 150), so shift m right by 126 - e (14..24).
    const uint32_t e = x >> 23;
    const uint32_t m = (x & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - e;
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) ++h;                    // may reach 0x400, the least normal
    return static_cast<uint16_t>(sign | h);
}

// bfloat16 -> binary32: the 16 bits are the high half.
RP_HD inline float bf16_to_fp32(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

// binary32 -> bfloat16 as ggml does it: round to nearest even by adding 0x7FFF + lsb; NaN -> quiet NaN.
// Subnormals are kept (not flushed); values past the largest bf16 round to inf.
RP_HD inline uint16_t fp32_to_bf16(float f) {
    const uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    return static_cast<uint16_t>((u + (0x7FFFu + ((u >> 16) & 1u))) >> 16);
}

} // namespace rp
