// Row conversions between f32 and the GGUF storage types: a loop over blocks calling quant_block.h.
#include "ggml_rp/core/quant.h"

#include "ggml_rp/core/fp16.h"
#include "ggml_rp/core/quant_block.h"
#include "ggml_rp/core/quantize_k.h"
#include "base/error.h"

#include <cassert>
#include <cstring>
#include <string>

namespace rp {

namespace {

// Block size of t, or throws naming the type when `supported` is false. Checks n against the block size.
int64_t checked_blocks(TensorType t, int64_t n, bool supported, const char * what) {
    const uint32_t id = static_cast<uint32_t>(t);
    const gguf::TypeTraits * tt = gguf::type_traits(id);
    if (!supported || !tt)
        throw Error(std::string(what) + ": unsupported tensor type " + gguf::type_name(id));
    if (n < 0 || n % tt->block_size != 0)
        throw Error(std::string(what) + ": " + std::to_string(n) + " elements of type " + tt->name +
                    " is not a multiple of its block size " + std::to_string(tt->block_size));
    return n / tt->block_size;
}

template <class Block, void (*Dequant)(const Block &, float *), int QK>
void dequant_blocks(const void * src, float * dst, int64_t nb) {
    assert(reinterpret_cast<uintptr_t>(src) % alignof(Block) == 0);
    const Block * b = static_cast<const Block *>(src);
    for (int64_t i = 0; i < nb; ++i) Dequant(b[i], dst + i * QK);
}

template <class Block, void (*Quant)(const float *, Block &), int QK>
void quant_blocks(const float * src, void * dst, int64_t nb) {
    assert(reinterpret_cast<uintptr_t>(dst) % alignof(Block) == 0);
    Block * b = static_cast<Block *>(dst);
    for (int64_t i = 0; i < nb; ++i) Quant(src + i * QK, b[i]);
}

} // namespace

bool can_dequantize(TensorType t) {
    switch (t) {
    case TensorType::F32: case TensorType::F16: case TensorType::BF16:
    case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1:
    case TensorType::Q8_0: case TensorType::Q2_K: case TensorType::Q3_K: case TensorType::Q4_K:
    case TensorType::Q5_K: case TensorType::Q6_K: case TensorType::MXFP4:
        return true;
    default:
        return false;
    }
}

bool can_quantize(TensorType t) {
    switch (t) {
    case TensorType::F32: case TensorType::F16: case TensorType::BF16:
    case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1:
    case TensorType::Q8_0: case TensorType::Q2_K: case TensorType::Q3_K: case TensorType::Q4_K:
    case TensorType::Q5_K: case TensorType::Q6_K: case TensorType::MXFP4:
        return true;
    default:
        return false;
    }
}

void dequantize_row(TensorType t, const void * src, float * dst, int64_t n) {
    const int64_t nb = checked_blocks(t, n, can_dequantize(t), "dequantize_row");
    switch (t) {
    case TensorType::F32:
        std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float));
        return;
    case TensorType::F16: {
        const uint16_t * s = static_cast<const uint16_t *>(src);
        for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
        return;
    }
    case TensorType::BF16: {
        const uint16_t * s = static_cast<const uint16_t *>(src);
        for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
        return;
    }
    case TensorType::Q4_0: return dequant_blocks<block_q4_0, dequantize_block_q4_0, QK4_0>(src, dst, nb);
    case TensorType::Q4_1: return dequant_blocks<block_q4_1, dequantize_block_q4_1, QK4_1>(src, dst, nb);
    case TensorType::Q5_0: return dequant_blocks<block_q5_0, dequantize_block_q5_0, QK5_0>(src, dst, nb);
    case TensorType::Q5_1: return dequant_blocks<block_q5_1, dequantize_block_q5_1, QK5_1>(src, dst, nb);
    case TensorType::Q8_0: return dequant_blocks<block_q8_0, dequantize_block_q8_0, QK8_0>(src, dst, nb);
    case TensorType::Q2_K: return dequant_blocks<block_q2_K, dequantize_block_q2_K, QK_K>(src, dst, nb);
    case TensorType::Q3_K: return dequant_blocks<block_q3_K, dequantize_block_q3_K, QK_K>(src, dst, nb);
    case TensorType::Q4_K: return dequant_blocks<block_q4_K, dequantize_block_q4_K, QK_K>(src, dst, nb);
    case TensorType::Q5_K: return dequant_blocks<block_q5_K, dequantize_block_q5_K, QK_K>(src, dst, nb);
    case TensorType::Q6_K: return dequant_blocks<block_q6_K, dequantize_block_q6_K, QK_K>(src, dst, nb);
    case TensorType::MXFP4: return dequant_blocks<block_mxfp4, dequantize_block_mxfp4, QK_MXFP4>(src, dst, nb);
    default: break;
    }
    assert(false && "can_dequantize and dequantize_row disagree");
}

void quantize_row(TensorType t, const float * src, void * dst, int64_t n) {
    const int64_t nb = checked_blocks(t, n, can_quantize(t), "quantize_row");
    switch (t) {
    case TensorType::F32:
        std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float));
        return;
    case TensorType::F16: {
        uint16_t * d = static_cast<uint16_t *>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
        return;
    }
    case TensorType::BF16: {
        uint16_t * d = static_cast<uint16_t *>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
        return;
    }
    case TensorType::Q4_0: return quant_blocks<block_q4_0, quantize_block_q4_0, QK4_0>(src, dst, nb);
    case TensorType::Q4_1: return quant_blocks<block_q4_1, quantize_block_q4_1, QK4_1>(src, dst, nb);
    case TensorType::Q5_0: return quant_blocks<block_q5_0, quantize_block_q5_0, QK5_0>(src, dst, nb);
    case TensorType::Q5_1: return quant_blocks<block_q5_1, quantize_block_q5_1, QK5_1>(src, dst, nb);
    case TensorType::Q8_0: return quant_blocks<block_q8_0, quantize_block_q8_0, QK8_0>(src, dst, nb);
    case TensorType::Q2_K: return kquant::quantize_q2_K(src, static_cast<block_q2_K *>(dst), nb);
    case TensorType::Q3_K: return kquant::quantize_q3_K(src, static_cast<block_q3_K *>(dst), nb);
    case TensorType::Q4_K: return kquant::quantize_q4_K(src, static_cast<block_q4_K *>(dst), nb);
    case TensorType::Q5_K: return kquant::quantize_q5_K(src, static_cast<block_q5_K *>(dst), nb);
    case TensorType::Q6_K: return kquant::quantize_q6_K(src, static_cast<block_q6_K *>(dst), nb);
    case TensorType::MXFP4: return quant_blocks<block_mxfp4, quantize_block_mxfp4, QK_MXFP4>(src, dst, nb);
    default: break;
    }
    assert(false && "can_quantize and quantize_row disagree");
}

void quantize_rows(TensorType t, const float * src, void * dst, int64_t n_per_row, int64_t rows, int threads) {
    checked_blocks(t, n_per_row, can_quantize(t), "quantize_rows");  // throws here, never inside a thread
    const size_t rb = gguf::row_bytes(t, n_per_row);
    uint8_t * out = static_cast<uint8_t *>(dst);
#pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(static)
    for (int64_t r = 0; r < rows; ++r) quantize_row(t, src + r * n_per_row, out + static_cast<size_t>(r) * rb, n_per_row);
}

} // namespace rp
