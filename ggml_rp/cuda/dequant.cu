// GPU dequantization: one thread per output element (coalesced stores), each computing its value with
// quant_block.h's dequant_elem_<t>, so the result equals the CPU reference bit for bit.
#include "ggml_rp/cuda/dequant.cuh"
#include "ggml_rp/cuda/launch.h"

#include "base/error.h"
#include "ggml_rp/core/fp16.h"
#include "ggml_rp/core/quant_block.h"

#include <string>

namespace rp::cuda {

namespace {


template <class Block, float (*Elem)(const Block &, int), int QK>
__global__ void __launch_bounds__(kElemThreads) dequant_kernel(const Block * __restrict__ src, float * __restrict__ dst, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = Elem(src[i / QK], static_cast<int>(i % QK));
}

__device__ inline float elem_f32(const float & x, int) { return x; }
__device__ inline float elem_f16(const uint16_t & h, int) { return fp16_to_fp32(h); }
__device__ inline float elem_bf16(const uint16_t & h, int) { return bf16_to_fp32(h); }

template <class Block, float (*Elem)(const Block &, int), int QK>
void launch(const void * src, float * dst, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    // Enough blocks to fill any current GPU; the grid-stride loop covers the rest.
    const int64_t want = (n + kElemThreads - 1) / kElemThreads;
    const int grid = static_cast<int>(want < 65536 ? want : 65536);
    dequant_kernel<Block, Elem, QK><<<grid, kElemThreads, 0, stream>>>(static_cast<const Block *>(src), dst, n);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        throw Error(std::string("cuda dequantize: kernel launch failed: ") + cudaGetErrorString(err));
}

} // namespace

bool can_dequantize(gguf::TensorType t) {
    using T = gguf::TensorType;
    switch (t) {
    case T::F32: case T::F16: case T::BF16: case T::Q4_0: case T::Q4_1: case T::Q5_0: case T::Q5_1:
    case T::Q8_0: case T::Q2_K: case T::Q3_K: case T::Q4_K: case T::Q5_K: case T::Q6_K: case T::MXFP4:
        return true;
    default:
        return false;
    }
}

void dequantize(gguf::TensorType t, const void * dsrc, float * ddst, int64_t n, cudaStream_t stream) {
    using T = gguf::TensorType;
    const uint32_t id = static_cast<uint32_t>(t);
    const gguf::TypeTraits * tt = gguf::type_traits(id);
    if (!can_dequantize(t) || !tt)
        throw Error(std::string("cuda dequantize: unsupported tensor type ") + gguf::type_name(id));
    if (n < 0 || n % tt->block_size != 0)
        throw Error("cuda dequantize: " + std::to_string(n) + " elements of type " + tt->name +
                    " is not a multiple of its block size " + std::to_string(tt->block_size));
    switch (t) {
    case T::F32: return launch<float, elem_f32, 1>(dsrc, ddst, n, stream);
    case T::F16: return launch<uint16_t, elem_f16, 1>(dsrc, ddst, n, stream);
    case T::BF16: return launch<uint16_t, elem_bf16, 1>(dsrc, ddst, n, stream);
    case T::Q4_0: return launch<block_q4_0, dequant_elem_q4_0, QK4_0>(dsrc, ddst, n, stream);
    case T::Q4_1: return launch<block_q4_1, dequant_elem_q4_1, QK4_1>(dsrc, ddst, n, stream);
    case T::Q5_0: return launch<block_q5_0, dequant_elem_q5_0, QK5_0>(dsrc, ddst, n, stream);
    case T::Q5_1: return launch<block_q5_1, dequant_elem_q5_1, QK5_1>(dsrc, ddst, n, stream);
    case T::Q8_0: return launch<block_q8_0, dequant_elem_q8_0, QK8_0>(dsrc, ddst, n, stream);
    case T::Q2_K: return launch<block_q2_K, dequant_elem_q2_K, QK_K>(dsrc, ddst, n, stream);
    case T::Q3_K: return launch<block_q3_K, dequant_elem_q3_K, QK_K>(dsrc, ddst, n, stream);
    case T::Q4_K: return launch<block_q4_K, dequant_elem_q4_K, QK_K>(dsrc, ddst, n, stream);
    case T::Q5_K: return launch<block_q5_K, dequant_elem_q5_K, QK_K>(dsrc, ddst, n, stream);
    case T::Q6_K: return launch<block_q6_K, dequant_elem_q6_K, QK_K>(dsrc, ddst, n, stream);
    case T::MXFP4: return launch<block_mxfp4, dequant_elem_mxfp4, QK_MXFP4>(dsrc, ddst, n, stream);
    default: break;
    }
}

} // namespace rp::cuda
