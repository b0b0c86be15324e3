#include "ggml_rp/cuda/blas.cuh"

#include "base/error.h"
#include "ggml_rp/cuda/common.cuh"

#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace rp::cuda {

namespace {

void blas_check(cublasStatus_t st, const std::string & what) {
    if (st != CUBLAS_STATUS_SUCCESS) throw Error("cuda " + what + ": cuBLAS failed: " + cublasGetStatusString(st));
}

struct Entry {
    cublasHandle_t handle = nullptr;
    void * workspace = nullptr;
};

std::mutex & registry_mutex() {
    static std::mutex m;
    return m;
}
// (GPU, stream) -> handle: the default stream (nullptr) is one per GPU.
std::map<std::pair<int, cudaStream_t>, Entry> & registry() {
    static auto * r = new std::map<std::pair<int, cudaStream_t>, Entry>();  // never destroyed: no teardown after CUDA's
    return *r;
}

int current_gpu(const std::string & what) {
    int dev = 0;
    check(cudaGetDevice(&dev), (what + ": cudaGetDevice").c_str());
    return dev;
}

Entry make_entry(cudaStream_t stream, void * workspace, size_t bytes, const std::string & what) {
    Entry e;
    blas_check(cublasCreate(&e.handle), what);
    blas_check(cublasSetStream(e.handle, stream), what);
    blas_check(cublasSetWorkspace(e.handle, workspace, bytes), what);
    e.workspace = workspace;
    return e;
}

} // namespace

void blas_release(cudaStream_t stream) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return;
    std::lock_guard<std::mutex> lk(registry_mutex());
    auto & r = registry();
    const auto it = r.find({dev, stream});
    if (it == r.end()) return;
    cublasDestroy(it->second.handle);
    cudaFree(it->second.workspace);
    r.erase(it);
}

cublasHandle_t blas_handle(cudaStream_t stream, const char * what) {
    const int dev = current_gpu(what);
    std::lock_guard<std::mutex> lk(registry_mutex());
    auto & r = registry();
    const auto it = r.find({dev, stream});
    if (it != r.end()) return it->second.handle;
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, dev), what);
    const size_t bytes = blas_workspace_bytes(prop.major);
    void * ws = nullptr;
    check(cudaMalloc(&ws, bytes), (std::string(what) + ": cuBLAS workspace").c_str());
    Entry e;
    try {
        e = make_entry(stream, ws, bytes, what);
    } catch (...) {
        cudaFree(ws);
        throw;
    }
    r[{dev, stream}] = e;
    return e.handle;
}

void blas_set_tf32(cudaStream_t stream, bool tf32, const char * what) {
    blas_check(cublasSetMathMode(blas_handle(stream, what), tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), what);
}

} // namespace rp::cuda
