// FILL and CPY: plain grid-stride loops, one thread per output element.
#include "ggml_rp/cuda/copy.cuh"

#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/node_kernel.cuh"

namespace rp::cuda {

namespace {

__global__ void __launch_bounds__(kElemThreads) fill_kernel(float * d, float v, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) d[i] = v;
}

__global__ void __launch_bounds__(kElemThreads) cpy_kernel(const char * src, Strided ss, int scode, char * dst, Strided ds, int dcode, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        int64_t c[4];
        coords(ds, i, c);
        const float v = load_float(src + offset_of(ss, c[0], c[1], c[2], c[3]), scode);
        store_float(dst + offset_of(ds, c[0], c[1], c[2], c[3]), dcode, v);
    }
}

void run_fill(Tensor * n, const NodeRun & r) {
    const int64_t ne = n->nelements();
    if (ne > 0) fill_kernel<<<grid_of(ne), kElemThreads, 0, r.stream>>>(out<float>(n), n->param_f32(0), ne);
    check_launch("fill");
}

void run_cpy(Tensor * n, const NodeRun & r) { enqueue_cpy(n->src[0], n, r.stream); }

const RegisterNodeKernels kRegister{{Op::FILL, run_fill}, {Op::CPY, run_cpy}};

} // namespace

void enqueue_cpy(const Tensor * src, const Tensor * dst, cudaStream_t s) {
    const int64_t ne = dst->nelements();
    if (ne > 0) {
        cpy_kernel<<<grid_of(ne), kElemThreads, 0, s>>>(in<char>(src), strided(src), float_code(src->type), out<char>(dst),
                                                        strided(dst), float_code(dst->type), ne);
    }
    check_launch("cpy");
}

} // namespace rp::cuda
