// Helpers of the CUDA tests: device detection (tests skip without a device), device buffers, random data,
// normalized mean squared error, and a runner for the CPU reference kernels through the graph API.
#pragma once

#include "ggml_rp/ggml_rp.h"
#include "tests/common/cpu_forward.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#if defined(RP_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace cutest {

#if defined(RP_HAVE_CUDA)
inline bool have_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define RP_REQUIRE_GPU() \
    if (!cutest::have_gpu()) GTEST_SKIP() << "skipped: no CUDA device"

// A device array of X, freed on scope exit.
template <class X>
struct Dev {
    X * p = nullptr;
    size_t n = 0;
    explicit Dev(size_t count) : n(count) {
        EXPECT_EQ(cudaMalloc(reinterpret_cast<void **>(&p), (n ? n : 1) * sizeof(X)), cudaSuccess);
        EXPECT_EQ(cudaMemset(p, 0, (n ? n : 1) * sizeof(X)), cudaSuccess);
    }
    explicit Dev(const std::vector<X> & v) : Dev(v.size()) {
        EXPECT_EQ(cudaMemcpy(p, v.data(), n * sizeof(X), cudaMemcpyHostToDevice), cudaSuccess);
    }
    Dev(const Dev &) = delete;
    Dev & operator=(const Dev &) = delete;
    ~Dev() { cudaFree(p); }
    std::vector<X> get() const {
        std::vector<X> v(n);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(X), cudaMemcpyDeviceToHost), cudaSuccess);
        return v;
    }
};
#endif

inline std::vector<float> rand_vec(size_t n, std::mt19937 & rng, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto & x : v) x = d(rng);
    return v;
}

// sum (a - ref)^2 / sum ref^2, ggml's test-backend-ops measure (0 when both are all zero).
inline double nmse(const std::vector<float> & a, const std::vector<float> & ref) {
    EXPECT_EQ(a.size(), ref.size());
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
        const double d = double(a[i]) - double(ref[i]);
        num += d * d;
        den += double(ref[i]) * double(ref[i]);
    }
    if (den == 0.0) return num;
    return num / den;
}

// Thresholds per input type, as ggml's test-backend-ops: exact-math f32 kernels vs the looser
// tensor-core paths on f16/bf16 operands.
constexpr double kNmseF32 = 1e-7;
constexpr double kNmseHalf = 5e-4;

// The CPU reference: builds leafs with data, runs the graph of one output node.
struct Cpu {
    rp::Context ctx;
    rp::Tensor * f32(const std::vector<float> & v, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, int64_t ne3 = 1) {
        rp::Tensor * t = ctx.new_tensor(rp::DType::F32, ne0, ne1, ne2, ne3);
        ctx.alloc_data(t);
        rp::tensor_set_f32(t, v);
        return t;
    }
    rp::Tensor * i32(const std::vector<int32_t> & v) {
        rp::Tensor * t = ctx.new_tensor(rp::DType::I32, static_cast<int64_t>(v.size()));
        ctx.alloc_data(t);
        rp::tensor_set_i32(t, v);
        return t;
    }
    // A leaf of any type from raw bytes (rows of ne0 elements).
    rp::Tensor * raw(rp::DType type, const std::vector<uint8_t> & bytes, int64_t ne0, int64_t ne1) {
        rp::Tensor * t = ctx.new_tensor(type, ne0, ne1);
        std::memcpy(ctx.alloc_data(t), bytes.data(), bytes.size());
        return t;
    }
    std::vector<float> run(rp::Tensor * out) { return rp_test::forward_on_cpu(out); }
};

} // namespace cutest
