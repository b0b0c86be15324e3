// REPEAT, SUM_TO, SUM and MEAN (CPU reference: ggml_rp/cpu/reduce.cpp): grid-stride loops through both
// tensors' strides; each output element is computed by one thread in the CPU kernel's order of summation, so
// results do not depend on the launch.
#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/copy.cuh"
#include "ggml_rp/cuda/node_kernel.cuh"

namespace rp::cuda {

namespace {

// out[i0..i3] = x[i0 % xne0, i1 % xne1, i2 % xne2, i3 % xne3]
__global__ void __launch_bounds__(kElemThreads) repeat_kernel(const char * src, Strided xs, char * dst, Strided ds, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        int64_t c[4];
        coords(ds, i, c);
        const float v = *reinterpret_cast<const float *>(
            src + offset_of(xs, c[0] % xs.ne[0], c[1] % xs.ne[1], c[2] % xs.ne[2], c[3] % xs.ne[3]));
        *reinterpret_cast<float *>(dst + offset_of(ds, c[0], c[1], c[2], c[3])) = v;
    }
}

// Each output element sums its repeats in double, in the CPU kernel's order: (a3, a2, a1) then a0.
__global__ void __launch_bounds__(kElemThreads) sum_to_kernel(const char * src, Strided xs, char * dst, Strided ds, int64_t n) {
    const int64_t r0 = xs.ne[0] / ds.ne[0], r1 = xs.ne[1] / ds.ne[1], r2 = xs.ne[2] / ds.ne[2], r3 = xs.ne[3] / ds.ne[3];
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        int64_t c[4];
        coords(ds, i, c);
        double acc = 0.0;
        for (int64_t a3 = 0; a3 < r3; ++a3)
            for (int64_t a2 = 0; a2 < r2; ++a2)
                for (int64_t a1 = 0; a1 < r1; ++a1)
                    for (int64_t a0 = 0; a0 < r0; ++a0)
                        acc += *reinterpret_cast<const float *>(
                            src + offset_of(xs, c[0] + a0 * ds.ne[0], c[1] + a1 * ds.ne[1], c[2] + a2 * ds.ne[2],
                                            c[3] + a3 * ds.ne[3]));
        *reinterpret_cast<float *>(dst + offset_of(ds, c[0], c[1], c[2], c[3])) = static_cast<float>(acc);
    }
}

// One block of 256 threads: per-thread strided sums in double, then a fixed tree; out = sum * mul.
constexpr int kSumThreads = 256;
__global__ void __launch_bounds__(kSumThreads) sum_kernel(const char * src, Strided xs, int64_t n, double mul, float * out_) {
    __shared__ double part[kSumThreads];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        int64_t c[4];
        coords(xs, i, c);
        s += *reinterpret_cast<const float *>(src + offset_of(xs, c[0], c[1], c[2], c[3]));
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = kSumThreads / 2; w > 0; w >>= 1) {
        if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out_ = static_cast<float>(part[0] * mul);
}

void run_repeat(Tensor * n, const NodeRun & r) {
    const int64_t ne = n->nelements();
    if (ne > 0) {
        repeat_kernel<<<grid_of(ne), kElemThreads, 0, r.stream>>>(in<char>(n->src[0]), strided(n->src[0]), out<char>(n),
                                                                  strided(n), ne);
    }
    check_launch("repeat");
}

void run_sum_to(Tensor * n, const NodeRun & r) {
    const int64_t ne = n->nelements();
    if (ne > 0) {
        sum_to_kernel<<<grid_of(ne), kElemThreads, 0, r.stream>>>(in<char>(n->src[0]), strided(n->src[0]), out<char>(n),
                                                                  strided(n), ne);
    }
    check_launch("sum_to");
}

void run_sum(Tensor * n, const NodeRun & r) {
    const Tensor * x = n->src[0];
    const int64_t ne = x->nelements();
    const double mul = n->op == Op::MEAN ? 1.0 / static_cast<double>(ne) : 1.0;
    sum_kernel<<<1, kSumThreads, 0, r.stream>>>(in<char>(x), strided(x), ne, mul, out<float>(n));
    check_launch(n->op == Op::MEAN ? "mean" : "sum");
}

const RegisterNodeKernels kRegister{
    {Op::REPEAT, run_repeat}, {Op::SUM_TO, run_sum_to}, {Op::SUM, run_sum}, {Op::MEAN, run_sum}};

} // namespace

} // namespace rp::cuda
