#include "models/convert/synth_model.h"

#include "models/arch/rope_scaling.h"

#include "ggml_rp/core/quant.h"
#include "base/error.h"
#include "gguf/gguf.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace rp {

namespace {

// Uniform in [-1, 1) from the top 53 bits: the same numbers on every platform (unlike std distributions).
double uniform_pm1(std::mt19937_64 & rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0; }

// What a tensor holds: a + b·u with u uniform in [-1, 1) (so std = b/√3 around a).
struct Init {
    float a, b;
};

// ne2 > 1: a stack of ne2 matrices (the experts of a qwen3moe layer).
void add(gguf::Writer & w, const std::string & name, gguf::TensorType type, int64_t ne0, int64_t ne1, Init init,
         uint64_t seed, bool weights, int64_t ne2 = 1) {
    const int64_t ne[3] = {ne0, ne1, ne2};
    const uint32_t dims = ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1;
    if (!weights) return w.add_tensor(name, type, dims, ne, gguf::Writer::Fill{});
    w.add_tensor(name, type, dims, ne, [=](uint8_t * dst, size_t nbytes) {
        std::mt19937_64 rng(seed);
        std::vector<float> row(static_cast<size_t>(ne0));
        const size_t rb = gguf::row_bytes(type, ne0);
        const int64_t rows = ne1 * ne2;
        if (rb * static_cast<size_t>(rows) != nbytes) throw Error(name + ": unexpected tensor size");
        for (int64_t r = 0; r < rows; ++r) {
            for (float & x : row) x = init.a + init.b * static_cast<float>(uniform_pm1(rng));
            if (type == gguf::TensorType::F32) std::memcpy(dst + r * rb, row.data(), rb);
            else quantize_row(type, row.data(), dst + r * rb, ne0);
        }
    });
}

// A 1-D f32 tensor of given values (RoPE factors).
void add_values(gguf::Writer & w, const std::string & name, const std::vector<float> & v, bool weights) {
    const int64_t ne[1] = {static_cast<int64_t>(v.size())};
    if (!weights) return w.add_tensor(name, gguf::TensorType::F32, 1, ne, gguf::Writer::Fill{});
    w.add_tensor(name, gguf::TensorType::F32, 1, ne, [v](uint8_t * dst, size_t nbytes) {
        if (nbytes != v.size() * sizeof(float)) throw Error("RoPE factors: unexpected tensor size");
        std::memcpy(dst, v.data(), nbytes);
    });
}

} // namespace

const std::vector<std::string> & synth_preset_names() {
    static const std::vector<std::string> names = {
        "qwen3-0.6b", "qwen3-1.7b", "qwen3-32b", "llama3.1-8b", "qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-next-80b-a3b",
        "qwen3.5-0.8b", "qwen3.5-2b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b", "qwen3.5-35b-a3b", "gpt-oss-20b", "gpt-oss-120b",
        "gemma-2-2b", "gemma-2-9b", "gemma-2-27b", "gemma-3-1b", "gemma-3-4b",
        "gemma-3-12b", "gemma-3-27b", "ministral-3-3b", "ministral-3-8b", "ministral-3-14b", "llama3.2-1b", "llama3.2-3b",
        "phi-3.5-mini", "phi-4-mini", "phi-4", "llama-98m", "llama-20m"};
    return names;
}

std::string synth_preset_list() {
    std::string s;
    for (const std::string & n : synth_preset_names()) s += (s.empty() ? "" : ", ") + n;
    return s;
}

SynthSpec synth_preset(const std::string & name) {
    SynthSpec s;
    auto qwen3 = [&](uint32_t embd, uint32_t layers, uint32_t heads, uint32_t ff, bool tied) {
        s.arch = "qwen3";
        s.n_embd = embd, s.n_layer = layers, s.n_head = heads, s.n_head_kv = 8, s.head_dim = 128, s.n_ff = ff;
        s.n_ctx_train = 40960, s.rope_base = 1e6f, s.tied = tied, s.n_vocab = 151936;
    };
    if (name == "qwen3-0.6b") qwen3(1024, 28, 16, 3072, true);
    else if (name == "qwen3-1.7b") qwen3(2048, 28, 16, 6144, true);
    else if (name == "qwen3-32b") qwen3(5120, 64, 64, 25600, false);
    else if (name == "qwen3-30b-a3b" || name == "qwen3-235b-a22b" || name == "qwen3-235b") {  // qwen3-235b: rp-simulate's name
        const bool big = name != "qwen3-30b-a3b";
        qwen3(big ? 4096 : 2048, big ? 94 : 48, big ? 64 : 32, big ? 12288 : 6144, false);
        s.arch = "qwen3moe", s.n_head_kv = 4, s.n_expert = 128, s.n_expert_used = 8, s.n_ff_exp = big ? 1536 : 768;
    } else if (name == "gpt-oss-20b" || name == "gpt-oss-120b") {  // the o200k_harmony vocabulary, YaRN 32 x 4096
        const bool big = name == "gpt-oss-120b";
        qwen3(2880, big ? 36 : 24, 64, 2880, false);
        s.arch = "gpt-oss", s.head_dim = 64, s.n_ctx_train = 131072, s.rope_base = 150000.0f, s.n_vocab = 201088;
        s.n_expert = big ? 128 : 32, s.n_expert_used = 4, s.n_ff_exp = 2880, s.n_swa = 128;
        s.yarn_factor = 32.0f, s.yarn_orig_ctx = 4096, s.expert_wtype = gguf::TensorType::MXFP4;
    }
    else if (name == "gemma-2-2b" || name == "gemma-2-9b" || name == "gemma-2-27b") {
        // Gemma 2: tied 256k vocabulary, a 4096-token window on every other layer, the soft-caps' defaults (50, 30).
        struct G { uint32_t embd, layers, heads, kv, hd, ff; };
        const G g = name == "gemma-2-2b" ? G{2304, 26, 8, 4, 256, 9216} : name == "gemma-2-9b" ? G{3584, 42, 16, 8, 256, 14336}
                                                                        : G{4608, 46, 32, 16, 128, 36864};
        s.arch = "gemma2", s.n_embd = g.embd, s.n_layer = g.layers, s.n_head = g.heads, s.n_head_kv = g.kv, s.head_dim = g.hd;
        s.n_ff = g.ff, s.n_vocab = 256000, s.n_swa = 4096, s.n_ctx_train = 8192, s.tied = true;
    } else if (name == "gemma-3-1b" || name == "gemma-3-4b" || name == "gemma-3-12b" || name == "gemma-3-27b") {
        // Gemma 3: tied 262k vocabulary, head_dim 256 (27B: 128), a 512 / 1024-token window on five layers of six,
        // the global layers' RoPE base 1e6 scaled linearly by 8 from 4B up.
        struct G { uint32_t embd, layers, heads, kv, hd, ff, vocab, swa, ctx; float linear; };
        const G g = name == "gemma-3-1b"  ? G{1152, 26, 4, 1, 256, 6912, 262144, 512, 32768, 0.0f}
                  : name == "gemma-3-4b"  ? G{2560, 34, 8, 4, 256, 10240, 262208, 1024, 131072, 8.0f}
                  : name == "gemma-3-12b" ? G{3840, 48, 16, 8, 256, 15360, 262208, 1024, 131072, 8.0f}
                                          : G{5376, 62, 32, 16, 128, 21504, 262208, 1024, 131072, 8.0f};
        s.arch = "gemma3", s.n_embd = g.embd, s.n_layer = g.layers, s.n_head = g.heads, s.n_head_kv = g.kv, s.head_dim = g.hd;
        s.n_ff = g.ff, s.n_vocab = g.vocab, s.n_swa = g.swa, s.n_ctx_train = g.ctx, s.rope_base = 1e6f, s.rope_linear = g.linear, s.tied = true;
    } else if (name == "ministral-3-3b" || name == "ministral-3-8b" || name == "ministral-3-14b") {
        // Ministral 3 (text decoder): tekken's 131,072 tokens, head_dim 128, RoPE base 1e6 with YaRN 16 over 16,384
        // tokens and Llama 4's attention temperature (0.1); the 3B ties its head.
        struct M { uint32_t embd, layers, ff; bool tied; };
        const M m = name == "ministral-3-3b" ? M{3072, 26, 9216, true} : name == "ministral-3-8b" ? M{4096, 34, 14336, false}
                                                                       : M{5120, 40, 16384, false};
        s.arch = "mistral3", s.n_embd = m.embd, s.n_layer = m.layers, s.n_head = 32, s.n_head_kv = 8, s.head_dim = 128, s.n_ff = m.ff;
        s.n_ctx_train = 262144, s.rope_base = 1e6f, s.yarn_factor = 16.0f, s.yarn_orig_ctx = 16384, s.attn_temp_scale = 0.1f;
        s.n_vocab = 131072, s.tied = m.tied;
    } else if (name == "qwen3-next-80b-a3b") {
        // Qwen3-Next-80B-A3B in qwen35moe's layout (the same computation as llama.cpp's qwen3next, whose files fuse the
        // DeltaNet's input projections): 48 layers, every fourth gated full attention (16 heads over 2, head_dim 256, 64
        // dimensions rotated), the others Gated DeltaNet (16 key heads, 32 value heads, 128 wide); 512 experts, 10 per
        // token, 512 wide, and a 512-wide shared expert.
        qwen3(2048, 48, 16, 512, false);
        s.arch = "qwen35moe", s.n_head_kv = 2, s.head_dim = 256, s.n_rot = 64, s.n_ctx_train = 262144, s.rope_base = 1e7f;
        s.n_expert = 512, s.n_expert_used = 10, s.n_ff_exp = 512;
        s.ssm_k_heads = 16, s.ssm_v_heads = 32, s.ssm_head_dim = 128, s.ssm_d_conv = 4, s.full_attn_interval = 4;
    } else if (name == "qwen3.5-0.8b" || name == "qwen3.5-2b" || name == "qwen3.5-4b" || name == "qwen3.5-9b" || name == "qwen3.5-27b") {
        // Qwen3.5's dense models (their config.json's text_config): every fourth layer gated full attention (head_dim
        // 256, 64 dimensions rotated, RoPE base 1e7), the others Gated DeltaNet (16 key heads, 128 wide, conv 4); the
        // 248,320-token vocabulary, tied up to the 4B. (Their checkpoints' MTP block and vision tower are not part of
        // the shape.)
        struct Q { uint32_t embd, layers, heads, kv, ff, v_heads; bool tied; };
        const Q q = name == "qwen3.5-0.8b" ? Q{1024, 24, 8, 2, 3584, 16, true}
                  : name == "qwen3.5-2b"   ? Q{2048, 24, 8, 2, 6144, 16, true}
                  : name == "qwen3.5-4b"   ? Q{2560, 32, 16, 4, 9216, 32, true}
                  : name == "qwen3.5-9b"   ? Q{4096, 32, 16, 4, 12288, 32, false}
                                           : Q{5120, 64, 24, 4, 17408, 48, false};
        qwen3(q.embd, q.layers, q.heads, q.ff, q.tied);
        s.arch = "qwen35", s.n_head_kv = q.kv, s.head_dim = 256, s.n_rot = 64, s.n_ctx_train = 262144, s.rope_base = 1e7f;
        s.n_vocab = 248320, s.ssm_k_heads = 16, s.ssm_v_heads = q.v_heads, s.ssm_head_dim = 128, s.ssm_d_conv = 4;
        s.full_attn_interval = 4;
    } else if (name == "qwen3.5-35b-a3b") {
        // Qwen3.5-35B-A3B (its public training recipe's model arguments): 40 layers of 2048, every fourth gated full
        // attention (16 heads over 2, head_dim 256, 64 dimensions rotated, RoPE base 1e7), the others Gated DeltaNet
        // (16 key heads, 32 value heads, 128 wide, conv 4); 256 experts, 8 per token, 512 wide, and a 512-wide shared
        // expert; the 248,320-token vocabulary, untied. (Its checkpoint's MTP block is not part of the shape.)
        qwen3(2048, 40, 16, 512, false);
        s.arch = "qwen35moe", s.n_head_kv = 2, s.head_dim = 256, s.n_rot = 64, s.n_ctx_train = 262144, s.rope_base = 1e7f;
        s.n_vocab = 248320, s.n_expert = 256, s.n_expert_used = 8, s.n_ff_exp = 512;
        s.ssm_k_heads = 16, s.ssm_v_heads = 32, s.ssm_head_dim = 128, s.ssm_d_conv = 4, s.full_attn_interval = 4;
    } else if (name == "llama3.1-8b") {
        s.n_embd = 4096, s.n_layer = 32, s.n_head = 32, s.n_head_kv = 8, s.head_dim = 128, s.n_ff = 14336;
        s.n_ctx_train = 131072, s.rope_base = 500000.0f, s.n_vocab = 128256, s.llama3_rope = 8.0f;
    } else if (name == "llama3.2-1b" || name == "llama3.2-3b") {
        const bool big = name == "llama3.2-3b";
        s.n_embd = big ? 3072 : 2048, s.n_layer = big ? 28 : 16, s.n_head = big ? 24 : 32, s.n_head_kv = 8, s.head_dim = big ? 128 : 64;
        s.n_ff = 8192, s.n_ctx_train = 131072, s.rope_base = 500000.0f, s.n_vocab = 128256, s.llama3_rope = 32.0f, s.tied = true;
    } else if (name == "phi-3.5-mini") {  // 32k SentencePiece vocabulary, LongRoPE from 4k
        s.arch = "phi3", s.n_embd = 3072, s.n_layer = 32, s.n_head = 32, s.n_head_kv = 32, s.head_dim = 96, s.n_ff = 8192;
        s.n_ctx_train = 131072, s.long_rope_ctx = 4096, s.n_vocab = 32064;
    } else if (name == "phi-4-mini") {  // 200k vocabulary, tied, 96 of 128 dimensions rotated, LongRoPE from 4k
        s.arch = "phi3", s.n_embd = 3072, s.n_layer = 32, s.n_head = 24, s.n_head_kv = 8, s.head_dim = 128, s.n_rot = 96, s.n_ff = 8192;
        s.n_ctx_train = 131072, s.long_rope_ctx = 4096, s.n_vocab = 200064, s.tied = true;
    } else if (name == "phi-4") {  // 14B, tiktoken-style 100k vocabulary
        s.arch = "phi3", s.n_embd = 5120, s.n_layer = 40, s.n_head = 40, s.n_head_kv = 10, s.head_dim = 128, s.n_ff = 17920;
        s.n_ctx_train = 16384, s.rope_base = 250000.0f, s.n_vocab = 100352;
    } else if (name == "llama-98m") {
        s.n_embd = 768, s.n_head = 12, s.n_head_kv = 4, s.head_dim = 64, s.n_ff = 2560, s.n_layer = 13, s.n_ctx_train = 2048;
        s.n_vocab = 32000;
    } else if (name == "llama-20m") {
        s.n_embd = 512, s.n_head = 8, s.n_head_kv = 8, s.head_dim = 64, s.n_ff = 1408, s.n_layer = 6, s.n_ctx_train = 2048;
        s.n_vocab = 32000;
    } else {
        throw Error("unknown model shape '" + name + "' (" + synth_preset_list() + ")");
    }
    return s;
}

void write_synth_model(const SynthSpec & s, const std::string & path) {
    const bool qwen35moe = s.arch == "qwen35moe";
    const bool qwen2 = s.arch == "qwen2", gpt_oss = s.arch == "gpt-oss", moe = s.arch == "qwen3moe" || gpt_oss || qwen35moe,
               qwen3 = s.arch == "qwen3" || s.arch == "qwen3moe", gemma3 = s.arch == "gemma3", mistral3 = s.arch == "mistral3",
               phi3 = s.arch == "phi3", gemma2 = s.arch == "gemma2", gemma = gemma2 || gemma3, qwen35 = s.arch == "qwen35" || qwen35moe;
    if (s.arch != "llama" && !qwen2 && !qwen3 && !gpt_oss && !gemma && !mistral3 && !phi3 && !qwen35)
        throw Error("synthetic model: unknown architecture '" + s.arch + "'");
    if (s.llama3_rope != 0.0f && s.arch != "llama" && !mistral3)
        throw Error("synthetic model: Llama 3's RoPE factors need arch llama or mistral3");
    if (s.llama3_rope != 0.0f && (s.llama3_rope < 1.0f || s.llama3_rope_ctx == 0))
        throw Error("synthetic model: Llama 3's RoPE factor must be >= 1, over an original context >= 1");
    if (s.long_rope_ctx != 0 && (!phi3 || s.long_rope_ctx >= s.n_ctx_train))
        throw Error("synthetic model: LongRoPE needs arch phi3 and an original context below n_ctx_train");
    if (s.attn_temp_scale != 0.0f && !mistral3) throw Error("synthetic model: attention temperature needs arch mistral3");
    if (moe && (s.n_expert == 0 || s.n_expert_used == 0 || s.n_expert_used > s.n_expert || s.n_ff_exp == 0))
        throw Error("synthetic model: " + s.arch + " needs n_expert >= n_expert_used >= 1 and n_ff_exp >= 1");
    if (!moe && s.n_expert != 0) throw Error("synthetic model: experts need arch qwen3moe, gpt-oss or qwen35moe");
    if (gpt_oss && s.tied) throw Error("synthetic model: gpt-oss has an untied head (llama.cpp requires output.weight)");
    if ((s.attn_softcap != 0.0f || s.final_softcap != 0.0f) && !gemma2) throw Error("synthetic model: soft-caps need arch gemma2");
    if (gemma2 && !s.tied) throw Error("synthetic model: gemma2 ties its head (llama.cpp reads no output.weight)");
    if ((gpt_oss || gemma) && s.n_swa == 0) throw Error("synthetic model: " + s.arch + " needs a sliding window (n_swa >= 1)");
    if (s.yarn_factor > 0.0f && s.rope_linear > 0.0f) throw Error("synthetic model: YaRN and linear RoPE scaling exclude each other");
    if (s.n_head % s.n_head_kv != 0) throw Error("synthetic model: n_head must be a multiple of n_head_kv");
    if (s.mix && s.weights)
        throw Error("synthetic model: the mix " + s.mix->name + " gives types to a shapes-only file (weights 0); for random data, write f32 or "
                    "bf16 and quantize it with rp-gguf convert --type " + s.mix->name);
    if (qwen35 && (s.ssm_k_heads == 0 || s.ssm_v_heads % s.ssm_k_heads != 0 || s.ssm_head_dim == 0 || s.ssm_d_conv < 2 ||
                   s.full_attn_interval == 0))
        throw Error("synthetic model: qwen35 needs key heads >= 1, value heads a multiple of them, a head width, a conv kernel >= 2 and "
                    "a full attention interval >= 1");
    const uint32_t n_q = s.n_head * s.head_dim, n_kv = s.n_head_kv * s.head_dim, n_rot = s.n_rot ? s.n_rot : s.head_dim;
    if (n_rot > s.head_dim || n_rot % 2 != 0) throw Error("synthetic model: n_rot must be even and at most head_dim");
    // qwen3, gpt-oss and gemma3 read key_length; a llama writes it when its head is not n_embd / n_head (Mistral
    // Nemo's 128 over 5120 / 32); qwen2 derives head_dim from n_embd / n_head.
    const bool key_length = qwen3 || gpt_oss || gemma || mistral3 || qwen35 || (s.arch == "llama" && n_q != s.n_embd);
    if (!key_length && n_q != s.n_embd) throw Error("synthetic model: " + s.arch + " needs n_embd = n_head * head_dim");

    std::unique_ptr<gguf::Reader> vocab;
    int64_t n_vocab = s.n_vocab;
    if (!s.vocab_from.empty()) {
        vocab = gguf::Reader::open(s.vocab_from);
        n_vocab = static_cast<int64_t>(vocab->get_string_array("tokenizer.ggml.tokens").size());
    }
    if (n_vocab < 1) throw Error("synthetic model: no vocabulary (vocab_from or n_vocab)");

    gguf::Writer w;
    const std::string p = s.arch + ".";
    w.set_string("general.architecture", s.arch);
    // llama.cpp gives a model named like "phi-3" / "phi3" Phi-3's special-token attributes, which expect its vocabulary.
    w.set_string("general.name", phi3 ? std::string("synthetic-phi") : "synthetic-" + s.arch);
    w.set_u32(p + "context_length", s.n_ctx_train);
    w.set_u32(p + "embedding_length", s.n_embd);
    if (s.mtp_layers > 0 && !qwen35) throw Error("synthetic model: multi-token prediction blocks need arch qwen35 or qwen35moe");
    w.set_u32(p + "block_count", s.n_layer + s.mtp_layers);
    if (s.mtp_layers > 0) w.set_u32(p + "nextn_predict_layers", s.mtp_layers);
    w.set_u32(p + "feed_forward_length", s.n_ff);
    w.set_u32(p + "attention.head_count", s.n_head);
    w.set_u32(p + "attention.head_count_kv", s.n_head_kv);
    w.set_f32(p + "attention.layer_norm_rms_epsilon", s.arch == "llama" || gpt_oss || mistral3 || phi3 ? 1e-5f : 1e-6f);
    if (s.attn_temp_scale != 0.0f) w.set_f32(p + "attention.temperature_scale", s.attn_temp_scale);
    w.set_f32(p + "rope.freq_base", s.rope_base);
    w.set_u32(p + "rope.dimension_count", n_rot);
    if (s.yarn_factor > 0.0f) {
        w.set_string(p + "rope.scaling.type", "yarn");
        w.set_f32(p + "rope.scaling.factor", s.yarn_factor);
        w.set_u32(p + "rope.scaling.original_context_length", s.yarn_orig_ctx);
        if (s.yarn_log_mul != 0.0f) w.set_f32(p + "rope.scaling.yarn_log_multiplier", s.yarn_log_mul);
    }
    if (s.rope_linear > 0.0f) {
        w.set_string(p + "rope.scaling.type", "linear");
        w.set_f32(p + "rope.scaling.factor", s.rope_linear);
    }
    if (gpt_oss || gemma) w.set_u32(p + "attention.sliding_window", s.n_swa);
    if (s.attn_softcap != 0.0f) w.set_f32(p + "attn_logit_softcapping", s.attn_softcap);
    if (s.final_softcap != 0.0f) w.set_f32(p + "final_logit_softcapping", s.final_softcap);
    if (s.long_rope_ctx != 0) {  // as llama.cpp's converter writes Phi-3.5's: no scaling type, the context and the scale
        w.set_u32(p + "rope.scaling.original_context_length", s.long_rope_ctx);
        const double ext = static_cast<double>(s.n_ctx_train) / s.long_rope_ctx;
        w.set_f32(p + "rope.scaling.attn_factor", static_cast<float>(std::sqrt(1.0 + std::log(ext) / std::log(double(s.long_rope_ctx)))));
    }
    if (key_length) {
        w.set_u32(p + "attention.key_length", s.head_dim);
        w.set_u32(p + "attention.value_length", s.head_dim);
    }
    const uint32_t key_dim = s.ssm_k_heads * s.ssm_head_dim, value_dim = s.ssm_v_heads * s.ssm_head_dim, conv_dim = 2 * key_dim + value_dim;
    if (qwen35) {  // llama.cpp's converter's keys; M-RoPE sections over the rotary pairs (a text token's the same in each)
        w.set_u32(p + "ssm.conv_kernel", s.ssm_d_conv);
        w.set_u32(p + "ssm.state_size", s.ssm_head_dim);
        w.set_u32(p + "ssm.group_count", s.ssm_k_heads);
        w.set_u32(p + "ssm.time_step_rank", s.ssm_v_heads);
        w.set_u32(p + "ssm.inner_size", value_dim);
        w.set_u32(p + "full_attention_interval", s.full_attn_interval);
        // Interleaved: pair i in section i % 3, as many of each as cover the pairs (Qwen3.5's 32 pairs: 11, 11, 10).
        const int32_t pairs = static_cast<int32_t>(n_rot / 2);
        w.set_i32_array(p + "rope.dimension_sections", {(pairs + 2) / 3, (pairs + 1) / 3, pairs / 3, 0});
    }
    if (moe) {
        w.set_u32(p + "expert_count", s.n_expert);
        w.set_u32(p + "expert_used_count", s.n_expert_used);
        w.set_u32(p + "expert_feed_forward_length", s.n_ff_exp);
        if (qwen35moe) w.set_u32(p + "expert_shared_feed_forward_length", s.n_ff);  // the shared expert's width: n_ff
    }
    if (vocab) {
        for (const gguf::KV & kv : vocab->kvs())
            if (kv.key.rfind("tokenizer.", 0) == 0) w.set_kv(kv);
    } else {
        w.set_u32(p + "vocab_size", static_cast<uint32_t>(n_vocab));
    }

    // Scales: inputs to every projection have RMS ~1 (RMSNorm, or the previous projection's output), so
    // b = k·√3/√fan_in gives outputs of std ~k. Queries and keys get k = 1.5 so attention is not uniform; the
    // head gets k = 3 (logits of a few units); for a tied head the embedding has std 1 and output_norm
    // provides the 3/√n_embd.
    const auto fan = [](double k, uint32_t fan_in) { return static_cast<float>(k * std::sqrt(3.0 / fan_in)); };
    const float sqrt3 = static_cast<float>(std::sqrt(3.0));
    const gguf::TensorType f32 = gguf::TensorType::F32, wt = s.wtype, xt = s.expert_wtype.value_or(s.wtype);
    uint64_t seed = s.seed * 1000003u;
    // gemma2 and gemma3 multiply the embeddings by sqrt(n_embd): rows of std 1/sqrt(n_embd) give the others' O(1) inputs,
    // and a tied head over them needs output_norm ~3 for the same logits.
    const float embd_b = gemma ? static_cast<float>(std::sqrt(3.0 / s.n_embd)) : sqrt3;
    add(w, "token_embd.weight", wt, s.n_embd, n_vocab, {0.0f, embd_b}, ++seed, s.weights);
    const float out_norm = !s.tied ? 1.0f : gemma ? 3.0f : static_cast<float>(3.0 / std::sqrt(s.n_embd));
    add(w, "output_norm.weight", f32, s.n_embd, 1, {out_norm, 0.1f * out_norm}, ++seed, s.weights);
    if (!s.tied) add(w, "output.weight", wt, s.n_embd, n_vocab, {0.0f, fan(3.0, s.n_embd)}, ++seed, s.weights);
    if (s.llama3_rope != 0.0f) add_values(w, "rope_freqs.weight", llama3_rope_factors(s.llama3_rope, 1.0f, 4.0f, s.llama3_rope_ctx, s.rope_base, n_rot), s.weights);
    if (s.long_rope_ctx != 0) {
        // Ramps over the pairs, short ones gentle (1 to 1.5), long ones steep (1 to 1 + ext), as Phi-3.5's run.
        const uint32_t R = n_rot / 2;
        const double ext = static_cast<double>(s.n_ctx_train) / s.long_rope_ctx;
        std::vector<float> shrt(R), lng(R);
        for (uint32_t i = 0; i < R; ++i) {
            const double x = R > 1 ? static_cast<double>(i) / (R - 1) : 0.0;
            shrt[i] = static_cast<float>(1.0 + 0.5 * x);
            lng[i] = static_cast<float>(1.0 + ext * x * x);
        }
        add_values(w, "rope_factors_long.weight", lng, s.weights);
        add_values(w, "rope_factors_short.weight", shrt, s.weights);
    }
    for (uint32_t l = 0; l < s.n_layer + s.mtp_layers; ++l) {
        const std::string b = "blk." + std::to_string(l) + ".";
        add(w, b + "attn_norm.weight", f32, s.n_embd, 1, {1.0f, 0.2f}, ++seed, s.weights);
        if (l >= s.n_layer) {  // an MTP block: a full attention block and its own projection of [embedding | hidden]
            add(w, b + "nextn.eh_proj.weight", wt, 2 * s.n_embd, s.n_embd, {0.0f, fan(1.0, 2 * s.n_embd)}, ++seed, s.weights);
            add(w, b + "nextn.enorm.weight", f32, s.n_embd, 1, {1.0f, 0.2f}, ++seed, s.weights);
            add(w, b + "nextn.hnorm.weight", f32, s.n_embd, 1, {1.0f, 0.2f}, ++seed, s.weights);
        }
        if (qwen35 && l < s.n_layer && (l + 1) % s.full_attn_interval != 0) {
            // A Gated DeltaNet layer: the convolution's q, k, v channels, the output gate z, beta's and the decay's
            // projections, the decay's bias and A = -exp(A_log) in [-1.5, -0.1] (a state that remembers over tens
            // of tokens), the conv kernel, the gated norm and the output.
            const uint32_t hv = s.ssm_v_heads;
            add(w, b + "attn_qkv.weight", wt, s.n_embd, conv_dim, {0.0f, fan(1.0, s.n_embd)}, ++seed, s.weights);
            add(w, b + "attn_gate.weight", wt, s.n_embd, value_dim, {0.0f, fan(1.0, s.n_embd)}, ++seed, s.weights);
            add(w, b + "ssm_conv1d.weight", f32, s.ssm_d_conv, conv_dim, {0.0f, fan(1.5, s.ssm_d_conv)}, ++seed, s.weights);
            add(w, b + "ssm_dt.bias", f32, hv, 1, {0.0f, 1.0f}, ++seed, s.weights);
            add(w, b + "ssm_a", f32, hv, 1, {-0.8f, 0.7f}, ++seed, s.weights);
            add(w, b + "ssm_beta.weight", wt, s.n_embd, hv, {0.0f, fan(1.0, s.n_embd)}, ++seed, s.weights);
            add(w, b + "ssm_alpha.weight", wt, s.n_embd, hv, {0.0f, fan(1.0, s.n_embd)}, ++seed, s.weights);
            add(w, b + "ssm_norm.weight", f32, s.ssm_head_dim, 1, {1.0f, 0.2f}, ++seed, s.weights);
            add(w, b + "ssm_out.weight", wt, value_dim, s.n_embd, {0.0f, fan(1.0, value_dim)}, ++seed, s.weights);
        } else if (qwen35) {  // gated full attention: per head, the query's rows then its output gate's
            add(w, b + "attn_q.weight", wt, s.n_embd, 2 * n_q, {0.0f, fan(1.5, s.n_embd)}, ++seed, s.weights);
            add(w, b + "attn_k.weight", wt, s.n_embd, n_kv, {0.0f, fan(1.5, s.n_embd)}, ++seed, s.weights);
            add(w, b + "attn_v.weight", wt, s.n_embd, n_kv, {0.0f, fan(1.0, s.n_embd)}, ++seed, s.weights);
            add(w, b + "attn_q_norm.weight", f32, s.head_dim, 1, {1.0f, 0.2f}, ++seed, s.weights);
            add(w, b + "attn_k_norm.weight", f32, s.head_dim, 1, {1.0f, 0.2f}, ++seed, s.weights);
            add(w, b + "attn_output.weight", wt, n_q, s.n_embd, {0.0f, fan(1.0, n_q)}, ++seed, s.weights);
        }
        if (!qwen35) {  // (qwen35's mixers are written above)
            if (phi3) {  // fused q, k, v rows (v's a smaller scale, as below, does not matter at these sizes)
                add(w, b + "attn_qkv.weight", wt, s.n_embd, n_q + 2 * n_kv, {0.0f, fan(1.5, s.n_embd)}, ++seed, s.weights);
            } else {
                add(w, b + "attn_q.weight", wt, s.n_embd, n_q, {0.0f, fan(1.5, s.n_embd)}, ++seed, s.weights);
                add(w, b + "attn_k.weight", wt, s.n_embd, n_kv, {0.0f, fan(1.5, s.n_embd)}, ++seed, s.weights);
                add(w, b + "attn_v.weight", wt, s.n_embd, n_kv, {0.0f, fan(1.0, s.n_embd)}, ++seed, s.weights);
            }
            if (qwen2 || gpt_oss) {
                add(w, b + "attn_q.bias", f32, n_q, 1, {0.0f, 0.5f}, ++seed, s.weights);
                add(w, b + "attn_k.bias", f32, n_kv, 1, {0.0f, 0.5f}, ++seed, s.weights);
                add(w, b + "attn_v.bias", f32, n_kv, 1, {0.0f, 0.5f}, ++seed, s.weights);
            }
            if (qwen3 || gemma3) {
                add(w, b + "attn_q_norm.weight", f32, s.head_dim, 1, {1.0f, 0.2f}, ++seed, s.weights);
                add(w, b + "attn_k_norm.weight", f32, s.head_dim, 1, {1.0f, 0.2f}, ++seed, s.weights);
            }
            add(w, b + "attn_output.weight", wt, n_q, s.n_embd, {0.0f, fan(1.0, n_q)}, ++seed, s.weights);
            if (gpt_oss) {  // the output bias, and sink logits that take a share of each row's probability
                add(w, b + "attn_output.bias", f32, s.n_embd, 1, {0.0f, 0.5f}, ++seed, s.weights);
                add(w, b + "attn_sinks.weight", f32, s.n_head, 1, {0.5f, 1.5f}, ++seed, s.weights);
            }
            if (gemma) add(w, b + "post_attention_norm.weight", f32, s.n_embd, 1, {1.0f, 0.2f}, ++seed, s.weights);
        }
        add(w, b + (gpt_oss || qwen35 ? "post_attention_norm.weight" : "ffn_norm.weight"), f32, s.n_embd, 1, {1.0f, 0.2f}, ++seed, s.weights);
        if (moe) {  // the router (logits of a few units, so tokens pick different experts), then the experts
            add(w, b + "ffn_gate_inp.weight", wt, s.n_embd, s.n_expert, {0.0f, fan(2.0, s.n_embd)}, ++seed, s.weights);
            add(w, b + "ffn_gate_exps.weight", xt, s.n_embd, s.n_ff_exp, {0.0f, fan(1.0, s.n_embd)}, ++seed, s.weights, s.n_expert);
            add(w, b + "ffn_up_exps.weight", xt, s.n_embd, s.n_ff_exp, {0.0f, fan(1.0, s.n_embd)}, ++seed, s.weights, s.n_expert);
            add(w, b + "ffn_down_exps.weight", xt, s.n_ff_exp, s.n_embd, {0.0f, fan(1.0, s.n_ff_exp)}, ++seed, s.weights,
                s.n_expert);
            if (gpt_oss) {  // the router's and the experts' biases ([width, n_expert])
                add(w, b + "ffn_gate_inp.bias", f32, s.n_expert, 1, {0.0f, 0.5f}, ++seed, s.weights);
                add(w, b + "ffn_gate_exps.bias", f32, s.n_ff_exp, s.n_expert, {0.0f, 0.5f}, ++seed, s.weights);
                add(w, b + "ffn_up_exps.bias", f32, s.n_ff_exp, s.n_expert, {0.0f, 0.5f}, ++seed, s.weights);
                add(w, b + "ffn_down_exps.bias", f32, s.n_embd, s.n_expert, {0.0f, 0.2f}, ++seed, s.weights);
            }
            if (qwen35moe) {  // the shared expert (n_ff wide) and its gate's logit vector
                add(w, b + "ffn_gate_inp_shexp.weight", f32, s.n_embd, 1, {0.0f, fan(1.0, s.n_embd)}, ++seed, s.weights);
                add(w, b + "ffn_gate_shexp.weight", wt, s.n_embd, s.n_ff, {0.0f, fan(1.0, s.n_embd)}, ++seed, s.weights);
                add(w, b + "ffn_up_shexp.weight", wt, s.n_embd, s.n_ff, {0.0f, fan(1.0, s.n_embd)}, ++seed, s.weights);
                add(w, b + "ffn_down_shexp.weight", wt, s.n_ff, s.n_embd, {0.0f, fan(1.0, s.n_ff)}, ++seed, s.weights);
            }
            continue;
        }
        if (phi3) {  // the gate's rows, then the up projection's
            add(w, b + "ffn_up.weight", wt, s.n_embd, 2 * s.n_ff, {0.0f, fan(1.0, s.n_embd)}, ++seed, s.weights);
        } else {
            add(w, b + "ffn_gate.weight", wt, s.n_embd, s.n_ff, {0.0f, fan(1.0, s.n_embd)}, ++seed, s.weights);
            add(w, b + "ffn_up.weight", wt, s.n_embd, s.n_ff, {0.0f, fan(1.0, s.n_embd)}, ++seed, s.weights);
        }
        add(w, b + "ffn_down.weight", wt, s.n_ff, s.n_embd, {0.0f, fan(1.0, s.n_ff)}, ++seed, s.weights);
        if (gemma) add(w, b + "post_ffw_norm.weight", f32, s.n_embd, 1, {1.0f, 0.2f}, ++seed, s.weights);
    }
    if (s.mix) {  // the mix's types, as llama-quantize gives them to a file of these tensors
        QuantMixModel m;
        m.arch = s.arch;
        m.n_layer = s.n_layer + s.mtp_layers;
        m.n_head = s.n_head;
        m.n_head_kv = s.n_head_kv;
        m.n_expert = s.n_expert;
        std::vector<QuantTensor> ts;
        const std::vector<gguf::TensorInfo> infos = w.tensor_infos();
        for (const gguf::TensorInfo & ti : infos) ts.push_back({ti.name, static_cast<int>(ti.n_dims), ti.ne[0], ti.type});
        const std::vector<QuantChoice> plan = plan_quant_mix(*s.mix, m, ts);
        for (size_t i = 0; i < infos.size(); ++i)
            if (plan[i].type != infos[i].type) w.set_hole_type(infos[i].name, plan[i].type);
        w.set_u32("general.file_type", s.mix->file_type);
    }
    w.write(path);  // `vocab` (whose keys were copied by value) may close after this
}

std::vector<double> synth_grad_bytes(const SynthSpec & sp, bool full, int r) {
    if (sp.arch == "qwen35" || sp.arch == "qwen35moe")  // two layer kinds: the uniform per-layer sum below would be wrong
        throw Error("synthetic model: the per-layer gradient bytes of " + sp.arch + " (DeltaNet and attention layers) are not modelled");
    const double d = sp.n_embd, q = double(sp.n_head) * sp.head_dim, kv = double(sp.n_head_kv) * sp.head_dim;
    const double experts = sp.n_expert > 0 ? sp.n_expert : 1, ff = sp.n_expert > 0 ? sp.n_ff_exp : sp.n_ff;
    auto pair = [&](double in, double out) { return full ? in * out : r * (in + out); };
    double block = pair(d, q) + 2 * pair(d, kv) + pair(q, d) + experts * (2 * pair(d, ff) + pair(ff, d));
    if (sp.arch == "phi3") block = pair(d, q + 2 * kv) + pair(q, d) + pair(d, 2 * ff) + pair(ff, d);  // fused qkv, gate/up
    const bool qk_norm = sp.arch == "qwen3" || sp.arch == "qwen3moe" || sp.arch == "gemma3";
    if (full) block += 2 * d + (qk_norm ? 2.0 * sp.head_dim : 0.0) + (sp.n_expert > 0 ? d * sp.n_expert : 0.0);
    if (full && (sp.arch == "gemma3" || sp.arch == "gemma2")) block += 2 * d;  // the post-attention and post-feed-forward norms
    if (full && sp.arch == "gpt-oss")  // biases of q, k, v, o, the router and the experts; the sinks
        block += q + 2 * kv + d + experts * (2 * ff + d + 1) + sp.n_head;
    std::vector<double> g(static_cast<size_t>(sp.n_layer + 2), 0);
    for (uint32_t l = 1; l <= sp.n_layer; ++l) g[l] = 4 * block;
    if (full) {
        g.front() = 4.0 * sp.n_vocab * d;
        g.back() = 4.0 * (d + (sp.tied ? 0.0 : double(sp.n_vocab) * d));
    }
    return g;
}

} // namespace rp
