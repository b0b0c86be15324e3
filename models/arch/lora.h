// LoRA adapters in llama.cpp's GGUF layout (formats.md §5): load + validate against a base model exactly as
// llama.cpp does, and save in the same layout so that llama.cpp loads our adapters unchanged.
//
//   general.type = "adapter", adapter.type = "lora", general.architecture = the base model's,
//   adapter.lora.alpha (f32, absent = 0). For a base weight <w> with ne [n_in, n_out]:
//     <w>.lora_a ne [n_in, r], <w>.lora_b ne [r, n_out]          y = W x + scale * B (A x)
//   token_embd (roles swapped): lora_a ne [r, n_vocab] (gathered per token), lora_b ne [r, n_embd].
//   Expert weights (qwen3moe *_exps, ne [n_in, n_out, n_expert]): lora_a ne [n_in, r, n_expert], lora_b ne
//   [r, n_out, n_expert], one pair per expert, as llama.cpp's build_lora_mm_id applies them.
//   r = lora_b.ne[0]; scale = user_scale * alpha / r, or user_scale when alpha = 0.
#pragma once

#include "ggml_rp/core/context.h"
#include "gguf/gguf.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace rp {

class Model;

// One adapted base weight.
struct LoraTensor {
    std::string base;       // base tensor name, e.g. "blk.0.attn_q.weight"
    Tensor * base_weight;   // the model's leaf for it
    Tensor * a;             // <base>.lora_a
    Tensor * b;             // <base>.lora_b
    bool embedding;         // token_embd: roles of A and B swapped (see above)
    int64_t rank() const { return b->ne[0]; }
};

class LoraAdapter {
public:
    // Loads `path` and validates it against `model`. Tensor types F32, F16, BF16 and Q8_0 are accepted. A pair
    // on token_embd of a model with a tied LM head is refused (llama.cpp would apply it to the head and abort).
    // Throws rp::Error naming the adapter file and the key or tensor at fault.
    static std::unique_ptr<LoraAdapter> load(const std::string & path, const Model & model);

    // A new adapter (f32 A and B, zero-filled, owned by the adapter) on the named base weights, for training;
    // allocate = false: shapes only (no data: for a memory plan).
    // Rank r, the given alpha. Throws for an unknown base name, and for output.weight / token_embd.weight of a
    // model with a tied LM head (llama.cpp cannot run either).
    static std::unique_ptr<LoraAdapter> create(const Model & model, const std::vector<std::string> & targets,
                                               int64_t rank, float alpha, bool allocate = true);

    LoraAdapter(const LoraAdapter &) = delete;
    LoraAdapter & operator=(const LoraAdapter &) = delete;

    // Writes the adapter (temp file + rename) in llama.cpp's layout, tensors in their current dtype.
    void save(const std::string & path) const;

    float alpha() const { return alpha_; }
    const std::string & arch() const { return arch_; }
    const std::string & path() const { return path_; }  // empty for a created adapter
    const std::vector<LoraTensor> & tensors() const { return tensors_; }
    // The pair for a base tensor name, or nullptr.
    const LoraTensor * find(std::string_view base) const;
    // The factor applied to B (A x) for this tensor: user_scale * alpha / r (user_scale when alpha = 0).
    float scale(const LoraTensor & t, float user_scale = 1.0f) const;

private:
    LoraAdapter() = default;

    std::unique_ptr<gguf::Reader> file_;  // loaded adapters keep their file mapped (tensor data points into it)
    std::string path_, arch_;
    float alpha_ = 0.0f;
    Context ctx_;
    std::vector<LoraTensor> tensors_;
};

} // namespace rp
