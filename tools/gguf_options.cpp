#include "tools/gguf_options.h"

#include "base/error.h"

namespace rp::cli {

namespace {

// A 0 | 1 option into a bool.
void bit(Options & p, const std::string & name, bool & target, const std::string & help) {
    p.value(name, "0|1", help, Options::Int, [&target](const std::string & f, const std::string & v) { target = parse_int(f, v, 0, 1) != 0; },
            [&target] { return std::optional<std::string>(target ? "1" : "0"); });
}

} // namespace

void SynthSettings::apply_preset(const std::string & name) {
    spec = synth_preset(name);
    preset = head_dim_given = true;
}

void SynthSettings::finish() {
    if (!head_dim_given) spec.head_dim = spec.n_embd / spec.n_head;
    if (spec.vocab_from.empty() && !n_vocab_given && !preset)
        throw Error("'synth' needs --vocab VOCAB.gguf (the tokenizer to copy) or --n-vocab N (see rp-gguf synth --help)");
}

void declare_synth_options(Options & p, SynthSettings & s) {
    p.positionals("OUT", s.out, 1, 1, "the model to write");
    // The presets, a line at most ~100 characters wide.
    std::string presets;
    size_t line = 0;
    for (const std::string & n : rp::synth_preset_names()) {
        if (line > 0 && line + n.size() + 2 > 100) {
            presets += ",\n";
            line = 0;
        } else if (line > 0) {
            presets += ", ";
            line += 2;
        }
        presets += n;
        line += n.size();
    }
    p.value("--shape", "NAME",
            "a preset: the real shapes and vocabulary sizes (llama-98m and llama-20m: the benchmark models); the\n"
            "other options override it:\n" + presets,
            Options::String, [](const std::string &, const std::string &) {}, [] { return std::nullopt; });
    p.text("--vocab", s.spec.vocab_from, "the GGUF whose tokenizer to copy (sets n_vocab)", "VOCAB.gguf");
    p.value("--n-vocab", "N", "without --vocab: N token rows and no tokenizer (the file plans and trains; it cannot tokenize)", Options::Int,
            [&](const std::string & f, const std::string & v) { s.spec.n_vocab = static_cast<uint32_t>(parse_int(f, v, 1, 1 << 24)), s.n_vocab_given = true; },
            [] { return std::nullopt; });
    bit(p, "--weights", s.spec.weights, "0: every weight a hole (zeros, a sparse file: no disk), the shapes for rp-finetune --plan");
    p.choice("--arch", s.spec.arch, {"llama", "qwen2", "qwen3", "qwen3moe", "gpt-oss", "gemma2", "gemma3", "mistral3", "phi3", "qwen35", "qwen35moe"},
             "llama | qwen2 | qwen3 | qwen3moe | gpt-oss | gemma2 | gemma3 | mistral3 | phi3 | qwen35 | qwen35moe",
             "A");
    p.integer("--experts", s.spec.n_expert, 1, 1 << 24, "qwen3moe, gpt-oss, qwen35moe: experts per layer");
    p.integer("--experts-used", s.spec.n_expert_used, 1, 1 << 24, "qwen3moe, gpt-oss, qwen35moe: experts per token", "K");
    p.integer("--expert-ff", s.spec.n_ff_exp, 1, 1 << 24, "qwen3moe, gpt-oss, qwen35moe: each expert's n_ff (qwen35moe's shared expert: --n-ff)", "F");
    p.integer("--window", s.spec.n_swa, 1, 1 << 24, "gpt-oss, gemma2, gemma3: the sliding window of the windowed layers", "N");
    p.number("--attn-softcap", s.spec.attn_softcap, 0.0f, 1e6f, "gemma2: the attention logits' soft-cap (0: llama.cpp's default, 50)");
    p.number("--final-softcap", s.spec.final_softcap, 0.0f, 1e6f, "gemma2: the final logits' soft-cap (0: llama.cpp's default, 30)");
    p.number("--rope-linear", s.spec.rope_linear, 0.0f, 1e6f, "linear RoPE scaling factor (0: none; gemma3 4B+: 8)");
    p.number("--yarn", s.spec.yarn_factor, 0.0f, 1e6f, "YaRN context extension factor (0: none; gpt-oss: 32)");
    p.integer("--yarn-ctx", s.spec.yarn_orig_ctx, 1, 1 << 24, "with --yarn: the original training context (gpt-oss: 4096)");
    p.number("--llama3-rope", s.spec.llama3_rope, 0.0f, 1e6f,
             "llama, mistral3: Llama 3's RoPE frequency factors (rope_freqs) for this factor (0: none; 3.1: 8, 3.2: 32)");
    p.integer("--llama3-rope-ctx", s.spec.llama3_rope_ctx, 1, 1 << 24, "with --llama3-rope: the original context (Llama 3: 8192)");
    p.integer("--long-rope", s.spec.long_rope_ctx, 0, 1 << 24,
              "phi3: LongRoPE from this original context to --n-ctx (short and long factors; 0: none; Phi-3.5: 4096)", "N");
    p.integer("--ssm-k-heads", s.spec.ssm_k_heads, 1, 1 << 16, "qwen35, qwen35moe: the Gated DeltaNet layers' key heads", "N");
    p.integer("--ssm-v-heads", s.spec.ssm_v_heads, 1, 1 << 16, "qwen35: their value heads (a multiple of the key heads)", "N");
    p.integer("--ssm-head-dim", s.spec.ssm_head_dim, 1, 1 << 16, "qwen35: the width of a key and of a value head", "N");
    p.integer("--ssm-conv", s.spec.ssm_d_conv, 2, 64, "qwen35: the short convolution's kernel (4)", "K");
    p.integer("--mtp-layers", s.spec.mtp_layers, 0, 16, "qwen35, qwen35moe: multi-token prediction blocks after the decoder (kept, not run)", "N");
    p.integer("--full-attn-interval", s.spec.full_attn_interval, 1, 1 << 16,
              "qwen35: every N-th layer is full attention, the others Gated DeltaNet (4)", "N");
    p.number("--attn-temp", s.spec.attn_temp_scale, 0.0f, 1e3f,
             "mistral3: attention temperature scale (0: none; Ministral 3: 0.1), by the YaRN context");
    p.integer("--n-embd", s.spec.n_embd, 1, 1 << 24, "hidden size");
    p.integer("--n-head", s.spec.n_head, 1, 1 << 24, "attention heads");
    p.integer("--n-head-kv", s.spec.n_head_kv, 1, 1 << 24, "key / value heads");
    p.value("--head-dim", "N", "dimension of a head (default: n_embd / n_head)", Options::Int,
            [&](const std::string & f, const std::string & v) { s.spec.head_dim = static_cast<uint32_t>(parse_int(f, v, 1, 1 << 24)), s.head_dim_given = true; },
            [] { return std::nullopt; });
    p.integer("--n-ff", s.spec.n_ff, 1, 1 << 24, "feed-forward width");
    p.integer("--n-rot", s.spec.n_rot, 0, 1 << 24, "rotary dimensions of a head (0: all of head_dim; Phi-4-mini: 96 of 128)");
    p.integer("--n-layer", s.spec.n_layer, 1, 1 << 24, "decoder layers");
    p.integer("--n-ctx", s.spec.n_ctx_train, 1, 1 << 24, "training context");
    p.number("--rope-base", s.spec.rope_base, 1.0f, 1e9f, "RoPE frequency base");
    bit(p, "--tied", s.spec.tied, "1: no output.weight, the head reuses token_embd");
    p.value("--type", "T", "the 2-D weights: f32 | f16 | bf16 | q8_0 | q4_0 (default f32; norms stay f32; the gpt-oss\n"
            "presets' experts are mxfp4 unless this is given); with --weights 0 also a llama-quantize mix\n"
            "(q4_k_m, q3_k_m, q2_k, q6_k, ...: each tensor the type that mix gives it)", Options::String,
            [&s](const std::string & f, const std::string & v) {
                using gguf::TensorType;
                s.spec.expert_wtype.reset();
                s.spec.mix.reset();
                s.spec.wtype = TensorType::F32;
                TensorType t = TensorType::F32;
                if (gguf::type_from_name(v.c_str(), t) && (t == TensorType::F32 || t == TensorType::F16 || t == TensorType::BF16 ||
                                                           t == TensorType::Q8_0 || t == TensorType::Q4_0)) {
                    s.spec.wtype = t;
                    return;
                }
                QuantMix m;
                if (!quant_mix_from_name(v, m) || v.rfind("iq", 0) == 0 || v == "q2_k_s")
                    throw Error(f + ": '" + v + "' is not one of f32, f16, bf16, q8_0, q4_0, or (with --weights 0) a mix: " + quant_mix_names());
                s.spec.mix = m;
            },
            [] { return std::nullopt; });
    p.integer("--seed", s.spec.seed, 0, 1LL << 62, "random seed");
}

} // namespace rp::cli
