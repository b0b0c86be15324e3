// Merging LoRA adapters into their base model, with the arithmetic of llama.cpp's llama-export-lora
// (formats.md §5.5): every adapted tensor is dequantized to f32, W' = W + sum_i scale_i * B_i A_i (token_embd:
// roles swapped). Unlike llama-export-lora (which writes F16 for any non-F32 base), each merged tensor keeps
// its base tensor's type, re-quantized with quant.cpp's quantizers (llama.cpp's bytes): a Q4_K_M base gives
// a Q4_K_M file, not one three times larger; every other tensor is copied byte for byte and the metadata is
// the base's. With `mix` (quant_mix.h, e.g. q4_k_m or q8_0) the output is the merge quantized to that mix,
// as llama-quantize would quantize the F32 merge: every tensor the mix re-types gets the mix's type.
#pragma once

#include "ggml_rp/core/dtype.h"
#include "models/convert/quant_mix.h"

#include <optional>
#include <string>
#include <vector>

namespace rp {

struct MergeInput {
    std::string path;
    float scale = 1.0f;  // user scale; the adapter's alpha / r is applied on top
};

struct MergeOptions {
    std::optional<QuantMix> mix;  // unset: every tensor keeps its base type
    int threads = 1;              // rows re-quantized in parallel; the bytes do not depend on it
};

// Writes the merged model to out_path (temp file + rename). Throws rp::Error naming the file and tensor: an
// adapter for another base, a quantized adapter, adapters on different tensor sets, or a base type we cannot
// write (then a mix must be given).
void merge_lora(const std::string & base_path, const std::vector<MergeInput> & adapters, const std::string & out_path,
                const MergeOptions & options = {});

} // namespace rp
