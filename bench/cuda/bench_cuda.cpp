// rp-cuda-bench [out.json]: throughput of the CUDA kernels on the current GPU, every operand random.
//   gemm:      rp::cuda::matmul_fwd for f32 and bf16 weights (bf16 includes rounding the activations) next to
//              a bare cublasGemmEx bf16 call of the same shape, the practical tensor-core peak of this GPU;
//   attention: rp::cuda::attention_fwd / attention_bwd, bf16, causal. FLOPs counted as FlashAttention does:
//              forward 4 * B * Hq * D * (causal score count), backward 2.5x the forward.
// Each timing is the median of 5 runs after 2 warm-ups, by CUDA events on one stream. Prints one line per
// measurement and writes them as JSON.
#include "ggml_rp/cuda/attention.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/mul_mat.cuh"
#include "base/error.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace {

void ck(cudaError_t e, const char * what) {
    if (e != cudaSuccess) throw rp::Error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Median milliseconds of f() on the default stream.
double time_ms(const std::function<void()> & f) {
    cudaEvent_t a, b;
    ck(cudaEventCreate(&a), "event");
    ck(cudaEventCreate(&b), "event");
    for (int i = 0; i < 2; ++i) f();
    std::vector<float> ms;
    for (int i = 0; i < 5; ++i) {
        ck(cudaEventRecord(a, nullptr), "record");
        f();
        ck(cudaEventRecord(b, nullptr), "record");
        ck(cudaEventSynchronize(b), "sync");
        float t = 0;
        ck(cudaEventElapsedTime(&t, a, b), "elapsed");
        ms.push_back(t);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

struct Result {
    std::string name;
    std::string shape;
    double ms;
    double tflops;
};

void* dev_alloc(size_t bytes) {
    void * p = nullptr;
    ck(cudaMalloc(&p, bytes), "cudaMalloc");
    ck(cudaMemset(p, 0, bytes), "cudaMemset");
    return p;
}

// Random values, uniform in [-1, 1), in f32 or bf16 (the top half of the f32 bits). Tensor cores are measurably
// faster on zeros (the H200's bf16 GEMM: 894 TFLOP/s on zeros, 788 on random data, KINDS.md), so a "peak"
// measured on zeros would overstate every MFU computed from it.
void fill_random(void * p, size_t n, bool bf16, uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    std::vector<float> f(n);
    for (float & v : f) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v = static_cast<float>(static_cast<double>(x >> 11) * 0x1.0p-52 - 1.0);
    }
    if (!bf16) {
        ck(cudaMemcpy(p, f.data(), n * 4, cudaMemcpyHostToDevice), "upload");
        return;
    }
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) {
        uint32_t b;
        std::memcpy(&b, &f[i], 4);
        h[i] = static_cast<uint16_t>(b >> 16);
    }
    ck(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice), "upload");
}

} // namespace

int main(int argc, char ** argv) {
    try {
        int dev = 0;
        cudaDeviceProp prop{};
        ck(cudaGetDevice(&dev), "cudaGetDevice");
        ck(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
        std::vector<Result> res;
        using TT = gguf::TensorType;

        // ---- GEMM ---------------------------------------------------------------------------------------------
        const int64_t shapes[][3] = {{4096, 4096, 4096}, {2048, 6144, 8192}, {2048, 151936, 512}};
        for (const auto & sh : shapes) {
            const int64_t K = sh[0], N = sh[1], T = sh[2];
            const double flops = 2.0 * double(K) * double(N) * double(T);
            const std::string shape = "K=" + std::to_string(K) + " N=" + std::to_string(N) + " T=" + std::to_string(T);
            void * W32 = dev_alloc(size_t(K * N) * 4);
            void * W16 = dev_alloc(size_t(K * N) * 2);
            fill_random(W32, size_t(K * N), false, 1);
            fill_random(W16, size_t(K * N), true, 2);
            float * X = static_cast<float *>(dev_alloc(size_t(K * T) * 4));
            fill_random(X, size_t(K * T), false, 3);
            float * Y = static_cast<float *>(dev_alloc(size_t(N * T) * 4));
            const size_t wsb = rp::cuda::matmul_workspace_bytes(K, N, T, TT::BF16);
            void * ws = dev_alloc(wsb);
            void * X16 = dev_alloc(size_t(K * T) * 2);  // the peak's bf16 activations
            fill_random(X16, size_t(K * T), true, 4);
            double ms = time_ms([&] { rp::cuda::matmul_fwd(K, N, T, W32, TT::F32, size_t(K) * 4, X, K, Y, N, false, nullptr, 0, nullptr); });
            res.push_back({"gemm_f32", shape, ms, flops / ms * 1e-9});
            ms = time_ms([&] { rp::cuda::matmul_fwd(K, N, T, W16, TT::BF16, size_t(K) * 2, X, K, Y, N, false, ws, wsb, nullptr); });
            res.push_back({"gemm_bf16", shape, ms, flops / ms * 1e-9});
            cublasHandle_t h;
            if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw rp::Error("cublasCreate failed");
            const float one = 1.0f, zero = 0.0f;
            ms = time_ms([&] {
                cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(T), int(K), &one, W16, CUDA_R_16BF, int(K), X16,
                             CUDA_R_16BF, int(K), &zero, Y, CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            });
            res.push_back({"cublas_bf16_peak", shape, ms, flops / ms * 1e-9});
            cublasDestroy(h);
            for (void * p : {W32, W16, static_cast<void *>(X), static_cast<void *>(Y), ws, X16}) cudaFree(p);
        }

        // ---- attention ------------------------------------------------------------------------------------------
        const int64_t acases[][5] = {{128, 16, 8, 4096, 1}, {128, 16, 8, 8192, 1}, {64, 32, 8, 4096, 2}, {256, 8, 4, 4096, 1}};
        for (const auto & c : acases) {
            rp::cuda::AttentionShape s{c[0], c[1], c[2], c[3], c[3], c[4], 1.0f / 11.0f};
            const size_t nq = size_t(s.D * s.Hq * s.Tq * s.B), nk = size_t(s.D * s.Hkv * s.Tk * s.B);
            void * q = dev_alloc(nq * 2);
            void * k = dev_alloc(nk * 2);
            void * v = dev_alloc(nk * 2);
            void * dout = dev_alloc(nq * 2);
            fill_random(q, nq, true, 5);
            fill_random(k, nk, true, 6);
            fill_random(v, nk, true, 7);
            fill_random(dout, nq, true, 8);
            float * o = static_cast<float *>(dev_alloc(nq * 4));
            float * lse = static_cast<float *>(dev_alloc(size_t(s.Hq * s.Tq * s.B) * 4));
            float * dq = static_cast<float *>(dev_alloc(nq * 4));
            float * dk = static_cast<float *>(dev_alloc(nk * 4));
            float * dv = static_cast<float *>(dev_alloc(nk * 4));
            const size_t wsb = rp::cuda::attention_bwd_workspace_bytes(s.Hq, s.Tq, s.B);
            void * ws = dev_alloc(wsb);
            const double pairs = double(s.Tq) * double(s.Tq + 1) / 2.0;   // causal (query, key) pairs
            const double fwd_flops = 4.0 * double(s.B * s.Hq * s.D) * pairs;
            const std::string shape = "D=" + std::to_string(s.D) + " Hq=" + std::to_string(s.Hq) + " Hkv=" +
                                      std::to_string(s.Hkv) + " T=" + std::to_string(s.Tq) + " B=" + std::to_string(s.B);
            double ms = time_ms([&] { rp::cuda::attention_fwd(s, TT::BF16, q, k, v, o, lse, nullptr); });
            res.push_back({"attention_fwd_bf16", shape, ms, fwd_flops / ms * 1e-9});
            ms = time_ms([&] { rp::cuda::attention_bwd(s, TT::BF16, q, k, v, o, lse, dout, dq, dk, dv, ws, wsb, nullptr); });
            res.push_back({"attention_bwd_bf16", shape, ms, 2.5 * fwd_flops / ms * 1e-9});
            for (void * p : {q, k, v, dout, static_cast<void *>(o), static_cast<void *>(lse), static_cast<void *>(dq),
                             static_cast<void *>(dk), static_cast<void *>(dv), ws})
                cudaFree(p);
        }

        std::string json = "{\n  \"device\": \"" + std::string(prop.name) + "\",\n  \"results\": [\n";
        for (size_t i = 0; i < res.size(); ++i) {
            const Result & r = res[i];
            std::printf("%-20s %-40s %10.3f ms %8.2f TFLOP/s\n", r.name.c_str(), r.shape.c_str(), r.ms, r.tflops);
            char line[512];
            std::snprintf(line, sizeof line, "    {\"name\": \"%s\", \"shape\": \"%s\", \"ms\": %.4f, \"tflops\": %.3f}%s\n",
                          r.name.c_str(), r.shape.c_str(), r.ms, r.tflops, i + 1 < res.size() ? "," : "");
            json += line;
        }
        json += "  ]\n}\n";
        if (argc > 1) {
            const std::string tmp = std::string(argv[1]) + ".tmp";
            FILE * f = std::fopen(tmp.c_str(), "w");
            if (!f) throw rp::Error(std::string("cannot write ") + tmp);
            std::fputs(json.c_str(), f);
            std::fclose(f);
            if (std::rename(tmp.c_str(), argv[1]) != 0) throw rp::Error(std::string("cannot rename to ") + argv[1]);
        }
        return 0;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
