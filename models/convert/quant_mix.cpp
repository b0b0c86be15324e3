// llama.cpp's per-tensor type rules for the mixes we can write (quant_mix.h). Written from llama-quant.cpp's
// llama_tensor_get_type_impl and tensor_type_fallback; the branches for types we do not write (IQ*, TQ*,
// MXFP4) are left out, and so is Q2_K_S, which llama-quantize refuses without an importance matrix (we
// quantize without one).
#include "models/convert/quant_mix.h"

#include "base/error.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <numeric>

namespace rp {

namespace {

// llama_ftype values (llama.h), which general.file_type stores.
enum FileType : uint32_t {
    kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 7, kQ5_0 = 8, kQ5_1 = 9, kQ2_K = 10, kQ3_K_S = 11,
    kQ3_K_M = 12, kQ3_K_L = 13, kQ4_K_S = 14, kQ4_K_M = 15, kQ5_K_S = 16, kQ5_K_M = 17, kQ6_K = 18, kBF16 = 32,
    kMXFP4_MOE = 38,
};

struct MixName {
    const char * name;
    uint32_t file_type;
    TensorType base;
};

constexpr MixName kMixes[] = {
    {"f32", kF32, TensorType::F32},       {"f16", kF16, TensorType::F16},       {"bf16", kBF16, TensorType::BF16},
    {"q4_0", kQ4_0, TensorType::Q4_0},    {"q4_1", kQ4_1, TensorType::Q4_1},    {"q5_0", kQ5_0, TensorType::Q5_0},
    {"q5_1", kQ5_1, TensorType::Q5_1},    {"q8_0", kQ8_0, TensorType::Q8_0},    {"q2_k", kQ2_K, TensorType::Q2_K},
    {"q3_k_s", kQ3_K_S, TensorType::Q3_K}, {"q3_k_m", kQ3_K_M, TensorType::Q3_K},
    {"q3_k_l", kQ3_K_L, TensorType::Q3_K}, {"q4_k_s", kQ4_K_S, TensorType::Q4_K}, {"q4_k_m", kQ4_K_M, TensorType::Q4_K},
    {"q5_k_s", kQ5_K_S, TensorType::Q5_K}, {"q5_k_m", kQ5_K_M, TensorType::Q5_K}, {"q6_k", kQ6_K, TensorType::Q6_K},
    // A mixture of experts' experts in MXFP4 (gpt-oss's own format), every other weight matrix Q8_0.
    {"mxfp4_moe", kMXFP4_MOE, TensorType::Q8_0},
};

// llama-quantize's aliases: a K type without a size letter is its _M mix.
constexpr std::pair<const char *, const char *> kAliases[] = {{"q3_k", "q3_k_m"}, {"q4_k", "q4_k_m"}, {"q5_k", "q5_k_m"}};

enum class Category { Output, TokenEmbd, AttnQkv, AttnKvB, AttnV, AttnK, AttnQ, AttnOutput, FfnUp, FfnGate, FfnDown, Other };

bool contains(const std::string & s, const char * part) { return s.find(part) != std::string::npos; }

Category category_of(const std::string & n) {
    if (n == "output.weight") return Category::Output;
    if (n == "token_embd.weight" || n == "per_layer_token_embd.weight") return Category::TokenEmbd;
    if (contains(n, "attn_qkv.weight")) return Category::AttnQkv;
    if (contains(n, "attn_kv_b.weight")) return Category::AttnKvB;
    if (contains(n, "attn_v.weight")) return Category::AttnV;
    if (contains(n, "attn_k.weight")) return Category::AttnK;
    if (contains(n, "attn_q.weight")) return Category::AttnQ;
    if (contains(n, "attn_output.weight")) return Category::AttnOutput;
    if (contains(n, "ffn_up")) return Category::FfnUp;
    if (contains(n, "ffn_gate")) return Category::FfnGate;
    if (contains(n, "ffn_down")) return Category::FfnDown;
    return Category::Other;
}

bool is_attn_v_like(Category c) { return c == Category::AttnV || c == Category::AttnQkv || c == Category::AttnKvB; }

// Which tensors llama-quantize re-types at all (tensor_allows_quantization, the names that can occur in
// the families we read and the generic ones).
bool allows_quantization(const QuantTensor & t) {
    if (t.n_dims < 2) return false;
    const std::string & n = t.name;
    if (n.size() < 6 || n.compare(n.size() - 6, 6, "weight") != 0) return false;
    for (const char * never : {"_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d", "attn_rel_b.weight"})
        if (contains(n, never)) return false;
    return n != "position_embd.weight" && n != "token_types.weight";
}

int layer_of(const std::string & name) {
    int layer = -1;
    std::sscanf(name.c_str(), "blk.%d.", &layer);
    return layer;
}

bool is_block_type(TensorType t) { return gguf::type_traits(static_cast<uint32_t>(t))->block_size > 1; }
int64_t block_of(TensorType t) { return gguf::type_traits(static_cast<uint32_t>(t))->block_size; }
const char * name_of(TensorType t) { return gguf::type_name(static_cast<uint32_t>(t)); }

// The first and last eighth of the layers and every third one between get more bits.
bool use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

struct MixState {
    const QuantMix & mix;
    const QuantMixModel & model;
    bool tied = true;        // no output.weight: token_embd is the head
    bool is_70b = false;     // llama.cpp's LLM_TYPE_70B (8 query heads per attn_v head)
    int n_attention_wv = 0, i_attention_wv = 0;
    int n_ffn = 0, i_ffn_down = 0, i_ffn_gate = 0, i_ffn_up = 0;

    int n_gqa() const { return model.n_head_kv ? static_cast<int>(model.n_head / model.n_head_kv) : 1; }

    // Mixtral-style models interleave expert tensors: their layer comes from the name, not the counter.
    std::pair<int, int> layer_info(int counter, const std::string & name) const {
        int layer = counter;
        if (model.n_expert > 1) {
            layer = layer_of(name);
            if (layer < 0 || layer >= n_ffn)
                throw Error("quantization mix: cannot tell the layer of tensor '" + name + "' (want blk.N. with N < " +
                            std::to_string(n_ffn) + ")");
        }
        return {layer, n_ffn};
    }

    TensorType mix_rule(const QuantTensor & t, Category cat, TensorType type);
};

TensorType MixState::mix_rule(const QuantTensor & t, Category cat, TensorType type) {
    const uint32_t ft = mix.file_type;
    if (ft == kMXFP4_MOE && contains(t.name, "_exps.")) return TensorType::MXFP4;
    if (cat == Category::Output || (tied && cat == Category::TokenEmbd)) {
        if (t.ne0 % block_of(type) != 0) return TensorType::Q8_0;
        return type == TensorType::Q8_0 ? type : TensorType::Q6_K;
    }
    if (cat == Category::TokenEmbd) return type;  // untied: only mixes we do not write change it
    if (is_attn_v_like(cat)) {
        if (ft == kQ2_K) type = n_gqa() >= 4 ? TensorType::Q4_K : TensorType::Q3_K;
        else if (ft == kQ3_K_M) type = i_attention_wv < 2 ? TensorType::Q5_K : TensorType::Q4_K;
        else if (ft == kQ3_K_L) type = TensorType::Q5_K;
        else if ((ft == kQ4_K_M || ft == kQ5_K_M) && use_more_bits(i_attention_wv, n_attention_wv)) type = TensorType::Q6_K;
        else if (ft == kQ4_K_S && i_attention_wv < 4) type = TensorType::Q5_K;
        if (is_70b && (type == TensorType::Q3_K || type == TensorType::Q4_K)) type = TensorType::Q5_K;
        if (model.n_expert == 8) type = TensorType::Q8_0;
        ++i_attention_wv;
        return type;
    }
    if (cat == Category::AttnK) return model.n_expert == 8 ? TensorType::Q8_0 : type;
    if (cat == Category::FfnDown) {
        const auto [i_layer, n_layer] = layer_info(i_ffn_down, t.name);
        if (ft == kQ2_K) type = TensorType::Q3_K;
        else if (ft == kQ3_K_M) {
            type = i_layer < n_layer / 16 ? TensorType::Q5_K : TensorType::Q4_K;  // (Q3_K only for falcon)
        } else if (ft == kQ3_K_L) {
            type = TensorType::Q5_K;
        } else if (ft == kQ4_K_M) {
            if (use_more_bits(i_layer, n_layer)) type = TensorType::Q6_K;
        } else if (ft == kQ5_K_M && use_more_bits(i_layer, n_layer)) {
            type = TensorType::Q6_K;
        } else if (ft == kQ4_K_S && i_layer < n_layer / 8) {
            type = TensorType::Q5_K;
        }
        ++i_ffn_down;
        return type;
    }
    if (cat == Category::AttnOutput) {
        if (model.n_expert == 8) {
            if (ft == kQ2_K || ft == kQ3_K_S || ft == kQ3_K_M || ft == kQ4_K_S || ft == kQ4_K_M) type = TensorType::Q5_K;
        } else if (ft == kQ2_K) {
            type = TensorType::Q3_K;
        } else if (ft == kQ3_K_M) {
            type = TensorType::Q4_K;
        } else if (ft == kQ3_K_L) {
            type = TensorType::Q5_K;
        }
        return type;
    }
    if (cat == Category::AttnQkv) {
        if (ft == kQ3_K_M || ft == kQ3_K_L) type = TensorType::Q4_K;
        else if (ft == kQ4_K_M) type = TensorType::Q5_K;
        else if (ft == kQ5_K_M) type = TensorType::Q6_K;
        return type;
    }
    if (cat == Category::FfnGate) {
        layer_info(i_ffn_gate, t.name);  // validates the name as llama.cpp does; no mix we write changes it
        ++i_ffn_gate;
    } else if (cat == Category::FfnUp) {
        layer_info(i_ffn_up, t.name);
        ++i_ffn_up;
    }
    return type;
}

// A row length the chosen type's block does not divide: the next type with a smaller block, else F16.
TensorType row_fallback(const QuantTensor & t, TensorType type, std::string & note) {
    if (t.ne0 % block_of(type) == 0) return type;
    TensorType to = type;
    switch (type) {
    case TensorType::Q2_K: case TensorType::Q3_K: to = TensorType::Q4_0; break;
    case TensorType::Q4_K: to = TensorType::Q5_0; break;
    case TensorType::Q5_K: to = TensorType::Q5_1; break;
    case TensorType::Q6_K: to = TensorType::Q8_0; break;
    default: break;  // a 32-block type has no smaller block
    }
    if (t.ne0 % block_of(to) != 0) to = TensorType::F16;
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s: row length %lld is not a multiple of %lld (the %s block); stored as %s",
                  t.name.c_str(), static_cast<long long>(t.ne0), static_cast<long long>(block_of(type)), name_of(type),
                  name_of(to));
    note = buf;
    return to;
}

} // namespace

bool quant_mix_from_name(const std::string & name, QuantMix & out) {
    std::string n = name;
    std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    for (const auto & [alias, target] : kAliases)
        if (n == alias) n = target;
    for (const MixName & m : kMixes) {
        if (n == m.name) {
            out.name = n;
            out.file_type = m.file_type;
            out.base = m.base;
            return true;
        }
    }
    return false;
}

std::string quant_mix_names() {
    std::string s;
    for (const MixName & m : kMixes) s += (s.empty() ? "" : ", ") + std::string(m.name);
    return s;
}

std::vector<QuantChoice> plan_quant_mix(const QuantMix & mix, const QuantMixModel & model,
                                        const std::vector<QuantTensor> & tensors, bool pure) {
    MixState st{mix, model};
    st.is_70b = model.n_expert == 0 && model.n_layer == 80 &&
                ((model.arch == "llama" && model.n_head != model.n_head_kv) || model.arch == "qwen2");
    st.n_ffn = static_cast<int>(model.n_layer);
    for (const QuantTensor & t : tensors) {
        const Category c = category_of(t.name);
        if (is_attn_v_like(c)) ++st.n_attention_wv;
        if (c == Category::Output) st.tied = false;
    }
    // llama.cpp visits the tensors by layer (non-layer tensors first), by name within a layer; the counters
    // above (i_attention_wv, ...) count in that order.
    std::vector<size_t> order(tensors.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        const int la = layer_of(tensors[a].name), lb = layer_of(tensors[b].name);
        return la != lb ? la < lb : tensors[a].name < tensors[b].name;
    });
    std::vector<QuantChoice> out(tensors.size(), QuantChoice{TensorType::F32, false, {}});
    for (size_t i : order) {
        const QuantTensor & t = tensors[i];
        QuantChoice & c = out[i];
        c.type = t.type;
        if (!allows_quantization(t)) continue;
        c.quantized = true;
        c.type = mix.base;
        if (!is_block_type(mix.base)) continue;  // f32 / f16 / bf16: every weight matrix gets it as is
        if (!pure) c.type = st.mix_rule(t, category_of(t.name), c.type);
        c.type = row_fallback(t, c.type, c.note);
    }
    return out;
}

} // namespace rp
