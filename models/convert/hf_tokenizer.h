// A GGUF's vocabulary as Hugging Face's tokenizer files (tokenizer.json + tokenizer_config.json): what
// transformers, vLLM, SGLang and tokenizers.js load next to a model exported with convert/hf_export.h.
//
// Written only where the files tokenize exactly as the GGUF does (as llama.cpp and our Tokenizer do):
//   - byte-level BPE (tokenizer.ggml.model = gpt2) with the pre-tokenizers llama.cpp names gpt-2, llama-bpe / llama3
//     (and dbrx), qwen2, qwen35, gpt-4o and tekken: the model is BPE over the GGUF's merges, the pre-tokenizer the
//     original regex split then ByteLevel, whole-word tokens first where llama.cpp ignores merges (llama3, tekken);
//   - SentencePiece (tokenizer.ggml.model = llama: Llama 2, Mistral, Gemma, Phi-3) as transformers writes it: spaces
//     as ▁ (and one before each piece of text when the file adds a space prefix), BPE over merges made from the
//     scores in the order transformers' converter gives them, byte fallback;
//   - CONTROL and UNKNOWN tokens are special added tokens, USER_DEFINED ones non-special added tokens (all matched
//     in raw text before the split, as llama.cpp matches them with parse_special; rstrip where llama.cpp absorbs
//     the whitespace after them: Phi-3's); BOS / EOS added by a TemplateProcessing post-processor when the file
//     says so.
// Also refused, naming the reason: llama.cpp's fallback "default" pre-tokenizer (no Hugging Face tokenizer has it),
// byte-level merges whose parts are not tokens, token texts repeated or not UTF-8.
// Known differences of the engines, not of the files: with o200k's and tekken's regexes a mark (\p{M}) joins the
// word next to it, which llama.cpp's matchers (and ours) do not do; where overlapping SentencePiece pairs make
// different tokens of the same score, llama.cpp merges the leftmost, BPE the lower rank; after an rstrip token
// llama.cpp absorbs ASCII whitespace (C isspace), Hugging Face's tokenizers any Unicode White_Space.
#pragma once

#include <cstdint>
#include <string>

namespace gguf {
class Reader;
}

namespace rp {

struct HfTokenizerFiles {
    std::string tokenizer_json;
    std::string tokenizer_config_json;
};

// The two files of the vocabulary in `file`. model_max_length: tokenizer_config.json's (the model's training
// context; 0: not written). Throws rp::Error naming the file and saying why the vocabulary cannot be written exactly.
HfTokenizerFiles hf_tokenizer_files(const gguf::Reader & file, uint32_t model_max_length = 0);

// The two files of the GGUF at `path` (a model or a vocabulary-only file) written into `dir` (made when missing;
// the files renamed into place once both are complete). model_max_length: the file's context_length when it has
// one. Throws rp::Error as hf_tokenizer_files does, before anything is written.
void export_hf_tokenizer(const std::string & path, const std::string & dir);

} // namespace rp
