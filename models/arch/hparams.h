// Architecture registry and hyper-parameters read from GGUF metadata, with llama.cpp's defaults
// (formats.md §3.1). One place states how llama, qwen2, qwen3, qwen3moe, gpt-oss, gemma2, gemma3, mistral3, phi3, qwen35 and
// qwen35moe differ.
#pragma once

#include "ggml_rp/ops/rope.h"
#include "ggml_rp/ops/unary_math.h"
#include "gguf/gguf.h"

#include <cstdint>
#include <string>
#include <vector>

namespace rp {

enum class Arch { Llama, Qwen2, Qwen3, Qwen3Moe, GptOss, Gemma2, Gemma3, Mistral3, Phi3, Qwen35, Qwen35Moe };

// What distinguishes one architecture's decoder layer from another's.
struct ArchTraits {
    Arch arch;
    const char * name;              // general.architecture value
    RopeMode rope_mode;             // ggml_rp/ops/rope.h: Normal (adjacent pairs, llama) or Neox (half split, qwen)
    bool qkv_bias = false;          // qwen2, gpt-oss: q/k/v projections carry biases (required)
    bool qk_norm = false;           // qwen3: per-head RMSNorm of q and k before RoPE
    bool moe = false;               // qwen3moe, gpt-oss: the feed-forward is a routed mixture of experts
    float default_rms_eps = 1e-6f;  // used only if the key is absent (it is required by llama.cpp)
    // gpt-oss:
    bool attn_out_bias = false;     // attn_output.bias
    bool attn_sinks = false;        // attn_sinks: one softmax sink logit per query head (ops/attention.h)
    bool moe_biases = false;        // the router's bias (ffn_gate_inp.bias) and each expert's (ffn_*_exps.bias)
    bool swiglu_oai = false;        // the experts' clamped SwiGLU (ops/unary.h swiglu_oai: alpha 1.702, limit 7)
    bool sliding_window = false;    // attention.sliding_window: windowed layers per attention.sliding_window_pattern
    const char * ffn_norm = "ffn_norm";  // the feed-forward's input norm (gpt-oss: post_attention_norm)
    // gemma2, gemma3:
    bool embd_scale = false;        // the embeddings times sqrt(n_embd)
    bool post_norms = false;        // RMSNorms on the attention's and the feed-forward's outputs before each residual
                                    // (post_attention_norm, post_ffw_norm)
    GluKind glu = GluKind::Silu;    // the dense feed-forward's activation (gemma3: GELU-tanh)
    uint32_t swa_period = 0;        // windowed layers fixed by the architecture (llama.cpp's set_swa_pattern), not
                                    // read from the file; 0: attention.sliding_window_pattern (default 2)
    float swa_rope_base = 0.0f;     // windowed layers' fixed RoPE base, unscaled (0: rope.freq_base_swa, scaled as
                                    // the other layers)
    uint32_t big_attn_scale_layers = 0;  // the query scale 1/sqrt(head_dim), but 1/sqrt(n_embd / n_head) for the model
                                         // of this many layers (the 27B: gemma3 62, gemma2 46), as llama.cpp (from
                                         // gemma_pytorch's configs) has it; 0: no such model
    uint32_t default_swa = 0;       // the window when attention.sliding_window is absent (gemma2: 4096); 0: required
    // gemma2: logit soft-capping, cap tanh(x / cap): the attention's (attn_logit_softcapping, default 50) and the
    // final logits' (final_logit_softcapping, default 30), as llama.cpp reads them
    bool softcaps = false;
    bool tied_head = false;         // gemma2: the head is always token_embd (llama.cpp reads no output.weight)
    // mistral3:
    bool yarn_log_mul = false;      // rope.scaling.yarn_log_multiplier m: YaRN's cos / sin scale is
                                    // mscale(factor, 1) / mscale(factor, m), mscale(s, m) = 1 + 0.1 m ln s (s > 1)
    bool attn_temperature = false;  // attention.temperature_scale: the queries scaled by position (ops/rope_math.h
                                    // RopeTemperature, floor = the YaRN training context)
    // llama, mistral3: Llama 3's RoPE frequency factors, one rope_freqs.weight [n_rot / 2] shared by every layer
    // (optional; ops/rope.h freq_factors).
    bool rope_freqs = false;
    // phi3:
    bool long_rope = false;         // LongRoPE: rope_factors_short / rope_factors_long.weight [n_rot / 2] (optional),
                                    // the long ones for a context beyond rope.scaling.original_context_length
    bool fused_qkv = false;         // attn_qkv [n_embd, n_q + 2 n_kv] (q, k, v rows in that order) in place of
                                    // attn_q / attn_k / attn_v (either is accepted, as llama.cpp does)
    bool fused_gate_up = false;     // ffn_up [n_embd, 2 n_ff] holds the gate's rows then the up rows; no ffn_gate
    // qwen35 (Qwen3.5): a hybrid of Gated DeltaNet layers (models/arch/delta_net_block.cpp) and full attention layers
    // whose attn_q also holds a sigmoid output gate: per head, head_dim query rows then head_dim gate rows.
    bool delta_net = false;
    bool attn_output_gate = false;
    // qwen35moe: beside the routed experts a shared expert (a SwiGLU of expert_shared_feed_forward_length) whose output
    // is scaled by sigmoid(ffn_gate_inp_shexp . x) per token.
    bool shared_expert = false;
};

// nullptr when the architecture is not supported.
const ArchTraits * find_arch(const std::string & name);
// Every supported general.architecture value, in the registry's order: "llama, qwen2, qwen3, qwen3moe" (what
// the tools' help and errors list, so the list cannot go stale).
std::string supported_architectures();

struct HParams {
    const ArchTraits * arch = nullptr;
    uint32_t n_vocab = 0;
    uint32_t n_ctx_train = 0;
    uint32_t n_embd = 0;
    uint32_t n_layer = 0;
    uint32_t n_head = 0;
    uint32_t n_head_kv = 0;
    uint32_t head_dim = 0;     // key_length (qwen3: independent of n_embd / n_head)
    uint32_t head_dim_v = 0;   // value_length
    uint32_t n_ff = 0;          // dense feed-forward width (qwen3moe: informational)
    // Mixture of experts (qwen3moe): experts per layer, experts per token, each expert's feed-forward width,
    // whether the selected router probabilities are renormalised (llama.cpp: always for qwen3moe; the key
    // expert_weights_norm is honoured when present) and their scale (expert_weights_scale; 0 = 1).
    uint32_t n_expert = 0;
    uint32_t n_expert_used = 0;
    uint32_t n_ff_exp = 0;
    uint32_t n_ff_shexp = 0;  // qwen35moe: the shared expert's width (expert_shared_feed_forward_length, else n_ff)
    bool expert_weights_norm = true;
    float expert_weights_scale = 0.0f;
    bool is_moe() const { return n_expert > 0; }
    // Sliding-window attention (gpt-oss, gemma3): the window in tokens and which layers use it (llama.cpp's
    // set_swa_pattern: with period P, layer il is windowed when il % P < P - 1; P = 0: every layer); a windowed
    // layer's RoPE base and scale are rope_freq_base_swa / rope_freq_scale_swa (gpt-oss: the key
    // rope.freq_base_swa, else rope_freq_base, and the file's scale; gemma3: 10000, unscaled).
    uint32_t n_swa = 0;
    uint32_t swa_period = 0;
    bool is_swa(uint32_t il) const { return n_swa > 0 && (swa_period == 0 || il % swa_period < swa_period - 1); }
    // Training graphs only: the load-balancing loss's gradient scale of the MoE router (ops/moe_math.h aux;
    // 0 = none). Not read from a file: a trainer sets it on its copy for each micro-batch.
    float moe_aux = 0.0f;
    // Inference graphs only: gemma3's GELU as llama.cpp's CPU backend computes it, from an fp16 table (ops/unary.h
    // geglu). Not read from a file: an InferenceSession sets it on its copy; training keeps the exact GELU.
    bool gelu_fp16_table = false;
    uint32_t n_rot = 0;
    float rms_eps = 1e-5f;
    float rope_freq_base = 10000.0f;
    float rope_freq_scale = 1.0f;
    // YaRN (rope.scaling.type = yarn: ops/rope_math.h): ext_factor 0 = none.
    float rope_ext_factor = 0.0f, rope_attn_factor = 1.0f, rope_beta_fast = 32.0f, rope_beta_slow = 1.0f;
    uint32_t rope_n_ctx_orig = 0;  // rope.scaling.original_context_length, else n_ctx_train
    float rope_freq_base_swa = 10000.0f;
    float rope_freq_scale_swa = 1.0f;
    float embd_scale = 1.0f;  // the embeddings' factor (gemma3: sqrt(n_embd))
    float attn_scale = 0.0f;  // the attention's query scale (1/sqrt(head_dim) unless the architecture says otherwise)
    // Attention temperature tuning (mistral3): 0 = none; the queries' RoPE carries it (rope_query()).
    float attn_temp_scale = 0.0f;
    uint32_t attn_temp_floor = 0;
    // Logit soft-capping (gemma2): 0 = none.
    float attn_softcap = 0.0f;
    float final_softcap = 0.0f;

    // Gated DeltaNet (qwen35): the conv kernel (ssm.conv_kernel), the key head dim (ssm.state_size), key heads
    // (ssm.group_count), value heads (ssm.time_step_rank), all value heads' width (ssm.inner_size); and which layers
    // are DeltaNet layers (attention.recurrent_layers, else every layer but each full_attention_interval-th).
    uint32_t ssm_d_conv = 0, ssm_d_state = 0, ssm_n_group = 0, ssm_dt_rank = 0, ssm_d_inner = 0;
    std::vector<uint8_t> recurrent;
    // Multi-token prediction blocks after the decoder (nextn_predict_layers): in the file, not run. n_layer counts the
    // decoder's layers only (block_count - n_layer_nextn).
    uint32_t n_layer_nextn = 0;
    bool is_recurrent(uint32_t il) const { return il < recurrent.size() && recurrent[il] != 0; }
    uint32_t ssm_head_v() const { return ssm_dt_rank ? ssm_d_inner / ssm_dt_rank : 0; }
    // The convolution's channels: q and k (ssm_d_state x ssm_n_group each) and v (ssm_d_inner).
    uint32_t ssm_conv_dim() const { return 2 * ssm_d_state * ssm_n_group + ssm_d_inner; }

    uint32_t n_q() const { return n_head * head_dim; }
    uint32_t n_kv() const { return n_head_kv * head_dim; }
    uint32_t n_gqa() const { return n_head / n_head_kv; }
    // The rope op's parameters for this model's layer il (mode from the architecture; a windowed layer's base).
    RopeParams rope(uint32_t il = 0) const;
    // The queries' RoPE: rope(il) with the attention temperature, where the architecture has one.
    RopeParams rope_query(uint32_t il = 0) const;
};

// Reads and validates the hyper-parameters of a model file. Throws rp::Error naming the file and key for a
// missing required key, an unsupported architecture, per-layer arrays that are not uniform, or inconsistent
// values (n_head not a multiple of n_head_kv, n_rot > head_dim, ...).
HParams load_hparams(const gguf::Reader & file);

// The key prefix of an architecture: "llama." etc.
std::string arch_key(const HParams & hp, const char * suffix);

} // namespace rp
