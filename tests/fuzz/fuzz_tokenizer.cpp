// libFuzzer target: arbitrary bytes -> the SentencePiece (llama-spm) and byte-level BPE (qwen2) tokenizers.
// Encoding never fails or reads out of bounds (with and without special-token parsing), every id is in the
// vocabulary, encoding is deterministic, and for valid UTF-8 without special tokens decode(encode(x)) == x
// (SentencePiece: also without a literal U+2581, its space).
#include "base/error.h"
#include "models/text/tokenizer.h"
#include "models/text/unicode.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace {

const rp::Tokenizer & vocab(const char * name) {
    static std::unique_ptr<rp::Tokenizer> spm = rp::Tokenizer::load(std::string(RP_SHARED_DIR) + "/models/vocab/ggml-vocab-llama-spm.gguf");
    static std::unique_ptr<rp::Tokenizer> bpe = rp::Tokenizer::load(std::string(RP_SHARED_DIR) + "/models/vocab/ggml-vocab-qwen2.gguf");
    return std::string(name) == "spm" ? *spm : *bpe;
}

void check(const rp::Tokenizer & tok, const std::string & s, bool round_trip) {
    for (const bool special : {false, true}) {
        const std::vector<int32_t> ids = tok.encode(s, special, special);
        for (int32_t id : ids)
            if (id < 0 || id >= tok.n_vocab()) __builtin_trap();
        if (tok.encode(s, special, special) != ids) __builtin_trap();
        const std::string back = tok.decode(ids);
        if (!special && round_trip && back != s) __builtin_trap();
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string s(reinterpret_cast<const char *>(data), size);
    // Round trips hold for text: valid UTF-8 without NUL (and nothing that looks like a special token).
    const bool text = rp::first_invalid_utf8(s) == std::string::npos && s.find('\0') == std::string::npos &&
                      s.find("<|") == std::string::npos && s.find("<s>") == std::string::npos && s.find("</s>") == std::string::npos;
    try {
        // SentencePiece writes spaces as U+2581 and decodes every U+2581 as a space (as llama.cpp does): a
        // literal U+2581 in the text cannot come back.
        check(vocab("spm"), s, text && s.find("\xe2\x96\x81") == std::string::npos);
        check(vocab("bpe"), s, text);
    } catch (const rp::Error &) {
        __builtin_trap();  // encoding any bytes must not fail
    }
    return 0;
}
