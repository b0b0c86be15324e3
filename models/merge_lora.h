// Merging LoRA adapters into their base model, with the semantics of llama.cpp's llama-export-lora
// (formats.md §5.5): every adapted tensor is dequantized to f32, W' = W + sum_i scale_i * B_i A_i (token_embd:
// roles swapped), and stored as F32 when the base tensor was F32, else F16 (or `out_type` when given: a
// re-quantization of the merged tensors); every other tensor is copied byte for byte; the metadata is the
// base's with general.file_type = 1 (MOSTLY_F16), as llama-export-lora writes it.
#pragma once

#include "ggml_rp/core/dtype.h"

#include <optional>
#include <string>
#include <vector>

namespace rp {

struct MergeInput {
    std::string path;
    float scale = 1.0f;  // user scale; the adapter's alpha / r is applied on top
};

// Writes the merged model to out_path (temp file + rename). Throws rp::Error naming the file and tensor: an
// adapter for another base, a quantized adapter, adapters on different tensor sets, or an out_type that a
// merged tensor's rows cannot hold.
void merge_lora(const std::string & base_path, const std::vector<MergeInput> & adapters, const std::string & out_path,
                std::optional<DType> out_type = std::nullopt);

} // namespace rp
