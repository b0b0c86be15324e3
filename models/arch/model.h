// A model of any architecture in hparams.h (llama, qwen2, qwen3, qwen3moe, gpt-oss, gemma3, mistral3, phi3, qwen35, qwen35moe)
// loaded from a
// GGUF file (formats.md §3).
//
// The file stays memory-mapped for the model's lifetime and every weight is a leaf Tensor whose data points
// straight into the mapping, in the file's own dtype (f32, f16, bf16 or a block type): nothing is copied or
// converted at load time. Loading checks every tensor the graph uses for presence, type and shape against
// the hyper-parameters, and rejects tensors it would not use, so a file either runs exactly or is refused
// with a message naming the file and the tensor.
#pragma once

#include "ggml_rp/core/context.h"
#include "gguf/gguf.h"
#include "models/arch/hparams.h"

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace rp {

// The weights of one decoder layer (names are blk.N.<name>.weight / .bias).
struct LayerWeights {
    Tensor * attn_norm = nullptr;   // [n_embd] f32
    Tensor * wq = nullptr;          // attn_q      [n_embd, n_q]
    Tensor * wk = nullptr;          // attn_k      [n_embd, n_kv]
    Tensor * wv = nullptr;          // attn_v      [n_embd, n_kv]
    Tensor * bq = nullptr;          // qwen2, gpt-oss: attn_q.bias [n_q] f32
    Tensor * bk = nullptr;          //                 attn_k.bias [n_kv]
    Tensor * bv = nullptr;          //                 attn_v.bias [n_kv]
    Tensor * q_norm = nullptr;      // qwen3, gemma3: attn_q_norm [head_dim] f32
    Tensor * k_norm = nullptr;      //             attn_k_norm [head_dim] f32
    Tensor * wo = nullptr;          // attn_output [n_q, n_embd]
    Tensor * ffn_norm = nullptr;    // [n_embd] f32 (gpt-oss: post_attention_norm, the same place)
    Tensor * ffn_gate = nullptr;    // [n_embd, n_ff]
    Tensor * ffn_up = nullptr;      // [n_embd, n_ff]
    Tensor * ffn_down = nullptr;    // [n_ff, n_embd]
    // qwen3moe, in place of ffn_gate / ffn_up / ffn_down:
    Tensor * ffn_gate_inp = nullptr;   // the router [n_embd, n_expert]
    Tensor * ffn_gate_exps = nullptr;  // [n_embd, n_ff_exp, n_expert]
    Tensor * ffn_up_exps = nullptr;    // [n_embd, n_ff_exp, n_expert]
    Tensor * ffn_down_exps = nullptr;  // [n_ff_exp, n_embd, n_expert]
    // gpt-oss:
    Tensor * bo = nullptr;              // attn_output.bias [n_embd] f32
    Tensor * attn_sinks = nullptr;      // attn_sinks.weight [n_head] f32
    Tensor * ffn_gate_inp_b = nullptr;  // ffn_gate_inp.bias [n_expert] f32
    Tensor * ffn_gate_exps_b = nullptr; // ffn_gate_exps.bias [n_ff_exp, n_expert] f32
    Tensor * ffn_up_exps_b = nullptr;   // ffn_up_exps.bias [n_ff_exp, n_expert] f32
    Tensor * ffn_down_exps_b = nullptr; // ffn_down_exps.bias [n_embd, n_expert] f32
    // gemma3:
    Tensor * attn_post_norm = nullptr;  // post_attention_norm [n_embd] f32, on the attention's output
    Tensor * ffn_post_norm = nullptr;   // post_ffw_norm [n_embd] f32, on the feed-forward's output
    // phi3 (ffn_up then holds [n_embd, 2 n_ff]: the gate's rows, then the up projection's; ffn_gate is unset):
    Tensor * wqkv = nullptr;            // attn_qkv [n_embd, n_q + 2 n_kv] in place of wq / wk / wv
    // RoPE frequency factors [n_rot / 2] f32 (ops/rope.h freq_factors), one tensor shared by every layer: Llama 3's
    // rope_freqs, or phi3's rope_factors_short / _long as the context chooses (Model::graph_weights). A constant:
    // never trained (is_constant).
    Tensor * rope_freqs = nullptr;
    // qwen35's Gated DeltaNet layers (models/arch/delta_net_block.cpp), wqkv then holding the convolution's channels
    // [n_embd, 2 Dk Hk + Dv Hv] (q, k, v rows):
    Tensor * ssm_gate = nullptr;    // attn_gate [n_embd, Dv Hv]: z, the gate of the output norm
    Tensor * ssm_beta = nullptr;    // ssm_beta [n_embd, Hv]
    Tensor * ssm_alpha = nullptr;   // ssm_alpha [n_embd, Hv]
    Tensor * ssm_dt = nullptr;      // ssm_dt.bias [Hv] f32
    Tensor * ssm_a = nullptr;       // ssm_a [Hv] f32: A = -exp(A_log)
    Tensor * ssm_conv1d = nullptr;  // ssm_conv1d [d_conv, conv channels] f32
    Tensor * ssm_norm = nullptr;    // ssm_norm [Dv] f32
    Tensor * ssm_out = nullptr;     // ssm_out [Dv Hv, n_embd]
    // qwen35moe's shared expert, beside the routed ones:
    Tensor * ffn_gate_inp_shexp = nullptr;  // [n_embd] f32: its gate's logit per token
    Tensor * ffn_gate_shexp = nullptr;      // [n_embd, n_ff_shexp]
    Tensor * ffn_up_shexp = nullptr;        // [n_embd, n_ff_shexp]
    Tensor * ffn_down_shexp = nullptr;      // [n_ff_shexp, n_embd]

    // Every slot, in the order the layer's tensors are listed everywhere (uploads, checkpoints, dumps).
    static constexpr size_t kSlots = 40;
    std::array<Tensor **, kSlots> slots() {
        return {&attn_norm, &wq, &wk, &wv, &bq, &bk, &bv, &q_norm, &k_norm, &wo, &ffn_norm, &ffn_gate, &ffn_up, &ffn_down,
                &ffn_gate_inp, &ffn_gate_exps, &ffn_up_exps, &ffn_down_exps, &bo, &attn_sinks, &ffn_gate_inp_b,
                &ffn_gate_exps_b, &ffn_up_exps_b, &ffn_down_exps_b, &attn_post_norm, &ffn_post_norm, &wqkv, &rope_freqs,
                &ssm_gate, &ssm_beta, &ssm_alpha, &ssm_dt, &ssm_a, &ssm_conv1d, &ssm_norm, &ssm_out,
                &ffn_gate_inp_shexp, &ffn_gate_shexp, &ffn_up_shexp, &ffn_down_shexp};
    }
    std::array<Tensor *, kSlots> tensors() const {
        return {attn_norm, wq, wk, wv, bq, bk, bv, q_norm, k_norm, wo, ffn_norm, ffn_gate, ffn_up, ffn_down,
                ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps, bo, attn_sinks, ffn_gate_inp_b,
                ffn_gate_exps_b, ffn_up_exps_b, ffn_down_exps_b, attn_post_norm, ffn_post_norm, wqkv, rope_freqs,
                ssm_gate, ssm_beta, ssm_alpha, ssm_dt, ssm_a, ssm_conv1d, ssm_norm, ssm_out,
                ffn_gate_inp_shexp, ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp};
    }
    // Whether a slot holds a constant of the architecture rather than a weight (the RoPE factors).
    bool is_constant(const Tensor * t) const { return t && t == rope_freqs; }
};

// The tensors the graph builders read: a model's own weights, or a trainer's fp32 masters standing in for them.
struct ModelWeights {
    Tensor * tok_embd = nullptr;
    Tensor * output_norm = nullptr;
    Tensor * output = nullptr;  // == tok_embd for a tied head
    std::vector<LayerWeights> layers;
    bool tied_output() const { return output == tok_embd; }
};

class Model {
public:
    // Maps and validates `path`. Throws rp::Error naming the file and the key or tensor at fault.
    static std::unique_ptr<Model> load(const std::string & path);

    Model(const Model &) = delete;
    Model & operator=(const Model &) = delete;

    const HParams & hparams() const { return hp_; }
    const gguf::Reader & file() const { return *file_; }
    const std::string & path() const { return file_->path(); }

    Tensor * tok_embd = nullptr;     // [n_embd, n_vocab]
    Tensor * output_norm = nullptr;  // [n_embd] f32
    Tensor * output = nullptr;       // [n_embd, n_vocab]; == tok_embd when the file has no output.weight
    std::vector<LayerWeights> layers;

    // phi3's LongRoPE factors for a context beyond rope_n_ctx_orig (layers[].rope_freqs holds the short ones).
    Tensor * rope_factors_long = nullptr;
    // qwen35's multi-token prediction blocks (blk.N.* from N = n_layer on): in weights(), never in a graph.
    std::vector<Tensor *> mtp;
    // Whether t is a constant of the architecture rather than a weight: the RoPE factors, either set.
    bool is_constant(const Tensor * t) const {
        return t && ((!layers.empty() && layers[0].is_constant(t)) || t == rope_factors_long);
    }

    bool tied_output() const { return output == tok_embd; }
    // The weights as the graph builders take them, for a context of n_ctx tokens: phi3's long RoPE factors when
    // n_ctx exceeds the original context (llama.cpp's choice by n_ctx; HF's by the sequence), else the short ones.
    ModelWeights graph_weights(int64_t n_ctx = 0) const;
    // The weight leaf of a GGUF tensor name ("blk.3.attn_q.weight"), or nullptr.
    Tensor * find(std::string_view name) const;
    // Every weight leaf, in file order.
    const std::vector<Tensor *> & weights() const { return weights_; }
    // Number of parameters (elements of every weight tensor).
    int64_t n_params() const;

private:
    Model() = default;

    std::unique_ptr<gguf::Reader> file_;
    HParams hp_;
    Context ctx_;                    // owns the weight leafs (their data is the mapped file)
    std::vector<Tensor *> weights_;
};

} // namespace rp
