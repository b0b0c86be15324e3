// GGML tensor storage types as they appear in GGUF files: ids, block sizes and byte sizes.
// Pure table, no math: the per-block (de)quantization math lives in ggml_rp/core/quant_block.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gguf {

// Type ids are the on-disk values (formats.md §2). Ids 4, 5, 31-33, 36-38 are retired.
enum class TensorType : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
    IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
    I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
    TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41, Q2_0 = 42,
};

constexpr uint32_t kTensorTypeCount = 43;

struct TypeTraits {
    const char * name;     // "f32", "q4_0", ... (nullptr for a retired id)
    int64_t block_size;    // elements per block (1 for plain types)
    size_t type_size;      // bytes per block
    bool known;            // a valid id in the reference snapshot (we can size it); what the engine can
                           // dequantize is its own business (ggml_rp/core/quant.h, can_dequantize)
};

// Traits of a type id; nullptr for ids >= kTensorTypeCount or retired ids.
const TypeTraits * type_traits(uint32_t id);

// Name of a type id for messages: "q4_k", or "type#37" for unknown ids. Never nullptr.
const char * type_name(uint32_t id);

// Parses "f32", "F16", "q4_0", "Q8_0", ... (case-insensitive); returns false when unknown.
bool type_from_name(const char * name, TensorType & out);

// Bytes of a row of n elements; n must be a multiple of the block size (checked by callers).
size_t row_bytes(TensorType t, int64_t n);

} // namespace gguf
