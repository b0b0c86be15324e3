// ROPE and ROPE_BACK: one thread per rotated pair or passed-through element of each row. The angle is
// rope_cos_sin (double, YaRN included), as on the CPU.
#include "ggml_rp/cuda/rope.cuh"

#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/node_kernel.cuh"
#include "ggml_rp/ops/node_args.h"
#include "ggml_rp/ops/rope_math.h"

namespace rp::cuda {

namespace {

__global__ void __launch_bounds__(kElemThreads) rope_kernel(const float * x, const int32_t * __restrict__ pos, int64_t npos,
                            const float * __restrict__ ff, float * y, int64_t ne0, int64_t ne1, int64_t ne2, RopeConfig c, float sign,
                            int64_t n) {
    const int64_t half = c.n_rot / 2;
    const int64_t slots = half + (ne0 - c.n_rot);   // per row: the pairs, then the pass-through tail
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t row = e / slots, s = e % slots;
        const float * xr = x + row * ne0;
        float * yr = y + row * ne0;
        if (s >= half) {
            const int64_t i = c.n_rot + (s - half);
            yr[i] = xr[i];
            continue;
        }
        const int64_t i2 = row / ne1 % ne2, i3 = row / ne1 / ne2;
        const int64_t t = npos == ne2 ? i2 : i2 + i3 * ne2;
        double cd, sd;
        rope_cos_sin(pos[t], s, c.n_rot, c.freq_base, c.freq_scale, c.yarn, cd, sd, rope_temperature(pos[t], c.temp), ff ? ff[s] : 1.0);
        const float co = static_cast<float>(cd), si = sign * static_cast<float>(sd);
        const int64_t a = c.neox ? s : 2 * s;
        const int64_t b = c.neox ? s + half : 2 * s + 1;
        const float x0 = xr[a], x1 = xr[b];
        yr[a] = x0 * co - x1 * si;
        yr[b] = x0 * si + x1 * co;
    }
}

} // namespace

void rope(const float * x, const int32_t * pos, int64_t npos, float * y, const int64_t ne[4], const RopeConfig & c,
          bool backward, cudaStream_t stream, const float * freq_factors) {
    const char * name = backward ? "rope_back" : "rope";
    require(c.n_rot >= 0 && c.n_rot % 2 == 0 && c.n_rot <= ne[0], name,
            "n_rot " + std::to_string(c.n_rot) + " must be even and <= head_dim " + std::to_string(ne[0]));
    require(npos == ne[2] || npos == ne[2] * ne[3], name,
            "positions " + std::to_string(npos) + " must be n_tokens " + std::to_string(ne[2]) + " or n_tokens * n_seqs");
    const int64_t rows = ne[1] * ne[2] * ne[3];
    const int64_t n = rows * (c.n_rot / 2 + ne[0] - c.n_rot);
    if (n <= 0) return;
    rope_kernel<<<static_cast<unsigned>(elementwise_grid(n)), kElemThreads, 0, stream>>>(
        x, pos, npos, freq_factors, y, ne[0], ne[1], ne[2], c, backward ? -1.0f : 1.0f, n);
    check_launch(name);
}

// ---- node entries ----
namespace {
void run_rope(Tensor * n, const NodeRun & r) {
    const node::RopeArgs a = node::rope_args(n);
    RopeConfig c;
    c.n_rot = a.n_rot;
    c.neox = a.neox;
    c.freq_base = a.freq_base;
    c.freq_scale = a.freq_scale;
    c.yarn = rope_yarn(a.n_rot, a.freq_base, a.freq_scale, a.ext_factor, a.attn_factor, a.beta_fast, a.beta_slow, a.n_ctx_orig);
    c.temp = a.temp;
    int64_t ne[4];
    shape4(n, ne);
    rope(in<float>(n->src[0]), in<int32_t>(n->src[1]), n->src[1]->ne[0], out<float>(n), ne, c, a.backward, r.stream,
         n->src[2] ? in<float>(n->src[2]) : nullptr);
}
const RegisterNodeKernels kRegister{{Op::ROPE, run_rope}, {Op::ROPE_BACK, run_rope}};
} // namespace

} // namespace rp::cuda
