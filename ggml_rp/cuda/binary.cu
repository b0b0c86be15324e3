// ADD and MUL with broadcast of b over a: grid-stride, one thread per output element.
#include "ggml_rp/cuda/binary.cuh"

#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/node_kernel.cuh"

namespace rp::cuda {

namespace {

struct Dims {
    int64_t ne[4];
    int64_t bne[4];
};

template <bool Mul>
__global__ void __launch_bounds__(kElemThreads) binary_kernel(const float * a, const float * __restrict__ b, float * out, Dims d, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t r = i;
        const int64_t i0 = r % d.ne[0]; r /= d.ne[0];
        const int64_t i1 = r % d.ne[1]; r /= d.ne[1];
        const int64_t i2 = r % d.ne[2];
        const int64_t i3 = r / d.ne[2];
        const int64_t j = ((i3 % d.bne[3] * d.bne[2] + i2 % d.bne[2]) * d.bne[1] + i1 % d.bne[1]) * d.bne[0] + i0 % d.bne[0];
        out[i] = Mul ? a[i] * b[j] : a[i] + b[j];
    }
}

template <bool Mul>
void launch(const char * name, const float * a, const float * b, float * out, const int64_t ne[4], const int64_t bne[4],
            cudaStream_t stream) {
    Dims d{};
    int64_t n = 1;
    for (int k = 0; k < 4; ++k) {
        require(ne[k] >= 1 && bne[k] >= 1 && ne[k] % bne[k] == 0, name,
                "b's size " + std::to_string(bne[k]) + " on axis " + std::to_string(k) + " does not divide a's " +
                    std::to_string(ne[k]));
        d.ne[k] = ne[k];
        d.bne[k] = bne[k];
        n *= ne[k];
    }
    binary_kernel<Mul><<<static_cast<unsigned>(elementwise_grid(n)), kElemThreads, 0, stream>>>(a, b, out, d, n);
    check_launch(name);
}

} // namespace

void add(const float * a, const float * b, float * out, const int64_t ne[4], const int64_t bne[4], cudaStream_t s) {
    launch<false>("add", a, b, out, ne, bne, s);
}
void mul(const float * a, const float * b, float * out, const int64_t ne[4], const int64_t bne[4], cudaStream_t s) {
    launch<true>("mul", a, b, out, ne, bne, s);
}

// ---- node entries ----
namespace {
void run_add_mul(Tensor * n, const NodeRun & r) {
    int64_t ne[4], bne[4];
    shape4(n, ne);
    shape4(n->src[1], bne);
    if (n->op == Op::ADD) add(in<float>(n->src[0]), in<float>(n->src[1]), out<float>(n), ne, bne, r.stream);
    else mul(in<float>(n->src[0]), in<float>(n->src[1]), out<float>(n), ne, bne, r.stream);
}
const RegisterNodeKernels kRegister{{Op::ADD, run_add_mul}, {Op::MUL, run_add_mul}};
} // namespace

} // namespace rp::cuda
