// Shared helpers of the kernel tests: a seeded RNG, weights of every type with their exact dequantized values,
// and OpenMP thread-count control. References are written in the tests themselves, in double precision.
#pragma once

#include "ggml_rp/core/fp16.h"
#include "ggml_rp/core/quant.h"
#include "ggml_rp/core/quant_block.h"
#include "ggml_rp/cpu/matvec_dot.h"
#include "gguf/types.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace kt {

using gguf::TensorType;

// xorshift64*: deterministic, platform-independent values.
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    uint64_t next() {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        return s * 0x2545F4914F6CDD1Dull;
    }
    float uniform(float lo = -1.0f, float hi = 1.0f) {
        return lo + (hi - lo) * float(double(next() >> 40) / double(1ull << 24));
    }
    int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
};

inline std::vector<float> random_floats(size_t n, Rng & rng, float amp = 1.0f) {
    std::vector<float> v(n);
    for (auto & x : v) x = rng.uniform(-amp, amp);
    return v;
}

// All weight types the GEMM takes.
inline const std::vector<TensorType> & weight_types() {
    static const std::vector<TensorType> t = {
        TensorType::F32,  TensorType::F16,  TensorType::BF16, TensorType::Q4_0, TensorType::Q4_1,
        TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0, TensorType::Q2_K, TensorType::Q3_K,
        TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K, TensorType::MXFP4};
    return t;
}

inline int64_t block_size(TensorType t) { return gguf::type_traits(uint32_t(t))->block_size; }

// N rows of K values of type t, rows `row_bytes` apart (>= the packed size: padding exercises the stride),
// plus `deq`: the exact values the kernel must use (rp::dequantize_row of each row, as double).
struct Weight {
    TensorType type;
    int64_t K, N;
    size_t row_bytes;
    std::vector<uint8_t> bytes;
    std::vector<double> deq;   // [N][K]
    const void * data() const { return bytes.data(); }
    double at(int64_t k, int64_t n) const { return deq[size_t(n * K + k)]; }
};

// K-quant blocks have no quantizer in the library: random bytes with sane f16 scales make valid blocks.
inline void fill_kquant_row(TensorType t, uint8_t * row, int64_t K, Rng & rng) {
    const size_t bs = gguf::type_traits(uint32_t(t))->type_size;
    for (int64_t b = 0; b < K / rp::QK_K; ++b) {
        uint8_t * blk = row + size_t(b) * bs;
        for (size_t i = 0; i < bs; ++i) blk[i] = uint8_t(rng.next() >> 56);
        // Super-block scales sized so that values stay within about [-1, 1]: d times the largest
        // (sub-scale x quant) product of the type, dmin times the largest sub-min.
        float dmul = 1.0f, mmul = 1.0f;
        switch (t) {
        case TensorType::Q2_K: dmul = 15 * 3; mmul = 15; break;
        case TensorType::Q3_K: dmul = 32 * 4; break;
        case TensorType::Q4_K: dmul = 63 * 15; mmul = 63; break;
        case TensorType::Q5_K: dmul = 63 * 31; mmul = 63; break;
        case TensorType::Q6_K: dmul = 128 * 32; break;
        default: break;
        }
        const uint16_t d = rp::fp32_to_fp16(rng.uniform(0.3f, 1.0f) / dmul);
        const uint16_t dmin = rp::fp32_to_fp16(rng.uniform(0.1f, 0.5f) / mmul);
        auto put = [&](size_t off, uint16_t v) { std::memcpy(blk + off, &v, 2); };
        switch (t) {
        case TensorType::Q2_K: put(offsetof(rp::block_q2_K, d), d); put(offsetof(rp::block_q2_K, dmin), dmin); break;
        case TensorType::Q3_K: put(offsetof(rp::block_q3_K, d), d); break;
        case TensorType::Q4_K: put(offsetof(rp::block_q4_K, d), d); put(offsetof(rp::block_q4_K, dmin), dmin); break;
        case TensorType::Q5_K: put(offsetof(rp::block_q5_K, d), d); put(offsetof(rp::block_q5_K, dmin), dmin); break;
        case TensorType::Q6_K: put(offsetof(rp::block_q6_K, d), d); break;
        default: break;
        }
    }
}

inline Weight make_weight(TensorType t, int64_t K, int64_t N, Rng & rng, size_t pad_bytes = 0) {
    if (pad_bytes % 4 != 0) pad_bytes += 4 - pad_bytes % 4;   // keeps f32 rows float-aligned
    Weight w{t, K, N, gguf::row_bytes(t, K) + pad_bytes, {}, {}};
    w.bytes.assign(w.row_bytes * size_t(N), 0xEE);   // padding bytes hold garbage on purpose
    std::vector<float> row(static_cast<size_t>(K)), back(static_cast<size_t>(K));
    w.deq.resize(size_t(K * N));
    for (int64_t n = 0; n < N; ++n) {
        uint8_t * dst = w.bytes.data() + size_t(n) * w.row_bytes;
        if (rp::can_quantize(t)) {
            for (auto & x : row) x = rng.uniform();
            rp::quantize_row(t, row.data(), dst, K);
        } else {
            fill_kquant_row(t, dst, K, rng);
        }
        rp::dequantize_row(t, dst, back.data(), K);
        for (int64_t k = 0; k < K; ++k) w.deq[size_t(n * K + k)] = back[size_t(k)];
    }
    return w;
}

// Sets the OpenMP thread count for a scope.
struct ScopedThreads {
    int saved = 1;
    explicit ScopedThreads(int n) {
#ifdef _OPENMP
        saved = omp_get_max_threads();
        omp_set_num_threads(n);
#else
        (void)n;
#endif
    }
    ~ScopedThreads() {
#ifdef _OPENMP
        omp_set_num_threads(saved);
#endif
    }
};

// The process-wide row-dot switch (ggml_rp/cpu/matvec_dot.h) set for a scope, restored after it.
struct RowDotSwitch {
    bool saved = rp::cpu::row_dots();
    explicit RowDotSwitch(bool on) { rp::cpu::set_row_dots(on); }
    ~RowDotSwitch() { rp::cpu::set_row_dots(saved); }
};

inline bool bit_equal(const std::vector<float> & a, const std::vector<float> & b) {
    // (memcmp must not see the null data() of an empty vector, even for 0 bytes)
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Worst-case float error bound of a length-n dot product accumulated in float (with FMAs or not), given
// sum |a_i b_i| (Higham's gamma_n), plus the rounding of adding it to an old value of magnitude `old`.
inline double dot_bound(int64_t n, double abs_sum, double old = 0.0) {
    const double u = std::ldexp(1.0, -24);
    return double(n + 2) * u * (abs_sum + std::fabs(old)) + 1e-30;
}

} // namespace kt
