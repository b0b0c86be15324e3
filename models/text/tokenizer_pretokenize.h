// Pre-tokenizers of the byte-level BPE tokenizers (formats.md §4.3-4.4): split text into the words that
// BPE merges never cross. Hand-written matchers for llama.cpp's regexes (no std::regex: too slow, and it
// has no Unicode classes); each follows the regex's leftmost-first alternation and reproduces llama.cpp's
// splitter for it, including its edge cases.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rp {

enum class PreTokenizer : uint8_t {
    // tokenizer.ggml.pre missing or "default": four regexes applied in turn, each splitting the pieces
    // of the previous one:  [\p{P}\$\+<=>\^~\|]+   then the GPT-2 regex   then \p{N}+   then [0-9][0-9][0-9]
    Default,
    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    Gpt2,
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    Llama3,
    // as Llama3 with \p{N} (single digits)
    Qwen2,
    // as Qwen2 with [\p{L}\p{M}] for letters (and marks excluded from the punctuation branch)
    Qwen35,
    // GPT-4o / o200k (gpt-oss, Llama 4), as llama.cpp rewrites it for std::regex:
    // [^\r\n\p{L}\p{N}]?U*L+C?|[^\r\n\p{L}\p{N}]?U+L*C?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
    // with U a letter other than a-z, L a letter other than A-Z, C an ASCII-case-insensitive 's 't 're 've 'm 'll 'd
    Gpt4o,
    // Mistral's tekken (Mistral Nemo, Mistral Small 3, Ministral 3): as Gpt4o without the contractions C and
    // with \p{N} (single digits)
    Tekken,
};

// Splits n code points into words. Returns the length of each word in code points, in order; the
// lengths sum to n and none is zero.
std::vector<uint32_t> pretokenize(PreTokenizer kind, const uint32_t * cpts, size_t n);

} // namespace rp
