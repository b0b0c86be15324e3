// The node -> kernel-argument glue, written once for both backends (cpu/*.cpp and the CUDA plugin's
// cuda/*.cu): the shapes of the fused ops, where a node's second outputs live, and the batch / broadcast loops
// of the GEMM ops (the kernels themselves see one [in, out] x [in, T] product at a time). Header-only, host
// code: the plugin compiles it with its kernels.
#pragma once

#include "ggml_rp/core/tensor.h"
#include "ggml_rp/ops/attention_shape.h"
#include "ggml_rp/ops/rope.h"
#include "ggml_rp/ops/rope_math.h"

#include <cstddef>
#include <cstdint>

namespace rp::node {

// ATTENTION / ATTENTION_BACK: q = src0, k = src1, scale = op param 0, window param 2, soft-cap param 3.
inline AttentionShape attention_shape(const Tensor * n) {
    const Tensor * q = n->src[0];
    const Tensor * k = n->src[1];
    // (k and v: contiguous within each sequence, the op builder sees to it; several sequences may be rows of a
    // longer cache apart)
    const int64_t kv_rows = k->ne[3] > 1 ? static_cast<int64_t>(k->nb[3] / k->nb[2]) : 0;
    return {q->ne[0], q->ne[1], k->ne[1], q->ne[2], k->ne[2], q->ne[3], n->param_f32(0), n->param_i32(2), n->param_f32(3),
            kv_rows == k->ne[2] ? 0 : kv_rows};
}

// ATTENTION / ATTENTION_BACK: the first visible key per query (i32 [Tq * B]), or nullptr (plain causal).
inline const Tensor * attention_key_start(const Tensor * n) { return n->src[n->op == Op::ATTENTION ? 3 : 6]; }
inline const int32_t * attention_key_start_data(const Tensor * n) {
    const Tensor * ks = attention_key_start(n);
    return ks ? static_cast<const int32_t *>(ks->data) : nullptr;
}

// ATTENTION / ATTENTION_BACK: the per-head sink logits (f32 [Hq]), or nullptr.
inline const Tensor * attention_sinks(const Tensor * n) { return n->src[n->op == Op::ATTENTION ? 4 : 7]; }
inline const float * attention_sinks_data(const Tensor * n) {
    const Tensor * s = attention_sinks(n);
    return s ? static_cast<const float *>(s->data) : nullptr;
}
// ATTENTION_BACK: where the sinks' gradient goes (after dk and dv in the aux bytes), or nullptr.
inline float * attention_dsinks(const Tensor * n) {
    return attention_sinks(n) ? reinterpret_cast<float *>(static_cast<char *>(n->data) + n->nbytes() + 2 * n->src[1]->nbytes()) : nullptr;
}

// ATTENTION / ATTENTION_BACK: the element type an accelerator may round the inputs to (op param 1).
inline DType attention_accelerated_type(const Tensor * n) { return static_cast<DType>(n->param_i32(1)); }

// The second outputs an op writes after its main result (attention's logsumexp, attention_back's dk and dv).
inline float * aux(const Tensor * t, size_t offset) {
    return reinterpret_cast<float *>(static_cast<char *>(t->data) + t->nbytes() + offset);
}

// Column stride, in floats, of an f32 matrix [rows, cols] (nb[1] bytes between columns).
inline int64_t col_floats(const Tensor * t) { return static_cast<int64_t>(t->nb[1] / sizeof(float)); }

template <class T> inline T * batch(const Tensor * t, int64_t i2, int64_t i3) {
    return reinterpret_cast<T *>(static_cast<char *>(t->data) + i2 * t->nb[2] + i3 * t->nb[3]);
}

// Batch (i2, i3) of an activation with broadcast batches reads weight batch (i2 / r2, i3 / r3), r = X / W.
inline const char * weight_batch(const Tensor * W, int64_t i2, int64_t i3, const Tensor * X) {
    const int64_t r2 = X->ne[2] / W->ne[2], r3 = X->ne[3] / W->ne[3];
    return static_cast<const char *>(W->data) + (i2 / r2) * W->nb[2] + (i3 / r3) * W->nb[3];
}

// One [in = K, out = N] x [K, T] product of a GEMM node.
struct MatmulArgs {
    int64_t K, N, T;
    const char * w;          // weight rows (W->type, row stride w_row bytes)
    size_t w_row;
    const float * x;         // MUL_MAT: X; MUL_MAT_BACK_X: dY; OUT_PROD: X
    int64_t ldx;
    const float * y_in;      // OUT_PROD: dY (else nullptr)
    int64_t ldy_in;
    float * out;             // MUL_MAT: Y; MUL_MAT_BACK_X: dX; OUT_PROD: dW
    int64_t ld_out;
    bool accumulate;         // add into out: OUT_PROD (the node's flag, then every later batch of the sum); MUL_MAT and
                             // MUL_MAT_BACK_X accumulating into src 2 (their `into`)
};

// Whether the batches of t [rows, T, B2, B3] follow each other column after column (one [rows, T * B2 * B3] matrix
// with t's column stride).
inline bool batches_are_columns(const Tensor * t) {
    return (t->ne[2] == 1 || t->nb[2] == t->nb[1] * static_cast<size_t>(t->ne[1])) &&
           (t->ne[3] == 1 || t->nb[3] == t->nb[2] * static_cast<size_t>(t->ne[2]));
}

// MUL_MAT (W = src0, X = src1 -> Y) and MUL_MAT_BACK_X (W = src0, dY = src1 -> dX): fn(args) per batch. With
// fold_batches, one product of every batch's columns when a batch has fewer than kFoldColumns columns, W is one
// matrix and the batches of the activation and the result are columns after each other (batched decoding, [K, 1,
// B]: each weight read once for all B, not B times; longer batches already reuse each weight row, and one product
// of them all would only pack a larger operand). The same bits either way: every element is the same sum over K
// whatever the column count (the CPU kernels' rule; CUDA plans its workspace per batch and does not fold).
inline constexpr int64_t kFoldColumns = 16;
template <class F> void for_each_gemm_batch(const Tensor * n, F && fn, bool fold_batches = false) {
    const Tensor * W = n->src[0];
    const Tensor * A = n->src[1];
    const bool fwd = n->op == Op::MUL_MAT;
    const Tensor * outer = fwd ? A : n;  // the tensor whose batches broadcast over W's
    MatmulArgs a{};
    a.K = W->ne[0];
    a.N = W->ne[1];
    a.T = fwd ? A->ne[1] : n->ne[1];
    a.w_row = W->nb[1];
    a.ldx = col_floats(A);
    a.ld_out = col_floats(n);
    a.accumulate = n->src[2] != nullptr;
    if (fold_batches && a.T < kFoldColumns && W->ne[2] == 1 && W->ne[3] == 1 && outer->ne[2] * outer->ne[3] > 1 && batches_are_columns(A) &&
        batches_are_columns(n)) {
        a.T *= outer->ne[2] * outer->ne[3];
        a.w = static_cast<const char *>(W->data);
        a.x = batch<const float>(A, 0, 0);
        a.out = batch<float>(n, 0, 0);
        fn(a);
        return;
    }
    for (int64_t i3 = 0; i3 < outer->ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < outer->ne[2]; ++i2) {
            a.w = weight_batch(W, i2, i3, outer);
            a.x = batch<const float>(A, i2, i3);
            a.out = batch<float>(n, i2, i3);
            fn(a);
        }
}

// OUT_PROD (X = src0, dY = src1 -> dW): each weight batch sums the activation batches that used it, in a
// fixed order (the first one overwrites unless the node accumulates).
template <class F> void for_each_out_prod_batch(const Tensor * n, F && fn) {
    const Tensor * X = n->src[0];
    const Tensor * dY = n->src[1];
    MatmulArgs a{};
    a.K = n->ne[0];
    a.N = n->ne[1];
    a.T = X->ne[1];
    a.ldx = col_floats(X);
    a.ldy_in = col_floats(dY);
    a.ld_out = col_floats(n);
    const int64_t r2 = X->ne[2] / n->ne[2], r3 = X->ne[3] / n->ne[3];
    for (int64_t w3 = 0; w3 < n->ne[3]; ++w3)
        for (int64_t w2 = 0; w2 < n->ne[2]; ++w2) {
            a.accumulate = n->param_i32(0) != 0;
            a.out = batch<float>(n, w2, w3);
            for (int64_t i3 = w3 * r3; i3 < (w3 + 1) * r3; ++i3)
                for (int64_t i2 = w2 * r2; i2 < (w2 + 1) * r2; ++i2) {
                    a.x = batch<const float>(X, i2, i3);
                    a.y_in = batch<const float>(dY, i2, i3);
                    fn(a);
                    a.accumulate = true;
                }
        }
}

// ROPE / ROPE_BACK op params.
struct RopeArgs {
    int32_t n_rot;
    bool neox;
    float freq_base;
    float freq_scale;
    bool backward;  // ROPE_BACK: rotate by -theta
    float ext_factor, attn_factor, beta_fast, beta_slow;  // YaRN (rope_math.h)
    int32_t n_ctx_orig;
    RopeTemperature temp;  // rope_math.h
};
inline RopeArgs rope_args(const Tensor * n) {
    return {n->param_i32(0), n->param_i32(1) == static_cast<int32_t>(RopeMode::Neox), n->param_f32(2), n->param_f32(3),
            n->op == Op::ROPE_BACK, n->param_f32(4), n->param_f32(5), n->param_f32(6), n->param_f32(7), n->param_i32(8),
            {n->param_f32(9), n->param_i32(10), n->param_f32(11)}};
}

} // namespace rp::node
