// FILL and CPY (strided copy with f32/f16/bf16 conversion).
#include "ggml_rp/core/fp16.h"
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/cpu/strided.h"

#include <cstring>

namespace rp::cpu {

void fill(Tensor * n) {
    const float v = n->param_f32(0);
    float * d = n->data_as<float>();
    const int64_t ne = n->nelements();
#pragma omp parallel for schedule(static) if (ne >= min_parallel_elements())
    for (int64_t i = 0; i < ne; ++i) d[i] = v;
}

namespace {

inline float load(DType t, const char * p) {
    uint16_t h;
    switch (t) {
    case DType::F16: std::memcpy(&h, p, 2); return fp16_to_fp32(h);
    case DType::BF16: std::memcpy(&h, p, 2); return bf16_to_fp32(h);
    default: return *reinterpret_cast<const float *>(p);
    }
}

inline void store(DType t, char * p, float v) {
    uint16_t h;
    switch (t) {
    case DType::F16: h = fp32_to_fp16(v); std::memcpy(p, &h, 2); return;
    case DType::BF16: h = fp32_to_bf16(v); std::memcpy(p, &h, 2); return;
    default: *reinterpret_cast<float *>(p) = v;
    }
}

} // namespace

void cpy(Tensor * n) {
    const Tensor * s = n->src[0];
    const int64_t ne0 = n->ne[0], nr = n->nrows();
    const DType st = s->type, dt = n->type;
    const size_t snb0 = s->nb[0], dnb0 = n->nb[0];
#pragma omp parallel for schedule(static) if (n->nelements() >= min_parallel_elements())
    for (int64_t r = 0; r < nr; ++r) {
        const RowIdx ri = row_idx(n, r);
        const char * sr = row_ptr(s, ri);
        char * dr = row_ptr(n, ri);
        if (st == dt && snb0 == dnb0 && snb0 == dtype_type_size(st)) {
            std::memcpy(dr, sr, static_cast<size_t>(ne0) * snb0);
            continue;
        }
        for (int64_t i = 0; i < ne0; ++i) store(dt, dr + i * dnb0, load(st, sr + i * snb0));
    }
}

const RegisterKernels kRegister{{Op::FILL, fill}, {Op::CPY, cpy}};

} // namespace rp::cpu
