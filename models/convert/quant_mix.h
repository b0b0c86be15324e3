// Quantization mixes: which type each tensor of a model gets when a file is quantized to, e.g., Q4_K_M.
// The rules are llama.cpp's (llama-quant.cpp, llama_tensor_get_type, without an importance matrix) so that
// a file we write has the types — and, with quant.cpp's quantizers, the bytes — llama-quantize writes:
//   - only 2-D+ tensors whose name ends in "weight" are quantized, never norms (1-D tensors keep their type);
//   - output.weight (and token_embd.weight when the head is tied to it) gets Q6_K, or Q8_0 when its rows
//     are not a multiple of the block size;
//   - the _M/_L mixes give more bits to attn_v and ffn_down of some layers (use_more_bits: the first and
//     last eighth and every third layer between), Q3_K_M/L and Q2_K to attn_output, ...;
//   - a row length that is not a multiple of the chosen type's block falls back (Q4_K -> Q5_0, Q5_K -> Q5_1,
//     Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0; then F16 when even 32 does not divide it).
#pragma once

#include "gguf/types.h"

#include <cstdint>
#include <string>
#include <vector>

namespace rp {

using gguf::TensorType;

// A target named as llama-quantize names it: a mix (q4_k_m, ...) or one type (q8_0, f16, ...).
struct QuantMix {
    std::string name;       // lower case, as given (aliases resolved: q4_k -> q4_k_m)
    uint32_t file_type = 0; // general.file_type (llama_ftype)
    TensorType base = TensorType::F32;  // the type most weights get
};

// False when `name` (case-insensitive) is neither a mix nor a supported type.
bool quant_mix_from_name(const std::string & name, QuantMix & out);
// "f32, f16, bf16, q4_0, ..., q6_k": for help texts and errors.
std::string quant_mix_names();

// What the rules read from the model.
struct QuantMixModel {
    std::string arch;       // general.architecture
    uint32_t n_layer = 0;
    uint32_t n_head = 0;
    uint32_t n_head_kv = 0;
    uint32_t n_expert = 0;  // 0: dense
};

struct QuantTensor {
    std::string name;
    int n_dims = 0;
    int64_t ne0 = 0;        // row length
    TensorType type = TensorType::F32;  // its type in the input
};

struct QuantChoice {
    TensorType type;        // what the tensor is written as
    bool quantized = false; // the rules re-type it (false: copied in its input type)
    std::string note;       // non-empty when a row-length fallback happened (says which and why)
};

// One choice per tensor, in the order given. `pure`: every quantizable tensor gets mix.base (llama-quantize
// --pure), still with the row-length fallbacks. Throws rp::Error naming the tensor for a name the rules
// must parse and cannot (an expert tensor without a layer number).
std::vector<QuantChoice> plan_quant_mix(const QuantMix & mix, const QuantMixModel & model,
                                        const std::vector<QuantTensor> & tensors, bool pure = false);

} // namespace rp
