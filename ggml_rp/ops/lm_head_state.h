// A streamed LM head's carried state (ops/cross_entropy.h lm_head_ce_range / lm_head_ce_streamed): where each
// token's running values lie in the state's buffer, and the pointers the CPU and CUDA kernels fold into.
// Plain C++ (the CUDA kernels' header includes it).
#pragma once

#include <cstddef>
#include <cstdint>

namespace rp {

// Bytes (each section 256-byte aligned), T tokens: the running sum and the sum without the label (double), the
// running max, the label logit and the label logit's cap derivative; with the gradient, the running unit
// gradients [C, T] and each token's label row of W (dequantized to f32 when its range passes, as the unstreamed
// op reads it at the end).
struct LmHeadStateLayout {
    size_t sum = 0, other = 0, max = 0, label_logit = 0, label_d = 0, unit = 0, label_rows = 0;
    size_t bytes = 0;
};

inline LmHeadStateLayout lm_head_state_layout(int64_t C, int64_t T, bool forms_grad) {
    LmHeadStateLayout l;
    size_t at = 0;
    auto take = [&](size_t bytes) {
        const size_t o = at;
        at += (bytes + 255) / 256 * 256;
        return o;
    };
    const size_t t = static_cast<size_t>(T);
    l.sum = take(t * sizeof(double));
    l.other = take(t * sizeof(double));
    l.max = take(t * sizeof(float));
    l.label_logit = take(t * sizeof(float));
    l.label_d = take(t * sizeof(float));
    if (forms_grad) {
        l.unit = take(static_cast<size_t>(C) * t * sizeof(float));
        l.label_rows = take(static_cast<size_t>(C) * t * sizeof(float));
    }
    l.bytes = at;
    return l;
}

// The state's values in a buffer laid out so (host or device memory); unit and label_rows with the gradient only.
struct LmHeadState {
    double * sum = nullptr;
    double * other = nullptr;
    float * max = nullptr;
    float * label_logit = nullptr;
    float * label_d = nullptr;
    float * unit = nullptr;
    float * label_rows = nullptr;
};

inline LmHeadState lm_head_state_at(void * base, int64_t C, int64_t T, bool forms_grad) {
    const LmHeadStateLayout l = lm_head_state_layout(C, T, forms_grad);
    char * b = static_cast<char *>(base);
    LmHeadState s;
    s.sum = reinterpret_cast<double *>(b + l.sum);
    s.other = reinterpret_cast<double *>(b + l.other);
    s.max = reinterpret_cast<float *>(b + l.max);
    s.label_logit = reinterpret_cast<float *>(b + l.label_logit);
    s.label_d = reinterpret_cast<float *>(b + l.label_d);
    if (forms_grad) {
        s.unit = reinterpret_cast<float *>(b + l.unit);
        s.label_rows = reinterpret_cast<float *>(b + l.label_rows);
    }
    return s;
}

} // namespace rp
