// K-quant quantizers, written from the algorithms of ggml's quantize_row_q{2..6}_K_ref (see quantize_k.h for
// why every expression keeps ggml's association; this file is compiled with -ffp-contract=off).
//
// Each super-block of 256 values is split into sub-blocks (16 values for Q2_K, Q3_K, Q6_K; 32 for Q4_K, Q5_K).
// Every sub-block gets its own scale (and, for the unsigned types, min) by a small search; the sub-block
// scales are then quantized to 4, 6 or 8 bits against the largest one, and the values are re-quantized with
// the scales as they will be decoded.
#include "ggml_rp/core/quantize_k.h"

#include "ggml_rp/core/fp16.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace rp::kquant {

namespace {

// A sub-block whose largest magnitude is below this is all zeros.
constexpr float kAllZero = 1e-15f;

inline int clamp(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }

// The first value of the largest magnitude (signed), and that magnitude.
float largest_magnitude(const float * x, int n, float & amax) {
    float max = 0;
    amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    return max;
}

// Signed sub-block scale with values in [-nmax, nmax) stored offset by nmax, weighted by x^2: starting from
// the scale that maps the largest-magnitude value to -nmax, tries 18 nearby scales and keeps the one that
// maximises (sum w x l)^2 / (sum w l^2) (ggml's make_qx_quants with rmse_type 1, no importance weights).
float signed_scale_x2_weighted(int n, int nmax, const float * x, int8_t * L) {
    float amax;
    const float max = largest_magnitude(x, n, amax);
    if (amax < kAllZero) {
        std::memset(L, 0, static_cast<size_t>(n));
        return 0.f;
    }
    float iscale = static_cast<float>(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = static_cast<int8_t>(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * static_cast<float>(l);
        suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * static_cast<float>(l);
            suml2 += w * static_cast<float>(l) * static_cast<float>(l);
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// Q3_K's signed sub-block scale: the largest-magnitude value maps to -nmax, then up to five passes of
// coordinate descent move single values to the level that improves (sum w x l)^2 / (sum w l^2), w = x^2
// (ggml's make_q3_quants with do_rmse). L holds values offset by nmax.
float signed_scale_q3(int n, int nmax, const float * x, int8_t * L) {
    float amax;
    const float max = largest_magnitude(x, n, amax);
    if (amax < kAllZero) {
        std::memset(L, 0, static_cast<size_t>(n));
        return 0.f;
    }
    const float iscale = static_cast<float>(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = static_cast<int8_t>(l);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * static_cast<float>(l);
        suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    for (int pass = 0; pass < 5; ++pass) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            const float li = static_cast<float>(L[i]);
            float slx = sumlx - w * x[i] * li;
            if (slx > 0) {
                float sl2 = suml2 - w * li * li;
                const int new_l = clamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    const float nl = static_cast<float>(new_l);
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = static_cast<int8_t>(new_l);
                        sumlx = slx;
                        suml2 = sl2;
                        ++changed;
                    }
                }
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Scale and min of an unsigned sub-block (value = scale * l - min, l in [0, nmax]) by a grid search over
// nstep + 1 scales around nmax / (max - min), each refined by weighted least squares for (scale, min); the
// error is the weighted squared (or absolute, `mad`) difference (ggml's make_qkx2_quants). Returns the
// scale; *neg_min gets -min (>= 0).
float scale_min_search(int n, int nmax, const float * x, const float * weights, uint8_t * L, float * neg_min,
                       uint8_t * Laux, float rmin, float rdelta, int nstep, bool mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        std::memset(L, 0, static_cast<size_t>(n));
        *neg_min = -min;
        return 0.f;
    }
    float iscale = static_cast<float>(nmax) / (max - min);
    float scale = 1 / iscale;
    auto error_of = [&](float d) { return mad ? std::fabs(d) : d * d; };
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        L[i] = static_cast<uint8_t>(clamp(nearest_int(iscale * (x[i] - min)), 0, nmax));
        best_error += weights[i] * error_of(scale * static_cast<float>(L[i]) + min - x[i]);
    }
    if (nstep < 1) {
        *neg_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = static_cast<uint8_t>(l);
            const float w = weights[i];
            const float fl = static_cast<float>(l);
            sum_l += w * fl;
            sum_l2 += w * fl * fl;
            sum_xl += w * fl * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i)
                cur_error += weights[i] * error_of(this_scale * static_cast<float>(Laux[i]) + this_min - x[i]);
            if (cur_error < best_error) {
                std::memcpy(L, Laux, static_cast<size_t>(n));
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
}

// Q4_K / Q5_K: eight 6-bit (scale, min) pairs packed into 12 bytes (quant_block.h k4_scale_min reads them).
void pack_k4_scales(const float * scales, const float * mins, float max_scale, float max_min, uint8_t * packed) {
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; ++j) {
        // ggml truncates to uint8_t before clamping; the products are in [0, 63] so that is the same value
        const uint8_t ls = static_cast<uint8_t>(std::min(63, static_cast<int>(static_cast<uint8_t>(nearest_int(inv_scale * scales[j])))));
        const uint8_t lm = static_cast<uint8_t>(std::min(63, static_cast<int>(static_cast<uint8_t>(nearest_int(inv_min * mins[j])))));
        if (j < 4) {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
            packed[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
            packed[j] |= static_cast<uint8_t>((lm >> 4) << 6);
        }
    }
}

// Q4_K / Q5_K: per-sub-block scale and min of 32 values weighted by rms(x) + |x|; returns the largest of each.
void k4_sub_blocks(const float * x, int nmax, float rmin, int nstep, float * scales, float * mins, uint8_t * L,
                   float & max_scale, float & max_min) {
    float weights[32];
    uint8_t Laux[32];
    max_scale = 0;
    max_min = 0;
    for (int j = 0; j < QK_K / 32; ++j) {
        const float * xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
        const float av_x = std::sqrt(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
        scales[j] = scale_min_search(32, nmax, xs, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
}

// Q4_K / Q5_K: the values re-quantized with the decoded 6-bit scales and mins.
void k4_requantize(const float * x, uint16_t d16, uint16_t dmin16, const uint8_t * packed, int nmax, uint8_t * L) {
    for (int j = 0; j < QK_K / 32; ++j) {
        int sc, m;
        k4_scale_min(j, packed, sc, m);
        const float d = fp16_to_fp32(d16) * static_cast<float>(sc);
        if (d == 0) continue;
        const float dm = fp16_to_fp32(dmin16) * static_cast<float>(m);
        for (int ii = 0; ii < 32; ++ii) L[32 * j + ii] = static_cast<uint8_t>(clamp(nearest_int((x[32 * j + ii] + dm) / d), 0, nmax));
    }
}

// Q2_K and Q3_K pack four 2-bit values per byte: byte l of each 32-byte group of a 128-value chunk holds
// values l, l+32, l+64, l+96 in bits 0-1, 2-3, 4-5, 6-7.
template <class Level>
void pack_2bit(const Level * L, uint8_t * qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

} // namespace

void quantize_q2_K(const float * x, block_q2_K * y, int64_t nb) {
    uint8_t L[QK_K];
    uint8_t Laux[16];
    float weights[16];
    float mins[QK_K / 16];
    float scales[QK_K / 16];
    const float q4scale = 15.f;
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        block_q2_K & b = y[i];
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
            scales[j] = scale_min_search(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) b.scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
            b.d = fp32_to_fp16(max_scale / q4scale);
        } else {
            for (int j = 0; j < QK_K / 16; ++j) b.scales[j] = 0;
            b.d = fp32_to_fp16(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; ++j) b.scales[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
            b.dmin = fp32_to_fp16(max_min / q4scale);
        } else {
            b.dmin = fp32_to_fp16(0.f);
        }
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = fp16_to_fp32(b.d) * static_cast<float>(b.scales[j] & 0xF);
            if (d == 0) continue;
            const float dm = fp16_to_fp32(b.dmin) * static_cast<float>(b.scales[j] >> 4);
            for (int ii = 0; ii < 16; ++ii) L[16 * j + ii] = static_cast<uint8_t>(clamp(nearest_int((x[16 * j + ii] + dm) / d), 0, 3));
        }
        pack_2bit(L, b.qs);
    }
}

void quantize_q3_K(const float * x, block_q3_K * y, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        block_q3_K & b = y[i];
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; ++j) {
            scales[j] = signed_scale_q3(16, 4, x + 16 * j, L + 16 * j);
            const float s = std::fabs(scales[j]);
            if (s > amax) {
                amax = s;
                max_scale = scales[j];
            }
        }
        std::memset(b.scales, 0, sizeof b.scales);
        if (max_scale != 0) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) {
                // 6-bit signed scales offset by 32: low 4 bits in scales[0..7] (two per byte), high 2 bits in
                // scales[8..11]. ggml truncates to int8_t before clamping; the product is within [-32, 32].
                const int l = clamp(static_cast<int8_t>(nearest_int(iscale * scales[j])), -32, 31) + 32;
                if (j < 8) b.scales[j] = static_cast<uint8_t>(l & 0xF);
                else b.scales[j - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
                b.scales[j % 4 + 8] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
            }
            b.d = fp32_to_fp16(1 / iscale);
        } else {
            b.d = fp32_to_fp16(0.f);
        }
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = fp16_to_fp32(b.d) * static_cast<float>(q3k_scale(j, b.scales));
            if (d == 0) continue;
            for (int ii = 0; ii < 16; ++ii) L[16 * j + ii] = static_cast<int8_t>(clamp(nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
        }
        // The third bit of value j goes to hmask[j % 32], bit j / 32; the low two bits are packed like Q2_K.
        std::memset(b.hmask, 0, sizeof b.hmask);
        for (int j = 0; j < QK_K; ++j) {
            if (L[j] > 3) {
                b.hmask[j % (QK_K / 8)] |= static_cast<uint8_t>(1 << (j / (QK_K / 8)));
                L[j] = static_cast<int8_t>(L[j] - 4);
            }
        }
        pack_2bit(L, b.qs);
    }
}

void quantize_q4_K(const float * x, block_q4_K * y, int64_t nb) {
    uint8_t L[QK_K];
    float mins[QK_K / 32];
    float scales[QK_K / 32];
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        block_q4_K & b = y[i];
        float max_scale, max_min;
        k4_sub_blocks(x, 15, -1.f, 20, scales, mins, L, max_scale, max_min);
        pack_k4_scales(scales, mins, max_scale, max_min, b.scales);
        b.d = fp32_to_fp16(max_scale / 63.f);
        b.dmin = fp32_to_fp16(max_min / 63.f);
        k4_requantize(x, b.d, b.dmin, b.scales, 15, L);
        // Byte l of each 32-byte group holds values l (low nibble) and l + 32 (high) of a 64-value chunk.
        for (int j = 0; j < QK_K; j += 64)
            for (int l = 0; l < 32; ++l) b.qs[j / 2 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    }
}

void quantize_q5_K(const float * x, block_q5_K * y, int64_t nb) {
    uint8_t L[QK_K];
    float mins[QK_K / 32];
    float scales[QK_K / 32];
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        block_q5_K & b = y[i];
        float max_scale, max_min;
        k4_sub_blocks(x, 31, -0.5f, 15, scales, mins, L, max_scale, max_min);
        pack_k4_scales(scales, mins, max_scale, max_min, b.scales);
        b.d = fp32_to_fp16(max_scale / 63.f);
        b.dmin = fp32_to_fp16(max_min / 63.f);
        k4_requantize(x, b.d, b.dmin, b.scales, 31, L);
        // Low nibbles like Q4_K; the fifth bit of value n + j (n a 64-value chunk c) is bit 2c of qh[j], of
        // value n + j + 32 bit 2c + 1.
        std::memset(b.qh, 0, sizeof b.qh);
        for (int n = 0, c = 0; n < QK_K; n += 64, ++c) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    b.qh[j] |= static_cast<uint8_t>(1 << (2 * c));
                }
                if (l2 > 15) {
                    l2 -= 16;
                    b.qh[j] |= static_cast<uint8_t>(2 << (2 * c));
                }
                b.qs[n / 2 + j] = static_cast<uint8_t>(l1 | (l2 << 4));
            }
        }
    }
}

void quantize_q6_K(const float * x, block_q6_K * y, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        block_q6_K & b = y[i];
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ++ib) {
            scales[ib] = signed_scale_x2_weighted(16, 32, x + 16 * ib, L + 16 * ib);
            const float a = std::fabs(scales[ib]);
            if (a > max_abs_scale) {
                max_abs_scale = a;
                max_scale = scales[ib];
            }
        }
        if (max_abs_scale < kAllZero) {
            std::memset(&b, 0, sizeof b);
            continue;
        }
        const float iscale = -128.f / max_scale;
        b.d = fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ++ib) b.scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = fp16_to_fp32(b.d) * static_cast<float>(b.scales[j]);
            if (d == 0) continue;
            for (int ii = 0; ii < 16; ++ii) L[16 * j + ii] = static_cast<int8_t>(clamp(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
        }
        // Per 128-value chunk: ql[l] = low nibbles of values l and l+64, ql[l+32] of l+32 and l+96; qh[l]
        // holds the high two bits of values l, l+32, l+64, l+96.
        uint8_t * ql = b.ql;
        uint8_t * qh = b.qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                const int v0 = L[j + l], v1 = L[j + l + 32], v2 = L[j + l + 64], v3 = L[j + l + 96];
                ql[l] = static_cast<uint8_t>((v0 & 0xF) | ((v2 & 0xF) << 4));
                ql[l + 32] = static_cast<uint8_t>((v1 & 0xF) | ((v3 & 0xF) << 4));
                qh[l] = static_cast<uint8_t>((v0 >> 4) | ((v1 >> 4) << 2) | ((v2 >> 4) << 4) | ((v3 >> 4) << 6));
            }
        }
    }
}

} // namespace rp::kquant
