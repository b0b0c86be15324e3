// What is inside a GGUF file, as text (rp-gguf info, dump, diff): built whole before anything is printed, so
// that an error leaves no partial output. Quantized tensors are dequantized row by row (ggml_rp/core/quant.h).
#pragma once

#include "gguf/gguf.h"

#include <cstdint>
#include <string>

namespace rp {

// The header (version, alignment, sizes), every metadata key with its type and value (arrays abbreviated),
// the tensor table (index, name, type, shape in ne order, bytes, offset in the data section) and totals.
std::string gguf_info(const gguf::Reader & file);

// A '#' header line, then the first n values of `tensor` in storage order (ne[0] fastest), dequantized to
// f32, one per line; n = 0: all. Throws rp::Error naming the file when there is no such tensor or its type
// cannot be dequantized.
std::string gguf_dump(const gguf::Reader & file, const std::string & tensor, int64_t n);

// For every tensor of a also in b with the same shape, the maximum absolute difference of the dequantized
// values; then the tensors only in a, only in b, the shape mismatches, and a summary line.
std::string gguf_diff(const gguf::Reader & a, const gguf::Reader & b);

} // namespace rp
