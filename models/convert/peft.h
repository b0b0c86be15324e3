// LoRA adapters in PEFT's layout (what vLLM, SGLang and the Hugging Face Hub take): a directory with
// adapter_config.json and adapter_model.safetensors — to and from our GGUF adapters (formats.md §5).
//
// Names (convert/hf_names.h): GGUF "blk.N.attn_q.weight" is HF "model.layers.N.self_attn.q_proj", and its pair is stored as
// "base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight" (r, in) and "...lora_B.weight" (out, r):
// the GGUF tensors' bytes as they are (ne [in, r] and [r, out] are those shapes reversed). The others:
// attn_k/v/output -> k_proj/v_proj/o_proj, ffn_gate/up/down -> mlp.gate_proj/up_proj/down_proj, a mixture of
// experts' router ffn_gate_inp -> mlp.gate and its experts ffn_*_exps -> mlp.experts.E.*_proj (one pair per
// expert), token_embd -> model.embed_tokens as lora_embedding_A (r, vocab) / lora_embedding_B (embd, r), and
// output -> lm_head. A llama model's q/k rows are in llama.cpp's permuted order (formats.md §3.6): their B
// rows are put back in HF's order on export and permuted again on import.
//
// Scale: PEFT's lora_alpha / r is GGUF's alpha / r; an adapter without alpha (scale 1) is exported with
// lora_alpha = r. Not representable in a GGUF adapter, and refused on import with an error naming what:
// DoRA (use_dora), modules_to_save, bias other than "none", fan_in_fan_out, per-module ranks or alphas
// (rank_pattern, alpha_pattern). rsLoRA (use_rslora, scale alpha / sqrt(r)) is imported as alpha x sqrt(r).
#pragma once

#include <string>

namespace rp {

class LoraAdapter;
class Model;

struct PeftExportOptions {
    std::string dtype = "F32";    // of the safetensors: F32 | F16 | BF16
    std::string base_model_name;  // adapter_config.json's base_model_name_or_path (default: the GGUF's general.name)
};

// Writes DIR/adapter_config.json and DIR/adapter_model.safetensors (creating DIR) for `adapter` on `model`.
// Throws rp::Error naming the tensor for what PEFT's layout cannot hold (ranks that differ between tensors).
void export_peft(const LoraAdapter & adapter, const Model & model, const std::string & dir, const PeftExportOptions & options = {});

// Reads the PEFT adapter in DIR (for `model`) and writes it as a GGUF adapter to out_path (temp file + rename).
// Throws rp::Error naming the file and the key or tensor at fault; nothing is written then.
void import_peft(const std::string & dir, const Model & model, const std::string & out_path);

} // namespace rp
