// The block products of the CPU flash attention (attention.cpp): S = A B^T over the head dim, and the
// accumulations C += W X of probability (or dS) blocks into output rows, for one (query block, key block) pair.
//
// Small heads (head_dim 8 or 16) run their own kernels: the GEMM engine's micro-kernel packs both operands on
// every call and, with 8 output columns, fills a quarter of its 12x32 tile, so for tiny heads its packing and
// tiles dominate the attention's time. Every other head_dim goes through gemm_f32_serial, which is faster there
// (these kernels' loads outweigh the packing). The measurements behind both: bench/design-measurements.md.
// Either way each output element is a fixed sequence of IEEE operations, so the results do not depend on
// threads; the small kernels' vector lanes and their scalar form (GemmBackend::Portable, and
// builds without AVX2) give the same bits.
#pragma once

#include <cstdint>

namespace rp::cpu {

class AttentionBlocks {
public:
    // bk_stride: the row stride (floats) of the S / W blocks (the kernels' BK).
    AttentionBlocks(int64_t head_dim, int64_t bk_stride);

    // Floats of scratch transposed() needs (0 on the GEMM path).
    int64_t transposed_floats() const { return small_ ? D_ * ldw_ : 0; }

    // The n rows of a key/value block (D floats each, at stride bs) in the form rows_dot reads: on the small
    // path their transpose into bt (transposed_floats() of scratch); otherwise b itself.
    const float * transposed(int64_t n, const float * b, int64_t bs, float * bt) const;

    // S[i*ldw + j] = sum_d a[i*as + d] * b(j, d) for i < m, j < n, with bt = transposed(n, b, bs, ...):
    // the d-sum in order, the first term a product, the rest fused multiply-adds (small path).
    void rows_dot(int64_t m, int64_t n, const float * a, int64_t as, const float * bt, int64_t bs, float * S) const;

    // C[r*D + d] += sum_k W(r, k) * x[k*xs + d] for r < rows, k < K, in k order (fused multiply-adds onto C),
    // where W(r, k) = w[r*ldw + k] (transpose_w false: C = W X) or w[k*ldw + r] (true: C = W^T X).
    void accumulate(int64_t rows, int64_t K, const float * w, bool transpose_w, const float * x, int64_t xs, float * C) const;

private:
    int64_t D_, ldw_;
    bool small_;
};

} // namespace rp::cpu
