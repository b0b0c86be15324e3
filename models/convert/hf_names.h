// Hugging Face's names for the weights of our architectures (llama, qwen2, qwen3, qwen3moe, phi3: the
// transformers classes LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, Phi3ForCausalLM;
// gpt-oss's and qwen35's own names below and in convert/hf_export.cpp), and
// llama.cpp's row order of a llama model's q/k projections (formats.md §3.6), for the conversions to and
// from Hugging Face's layouts (convert/peft.h, convert/hf_export.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rp {

struct HParams;

// The HF module of a GGUF weight matrix ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj"; experts:
// "model.layers.3.mlp.experts.{E}.gate_proj", {E} standing for the expert; phi3's attn_qkv: "self_attn.qkv_proj",
// and its ffn_up, the gate's and up rows (fused_gate_up): "mlp.gate_up_proj"); "" when it has none.
std::string hf_module_of(const std::string & gguf_weight, bool fused_gate_up = false);
// The inverse: the GGUF weight of an HF module and the expert it is (-1: not an expert); "" when none.
std::pair<std::string, int64_t> gguf_weight_of(const std::string & hf_module);
// `module` with {E} replaced by expert e.
std::string hf_expert_module(std::string module, int64_t e);

// The same with the architecture's own names: phi3's fused ffn_up (mlp.gate_up_proj), gpt-oss's router (mlp.router),
// Qwen3.5's DeltaNet projections under linear_attn (attn_qkv in_proj_qkv, attn_gate in_proj_z, ssm_beta in_proj_b,
// ssm_alpha in_proj_a, ssm_out out_proj).
std::string hf_module_of(const HParams & hp, const std::string & gguf_weight);
std::pair<std::string, int64_t> gguf_weight_of(const HParams & hp, const std::string & hf_module);

// Qwen3.5's DeltaNet value heads: llama.cpp's converter stores them tiled (head j * Hk + k is the j-th value head of
// key head k) where transformers keeps them grouped (head k * r + j, r = Hv / Hk). Which part of a GGUF tensor
// (as a row-major [rows][row_len] matrix) holds value heads: rows (or, columns: entries of every row) [first,
// first + Hv * head_len); head_len 0: none (any other tensor or model).
struct ValueHeads {
    int64_t first = 0, head_len = 0;
    bool columns = false;
};
ValueHeads value_heads_of(const HParams & hp, const std::string & gguf_tensor);
// m with those heads from tiled to grouped order (to_hf) or back.
std::vector<float> reorder_value_heads(const std::vector<float> & m, int64_t row_len, const ValueHeads & vh, const HParams & hp, bool to_hf);

// The HF tensor of any GGUF tensor of those models (weights, biases, norms: "blk.0.attn_norm.weight" ->
// "model.layers.0.input_layernorm.weight", "output_norm.weight" -> "model.norm.weight"); "" when none.
// gemma_norms (gemma2, gemma3: four norms a layer): ffn_norm is pre_feedforward_layernorm, post_attention_norm and
// post_ffw_norm post_attention_layernorm and post_feedforward_layernorm.
std::string hf_tensor_of(const std::string & gguf_tensor, bool fused_gate_up = false, bool gemma_norms = false);

// A llama model's q (n_head heads) and k (n_head_kv) rows: GGUF row h*D + 2j + s holds HF row h*D + s*D/2 + j.
// The heads of `gguf_tensor`'s rows when they are in that order (attn_q / attn_k weights and biases of a
// llama model), else 0.
int64_t permuted_row_heads(const HParams & hp, const std::string & gguf_tensor);
// A row-major [rows][row_len] matrix with its rows moved from GGUF's order to HF's (to_hf) or back.
std::vector<float> reorder_qk_rows(const float * m, int64_t rows, int64_t row_len, int64_t heads, bool to_hf);

} // namespace rp
