// Row addressing for strided tensors (internal header of the CPU kernels). A "row" is the ne[0] elements at
// fixed (i1, i2, i3); rows are numbered r = i1 + ne1 * (i2 + ne2 * i3).
#pragma once

#include "ggml_rp/core/tensor.h"

#include <cstdint>

namespace rp::cpu {

// Below min_parallel_elements() a kernel runs on the calling thread: waking the OpenMP team costs more
// than the work (see set_min_parallel_elements in backend.h).
int64_t min_parallel_elements();

struct RowIdx {
    int64_t i1, i2, i3;
};

inline RowIdx row_idx(const Tensor * t, int64_t r) {
    return {r % t->ne[1], (r / t->ne[1]) % t->ne[2], r / (t->ne[1] * t->ne[2])};
}

inline char * row_ptr(const Tensor * t, int64_t i1, int64_t i2, int64_t i3) {
    return static_cast<char *>(t->data) + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}
inline char * row_ptr(const Tensor * t, RowIdx r) { return row_ptr(t, r.i1, r.i2, r.i3); }
// The row of a broadcast operand b that pairs with row r of the result.
inline char * bcast_row_ptr(const Tensor * b, RowIdx r) {
    return row_ptr(b, r.i1 % b->ne[1], r.i2 % b->ne[2], r.i3 % b->ne[3]);
}

// Element i of a float row with byte stride s.
inline float & at(char * row, size_t s, int64_t i) { return *reinterpret_cast<float *>(row + i * s); }
inline float at(const char * row, size_t s, int64_t i) { return *reinterpret_cast<const float *>(row + i * s); }

} // namespace rp::cpu
