// A model (merged, fully finetuned, or any GGUF of our architectures) as Hugging Face safetensors: what
// transformers, vLLM and SGLang load. DIR gets
//   model-0000N-of-0000M.safetensors   the tensors under HF's names (convert/hf_names.h), PyTorch shapes
//                                      (GGUF's ne reversed), a llama's q/k rows in HF's order, each expert of a
//                                      mixture its own tensors, quantized tensors dequantized;
//   model.safetensors.index.json       {"metadata": {"total_size"}, "weight_map": {tensor: file}};
//   config.json                        the transformers config of the architecture from the GGUF's
//                                      hyper-parameters (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
//                                      Qwen3MoeForCausalLM, Phi3ForCausalLM: qkv_proj and gate_up_proj as the GGUF
//                                      holds them; Gemma2ForCausalLM, Gemma3ForCausalLM: their four norms a layer
//                                      as w where the GGUF holds 1 + w, layer_types, query_pre_attn_scalar, the
//                                      soft-caps; GptOssForCausalLM: fused experts, router, sinks, windows, YaRN;
//                                      Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM: DeltaNet layers, value heads
//                                      grouped, packed experts; Ministral3ForCausalLM: YaRN and the attention
//                                      temperature in rope_parameters: formats.md §5.4.1), its rope_scaling (gemma3's linear factor) from the factor tensors (Llama 3.1-3.3's
//                                      rope_freqs as {"rope_type": "llama3", ...}, phi3's LongRoPE as {"type":
//                                      "longrope", ...}), and generation_config.json (BOS / EOS);
//   tokenizer.json, tokenizer_config.json  the vocabulary, its special tokens and chat template, where they can be
//                                      written exactly (convert/hf_tokenizer.h; else the report says why, and the
//                                      files are to be copied from the model's Hugging Face repository).
// A model with other rope
// scaling (a rope scale other than 1, factors that are not Llama 3's) is refused: its config cannot be written exactly.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace rp {

class Model;

struct HfExportOptions {
    // F32 | F16 | BF16, or "auto": F32 when every tensor is F32, BF16 when one is BF16, else F16.
    std::string dtype = "auto";
    size_t shard_bytes = size_t(5) * 1000 * 1000 * 1000;  // at most this much tensor data per file (transformers' "5GB")
    // Called after each tensor is written: tensors and bytes written so far, and in all (a large model's export
    // takes minutes). Empty: none.
    std::function<void(size_t tensors_done, size_t tensors, size_t bytes_done, size_t bytes)> progress;
};

struct HfExportReport {
    std::string dtype;               // what was written
    std::vector<std::string> files;  // in DIR
    size_t tensors = 0, bytes = 0;
    std::string tokenizer_refused;   // why the tokenizer files were not written ("": they were)
};

// Throws rp::Error naming the tensor or setting at fault; files are written to temporary names and renamed
// once all are complete.
HfExportReport export_hf(const Model & model, const std::string & dir, const HfExportOptions & options = {});

} // namespace rp
