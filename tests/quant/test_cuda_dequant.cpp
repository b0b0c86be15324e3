// GPU dequantization equals the CPU's dequantize_row bit for bit (the CPU path is checked against the formulas
// in test_dequant.cpp). Built only with CUDA; needs a GPU at run time.
#if defined(RP_HAVE_CUDA)

#include "ggml_rp/core/quant.h"
#include "ggml_rp/cuda/dequant.cuh"
#include "base/error.h"
#include "quant_ref.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace {

bool have_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Dequantizes `bytes` (n elements of type t) on the GPU and returns the floats.
std::vector<float> gpu_dequant(gguf::TensorType t, const std::vector<uint8_t> & bytes, int64_t n) {
    void * dsrc = nullptr;
    float * ddst = nullptr;
    EXPECT_EQ(cudaMalloc(&dsrc, bytes.size()), cudaSuccess);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void **>(&ddst), static_cast<size_t>(n) * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(dsrc, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    rp::cuda::dequantize(t, dsrc, ddst, n, nullptr);
    std::vector<float> y(static_cast<size_t>(n));
    EXPECT_EQ(cudaMemcpy(y.data(), ddst, y.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(dsrc);
    cudaFree(ddst);
    return y;
}

} // namespace

TEST(CudaDequant, BitIdenticalToCpu) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    std::mt19937 rng(5);
    for (const qref::BlockType & bt : qref::block_types()) {
        SCOPED_TRACE(bt.name);
        const int nblocks = 4099;  // not a multiple of the launch size
        const auto q = qref::random_blocks(bt, nblocks, rng);
        const int64_t n = static_cast<int64_t>(nblocks) * bt.block_size;
        const auto t = static_cast<gguf::TensorType>(bt.id);
        std::vector<float> cpu(static_cast<size_t>(n));
        rp::dequantize_row(t, q.data(), cpu.data(), n);
        const std::vector<float> gpu = gpu_dequant(t, q, n);
        ASSERT_EQ(std::memcmp(cpu.data(), gpu.data(), cpu.size() * sizeof(float)), 0);
    }
    for (gguf::TensorType t : {gguf::TensorType::F16, gguf::TensorType::BF16, gguf::TensorType::F32}) {
        const int64_t n = 100003;
        std::vector<uint8_t> raw(static_cast<size_t>(n) * (t == gguf::TensorType::F32 ? 4 : 2));
        for (auto & b : raw) b = static_cast<uint8_t>(rng());
        std::vector<float> cpu(static_cast<size_t>(n));
        rp::dequantize_row(t, raw.data(), cpu.data(), n);
        const std::vector<float> gpu = gpu_dequant(t, raw, n);
        ASSERT_EQ(std::memcmp(cpu.data(), gpu.data(), cpu.size() * sizeof(float)), 0) << static_cast<int>(t);
    }
}

TEST(CudaDequant, BadInputsThrow) {
    EXPECT_THROW(rp::cuda::dequantize(gguf::TensorType::Q4_K, nullptr, nullptr, 100, nullptr), rp::Error);
    EXPECT_THROW(rp::cuda::dequantize(gguf::TensorType::IQ1_S, nullptr, nullptr, 256, nullptr), rp::Error);
}

#endif // RP_HAVE_CUDA
