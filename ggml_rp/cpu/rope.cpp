// ROPE and ROPE_BACK (the rotation by -theta). cos/sin are computed once per (token, pair) in a table and
// shared by all heads; the table of the last positions seen is kept (per thread) for the next call with the
// same positions and frequencies: every layer's q and k, forward and backward, read the same table.
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/strided.h"
#include "ggml_rp/ops/node_args.h"
#include "ggml_rp/ops/rope_math.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace rp::cpu {

void rope(Tensor * n) {
    const Tensor * x = n->src[0];
    const Tensor * pos = n->src[1];
    const node::RopeArgs ra = node::rope_args(n);
    const int32_t n_rot = ra.n_rot;
    const bool neox = ra.neox;
    const float base = ra.freq_base, fscale = ra.freq_scale;
    const RopeYarn yarn = rope_yarn(n_rot, base, fscale, ra.ext_factor, ra.attn_factor, ra.beta_fast, ra.beta_slow, ra.n_ctx_orig);
    const float sign = ra.backward ? -1.0f : 1.0f;
    const int64_t ne0 = n->ne[0], ne2 = n->ne[2], ne3 = n->ne[3], half = n_rot / 2;
    const int64_t npos = pos->ne[0];
    const int32_t * p = pos->data_as<int32_t>();

    // cs[(t * half + i) * 2 + {0,1}] = cos, sin of pair i at position entry t.
    struct Table {
        std::vector<int32_t> pos;
        int32_t n_rot = 0;
        float base = 0.0f, fscale = 0.0f;
        RopeYarn yarn;
        RopeTemperature temp;
        std::vector<float> ff;  // the freq factors' values (empty: none)
        std::vector<float> cs;
    };
    thread_local Table table;
    const auto same_yarn = [&] {
        return table.yarn.ext_factor == yarn.ext_factor && table.yarn.mscale == yarn.mscale && table.yarn.corr_low == yarn.corr_low &&
               table.yarn.corr_high == yarn.corr_high;
    };
    const RopeTemperature temp = ra.temp;
    const Tensor * fft = n->src[2];
    const float * ff = fft ? fft->data_as<float>() : nullptr;
    const bool same_ff = ff ? table.ff.size() >= static_cast<size_t>(half) && std::equal(ff, ff + half, table.ff.begin()) : table.ff.empty();
    const bool same_temp = table.temp.scale == temp.scale && table.temp.floor_scale == temp.floor_scale && table.temp.offset == temp.offset;
    if (table.n_rot != n_rot || table.base != base || table.fscale != fscale || !same_yarn() || !same_temp || !same_ff ||
        table.pos.size() != static_cast<size_t>(npos) ||
        !std::equal(p, p + npos, table.pos.begin())) {
        table.n_rot = 0;  // invalid until filled
        table.pos.assign(p, p + npos);
        table.cs.resize(static_cast<size_t>(npos * half * 2));
        float * cs = table.cs.data();
#pragma omp parallel for schedule(static) if (npos * half * 16 >= min_parallel_elements())
        for (int64_t t = 0; t < npos; ++t)
            for (int64_t i = 0; i < half; ++i) {
                double c, sn;
                rope_cos_sin(p[t], i, n_rot, base, fscale, yarn, c, sn, rope_temperature(p[t], temp), ff ? ff[i] : 1.0);
                cs[(t * half + i) * 2] = static_cast<float>(c);
                cs[(t * half + i) * 2 + 1] = static_cast<float>(sn);
            }
        table.n_rot = n_rot;
        table.base = base;
        table.fscale = fscale;
        table.yarn = yarn;
        table.temp = temp;
        table.ff.assign(ff, ff ? ff + half : ff);
    }
    const std::vector<float> & cs = table.cs;

    const int64_t nr = n->nrows();
    const size_t xnb = x->nb[0], dnb = n->nb[0];
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const int64_t t = npos == ne2 ? ri.i2 : ri.i2 + ri.i3 * ne2;
        (void) ne3;
        const float * c = &cs[static_cast<size_t>(t * half * 2)];
        const char * xr = row_ptr(x, ri);
        char * d = row_ptr(n, ri);
        for (int64_t i = 0; i < half; ++i) {
            const int64_t a = neox ? i : 2 * i;
            const int64_t b = neox ? i + half : 2 * i + 1;
            const float x0 = at(xr, xnb, a), x1 = at(xr, xnb, b);
            const float co = c[2 * i], si = sign * c[2 * i + 1];   // (exact: the backward's -sin)
            at(d, dnb, a) = x0 * co - x1 * si;
            at(d, dnb, b) = x0 * si + x1 * co;
        }
        for (int64_t i = n_rot; i < ne0; ++i) at(d, dnb, i) = at(xr, xnb, i);
    }
}

const RegisterKernels kRegister{{Op::ROPE, rope}, {Op::ROPE_BACK, rope}};

} // namespace rp::cpu
