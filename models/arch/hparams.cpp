#include "models/arch/hparams.h"

#include <cmath>
#include <vector>

namespace rp {

namespace {

const ArchTraits kArchs[] = {
    {.arch = Arch::Llama, .name = "llama", .rope_mode = RopeMode::Normal, .default_rms_eps = 1e-5f, .rope_freqs = true},
    {.arch = Arch::Qwen2, .name = "qwen2", .rope_mode = RopeMode::Neox, .qkv_bias = true},
    {.arch = Arch::Qwen3, .name = "qwen3", .rope_mode = RopeMode::Neox, .qk_norm = true},
    {.arch = Arch::Qwen3Moe, .name = "qwen3moe", .rope_mode = RopeMode::Neox, .qk_norm = true, .moe = true},
    {.arch = Arch::GptOss, .name = "gpt-oss", .rope_mode = RopeMode::Neox, .qkv_bias = true, .moe = true, .default_rms_eps = 1e-5f,
     .attn_out_bias = true, .attn_sinks = true, .moe_biases = true, .swiglu_oai = true, .sliding_window = true,
     .ffn_norm = "post_attention_norm"},
    {.arch = Arch::Gemma2, .name = "gemma2", .rope_mode = RopeMode::Neox, .sliding_window = true, .embd_scale = true, .post_norms = true,
     .glu = GluKind::GeluTanh, .swa_period = 2, .big_attn_scale_layers = 46, .default_swa = 4096, .softcaps = true,
     .tied_head = true},
    {.arch = Arch::Gemma3, .name = "gemma3", .rope_mode = RopeMode::Neox, .qk_norm = true, .sliding_window = true, .embd_scale = true,
     .post_norms = true, .glu = GluKind::GeluTanh, .swa_period = 6, .swa_rope_base = 10000.0f, .big_attn_scale_layers = 62},
    {.arch = Arch::Mistral3, .name = "mistral3", .rope_mode = RopeMode::Normal, .default_rms_eps = 1e-5f, .yarn_log_mul = true,
     .attn_temperature = true, .rope_freqs = true},
    // phi3 (Phi-3, Phi-3.5, Phi-4): llama.cpp reads attention.sliding_window but runs every layer unwindowed (its
    // "Phi SWA is currently disabled"); so do we, to give its logits.
    {.arch = Arch::Phi3, .name = "phi3", .rope_mode = RopeMode::Neox, .default_rms_eps = 1e-5f, .long_rope = true, .fused_qkv = true,
     .fused_gate_up = true},
    // qwen35: llama.cpp runs its full attention layers with M-RoPE's interleaved sections (IMROPE); a text token has
    // the same position in every section, which makes that NEOX RoPE over rope.dimension_count dimensions.
    {.arch = Arch::Qwen35, .name = "qwen35", .rope_mode = RopeMode::Neox, .qk_norm = true, .ffn_norm = "post_attention_norm",
     .delta_net = true, .attn_output_gate = true},
    {.arch = Arch::Qwen35Moe, .name = "qwen35moe", .rope_mode = RopeMode::Neox, .qk_norm = true, .moe = true, .ffn_norm = "post_attention_norm",
     .delta_net = true, .attn_output_gate = true, .shared_expert = true},
};

[[noreturn]] void fail(const gguf::Reader & f, const std::string & what) {
    throw Error(f.path() + ": " + what);
}

// A count that llama.cpp allows to be a scalar or a per-layer array; we support uniform arrays only.
uint32_t uniform_count(const gguf::Reader & f, const std::string & key, uint32_t n_layer, bool required,
                       uint32_t dflt) {
    const gguf::KV * kv = f.find(key);
    if (!kv) {
        if (required) fail(f, "missing required key '" + key + "'");
        return dflt;
    }
    if (kv->type != gguf::ValueType::ARRAY) return f.get_u32(key);
    std::vector<int64_t> v = f.get_int_array(key);
    if (v.size() != n_layer)
        fail(f, "key '" + key + "' has " + std::to_string(v.size()) + " entries, expected one per layer (" +
                    std::to_string(n_layer) + ")");
    for (int64_t x : v)
        if (x != v[0] || x < 0 || x > UINT32_MAX)
            fail(f, "key '" + key + "' differs between layers; per-layer sizes are not supported");
    return static_cast<uint32_t>(v.empty() ? dflt : v[0]);
}

} // namespace

const ArchTraits * find_arch(const std::string & name) {
    for (const ArchTraits & a : kArchs)
        if (name == a.name) return &a;
    return nullptr;
}

std::string supported_architectures() {
    std::string s;
    for (const ArchTraits & a : kArchs) s += (s.empty() ? "" : ", ") + std::string(a.name);
    return s;
}

RopeParams HParams::rope(uint32_t il) const {
    RopeParams p;
    p.n_rot = static_cast<int32_t>(n_rot);
    p.mode = arch->rope_mode;
    p.freq_base = is_swa(il) ? rope_freq_base_swa : rope_freq_base;
    p.freq_scale = is_swa(il) ? rope_freq_scale_swa : rope_freq_scale;
    p.ext_factor = rope_ext_factor;
    p.attn_factor = rope_attn_factor;
    p.beta_fast = rope_beta_fast;
    p.beta_slow = rope_beta_slow;
    p.n_ctx_orig = static_cast<int32_t>(rope_n_ctx_orig);
    return p;
}

RopeParams HParams::rope_query(uint32_t il) const {
    RopeParams p = rope(il);
    p.temp_scale = attn_temp_scale;
    p.temp_floor = static_cast<int32_t>(attn_temp_floor);
    return p;
}

std::string arch_key(const HParams & hp, const char * suffix) {
    return std::string(hp.arch->name) + "." + suffix;
}

HParams load_hparams(const gguf::Reader & f) {
    HParams hp;
    const std::string arch = f.get_string_or("general.architecture", "");
    if (arch.empty()) fail(f, "missing required key 'general.architecture'");
    hp.arch = find_arch(arch);
    if (!hp.arch)
        fail(f, "unsupported architecture '" + arch + "' (general.architecture); supported: " + supported_architectures());
    const std::string type = f.get_string_or("general.type", "model");
    if (type != "model") fail(f, "general.type is '" + type + "', expected a model (is this a LoRA adapter?)");

    auto key = [&](const char * s) { return arch + "." + s; };
    hp.n_layer = f.get_u32(key("block_count"));
    hp.n_embd = f.get_u32(key("embedding_length"));
    hp.n_ctx_train = f.get_u32(key("context_length"));
    hp.n_ff = uniform_count(f, key("feed_forward_length"), hp.n_layer, false, 0);
    hp.n_head = uniform_count(f, key("attention.head_count"), hp.n_layer, true, 0);
    hp.n_head_kv = uniform_count(f, key("attention.head_count_kv"), hp.n_layer, false, hp.n_head);
    if (hp.arch->moe) {
        hp.n_expert = f.get_u32_or(key("expert_count"), 0);
        hp.n_expert_used = f.get_u32_or(key("expert_used_count"), 0);
        if (hp.n_expert == 0 || hp.n_expert_used == 0 || hp.n_expert_used > hp.n_expert)
            fail(f, key("expert_count") + " (" + std::to_string(hp.n_expert) + ") and " + key("expert_used_count") + " (" +
                        std::to_string(hp.n_expert_used) + ") must be > 0 with used <= count");
        // llama.cpp: expert_feed_forward_length, else feed_forward_length / expert_used_count.
        hp.n_ff_exp = uniform_count(f, key("expert_feed_forward_length"), hp.n_layer, false, hp.n_ff / hp.n_expert_used);
        if (hp.n_ff_exp == 0) fail(f, "neither " + key("expert_feed_forward_length") + " nor feed_forward_length gives the experts' width");
        if (hp.n_ff == 0) hp.n_ff = hp.n_ff_exp * hp.n_expert_used;
        if (hp.arch->shared_expert) hp.n_ff_shexp = f.get_u32_or(key("expert_shared_feed_forward_length"), hp.n_ff);
        hp.expert_weights_norm = f.has(key("expert_weights_norm")) ? f.get_bool(key("expert_weights_norm")) : true;
        // gpt-oss gates by a softmax over the selected experts' logits (llama.cpp's SOFTMAX_WEIGHT): the same
        // weights as the softmax over all experts renormalised over the selection.
        if (hp.arch->arch == Arch::GptOss) hp.expert_weights_norm = true;
        hp.expert_weights_scale = f.get_f32_or(key("expert_weights_scale"), 0.0f);
    }
    if (hp.n_layer == 0 || hp.n_embd == 0 || hp.n_head == 0 || hp.n_head_kv == 0 || hp.n_ff == 0)
        fail(f, "block_count, embedding_length, head_count, head_count_kv and feed_forward_length must be > 0");
    if (hp.n_head % hp.n_head_kv != 0)
        fail(f, "attention.head_count (" + std::to_string(hp.n_head) + ") is not a multiple of head_count_kv (" +
                    std::to_string(hp.n_head_kv) + ")");
    const uint32_t dflt_hd = hp.n_embd % hp.n_head == 0 ? hp.n_embd / hp.n_head : 0;
    hp.head_dim = f.get_u32_or(key("attention.key_length"), dflt_hd);
    hp.head_dim_v = f.get_u32_or(key("attention.value_length"), dflt_hd);
    if (hp.head_dim == 0) fail(f, "embedding_length is not a multiple of head_count and no attention.key_length");
    if (hp.head_dim_v != hp.head_dim)
        fail(f, "attention.value_length (" + std::to_string(hp.head_dim_v) + ") != key_length (" +
                    std::to_string(hp.head_dim) + ") is not supported");
    hp.n_rot = f.get_u32_or(key("rope.dimension_count"), hp.head_dim);
    if (hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0)
        fail(f, "rope.dimension_count (" + std::to_string(hp.n_rot) + ") must be even and <= head_dim (" +
                    std::to_string(hp.head_dim) + ")");
    if ((hp.arch->arch == Arch::Llama || hp.arch->arch == Arch::Mistral3) && hp.n_rot != hp.head_dim)
        fail(f, std::string(hp.arch->name) + " requires rope.dimension_count == head_dim");
    if (!f.has(key("attention.layer_norm_rms_epsilon")))
        fail(f, "missing required key '" + key("attention.layer_norm_rms_epsilon") + "'");
    hp.rms_eps = f.get_f32(key("attention.layer_norm_rms_epsilon"));
    hp.rope_freq_base = f.get_f32_or(key("rope.freq_base"), 10000.0f);
    // rope.scaling.type: none, linear (factor -> freq_scale) and yarn (also the training context and, as llama.cpp
    // reads them, ext_factor 1, attn_factor 1, beta_fast 32, beta_slow 1 unless the file gives them); phi3's files may
    // say longrope (its factors are tensors: Model; the scale as linear's).
    const std::string scaling = f.get_string_or(key("rope.scaling.type"), "linear");
    if (scaling != "none" && scaling != "linear" && scaling != "yarn" && !(scaling == "longrope" && hp.arch->long_rope))
        fail(f, "rope scaling '" + scaling + "' (" + key("rope.scaling.type") + ") is not supported");
    float factor = f.get_f32_or(key("rope.scaling.factor"), 0.0f);
    if (factor == 0.0f) factor = f.get_f32_or(key("rope.scale_linear"), 0.0f);
    hp.rope_freq_scale = (scaling == "none" || factor == 0.0f) ? 1.0f : 1.0f / factor;
    hp.rope_n_ctx_orig = f.get_u32_or(key("rope.scaling.original_context_length"), hp.n_ctx_train);
    if (scaling == "yarn") {
        hp.rope_ext_factor = f.get_f32_or(key("rope.scaling.yarn_ext_factor"), 1.0f);
        hp.rope_attn_factor = f.get_f32_or(key("rope.scaling.yarn_attn_factor"), 1.0f);
        hp.rope_beta_fast = f.get_f32_or(key("rope.scaling.yarn_beta_fast"), 32.0f);
        hp.rope_beta_slow = f.get_f32_or(key("rope.scaling.yarn_beta_slow"), 1.0f);
        if (hp.rope_n_ctx_orig == 0 || !(hp.rope_ext_factor >= 0) || !(hp.rope_attn_factor > 0) || !(hp.rope_beta_fast > 0) || !(hp.rope_beta_slow > 0))
            fail(f, "yarn rope scaling needs a training context and positive factors (" + key("rope.scaling.*") + ")");
    }
    if (!(hp.rope_freq_base > 0) || !std::isfinite(hp.rope_freq_base))
        fail(f, key("rope.freq_base") + " must be a positive number");
    if (hp.arch->yarn_log_mul) {
        // As llama.cpp runs mistral3 with a log multiplier m (DeepSeek-style mscale / mscale_all_dim, mscale 1): the
        // cos / sin scale is mscale(factor, 1) / mscale(factor, m) in place of YaRN's own 1 + 0.1 ln(factor), which
        // the attn_factor divides out (measured against llama.cpp at m = 1 and 0.5: Mistral.Mistral3Logits...).
        const float log_mul = f.get_f32_or(key("rope.scaling.yarn_log_multiplier"), 0.0f);
        if (log_mul != 0.0f) {
            const float yarn_factor = 1.0f / hp.rope_freq_scale;
            auto mscale = [](float scale, float m) { return scale <= 1.0f ? 1.0f : 0.1f * m * std::log(scale) + 1.0f; };
            hp.rope_attn_factor = mscale(yarn_factor, 1.0f) / mscale(yarn_factor, log_mul) / mscale(yarn_factor, 1.0f);
        }
        if (f.has(key("attention.scale")))
            fail(f, key("attention.scale") + ": a query scale other than 1/sqrt(head_dim) is not supported");
    }
    if (hp.arch->attn_temperature) {
        hp.attn_temp_scale = f.get_f32_or(key("attention.temperature_scale"), 0.0f);
        if (hp.attn_temp_scale != 0.0f) {
            hp.attn_temp_floor = hp.rope_n_ctx_orig;
            if (hp.attn_temp_floor == 0 || !std::isfinite(hp.attn_temp_scale))
                fail(f, key("attention.temperature_scale") + " needs a training context (rope.scaling.original_context_length)");
        }
    }
    // rope.scaling.attn_factor (phi3's LongRoPE: sqrt(1 + ln(s) / ln(n_ctx_orig)) for an extension s) scales every
    // cos / sin on top of the above, as llama.cpp multiplies it in.
    const float attn_factor = f.get_f32_or(key("rope.scaling.attn_factor"), 1.0f);
    if (!(attn_factor > 0) || !std::isfinite(attn_factor)) fail(f, key("rope.scaling.attn_factor") + " must be a positive number");
    hp.rope_attn_factor *= attn_factor;
    hp.rope_freq_base_swa = f.get_f32_or(key("rope.freq_base_swa"), hp.rope_freq_base);
    hp.rope_freq_scale_swa = hp.rope_freq_scale;
    if (hp.arch->sliding_window) {
        if (!f.has(key("attention.sliding_window")) && hp.arch->default_swa == 0)
            fail(f, "missing required key '" + key("attention.sliding_window") + "'" +
                        (hp.arch->arch == Arch::Gemma3 ? " (a gemma3 without sliding-window layers, with final-logit soft-capping, is not supported)" : ""));
        hp.n_swa = f.get_u32_or(key("attention.sliding_window"), hp.arch->default_swa);
        if (hp.n_swa == 0) fail(f, key("attention.sliding_window") + " must be > 0");
        if (hp.arch->swa_period > 0) {
            hp.swa_period = hp.arch->swa_period;
        } else {
            const gguf::KV * pattern = f.find(key("attention.sliding_window_pattern"));
            if (pattern && pattern->type == gguf::ValueType::ARRAY)
                fail(f, key("attention.sliding_window_pattern") + ": per-layer arrays are not supported (a period is)");
            hp.swa_period = pattern ? f.get_u32(key("attention.sliding_window_pattern")) : 2;  // llama.cpp's default for gpt-oss
        }
        if (hp.arch->swa_rope_base > 0.0f) {
            hp.rope_freq_base_swa = hp.arch->swa_rope_base;
            hp.rope_freq_scale_swa = 1.0f;
        }
        if (!(hp.rope_freq_base_swa > 0) || !std::isfinite(hp.rope_freq_base_swa))
            fail(f, key("rope.freq_base_swa") + " must be a positive number");
    }
    hp.embd_scale = hp.arch->embd_scale ? std::sqrt(static_cast<float>(hp.n_embd)) : 1.0f;
    if (hp.arch->softcaps) {
        hp.attn_softcap = f.get_f32_or(key("attn_logit_softcapping"), 50.0f);
        hp.final_softcap = f.get_f32_or(key("final_logit_softcapping"), 30.0f);
        if (!(hp.attn_softcap > 0) || !std::isfinite(hp.attn_softcap) || !(hp.final_softcap > 0) || !std::isfinite(hp.final_softcap))
            fail(f, key("attn_logit_softcapping") + " and " + key("final_logit_softcapping") + " must be positive numbers");
    }
    // gemma_pytorch's query_pre_attn_scalar: n_embd / n_head for the 27B model (gemma3: 62 layers, gemma2: 46), else
    // head_dim.
    const bool gemma_27b = hp.arch->big_attn_scale_layers > 0 && hp.n_layer == hp.arch->big_attn_scale_layers;
    hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(gemma_27b ? hp.n_embd / hp.n_head : hp.head_dim));

    if (hp.arch->delta_net) {
        hp.ssm_d_conv = f.get_u32(key("ssm.conv_kernel"));
        hp.ssm_d_inner = f.get_u32(key("ssm.inner_size"));
        hp.ssm_d_state = f.get_u32(key("ssm.state_size"));
        hp.ssm_dt_rank = f.get_u32(key("ssm.time_step_rank"));
        hp.ssm_n_group = f.get_u32(key("ssm.group_count"));
        if (hp.ssm_d_conv < 2 || hp.ssm_d_state == 0 || hp.ssm_n_group == 0 || hp.ssm_dt_rank == 0 || hp.ssm_d_inner % hp.ssm_dt_rank != 0 ||
            hp.ssm_dt_rank % hp.ssm_n_group != 0)
            fail(f, key("ssm.*") + ": conv_kernel must be >= 2, state_size, group_count and time_step_rank > 0, inner_size a multiple of "
                    "time_step_rank (the value heads) and time_step_rank a multiple of group_count (the key heads)");
        // Multi-token prediction (Qwen3.5's MTP): nextn_predict_layers more blocks after the decoder, which generation
        // and training here do not run (llama.cpp's main pass does not either); block_count counts them.
        hp.n_layer_nextn = f.get_u32_or(key("nextn_predict_layers"), 0);
        if (hp.n_layer_nextn >= hp.n_layer)
            fail(f, key("nextn_predict_layers") + " (" + std::to_string(hp.n_layer_nextn) + ") must be below block_count (" +
                        std::to_string(hp.n_layer) + ")");
        const uint32_t n_all = hp.n_layer;
        hp.n_layer -= hp.n_layer_nextn;
        hp.recurrent.assign(hp.n_layer, 0);
        if (const gguf::KV * kv = f.find(key("attention.recurrent_layers"))) {  // one bool (or integer) per block
            std::vector<int64_t> r;
            if (kv->type == gguf::ValueType::ARRAY && kv->arr_type == gguf::ValueType::BOOL) r.assign(kv->data.begin(), kv->data.end());
            else r = f.get_int_array(key("attention.recurrent_layers"));
            if (r.size() != n_all)
                fail(f, key("attention.recurrent_layers") + " has " + std::to_string(r.size()) + " entries, expected " + std::to_string(n_all));
            for (uint32_t il = 0; il < hp.n_layer; ++il) hp.recurrent[il] = r[il] != 0;
        } else {
            const uint32_t interval = f.get_u32_or(key("full_attention_interval"), 4);
            if (interval == 0) fail(f, key("full_attention_interval") + " must be > 0");
            for (uint32_t il = 0; il < hp.n_layer; ++il) hp.recurrent[il] = (il + 1) % interval != 0;
        }
        if (f.has(key("rope.dimension_sections"))) {
            // llama.cpp's interleaved M-RoPE (IMROPE) gives rotated pair i the position of section i % 3 (time, height,
            // width) while i / 3 is within that section's count, else of the fourth (a vision-only position, 0 for
            // text). A text token has one position in the first three, so RoPE over them is NEOX RoPE; a pair left
            // to the fourth would not rotate, which we do not model: such sections are refused.
            const std::vector<int64_t> sec = f.get_int_array(key("rope.dimension_sections"));
            int64_t sum = 0;
            for (int64_t x : sec) sum += x;
            if (sec.size() != 4 || sum < 1 || sum * 2 > hp.n_rot)
                fail(f, key("rope.dimension_sections") + " must be 4 sections of at most rope.dimension_count / 2 pairs in all");
            for (int64_t i = 0; i < hp.n_rot / 2; ++i) {
                const int64_t sector = i % sum, cls = sector % 3;
                if (sector >= 3 * sec[static_cast<size_t>(cls)])
                    fail(f, key("rope.dimension_sections") + ": rotated pair " + std::to_string(i) +
                                " falls to the fourth section (a vision position), which is not supported for text");
            }
        }
    }

    if (f.has("tokenizer.ggml.tokens"))
        hp.n_vocab = static_cast<uint32_t>(f.get_string_array("tokenizer.ggml.tokens").size());
    else
        hp.n_vocab = f.get_u32_or(key("vocab_size"), 0);
    if (f.find_tensor("token_embd.weight")) {
        const uint32_t nv = static_cast<uint32_t>(f.find_tensor("token_embd.weight")->ne[1]);
        if (hp.n_vocab == 0) hp.n_vocab = nv;
    }
    if (hp.n_vocab == 0) fail(f, "cannot tell the vocabulary size (no tokenizer.ggml.tokens, no token_embd)");
    return hp;
}

} // namespace rp
