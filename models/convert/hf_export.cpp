#include "models/convert/hf_export.h"

#include "base/atomic_file.h"
#include "base/error.h"
#include "ggml_rp/core/fp16.h"
#include "ggml_rp/core/json.h"
#include "ggml_rp/core/quant.h"
#include "gguf/gguf.h"
#include "models/arch/hparams.h"
#include "models/arch/model.h"
#include "models/arch/rope_scaling.h"
#include "models/convert/hf_names.h"
#include "models/convert/hf_tokenizer.h"
#include "models/convert/safetensors.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>

namespace rp {

namespace {

// The shortest decimal that reads back as the same float (1e-05, not 9.99999975e-06).
std::string number(float v) {
    char b[48];
    if (v == std::floor(v) && std::fabs(v) < 1e15f) {
        std::snprintf(b, sizeof b, "%.1f", static_cast<double>(v));
        return b;
    }
    for (int p = 1; p <= 9; ++p) {
        std::snprintf(b, sizeof b, "%.*g", p, static_cast<double>(v));
        if (std::strtof(b, nullptr) == v) break;
    }
    return b;
}

// The tensor's values as f32, dequantized row by row; part of 0 .. parts - 1: only that part of its rows (an expert's
// slice of a stacked tensor, so that exporting E experts dequantizes the tensor once, not E times).
std::vector<float> values_of(const gguf::Reader & f, const gguf::TensorInfo & t, int64_t part = 0, int64_t parts = 1) {
    if (!can_dequantize(t.type))
        throw Error(f.path() + ": tensor '" + t.name + "' has type " + gguf::type_name(static_cast<uint32_t>(t.type)) + ", which cannot be dequantized");
    const int64_t ne0 = t.ne[0], rows = t.nelements() / ne0 / parts, first = part * rows;
    const size_t rb = gguf::row_bytes(t.type, ne0);
    std::vector<float> out(static_cast<size_t>(rows * ne0));
    const uint8_t * src = f.tensor_data(t);
    for (int64_t r = 0; r < rows; ++r) dequantize_row(t.type, src + static_cast<size_t>(first + r) * rb, out.data() + r * ne0, ne0);
    return out;
}

std::string encode(const float * v, size_t n, const std::string & dtype) {
    if (dtype == "F32") return std::string(reinterpret_cast<const char *>(v), n * sizeof(float));
    std::string out(n * 2, '\0');
    for (size_t i = 0; i < n; ++i) {
        const uint16_t h = dtype == "F16" ? fp32_to_fp16(v[i]) : fp32_to_bf16(v[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
    }
    return out;
}

std::string choose_dtype(const gguf::Reader & f, const std::string & asked) {
    if (asked != "auto") {
        if (!safetensors_dtype_size(asked)) throw Error("HF export: dtype " + asked + " is not one of F32, F16, BF16, auto");
        return asked;
    }
    bool all_f32 = true, any_bf16 = false;
    for (const gguf::TensorInfo & t : f.tensors()) {
        all_f32 &= t.type == gguf::TensorType::F32;
        any_bf16 |= t.type == gguf::TensorType::BF16;
    }
    return all_f32 ? "F32" : any_bf16 ? "BF16" : "F16";
}

// A JSON array of floats, each the shortest decimal that reads back as it.
std::string float_array(const std::vector<float> & v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + number(v[i]);
    return s + "]";
}

bool same_factors(const std::vector<float> & a, const std::vector<float> & b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (!(std::fabs(a[i] - b[i]) <= 1e-6f * std::fabs(b[i]))) return false;
    return true;
}

// The config's rope_scaling: null; Llama 3's ({"rope_type": "llama3", ...}) recognised in rope_freqs.weight (Meta's
// low / high frequency factors 1 and 4 over 8192 tokens, the released 3.1-3.3 models'; any factor); phi3's LongRoPE
// ({"type": "longrope", long and short factors}). Throws when a model's factors are none of those.
std::string rope_scaling_json(const Model & model) {
    const HParams & hp = model.hparams();
    const Tensor * freqs = model.layers.empty() ? nullptr : model.layers[0].rope_freqs;
    if (hp.arch->arch == Arch::Mistral3) return "null";  // its YaRN is in rope_parameters (config_json)
    if (hp.arch->arch == Arch::GptOss && hp.rope_ext_factor != 0.0f)  // gpt-oss's YaRN, as its own config states it
        return "{\"beta_fast\": " + number(hp.rope_beta_fast) + ", \"beta_slow\": " + number(hp.rope_beta_slow) + ", \"factor\": " +
               number(1.0f / hp.rope_freq_scale) + ", \"original_max_position_embeddings\": " + std::to_string(hp.rope_n_ctx_orig) +
               ", \"rope_type\": \"yarn\", \"truncate\": false}";
    if (!freqs && hp.rope_freq_scale != 1.0f)  // gemma3 4B+: its global layers' linear scaling
        return "{\"factor\": " + number(1.0f / hp.rope_freq_scale) + ", \"rope_type\": \"linear\"}";
    if (!freqs) return "null";
    const std::vector<float> f = tensor_get_f32(freqs);
    if (model.rope_factors_long) {
        // transformers recomputes the cos / sin scale from the two contexts: it must be the file's
        const double ext = static_cast<double>(hp.n_ctx_train) / hp.rope_n_ctx_orig;
        const double want = ext > 1.0 ? std::sqrt(1.0 + std::log(ext) / std::log(static_cast<double>(hp.rope_n_ctx_orig))) : 1.0;
        if (std::fabs(hp.rope_attn_factor - want) > 1e-5 * want)
            throw Error(model.path() + ": rope.scaling.attn_factor " + number(hp.rope_attn_factor) + " is not the " + number(static_cast<float>(want)) +
                        " transformers computes from the contexts " + std::to_string(hp.n_ctx_train) + " and " + std::to_string(hp.rope_n_ctx_orig));
        return "{\"type\": \"longrope\", \"long_factor\": " + float_array(tensor_get_f32(model.rope_factors_long)) + ", \"short_factor\": " +
               float_array(f) + "}";
    }
    float factor = 1.0f;
    for (float x : f) factor = std::max(factor, x);
    const uint32_t orig = 8192;
    if (!same_factors(f, llama3_rope_factors(factor, 1.0f, 4.0f, orig, hp.rope_freq_base, hp.n_rot)))
        throw Error(model.path() + ": rope_freqs.weight holds factors that are not Llama 3's (factor " + number(factor) +
                    ", low / high frequency factors 1 / 4 over 8192 tokens): no Hugging Face config states them");
    return "{\"factor\": " + number(factor) + ", \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": " +
           std::to_string(orig) + ", \"rope_type\": \"llama3\"}";
}

// transformers' layer_types of a model with windowed layers: "sliding_attention" or "full_attention" a layer.
std::string window_layer_types(const HParams & hp) {
    std::string types = "[";
    for (uint32_t il = 0; il < hp.n_layer; ++il) types += std::string(il ? ", " : "") + (hp.is_swa(il) ? "\"sliding_attention\"" : "\"full_attention\"");
    return types + "]";
}

// A token id key as a JSON value: the number, or null when the file has none.
std::string token_id(const gguf::Reader & f, const char * key) { return f.has(key) ? std::to_string(f.get_u32(key)) : std::string("null"); }

// transformers' config.json of the model.
std::string config_json(const Model & model, const std::string & dtype) {
    const HParams & hp = model.hparams();
    const gguf::Reader & f = model.file();
    const char * cls = nullptr, * type = nullptr;
    switch (hp.arch->arch) {
    case Arch::Llama: cls = "LlamaForCausalLM", type = "llama"; break;
    case Arch::Qwen2: cls = "Qwen2ForCausalLM", type = "qwen2"; break;
    case Arch::Qwen3: cls = "Qwen3ForCausalLM", type = "qwen3"; break;
    case Arch::Qwen3Moe: cls = "Qwen3MoeForCausalLM", type = "qwen3_moe"; break;
    case Arch::GptOss: cls = "GptOssForCausalLM", type = "gpt_oss"; break;
    case Arch::Gemma2: cls = "Gemma2ForCausalLM", type = "gemma2"; break;
    case Arch::Gemma3: cls = "Gemma3ForCausalLM", type = "gemma3_text"; break;
    case Arch::Mistral3: cls = "Ministral3ForCausalLM", type = "ministral3"; break;  // the text model (no vision tower here)
    case Arch::Phi3: cls = "Phi3ForCausalLM", type = "phi3"; break;
    case Arch::Qwen35: cls = "Qwen3_5ForCausalLM", type = "qwen3_5_text"; break;
    case Arch::Qwen35Moe: cls = "Qwen3_5MoeForCausalLM", type = "qwen3_5_moe_text"; break;
    }
    const std::string torch = dtype == "F32" ? "float32" : dtype == "F16" ? "float16" : "bfloat16";
    std::string c = "{\n";
    auto field = [&](const std::string & k, const std::string & v) {
        c += "  ";
        c += json::quoted(k);
        c += ": ";
        c += v;
        c += ",\n";
    };
    std::string classes = "[";
    classes += json::quoted(cls);
    classes += "]";
    field("architectures", classes);
    field("model_type", json::quoted(type));
    const bool gemma = hp.arch->arch == Arch::Gemma2 || hp.arch->arch == Arch::Gemma3;
    field(gemma ? "hidden_activation" : "hidden_act", gemma ? "\"gelu_pytorch_tanh\"" : "\"silu\"");
    field("hidden_size", std::to_string(hp.n_embd));
    const bool gpt_oss = hp.arch->arch == Arch::GptOss;
    field("intermediate_size", std::to_string(gpt_oss ? hp.n_ff_exp : hp.n_ff));  // gpt-oss: each expert's width
    field("num_hidden_layers", std::to_string(hp.n_layer));
    field("num_attention_heads", std::to_string(hp.n_head));
    field("num_key_value_heads", std::to_string(hp.n_head_kv));
    field("head_dim", std::to_string(hp.head_dim));
    field("max_position_embeddings", std::to_string(hp.n_ctx_train));
    field("rms_norm_eps", number(hp.rms_eps));
    field("rope_theta", number(hp.rope_freq_base));
    field("rope_scaling", rope_scaling_json(model));
    if (hp.arch->long_rope) field("original_max_position_embeddings", std::to_string(hp.rope_n_ctx_orig));
    field("vocab_size", std::to_string(hp.n_vocab));
    field("tie_word_embeddings", model.tied_output() ? "true" : "false");
    if (hp.arch->arch != Arch::Qwen2) field("attention_bias", gpt_oss ? "true" : "false");
    if (hp.arch->arch == Arch::Phi3) field("sliding_window", "null");  // llama.cpp runs Phi-3 unwindowed: so do we
    if (hp.n_rot != hp.head_dim) field("partial_rotary_factor", number(static_cast<float>(hp.n_rot) / static_cast<float>(hp.head_dim)));
    if (gemma) {
        // The query scale as query_pre_attn_scalar (head_dim, or n_embd / n_head for the 27Bs), the windowed layers as
        // layer_types (and the older sliding_window_pattern), the local layers' RoPE base (gemma3), the soft-caps.
        const bool big = hp.n_layer == hp.arch->big_attn_scale_layers;  // the 27Bs' scale, as load_hparams chooses it
        field("query_pre_attn_scalar", std::to_string(big ? hp.n_embd / hp.n_head : hp.head_dim));
        field("sliding_window", std::to_string(hp.n_swa));
        field("sliding_window_pattern", std::to_string(hp.swa_period));
        field("layer_types", window_layer_types(hp));
        if (hp.arch->arch == Arch::Gemma3) field("rope_local_base_freq", number(hp.rope_freq_base_swa));
        field("attn_logit_softcapping", hp.attn_softcap > 0.0f ? number(hp.attn_softcap) : "null");
        field("final_logit_softcapping", hp.final_softcap > 0.0f ? number(hp.final_softcap) : "null");
    }
    if (hp.arch->delta_net) {
        // Which layers are DeltaNet ("linear_attention") layers, their widths, and the interleaved M-RoPE of the
        // attention layers (rope_parameters; the text positions rotate every pair of the first n_rot dimensions).
        std::string types = "[";
        uint32_t period = 0;  // full_attention_interval, when the full-attention layers are every period-th
        for (uint32_t il = 0; il < hp.n_layer; ++il) {
            types += std::string(il ? ", " : "") + (hp.is_recurrent(il) ? "\"linear_attention\"" : "\"full_attention\"");
            if (!hp.is_recurrent(il) && period == 0) period = il + 1;
        }
        for (uint32_t il = 0; period && il < hp.n_layer; ++il)
            if (hp.is_recurrent(il) == ((il + 1) % period == 0)) period = 0;
        field("layer_types", types + "]");
        if (period) field("full_attention_interval", std::to_string(period));
        field("linear_conv_kernel_dim", std::to_string(hp.ssm_d_conv));
        field("linear_key_head_dim", std::to_string(hp.ssm_d_state));
        field("linear_value_head_dim", std::to_string(hp.ssm_head_v()));
        field("linear_num_key_heads", std::to_string(hp.ssm_n_group));
        field("linear_num_value_heads", std::to_string(hp.ssm_dt_rank));
        std::string sections = "[";
        const std::vector<int64_t> secs = f.get_int_array(arch_key(hp, "rope.dimension_sections"));
        for (size_t i = 0; i < 3 && i < secs.size(); ++i) sections += (i ? ", " : "") + std::to_string(secs[i]);
        field("rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": " + number(hp.rope_freq_base) + ", \"partial_rotary_factor\": " +
                                     number(static_cast<float>(hp.n_rot) / static_cast<float>(hp.head_dim)) + ", \"mrope_section\": " + sections +
                                     "], \"mrope_interleaved\": true}");
    }
    if (hp.arch->arch == Arch::Mistral3) {
        // Ministral 3's rope_parameters: YaRN with DeepSeek's mscale / mscale_all_dim (transformers' cos / sin scale
        // mscale(f, 1) / mscale(f, m), llama.cpp's with yarn_log_multiplier m), and the query scale
        // 1 + beta ln(1 + floor(pos / original_max_position_embeddings)) (llama_4_scaling_beta, llama.cpp's
        // attention.temperature_scale).
        std::string rp = "{\"rope_type\": \"" + std::string(hp.rope_ext_factor != 0.0f ? "yarn" : "default") + "\", \"rope_theta\": " + number(hp.rope_freq_base);
        if (hp.rope_ext_factor != 0.0f) {
            rp += ", \"factor\": " + number(1.0f / hp.rope_freq_scale) + ", \"original_max_position_embeddings\": " + std::to_string(hp.rope_n_ctx_orig) +
                  ", \"beta_fast\": " + number(hp.rope_beta_fast) + ", \"beta_slow\": " + number(hp.rope_beta_slow);
            const float log_mul = f.get_f32_or(arch_key(hp, "rope.scaling.yarn_log_multiplier"), 0.0f);
            if (log_mul != 0.0f) rp += ", \"mscale\": 1.0, \"mscale_all_dim\": " + number(log_mul);
        }
        rp += ", \"llama_4_scaling_beta\": " + number(hp.attn_temp_scale) + "}";
        field("rope_parameters", rp);
        field("sliding_window", "null");
    }
    if (gpt_oss) {
        // The windowed layers, the experts (router and experts biased, the clamped SwiGLU of llama.cpp's
        // LLM_FFN_SWIGLU_OAI_MOE: limit 7), YaRN's original context (initial_context_length).
        field("sliding_window", std::to_string(hp.n_swa));
        field("layer_types", window_layer_types(hp));
        field("num_local_experts", std::to_string(hp.n_expert));
        field("num_experts_per_tok", std::to_string(hp.n_expert_used));
        field("experts_per_token", std::to_string(hp.n_expert_used));
        field("swiglu_limit", "7.0");
        field("initial_context_length", std::to_string(hp.rope_n_ctx_orig));
        field("router_aux_loss_coef", "0.9");
        field("output_router_logits", "false");
        field("pad_token_id", token_id(f, "tokenizer.ggml.padding_token_id"));
    } else if (hp.is_moe()) {
        field("num_experts", std::to_string(hp.n_expert));
        field("num_experts_per_tok", std::to_string(hp.n_expert_used));
        field("moe_intermediate_size", std::to_string(hp.n_ff_exp));
        field("norm_topk_prob", hp.expert_weights_norm ? "true" : "false");
        if (hp.n_ff_shexp) field("shared_expert_intermediate_size", std::to_string(hp.n_ff_shexp));
        field("decoder_sparse_step", "1");
        field("mlp_only_layers", "[]");
    }
    field("bos_token_id", token_id(f, "tokenizer.ggml.bos_token_id"));
    field("eos_token_id", token_id(f, "tokenizer.ggml.eos_token_id"));
    c += "  \"torch_dtype\": " + json::quoted(torch) + "\n}\n";
    return c;
}

// One tensor of the HF checkpoint: its name, PyTorch shape, bytes in the chosen dtype, and its values (made when
// its shard is written, one tensor at a time).
struct HfTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::function<std::vector<float>()> values;
    size_t bytes = 0;
};

// A GGUF tensor's PyTorch shape: ne reversed.
std::vector<int64_t> torch_shape(const gguf::TensorInfo & t) {
    std::vector<int64_t> shape;
    for (int d = static_cast<int>(t.n_dims) - 1; d >= 0; --d) shape.push_back(t.ne[d]);
    return shape;
}

// t's values as HF tensor `name` of `shape`, through `edit` (none: as they are).
bool add_tensor(std::vector<HfTensor> & outs, const gguf::Reader & f, const gguf::TensorInfo & t, std::string name, std::vector<int64_t> shape,
                std::function<std::vector<float>(std::vector<float>)> edit = {}) {
    outs.push_back({std::move(name), std::move(shape), [&f, &t, edit]() { return edit ? edit(values_of(f, t)) : values_of(f, t); }});
    return true;
}

// A per-layer tensor's name "blk.N.rest": its "blk.N." and HF's "model.layers.N.", N and rest; false for others.
struct LayerTensor {
    std::string blk, hf, rest;
    uint32_t layer = 0;
};
bool layer_tensor(const std::string & name, LayerTensor & lt) {
    const size_t dot = name.find('.', 4);
    if (name.compare(0, 4, "blk.") != 0 || dot == std::string::npos || dot == 4 || dot > 10) return false;
    const std::string n = name.substr(4, dot - 4);
    if (n.find_first_not_of("0123456789") != std::string::npos) return false;
    lt = {name.substr(0, dot + 1), "model.layers." + n + ".", name.substr(dot + 1), static_cast<uint32_t>(std::stoul(n))};
    return true;
}

// The up projection `up_name` of gate's layer, of gate's shape (gpt-oss and qwen35moe fuse the two into one HF tensor).
const gguf::TensorInfo & up_of(const Model & model, const gguf::TensorInfo & gate, const LayerTensor & lt, const std::string & up_name) {
    const gguf::TensorInfo * up = model.file().find_tensor(lt.blk + up_name);
    bool same = up && up->n_dims == gate.n_dims;
    for (uint32_t d = 0; same && d < gate.n_dims; ++d) same = up->ne[d] == gate.ne[d];
    if (!same) throw Error(model.path() + ": tensor '" + gate.name + "' has no " + lt.blk + up_name + " of its shape to fuse with (HF's gate_up_proj)");
    return *up;
}

// A GGUF tensor under its HF name (hf_names.h), PyTorch's shape (ne reversed), each expert of a mixture its own
// tensor; a llama's q/k rows in HF's order, Gemma's norms as w where the GGUF holds 1 + w.
void plain_tensor(const Model & model, const gguf::TensorInfo & t, std::vector<HfTensor> & outs) {
    const HParams & hp = model.hparams();
    const gguf::Reader & f = model.file();
    const std::string hf = hf_tensor_of(t.name, hp.arch->fused_gate_up, hp.arch->post_norms);
    if (hf.empty()) throw Error(model.path() + ": tensor '" + t.name + "' has no Hugging Face name");
    std::vector<int64_t> shape = torch_shape(t);
    if (shape.size() == 3) shape.erase(shape.begin());  // one expert's
    const int64_t experts = t.n_dims >= 3 ? t.ne[2] : 1;
    const bool per_expert = hf.find("{E}") != std::string::npos;
    if (t.n_dims > 3 || (experts > 1 && !per_expert))
        throw Error(model.path() + ": tensor '" + t.name + "' has " + std::to_string(t.n_dims) + " dimensions, which no HF tensor of it has");
    const int64_t heads = permuted_row_heads(hp, t.name);
    // Gemma's RMSNorm multiplies by 1 + w in transformers; llama.cpp's converter stores the 1 + w.
    const bool one_plus = hp.arch->post_norms && t.n_dims == 1 && hf.size() > 11 && hf.compare(hf.size() - 11, 11, "norm.weight") == 0;
    for (int64_t e = 0; e < experts; ++e)
        outs.push_back({per_expert ? hf_expert_module(hf, e) : hf, shape, [&f, &t, e = per_expert ? e : -1, shape, heads, one_plus]() {
            std::vector<float> v = e >= 0 ? values_of(f, t, e, t.ne[2]) : values_of(f, t);
            if (heads) return reorder_qk_rows(v.data(), shape.front(), shape.size() > 1 ? shape[1] : 1, heads, true);
            if (one_plus)
                for (float & x : v) x -= 1.0f;
            return v;
        }});
}

// gpt-oss's tensors that transformers' GptOssForCausalLM names or lays out otherwise (the rest are plain_tensor's):
//   attn_sinks -> self_attn.sinks, post_attention_norm -> post_attention_layernorm, ffn_gate_inp -> mlp.router;
//   ffn_gate_exps and ffn_up_exps -> mlp.experts.gate_up_proj [E, n_embd, 2 ff], the gate's and the up's columns
//   interleaved (gate at even, up at odd), and their biases -> gate_up_proj_bias [E, 2 ff] likewise;
//   ffn_down_exps -> mlp.experts.down_proj [E, ff, n_embd] (transposed: input-major, as gate_up_proj), its bias
//   -> down_proj_bias [E, n_embd]. (llama.cpp's converter undoes exactly this.) Returns false for other tensors.
bool gpt_oss_tensor(const Model & model, const gguf::TensorInfo & t, std::vector<HfTensor> & outs) {
    const gguf::Reader & f = model.file();
    LayerTensor lt;
    if (!layer_tensor(t.name, lt)) return false;
    const std::string & layer = lt.hf, & rest = lt.rest;
    auto plain_as = [&](const std::string & hf) { return add_tensor(outs, f, t, layer + hf, torch_shape(t)); };
    if (rest == "attn_sinks.weight") return plain_as("self_attn.sinks");
    if (rest == "post_attention_norm.weight") return plain_as("post_attention_layernorm.weight");
    if (rest == "ffn_gate_inp.weight") return plain_as("mlp.router.weight");
    if (rest == "ffn_gate_inp.bias") return plain_as("mlp.router.bias");
    if (rest == "ffn_down_exps.bias") return plain_as("mlp.experts.down_proj_bias");
    if (rest == "ffn_up_exps.weight" || rest == "ffn_up_exps.bias") return true;  // in gate_up_proj (with the gate's)
    const bool weight = rest == "ffn_gate_exps.weight";
    if (weight || rest == "ffn_gate_exps.bias") {
        const gguf::TensorInfo * up = &up_of(model, t, lt, weight ? "ffn_up_exps.weight" : "ffn_up_exps.bias");
        // weight: gate / up ne [n_embd, ff, E] -> [E][n_embd][2 ff]; bias: ne [ff, E] -> [E][2 ff]
        const int64_t E = weight ? t.ne[2] : t.ne[1], ff = weight ? t.ne[1] : t.ne[0], C = weight ? t.ne[0] : 1;
        std::vector<int64_t> shape = weight ? std::vector<int64_t>{E, C, 2 * ff} : std::vector<int64_t>{E, 2 * ff};
        outs.push_back({layer + (weight ? "mlp.experts.gate_up_proj" : "mlp.experts.gate_up_proj_bias"), shape, [&f, &t, up, E, ff, C]() {
            const std::vector<float> g = values_of(f, t), u = values_of(f, *up);
            std::vector<float> v(g.size() + u.size());
            for (int64_t e = 0; e < E; ++e)
                for (int64_t j = 0; j < ff; ++j)
                    for (int64_t c = 0; c < C; ++c) {
                        const size_t from = static_cast<size_t>((e * ff + j) * C + c), to = static_cast<size_t>((e * C + c) * 2 * ff + 2 * j);
                        v[to] = g[from];
                        v[to + 1] = u[from];
                    }
            return v;
        }});
        return true;
    }
    if (rest == "ffn_down_exps.weight") {
        // ne [ff, n_embd, E] -> [E][ff][n_embd]
        const int64_t ff = t.ne[0], C = t.ne[1], E = t.ne[2];
        outs.push_back({layer + "mlp.experts.down_proj", {E, ff, C}, [&f, &t, E, ff, C]() {
            const std::vector<float> d = values_of(f, t);
            std::vector<float> v(d.size());
            for (int64_t e = 0; e < E; ++e)
                for (int64_t c = 0; c < C; ++c)
                    for (int64_t j = 0; j < ff; ++j) v[static_cast<size_t>((e * ff + j) * C + c)] = d[static_cast<size_t>((e * C + c) * ff + j)];
            return v;
        }});
        return true;
    }
    return false;
}

// Qwen3.5 as transformers' Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM names and holds it (the rest are plain_tensor's):
//   its RMSNorms (input_layernorm, post_attention_layernorm, q_norm, k_norm, model.norm) as w where the GGUF holds
//   1 + w; the DeltaNet layer under linear_attn: attn_qkv -> in_proj_qkv, attn_gate -> in_proj_z, ssm_beta ->
//   in_proj_b, ssm_alpha -> in_proj_a, ssm_dt.bias -> dt_bias, ssm_a (-exp(A_log)) -> A_log, ssm_conv1d [K, C] ->
//   conv1d.weight [C, 1, K], ssm_norm -> norm (the gated norm: w as it is), ssm_out -> out_proj, the value heads
//   back in grouped order; the multi-token-prediction blocks are not written (transformers ignores mtp.* on load).
// Returns false for the tensors plain_tensor names (attention and feed-forward matrices, embeddings, head).
bool qwen35_tensor(const Model & model, const gguf::TensorInfo & t, std::vector<HfTensor> & outs) {
    const HParams & hp = model.hparams();
    const gguf::Reader & f = model.file();
    const std::vector<int64_t> shape = torch_shape(t);
    auto add = [&](const std::string & name, std::vector<int64_t> hf_shape, std::function<std::vector<float>(std::vector<float>)> edit = {}) {
        return add_tensor(outs, f, t, name, std::move(hf_shape), std::move(edit));
    };
    auto minus_one = [](std::vector<float> v) {
        for (float & x : v) x -= 1.0f;
        return v;
    };
    if (t.name == "output_norm.weight") return add("model.norm.weight", shape, minus_one);
    LayerTensor lt;
    if (!layer_tensor(t.name, lt)) return false;
    if (lt.layer >= hp.n_layer) return true;  // a multi-token-prediction block
    const std::string & L = lt.hf, & rest = lt.rest;
    for (const auto & [g, h] : {std::pair<const char *, const char *>{"attn_norm.weight", "input_layernorm.weight"},
                                {"post_attention_norm.weight", "post_attention_layernorm.weight"},
                                {"attn_q_norm.weight", "self_attn.q_norm.weight"},
                                {"attn_k_norm.weight", "self_attn.k_norm.weight"}})
        if (rest == g) return add(L + h, shape, minus_one);
    const int64_t row_len = shape.size() > 1 ? shape[1] : 1;
    auto heads = [&hp, row_len, vh = value_heads_of(hp, t.name)](std::vector<float> v) { return reorder_value_heads(v, row_len, vh, hp, true); };
    if (rest == "ssm_a")
        return add(L + "linear_attn.A_log", shape, [&model, &t, heads](std::vector<float> v) {
            for (float & x : v) {
                if (!(x < 0.0f)) throw Error(model.path() + ": tensor '" + t.name + "' holds " + number(x) + ", which is no -exp(A_log)");
                x = std::log(-x);
            }
            return heads(v);  // (one value a head, in the order of ssm_dt's)
        });
    for (const auto & [g, h] : {std::pair<const char *, const char *>{"attn_qkv.weight", "in_proj_qkv.weight"}, {"attn_gate.weight", "in_proj_z.weight"},
                                {"ssm_beta.weight", "in_proj_b.weight"}, {"ssm_alpha.weight", "in_proj_a.weight"}, {"ssm_dt.bias", "dt_bias"},
                                {"ssm_norm.weight", "norm.weight"}, {"ssm_out.weight", "out_proj.weight"}})
        if (rest == g) return add(L + "linear_attn." + h, shape, heads);  // (the gated norm multiplies by w: as it is)
    if (rest == "ssm_conv1d.weight")  // [C][K]: the channels are rows
        return add(L + "linear_attn.conv1d.weight", {shape[0], 1, shape[1]}, heads);
    // qwen35moe: the experts as transformers' packed parameters, gate_up_proj [E, 2 ff, n_embd] (each expert's gate rows
    // then its up rows) and down_proj [E, n_embd, ff] (the GGUF's layout); the shared expert's gate [1, n_embd].
    if (rest == "ffn_up_exps.weight") return true;  // in gate_up_proj (with the gate's)
    if (rest == "ffn_down_exps.weight") return add(L + "mlp.experts.down_proj", shape);
    if (rest == "ffn_gate_inp_shexp.weight") return add(L + "mlp.shared_expert_gate.weight", {1, shape[0]});
    if (rest == "ffn_gate_exps.weight") {
        const gguf::TensorInfo * up = &up_of(model, t, lt, "ffn_up_exps.weight");
        const int64_t E = t.ne[2], per = t.ne[0] * t.ne[1];  // one expert's gate (or up) values
        outs.push_back({L + "mlp.experts.gate_up_proj", {E, 2 * t.ne[1], t.ne[0]}, [&f, &t, up, E, per]() {
            const std::vector<float> g = values_of(f, t), u = values_of(f, *up);
            std::vector<float> v(g.size() + u.size());
            for (int64_t e = 0; e < E; ++e) {
                std::copy(g.begin() + e * per, g.begin() + (e + 1) * per, v.begin() + 2 * e * per);
                std::copy(u.begin() + e * per, u.begin() + (e + 1) * per, v.begin() + (2 * e + 1) * per);
            }
            return v;
        }});
        return true;
    }
    return false;
}

} // namespace

HfExportReport export_hf(const Model & model, const std::string & dir, const HfExportOptions & o) {
    const HParams & hp = model.hparams();
    const gguf::Reader & f = model.file();
    if (hp.arch->arch == Arch::GptOss && hp.rope_freq_base_swa != hp.rope_freq_base)
        throw Error(model.path() + ": rope.freq_base_swa " + number(hp.rope_freq_base_swa) + " differs from rope.freq_base " + number(hp.rope_freq_base) +
                    ": transformers' gpt-oss has one rope_theta");
    const bool yarn_config = hp.arch->arch == Arch::GptOss || hp.arch->arch == Arch::Mistral3;  // their configs state YaRN
    if (hp.rope_ext_factor != 0.0f && !yarn_config)
        throw Error(model.path() + ": YaRN rope scaling is exported for gpt-oss and mistral3 only");
    if (hp.arch->arch == Arch::Mistral3 && !model.layers.empty() && model.layers[0].rope_freqs)
        throw Error(model.path() + ": a mistral3 file with rope_freqs.weight: Ministral 3's config has no RoPE factors");
    if (hp.arch->arch == Arch::Mistral3 && hp.rope_ext_factor != 0.0f && hp.rope_ext_factor != 1.0f)
        throw Error(model.path() + ": YaRN ext_factor " + number(hp.rope_ext_factor) + ": transformers' YaRN has 1");
    if (hp.rope_freq_scale != 1.0f && hp.arch->arch != Arch::Gemma3 && !yarn_config)  // gemma3's linear scaling of its global layers is
        throw Error(model.path() + ": rope scale " + number(hp.rope_freq_scale) + ": rope scaling is not exported");
    rope_scaling_json(model);  // refused before anything is written
    if (hp.n_rot != hp.head_dim && hp.arch->arch != Arch::Phi3 && !hp.arch->delta_net)  // their partial RoPE is in the config
        throw Error(model.path() + ": rotary dimensions " + std::to_string(hp.n_rot) + " of a head of " + std::to_string(hp.head_dim) + " are not exported");
    if (hp.expert_weights_scale != 0.0f && hp.expert_weights_scale != 1.0f)
        throw Error(model.path() + ": expert_weights_scale " + number(hp.expert_weights_scale) + " has no place in " + "a Qwen3Moe config");
    if (o.shard_bytes == 0) throw Error("HF export: shard size 0");
    HfExportReport rep;
    rep.dtype = choose_dtype(f, o.dtype);
    const size_t esize = safetensors_dtype_size(rep.dtype);

    // The HF tensors in file order, each made from one GGUF tensor (an expert's slice of it) or, for gpt-oss's
    // experts, from two.
    std::vector<HfTensor> outs;
    for (const gguf::TensorInfo & t : f.tensors()) {
        if (model.is_constant(model.find(t.name))) continue;  // RoPE factors: config.json's rope_scaling states them
        if (hp.arch->arch == Arch::GptOss && gpt_oss_tensor(model, t, outs)) continue;
        if (hp.arch->delta_net && qwen35_tensor(model, t, outs)) continue;
        plain_tensor(model, t, outs);
    }
    for (HfTensor & x : outs) {
        size_t n = 1;
        for (int64_t d : x.shape) n *= static_cast<size_t>(d);
        x.bytes = n * esize;
    }
    // Shards of at most shard_bytes (one tensor at least), in order.
    std::vector<std::vector<const HfTensor *>> shards(1);
    size_t in_shard = 0;
    for (const HfTensor & x : outs) {
        if (!shards.back().empty() && in_shard + x.bytes > o.shard_bytes) shards.emplace_back(), in_shard = 0;
        shards.back().push_back(&x);
        in_shard += x.bytes;
        rep.bytes += x.bytes;
    }
    rep.tensors = outs.size();

    size_t done = 0, done_bytes = 0;  // for o.progress
    OutputDir out(dir);  // removed again if this made it and a file fails
    std::vector<std::unique_ptr<AtomicFile>> files;  // renamed together once every one is complete
    std::map<std::string, std::string> weight_map;
    char total[16];
    std::snprintf(total, sizeof total, "%05zu", shards.size());
    for (size_t s = 0; s < shards.size(); ++s) {
        char name[64];
        std::snprintf(name, sizeof name, "model-%05zu-of-%s.safetensors", s + 1, total);
        SafetensorsWriter w;
        w.set_metadata("format", "pt");
        for (const HfTensor * x : shards[s]) {
            weight_map[x->name] = name;
            w.add_deferred(x->name, rep.dtype, x->shape, [x, dtype = rep.dtype, &o, &rep, &done, &done_bytes]() {
                const std::vector<float> v = x->values();
                std::string bytes = encode(v.data(), v.size(), dtype);
                done_bytes += x->bytes;
                if (o.progress) o.progress(++done, rep.tensors, done_bytes, rep.bytes);
                return bytes;
            });
        }
        files.push_back(std::make_unique<AtomicFile>(out.file(name)));
        w.write_to(*files.back());  // the deferred tensors made one at a time
        rep.files.push_back(name);
    }
    std::string index = "{\n  \"metadata\": {\"total_size\": " + std::to_string(rep.bytes) + "},\n  \"weight_map\": {\n";
    size_t k = 0;
    for (const auto & [t, file] : weight_map) index += "    " + json::quoted(t) + ": " + json::quoted(file) + (++k < weight_map.size() ? ",\n" : "\n");
    index += "  }\n}\n";
    const std::string generation = "{\n  \"bos_token_id\": " + token_id(f, "tokenizer.ggml.bos_token_id") + ",\n  \"eos_token_id\": " +
                                   token_id(f, "tokenizer.ggml.eos_token_id") + "\n}\n";
    std::vector<std::pair<std::string, std::string>> texts = {
        {"model.safetensors.index.json", index}, {"config.json", config_json(model, rep.dtype)}, {"generation_config.json", generation}};
    try {
        HfTokenizerFiles tk = hf_tokenizer_files(f, hp.n_ctx_train);
        texts.emplace_back("tokenizer.json", std::move(tk.tokenizer_json));
        texts.emplace_back("tokenizer_config.json", std::move(tk.tokenizer_config_json));
    } catch (const Error & e) {
        rep.tokenizer_refused = e.what();
    }
    for (const auto & [name, text] : texts) {
        files.push_back(std::make_unique<AtomicFile>(out.file(name)));
        files.back()->write(text);
        rep.files.push_back(name);
    }
    for (auto & file : files) file->commit();
    out.commit();
    return rep;
}

} // namespace rp
