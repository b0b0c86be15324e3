#include "models/convert/hf_names.h"

#include "models/arch/hparams.h"

#include <cctype>
#include <algorithm>
#include <cstring>

namespace rp {

namespace {

// GGUF per-layer name <-> HF module below "model.layers.N."; "{E}" marks an expert's index.
struct ModuleName {
    const char * gguf;
    const char * hf;
};
const ModuleName kMatrices[] = {
    {"attn_q", "self_attn.q_proj"},      {"attn_k", "self_attn.k_proj"},     {"attn_v", "self_attn.v_proj"},
    {"attn_output", "self_attn.o_proj"}, {"ffn_gate", "mlp.gate_proj"},      {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},       {"ffn_gate_inp", "mlp.gate"},       {"ffn_gate_exps", "mlp.experts.{E}.gate_proj"},
    {"ffn_up_exps", "mlp.experts.{E}.up_proj"}, {"ffn_down_exps", "mlp.experts.{E}.down_proj"},
    // phi3 (transformers' Phi3ForCausalLM): the fused projections, the same rows in the same order; its ffn_up is
    // gate_up_proj (hf_module_of's fused_gate_up), found here by the inverse lookup
    {"attn_qkv", "self_attn.qkv_proj"}, {"ffn_up", "mlp.gate_up_proj"},
    // qwen35moe's shared expert (transformers' Qwen2-MoE naming)
    {"ffn_gate_shexp", "mlp.shared_expert.gate_proj"}, {"ffn_up_shexp", "mlp.shared_expert.up_proj"},
    {"ffn_down_shexp", "mlp.shared_expert.down_proj"},
};
const ModuleName kNorms[] = {
    {"attn_norm", "input_layernorm"}, {"ffn_norm", "post_attention_layernorm"}, {"attn_q_norm", "self_attn.q_norm"},
    {"attn_k_norm", "self_attn.k_norm"},
};
const ModuleName kGemmaNorms[] = {
    {"attn_norm", "input_layernorm"}, {"post_attention_norm", "post_attention_layernorm"}, {"ffn_norm", "pre_feedforward_layernorm"},
    {"post_ffw_norm", "post_feedforward_layernorm"}, {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"},
};

// "blk.N.<name>.<suffix>" -> N, name, suffix.
bool split_layer_tensor(const std::string & t, std::string & layer, std::string & name, std::string & suffix) {
    if (t.compare(0, 4, "blk.") != 0) return false;
    const size_t dot = t.find('.', 4), last = t.rfind('.');
    if (dot == std::string::npos || last <= dot) return false;
    layer = t.substr(4, dot - 4);
    name = t.substr(dot + 1, last - dot - 1);
    suffix = t.substr(last + 1);
    return !layer.empty() && layer.find_first_not_of("0123456789") == std::string::npos;
}

} // namespace

std::string hf_expert_module(std::string module, int64_t e) {
    const size_t at = module.find("{E}");
    if (at != std::string::npos) module.replace(at, 3, std::to_string(e));
    return module;
}

std::string hf_module_of(const std::string & w, bool fused_gate_up) {
    if (w == "token_embd.weight") return "model.embed_tokens";
    if (w == "output.weight") return "lm_head";
    std::string layer, name, suffix;
    if (!split_layer_tensor(w, layer, name, suffix) || suffix != "weight") return "";
    if (fused_gate_up && name == "ffn_up") return "model.layers." + layer + ".mlp.gate_up_proj";
    for (const ModuleName & m : kMatrices)
        if (name == m.gguf) return "model.layers." + layer + "." + m.hf;
    return "";
}

std::pair<std::string, int64_t> gguf_weight_of(const std::string & module) {
    if (module == "model.embed_tokens") return {"token_embd.weight", -1};
    if (module == "lm_head") return {"output.weight", -1};
    const std::string layers = "model.layers.";
    if (module.compare(0, layers.size(), layers) != 0) return {"", -1};
    const size_t p = layers.size();
    size_t q = p;
    while (q < module.size() && std::isdigit(static_cast<unsigned char>(module[q]))) ++q;
    if (q == p || q - p > 6 || q >= module.size() || module[q] != '.') return {"", -1};
    const std::string layer = module.substr(p, q - p), rest = module.substr(q + 1);
    for (const ModuleName & m : kMatrices) {
        const std::string hf = m.hf;
        const size_t e = hf.find("{E}");
        if (e == std::string::npos) {
            if (rest == hf) return {"blk." + layer + "." + m.gguf + ".weight", -1};
            continue;
        }
        const std::string head = hf.substr(0, e), tail = hf.substr(e + 3);
        if (rest.size() <= head.size() + tail.size() || rest.compare(0, head.size(), head) != 0 ||
            rest.compare(rest.size() - tail.size(), tail.size(), tail) != 0)
            continue;
        const std::string idx = rest.substr(head.size(), rest.size() - head.size() - tail.size());
        if (idx.empty() || idx.size() > 6 || idx.find_first_not_of("0123456789") != std::string::npos) continue;
        return {"blk." + layer + "." + m.gguf + ".weight", std::stoll(idx)};
    }
    return {"", -1};
}

std::string hf_tensor_of(const std::string & t, bool fused_gate_up, bool gemma_norms) {
    if (t == "token_embd.weight") return "model.embed_tokens.weight";
    if (t == "output.weight") return "lm_head.weight";
    if (t == "output_norm.weight") return "model.norm.weight";
    std::string layer, name, suffix;
    if (!split_layer_tensor(t, layer, name, suffix) || (suffix != "weight" && suffix != "bias")) return "";
    if (fused_gate_up && name == "ffn_up") return hf_module_of(t.substr(0, t.size() - suffix.size()) + "weight", true) + "." + suffix;
    for (const ModuleName & m : kMatrices)
        if (name == m.gguf) return "model.layers." + layer + "." + m.hf + "." + suffix;
    if (gemma_norms) {
        for (const ModuleName & m : kGemmaNorms)
            if (name == m.gguf && suffix == "weight") return "model.layers." + layer + "." + m.hf + ".weight";
        return "";
    }
    for (const ModuleName & m : kNorms)
        if (name == m.gguf && suffix == "weight") return "model.layers." + layer + "." + m.hf + ".weight";
    return "";
}

namespace {

// Qwen3.5's DeltaNet projections (GGUF per-layer name <-> HF module below "model.layers.N.").
const ModuleName kDeltaNet[] = {
    {"attn_qkv", "linear_attn.in_proj_qkv"}, {"attn_gate", "linear_attn.in_proj_z"}, {"ssm_beta", "linear_attn.in_proj_b"},
    {"ssm_alpha", "linear_attn.in_proj_a"}, {"ssm_out", "linear_attn.out_proj"},
};

} // namespace

std::string hf_module_of(const HParams & hp, const std::string & w) {
    std::string layer, name, suffix;
    if (hp.arch->delta_net && split_layer_tensor(w, layer, name, suffix) && suffix == "weight")
        for (const ModuleName & m : kDeltaNet)
            if (name == m.gguf) return "model.layers." + layer + "." + m.hf;
    std::string m = hf_module_of(w, hp.arch->fused_gate_up);
    if (hp.arch->arch == Arch::GptOss && m.ends_with(".mlp.gate")) m.replace(m.size() - 4, 4, "router");
    return m;
}

std::pair<std::string, int64_t> gguf_weight_of(const HParams & hp, const std::string & module) {
    const std::string layers = "model.layers.";
    if (hp.arch->delta_net && module.compare(0, layers.size(), layers) == 0) {
        const size_t dot = module.find('.', layers.size());
        if (dot != std::string::npos)
            for (const ModuleName & m : kDeltaNet)
                if (module.compare(dot + 1, std::string::npos, m.hf) == 0)
                    return {"blk." + module.substr(layers.size(), dot - layers.size()) + "." + m.gguf + ".weight", -1};
    }
    if (hp.arch->arch == Arch::GptOss && module.ends_with(".mlp.router")) return gguf_weight_of(module.substr(0, module.size() - 6) + "gate");
    if (hp.arch->arch == Arch::GptOss && module.ends_with(".mlp.gate")) return {"", -1};  // transformers' gpt-oss has none
    return gguf_weight_of(module);
}

ValueHeads value_heads_of(const HParams & hp, const std::string & t) {
    std::string layer, name, suffix;
    if (!hp.arch->delta_net || hp.ssm_n_group == hp.ssm_dt_rank) return {};
    if (t.compare(0, 4, "blk.") == 0 && t.ends_with(".ssm_a")) return {0, 1, false};  // (no suffix: -exp(A_log) a value head)
    if (!split_layer_tensor(t, layer, name, suffix)) return {};
    const int64_t qk = 2 * static_cast<int64_t>(hp.ssm_n_group) * hp.ssm_d_state, Dv = hp.ssm_head_v();
    if (name == "attn_qkv" || name == "ssm_conv1d") return {qk, Dv, false};  // [q | k | v] rows (conv: channels)
    if (name == "attn_gate") return {0, Dv, false};
    if (name == "ssm_beta" || name == "ssm_alpha" || name == "ssm_dt") return {0, 1, false};
    if (name == "ssm_out") return {0, Dv, true};  // its input columns
    return {};
}

std::vector<float> reorder_value_heads(const std::vector<float> & v, int64_t row_len, const ValueHeads & vh, const HParams & hp, bool to_hf) {
    std::vector<float> out = v;
    if (vh.head_len == 0) return out;
    const int64_t Hk = hp.ssm_n_group, Hv = hp.ssm_dt_rank, r = Hv / Hk, rows = static_cast<int64_t>(v.size()) / row_len, D = vh.head_len;
    for (int64_t g = 0; g < Hv; ++g) {
        const int64_t t = (g % r) * Hk + g / r;  // grouped head g's tiled index
        for (int64_t d = 0; d < D; ++d) {
            const int64_t hf = vh.first + g * D + d, gguf = vh.first + t * D + d;
            const int64_t to = to_hf ? hf : gguf, from = to_hf ? gguf : hf;
            if (vh.columns)
                for (int64_t row = 0; row < rows; ++row) out[static_cast<size_t>(row * row_len + to)] = v[static_cast<size_t>(row * row_len + from)];
            else
                std::copy(v.begin() + from * row_len, v.begin() + (from + 1) * row_len, out.begin() + to * row_len);
        }
    }
    return out;
}

int64_t permuted_row_heads(const HParams & hp, const std::string & t) {
    if (hp.arch->arch != Arch::Llama && hp.arch->arch != Arch::Mistral3) return 0;  // the two NORM-rope archs llama.cpp permutes
    std::string layer, name, suffix;
    if (!split_layer_tensor(t, layer, name, suffix)) return 0;
    return name == "attn_q" ? hp.n_head : name == "attn_k" ? hp.n_head_kv : 0;
}

std::vector<float> reorder_qk_rows(const float * m, int64_t rows, int64_t row_len, int64_t heads, bool to_hf) {
    const int64_t D = rows / heads;
    std::vector<float> out(static_cast<size_t>(rows * row_len));
    for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < D / 2; ++j)
            for (int64_t s = 0; s < 2; ++s) {
                const int64_t gguf_row = h * D + 2 * j + s, hf_row = h * D + s * (D / 2) + j;
                const int64_t from = to_hf ? gguf_row : hf_row, to = to_hf ? hf_row : gguf_row;
                std::memcpy(out.data() + to * row_len, m + from * row_len, static_cast<size_t>(row_len) * sizeof(float));
            }
    return out;
}

} // namespace rp
