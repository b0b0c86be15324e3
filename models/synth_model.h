// The synthetic-model writer: random-weight llama / qwen2 / qwen3 models of any shape, written with our GGUF
// writer — for benchmarks (a Qwen3-1.7B or 0.6B shape without downloading it) and for tests of shapes the
// shared files do not cover (GQA 3:1, head_dim 48 and 128, more layers, rope bases 1e4 / 1e6, quantized
// weights). The tokenizer keys are copied from a real file (stories260K: SentencePiece, a qwen2 vocabulary:
// byte-level BPE) so that llama.cpp loads the result. Weights are scaled so that activations stay O(1) and
// logits are O(1..10). `rp-gguf synth` is its command line.
#pragma once

#include "gguf/types.h"

#include <cstdint>
#include <string>

namespace rp {

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

} // namespace rp
