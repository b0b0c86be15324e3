// The synthetic-model writer: random-weight llama / qwen2 / qwen3 / qwen3moe / gpt-oss / gemma2 / gemma3 / mistral3 / phi3 /
// qwen35 / qwen35moe models of any shape, written with our GGUF
// writer — for benchmarks (a Qwen3-1.7B or 0.6B shape without downloading it) and for tests of shapes the
// shared files do not cover (GQA 3:1, head_dim 48 and 128, more layers, rope bases 1e4 / 1e6, quantized
// weights). The tokenizer keys are copied from a real file (stories260K: SentencePiece, a qwen2 vocabulary:
// byte-level BPE) so that llama.cpp loads the result. Weights are scaled so that activations stay O(1) and
// logits are O(1..10). `rp-gguf synth` is its command line.
#pragma once

#include "models/convert/quant_mix.h"

#include "gguf/types.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rp {

struct SynthSpec {
    std::string arch = "llama";   // llama | qwen2 | qwen3 | qwen3moe | gpt-oss | gemma2 | gemma3 | mistral3 | phi3 | qwen35 |
                                  // qwen35moe (its shared expert n_ff wide)
    std::string vocab_from;       // GGUF whose tokenizer.* keys are copied (sets n_vocab)
    uint32_t n_vocab = 0;         // without vocab_from: no tokenizer, this many token rows (shapes for plans)
    uint32_t n_embd = 64, n_head = 4, n_head_kv = 2, head_dim = 16, n_ff = 128, n_layer = 2;
    uint32_t n_rot = 0;           // rotary dimensions of a head (rope.dimension_count); 0 = head_dim (Phi-4-mini: 96 of 128)
    uint32_t n_ctx_train = 1024;
    // qwen3moe, gpt-oss: experts per layer, experts per token, each expert's feed-forward width (n_ff stays the
    // informational dense width).
    uint32_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
    uint32_t n_swa = 128;         // gpt-oss, gemma3: the sliding window of their windowed layers
    float rope_base = 10000.0f;
    float rope_linear = 0.0f;     // linear RoPE scaling (gemma3 4B+: 8 on the global layers): this factor; 0 = none
    // YaRN context extension (gpt-oss: 32 over 4096): rope.scaling.type yarn with this factor and training
    // context; 0 = none.
    float yarn_factor = 0.0f;
    uint32_t yarn_orig_ctx = 0;
    float yarn_log_mul = 0.0f;    // mistral3: rope.scaling.yarn_log_multiplier (0: not written)
    // mistral3: attention temperature tuning (attention.temperature_scale; the floor is the YaRN training
    // context, else n_ctx_train); 0 = none.
    float attn_temp_scale = 0.0f;
    // llama, mistral3: Llama 3's RoPE frequency factors (rope_freqs.weight) for this scaling factor (Llama 3.1: 8,
    // 3.2: 32), with Meta's low / high frequency factors 1 / 4 over llama3_rope_ctx tokens; 0 = none.
    float llama3_rope = 0.0f;
    uint32_t llama3_rope_ctx = 8192;
    // phi3: LongRoPE from this original context to n_ctx_train (rope_factors_short / _long, smooth ramps over the
    // pairs, and rope.scaling.attn_factor sqrt(1 + ln(n_ctx_train / it) / ln(it))); 0 = none.
    uint32_t long_rope_ctx = 0;
    // gemma2: the attention's and the final logits' soft-caps (attn_logit_softcapping, final_logit_softcapping);
    // 0: not written (llama.cpp's defaults, 50 and 30).
    float attn_softcap = 0.0f, final_softcap = 0.0f;
    // qwen35: Gated DeltaNet layers (all but every full_attn_interval-th): the delta rule's key heads and value heads
    // (a multiple of them), each head's key and value width (llama.cpp runs equal ones), and the conv kernel. The
    // full attention layers' rotary dimensions are n_rot (M-RoPE sections written over them).
    uint32_t ssm_k_heads = 2, ssm_v_heads = 4, ssm_head_dim = 16, ssm_d_conv = 4, full_attn_interval = 4;
    // qwen35, qwen35moe: multi-token prediction blocks after the decoder (nextn_predict_layers; Qwen3.5's checkpoints
    // carry one): block_count counts them, nothing here runs them.
    uint32_t mtp_layers = 0;
    bool tied = false;            // no output.weight: the head reuses token_embd
    gguf::TensorType wtype = gguf::TensorType::F32;  // the 2-D weights; norms and biases stay F32
    std::optional<gguf::TensorType> expert_wtype;    // the experts' stacks (unset: wtype; the gpt-oss presets:
                                                     // MXFP4, as the models are released)
    // A llama-quantize mix (q4_k_m, q3_k_m, ...; quant_mix.h): each weight gets the type its rules give it, as
    // a file quantized to it has (general.file_type too). Shapes only: it needs weights = false (for data,
    // write f32 or bf16 and quantize with rp-gguf convert).
    std::optional<QuantMix> mix;
    uint64_t seed = 1;
    bool weights = true;          // false: every weight a hole (all zeros, no disk): shapes for a memory plan
};

// The real shapes of models people finetune (hidden size, layers, heads, head_dim, n_ff, vocabulary, tied
// head, rope base, context): qwen3-0.6b, qwen3-1.7b, qwen3-32b, llama3.1-8b, the mixtures of experts
// qwen3-30b-a3b and qwen3-235b-a22b, the hybrids qwen3-next-80b-a3b (Gated DeltaNet and gated attention, qwen35moe's layout)
// and qwen3.5-35b-a3b, Qwen3.5's dense hybrids qwen3.5-0.8b, -2b, -4b, -9b and -27b,
// gpt-oss-20b and gpt-oss-120b (their sliding window and YaRN), gemma-3-1b,
// gemma-3-4b, gemma-3-12b and gemma-3-27b, ministral-3-3b, ministral-3-8b and ministral-3-14b (YaRN 16 x
// 16384, attention temperature 0.1), gemma-2-2b, gemma-2-9b and gemma-2-27b (a 4096-token window on every other layer,
// soft-caps 50 and 30), llama3.2-1b and llama3.2-3b (tied, RoPE factors 32), phi-3.5-mini (LongRoPE 4096 to
// 131072), phi-4-mini (partial rotary, tied) and phi-4; and the benchmark models llama-98m, llama-20m. n_vocab is the real model's (vocab_from unset). rp::Error naming the presets otherwise.
SynthSpec synth_preset(const std::string & name);
// Every name synth_preset takes (rp-simulate's alias qwen3-235b aside), in the order help texts list them.
const std::vector<std::string> & synth_preset_names();
// The same as one comma-separated line.
std::string synth_preset_list();

// Writes the model to `path` (temp file, then rename). Throws rp::Error on a bad spec or I/O failure.
// Weights are generated tensor by tensor at write time: a 100M-parameter model never sits in memory.
void write_synth_model(const SynthSpec & spec, const std::string & path);

// Gradient bytes per layer of the sequential view (prefix, decoder layers, postfix) of a model of this
// shape: fp32 gradients of every weight (full), or of LoRA pairs of rank `lora_rank` on every linear layer
// (experts included; embedding and head frozen). What data parallel all-reduces (rp-simulate --nodes).
std::vector<double> synth_grad_bytes(const SynthSpec & spec, bool full, int lora_rank);

} // namespace rp
