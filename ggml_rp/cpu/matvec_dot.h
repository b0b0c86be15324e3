// One-token products as per-row dot products, with the activation column in the weight's dot-product format:
// the generation path, as llama.cpp's CPU backend does it (its vec_dot with q8_0 / q8_K / bf16 activations).
//
// Generating one token reads every weight once, so the product is bound by how fast the weight rows stream
// in and are decoded, not by work on the activations. Converting the column once lets each weight row be
// dotted where it lies, one contiguous stream, with the cheapest instructions its format allows:
//   Q4_0 .. Q8_0, Q2_K .. Q6_K, MXFP4
//                           int8 column, integer multiply-adds (AVX-512 VNNI, or AVX2's maddubs + madd:
//                           the same int32 sums), exact in int32, scaled per block (MXFP4: its E2M1 codes as
//                           ggml's doubled integer values by a table lookup, the power-of-two scale halved);
//   BF16                    bf16 column, pairwise bf16 products summed in f32 (AVX-512 BF16, or the
//                           instruction's arithmetic by FMAs on zmm (AVX-512F) or ymm (AVX2));
//   F32, F16                the f32 column itself, one FMA chain per 16 lanes (one zmm or two ymm).
//
// Numerics (stated, and tested against double-precision references):
//   int8: x is cut into blocks of 32; block b becomes d_b * q_i with d_b = max|x_i| / 127 and q_i = round(x_i /
//     d_b) (ties to even) in [-127, 127], so |x_i - d_b q_i| <= d_b / 2. (llama.cpp: 32-blocks with an fp16
//     scale for Q8_0, 256-blocks with an f32 scale for the K types; ours is at least as fine for every type.)
//     The weights are rp::dequantize_row's values, factored per sub-block (w = s q - m):
//     y = sum over sub-blocks of s d_b (sum q q', exact) - m d_b (sum q').
//   bf16: x rounded to bf16 (to nearest even, relative error <= 2^-8); each product of two bf16 values is
//     exact in f32; the products are summed in f32 (with AVX-512 BF16 subnormal bf16 inputs count as zero, as
//     the instruction does; the FMA and portable loops keep them). The SIMD paths give the same bits where no
//     bf16 input is subnormal.
//   f32 / f16: the exact values, summed in f32 in 16 interleaved lanes.
// Each row's order is fixed (the same for any thread count: results are deterministic), but it is not the
// batch path's order, so a token's logits differ from its column in a batch by the rounding above (int8:
// ~1e-3 relative; bf16: ~4e-3 of |w||x|; f32: reassociation only). That is why this is opt-in per process
// (rp-generate turns it on) and the batch arithmetic stays the default (training, perplexity). In a process
// that turned it on, products of more tokens with the int8 types (prompts) take the same numerics through the
// int8 product of gemm_int8.h; a RowDotScope keeps a session's prompts exact.
#pragma once

#include "gguf/types.h"

#include <cstdint>
#include <vector>

namespace rp::cpu {

// An activation column prepared for row_dot with one weight type.
struct DotColumn {
    int64_t K = 0;
    const float * x = nullptr;    // f32 / f16 weights: the column itself (not owned)
    std::vector<int8_t> q;        // int8 types: K values
    std::vector<float> d;         //   K/32 block scales
    std::vector<float> dsum16;    //   K/16: d of the block * (sum of the 16 q's), for the min / offset terms
    std::vector<float> dsum32;    //   K/32: dsum16 of the block's two halves added (the 32-sub-block types' mins)
    std::vector<int8_t> qt;       // K-quant types: q reordered for the row dots of several columns (below)
    std::vector<int32_t> bias12;  // MXFP4: per 4 values, -12 x the sum of their q's (below)
    std::vector<uint16_t> bf16;   // bf16 weights: K values, zeros to a multiple of 32
};

// Quantizes x[0..K) to int8 (K a multiple of 32): q, d, dsum16, dsum32.
void quantize_column(const float * x, int64_t K, DotColumn & out);

// The K-quant row dots of several columns decode a super-block's 256 weights once into 32-element groups and
// transpose each half's four groups by dwords within 16-byte halves (simd::transpose4x4_halves), so that each int32
// lane accumulates one 16-element sub-block over four multiply-adds and no horizontal sums remain: per column, four
// multiply-adds a half instead of the shuffles of a horizontal sum. prepare_column fills qt in that order, the two
// halves' vectors interleaved (vector k of half h at 64 k + 32 h of each 256, so that both load as one 512-bit
// vector): value i of each 256 (k = i / 64, h = (i / 32) % 2, dword lane L = (i % 32) / 4) is q's value
// 128 h + 32 (L % 4) + 16 (L / 4) + 4 k + i % 4 of the same 256.

// The MXFP4 row dots multiply each code's value v offset to v + 12 (0 .. 24: unsigned, as the multiply-adds take one
// operand) and start each int32 lane's sum (4 values) at bias12 = -12 (their q's sum): the same exact integer sums
// as the signed products, with no sign work per column.

// Prepares x[0..K) for rows of type t (row_dot_supports(t, K)).
void prepare_column(gguf::TensorType t, const float * x, int64_t K, DotColumn & out);

// Whether row_dot takes weight rows of type t and length K.
bool row_dot_supports(gguf::TensorType t, int64_t K);

// One weight row (K elements of type t) times the column prepare_column(t, ...) made.
float row_dot(gguf::TensorType t, const void * row, const DotColumn & x);

// One weight row times n <= kRowDotColumns columns (a decode step of several sequences): out[c] = row_dot(t, row,
// *xs[c]), bit for bit; every int8 type (Q4_0 .. Q8_0, Q2_K .. Q6_K, MXFP4) decodes each block once for all of them,
// BF16 loads each part of the row once, F32 and F16 once per group of columns (f16: converted once).
constexpr int kRowDotColumns = 8;
void row_dot_columns(gguf::TensorType t, const void * row, const DotColumn * const * xs, int n, float * out);

// True when row_dot uses the instructions named above for t (AVX2 at least; false: a portable loop, same
// numerics).
bool row_dot_is_simd(gguf::TensorType t);

// Process-wide switch: one-token matmul_fwd products of supported weight types become row dots, where
// row_dot_is_simd (the portable loops are slower than the exact path, which then stays). Off by default.
void set_row_dots(bool on);
// This thread's switch: its RowDotScope's while one lives, else the process-wide one.
bool row_dots();

// Overrides the switch for the calling thread while it lives (the products are dispatched on the thread that runs
// the graph): a session that decodes with row dots (GRPO's rollouts) while other threads run training graphs,
// which keep the exact arithmetic. max_columns > 0: products of up to that many tokens take the row dots (each
// column's bits are its own, so a decode step's sequences get the same bits however many decode together), more
// the exact arithmetic; 0: the process-wide rule (a few tokens, by weight type: gemm.cpp; more: the int8 product,
// gemm_int8.h, where it takes the type).
class RowDotScope {
public:
    explicit RowDotScope(bool on, int64_t max_columns = 0);
    ~RowDotScope();
    RowDotScope(const RowDotScope &) = delete;
    RowDotScope & operator=(const RowDotScope &) = delete;

private:
    int saved_;
    int64_t saved_columns_;
};
// The calling thread's RowDotScope max_columns (0: none, or the process-wide rule).
int64_t row_dot_max_columns();

// How far ahead of the block it decodes each row dot asks for its weight bytes (software prefetch): by default
// 16 KiB on Intel CPUs, whose prefetchers alone leave the stream's loads waiting, and none on AMD ones, whose
// stream prefetcher keeps up alone (bench/design-measurements.md). A negative value restores the default
// (benchmarks sweep it: rp-bench ops --only matvec). The results never depend on it.
void set_row_prefetch_bytes(int64_t bytes);
int64_t row_prefetch_bytes();

} // namespace rp::cpu
