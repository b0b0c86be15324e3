// DROPOUT: one thread per Philox block, i.e. per four consecutive counters (the four 32-bit words of one
// block, as in the CPU kernel), in a grid-stride loop. The first group starts at word counter_offset % 4 of
// its block, so an element's mask depends only on counter_offset + i, never on the launch shape.
#include "ggml_rp/cuda/dropout.cuh"

#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/node_kernel.cuh"
#include "ggml_rp/ops/dropout.h"
#include "ggml_rp/ops/dropout_math.h"

#include <cstdio>

namespace rp::cuda {

namespace {

// Group g covers elements i = 4 g - w0 .. 4 g - w0 + 3 (those in [0, n)) with counters in block first + g.
__global__ void __launch_bounds__(kElemThreads) dropout_kernel(const float * x, float * y, int64_t n, int64_t groups, float p, float scale,
                               uint64_t key, uint64_t first_block, int w0) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
        // A counter wraps mod 2^64, so its block index wraps mod 2^62.
        const uint64_t block = (first_block + static_cast<uint64_t>(g)) & ((uint64_t{1} << 62) - 1);
        const Philox4x32 r = philox_block(key, block);
        const int64_t i0 = 4 * g - w0;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const int64_t i = i0 + w;
            if (i >= 0 && i < n) y[i] = dropout_f(x[i], r.v[w], p, scale);
        }
    }
}

} // namespace

void dropout(const float * x, float * y, int64_t n, float p, uint64_t key, uint64_t counter_offset,
             cudaStream_t stream) {
    require(n >= 0, "dropout", "negative element count " + std::to_string(n));
    if (!(p >= 0.0f && p < 1.0f)) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(p));
        require(false, "dropout", std::string("probability p = ").append(buf).append(" must be in [0, 1)"));
    }
    if (n == 0) return;
    const int w0 = static_cast<int>(counter_offset & 3u);
    const int64_t groups = ceil_div(n + w0, 4);
    dropout_kernel<<<static_cast<unsigned>(elementwise_grid(groups)), kElemThreads, 0, stream>>>(
        x, y, n, groups, p, dropout_scale(p), key, counter_offset >> 2, w0);
    check_launch("dropout");
}

// ---- node entries ----
namespace {
void run_dropout(Tensor * n, const NodeRun & r) {
    const DropoutParams d = dropout_params(n);
    dropout(in<float>(n->src[0]), out<float>(n), n->nelements(), d.p, d.key, d.counter_offset, r.stream);
}
const RegisterNodeKernels kRegister{{Op::DROPOUT, run_dropout}};
} // namespace

} // namespace rp::cuda
