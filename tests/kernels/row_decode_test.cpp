// The GEMM's vectorized row decoder (ggml_rp/cpu/row_decode.h) against the scalar reference
// rp::dequantize_row, bit for bit, for every weight type: on rows the quantizers write and on rows of random
// bytes (every bit pattern of quants, scales and the fp16 fields, so a wrong shift, mask or sub-block order
// cannot hide behind a small scale).
#include "ggml_rp/cpu/row_decode.h"

#include "kernels_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace {

using namespace kt;

// Equal bits, or both NaN (a NaN's payload is not a value).
bool same_value(float a, float b) {
    return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
}

void expect_decodes_as_reference(TensorType t, const std::vector<uint8_t> & row, int64_t n, const char * what) {
    std::vector<float> ref(static_cast<size_t>(n)), got(static_cast<size_t>(n), -7.0f);
    rp::dequantize_row(t, row.data(), ref.data(), n);
    rp::cpu::decode_row(t, row.data(), got.data(), n);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; ++i)
        if (!same_value(ref[size_t(i)], got[size_t(i)])) {
            if (first < 0) first = i;
            ++bad;
        }
    EXPECT_EQ(bad, 0) << gguf::type_name(uint32_t(t)) << " " << what << " n=" << n << ": first difference at element " << first
                      << " (" << (first >= 0 ? got[size_t(first)] : 0.0f) << " vs "
                      << (first >= 0 ? ref[size_t(first)] : 0.0f) << ")";
}

TEST(RowDecode, EveryTypeDecodesAsTheReferenceBitForBit) {
    Rng rng(41);
    for (TensorType t : weight_types()) {
        const int64_t qk = block_size(t);
        // 1 and 3 blocks, and for the plain types lengths that leave a vector tail.
        std::vector<int64_t> lengths = {qk, 3 * qk, 256 * ((qk + 255) / 256) * 2};
        if (qk == 1) lengths.insert(lengths.end(), {1, 7, 15, 17, 33, 301});
        for (int64_t n : lengths) {
            const size_t bytes = gguf::row_bytes(t, n);
            // Random bytes (f32 excluded: its decoding is a copy).
            if (t != TensorType::F32) {
                std::vector<uint8_t> raw(bytes);
                for (auto & b : raw) b = uint8_t(rng.next() >> 56);
                expect_decodes_as_reference(t, raw, n, "random bytes");
            }
            // A real row: quantized (or, for the K types without a round-to-nearest quantizer here, filled).
            const Weight w = make_weight(t, n, 1, rng);
            expect_decodes_as_reference(t, w.bytes, n, "quantized row");
        }
    }
}

}  // namespace
