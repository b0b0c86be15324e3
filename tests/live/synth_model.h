// Random-weight llama / qwen2 / qwen3 models written with our GGUF writer, for shapes the shared files do not
// cover (GQA 3:1, head_dim 48 and 128, more layers, rope bases 1e4 / 1e6, quantized weights). The tokenizer
// keys are copied from a real file (stories260K: SentencePiece, tiny-random-qwen2: byte-level BPE) so that
// llama.cpp loads the result. Weights are scaled so that activations stay O(1) and logits are O(1..10).
// Also used by bench/infer/gen_model.cpp (the ~100M-parameter benchmark model).
#pragma once

#include "gguf/types.h"

#include <cstdint>
#include <string>

namespace rp::live {

struct SynthSpec {
    std::string arch = "llama";   // llama | qwen2 | qwen3
    std::string vocab_from;       // GGUF whose tokenizer.* keys are copied (sets n_vocab)
    uint32_t n_embd = 64, n_head = 4, n_head_kv = 2, head_dim = 16, n_ff = 128, n_layer = 2;
    uint32_t n_ctx_train = 1024;
    float rope_base = 10000.0f;
    bool tied = false;            // no output.weight: the head reuses token_embd
    gguf::TensorType wtype = gguf::TensorType::F32;  // the 2-D weights; norms and biases stay F32
    uint64_t seed = 1;
};

// Writes the model to `path` (temp file, then rename). Throws rp::Error on a bad spec or I/O failure.
// Weights are generated tensor by tensor at write time: a 100M-parameter model never sits in memory.
void write_synth_model(const SynthSpec & spec, const std::string & path);

} // namespace rp::live
