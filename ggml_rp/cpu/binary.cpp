// ADD and MUL with broadcast of src[1] over src[0]. The node may be an in-place view of src[0].
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/strided.h"

namespace rp::cpu {

namespace {

template <typename F>
void binary(Tensor * n, F f) {
    const Tensor * a = n->src[0];
    const Tensor * b = n->src[1];
    const int64_t ne0 = n->ne[0], nr = n->nrows(), bne0 = b->ne[0];
    const size_t anb0 = a->nb[0], bnb0 = b->nb[0], dnb0 = n->nb[0];
    const bool fast = anb0 == 4 && bnb0 == 4 && dnb0 == 4 && bne0 == ne0;
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const char * ar = row_ptr(a, ri);
        const char * br = bcast_row_ptr(b, ri);
        char * dr = row_ptr(n, ri);
        if (fast) {
            const float * x = reinterpret_cast<const float *>(ar);
            const float * y = reinterpret_cast<const float *>(br);
            float * z = reinterpret_cast<float *>(dr);
            for (int64_t i = 0; i < ne0; ++i) z[i] = f(x[i], y[i]);
        } else {
            for (int64_t i = 0; i < ne0; ++i) at(dr, dnb0, i) = f(at(ar, anb0, i), at(br, bnb0, i % bne0));
        }
    }
}

} // namespace

void add(Tensor * n) { binary(n, [](float x, float y) { return x + y; }); }
void mul(Tensor * n) { binary(n, [](float x, float y) { return x * y; }); }

const RegisterKernels kRegister{{Op::ADD, add}, {Op::MUL, mul}};

} // namespace rp::cpu
