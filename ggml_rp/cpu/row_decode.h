// Vectorized weight-row decoding for the CPU matrix products: rp::dequantize_row's values, faster.
//
// decode_row(t, src, dst, n) writes exactly the floats rp::dequantize_row(t, src, dst, n) writes (bit for bit:
// the same float operations in the same order per element, e.g. Q4_K (d*sc)*q - dmin*m with each step rounded,
// never fused), using AVX-512 for every block type and bf16, F16C for f16, AVX2 for MXFP4 (whose scalar decoder is
// the slowest), and the scalar reference elsewhere (other CPUs, partial blocks). The GEMM calls it per tile, so a weight read once per generated token costs
// its decoding once, which for the K-quants is what bounds generation speed.
#pragma once

#include "gguf/types.h"

#include <cstdint>

namespace rp::cpu {

// n elements of a row of type t (n a multiple of t's block size, as for rp::dequantize_row).
void decode_row(gguf::TensorType t, const void * src, float * dst, int64_t n);

} // namespace rp::cpu
