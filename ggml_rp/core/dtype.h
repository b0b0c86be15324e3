// The dtype table of ggml-rp. A dtype is a GGUF storage type (gguf::TensorType): f32, f16, bf16 and i32 for
// activations and ids, and the GGUF block types (Q4_0 .. Q6_K) as *weight* types. A block type stores
// `block_size` elements in `type_size` bytes; rows of a quantized tensor hold whole blocks.
#pragma once

#include "gguf/types.h"

#include <cstddef>
#include <cstdint>

namespace rp {

using DType = gguf::TensorType;

// Traits of a dtype; throws rp::Error for an unknown or retired id.
const gguf::TypeTraits & dtype_traits(DType t);

inline int64_t dtype_block_size(DType t) { return dtype_traits(t).block_size; }
inline size_t dtype_type_size(DType t) { return dtype_traits(t).type_size; }
const char * dtype_name(DType t);  // never nullptr ("type#37" for unknown ids)

// True for the block types (block size > 1).
bool dtype_is_quantized(DType t);
// True for f32, f16 and bf16: types every element-wise kernel can load.
bool dtype_is_float(DType t);

// Bytes of a row of n elements; throws rp::Error when n is not a multiple of the block size.
size_t dtype_row_bytes(DType t, int64_t n);

} // namespace rp
