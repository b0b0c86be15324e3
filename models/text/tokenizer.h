// Tokenizers of GGUF models, reproducing llama.cpp's token ids byte-exactly (formats.md §4):
//   tokenizer.ggml.model = "llama": SentencePiece-style (score-ordered bigram merges, byte fallback <0xXX>)
//   tokenizer.ggml.model = "gpt2":  byte-level BPE (merge ranks, GPT-2 byte map) after a pre-tokenizer
//                                   chosen by tokenizer.ggml.pre (llama-bpe / llama3, qwen2, gpt-2, default)
// Special tokens (CONTROL / USER_DEFINED / UNKNOWN types) are cut out of the text first, longest first;
// CONTROL and UNKNOWN ones only when parse_special is set.
//
// Loading builds flat hash tables over one text buffer (no node per token), so a 150k-token vocabulary
// loads about as fast as the file reads. A loaded Tokenizer is
// immutable; encode and decode may be called from several threads at once.
#pragma once

#include "models/text/tokenizer_pretokenize.h"
#include "models/text/tokenizer_strmap.h"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gguf {
class Reader;
}

namespace rp {

constexpr int32_t kTokenNull = -1;

// Token attributes, derived from tokenizer.ggml.token_type as llama.cpp does (bit flags; a token has one,
// except that tokens recognised by their text as end-of-generation / FIM gain kAttrControl).
enum TokenAttr : uint32_t {
    kAttrUndefined = 0,        // type 0 or unknown type values
    kAttrUnknown = 1u << 0,    // type 2
    kAttrUnused = 1u << 1,     // type 5
    kAttrNormal = 1u << 2,     // type 1
    kAttrControl = 1u << 3,    // type 3
    kAttrUserDefined = 1u << 4,// type 4
    kAttrByte = 1u << 5,       // type 6
    kAttrRstrip = 1u << 6,     // not a type: the whitespace after the token is absorbed (Phi-3's, by model name)
};

enum class TokenizerModel : uint8_t { Spm, Bpe };

class Tokenizer {
public:
    // Reads the tokenizer.* keys of an open GGUF file. Throws rp::Error naming the file and key for a
    // missing or malformed vocabulary, an unsupported tokenizer.ggml.model or an unknown tokenizer.ggml.pre.
    explicit Tokenizer(const gguf::Reader & reader);
    // Opens `path` and loads its tokenizer.
    static std::unique_ptr<Tokenizer> load(const std::string & path);

    // The tables hold views into the object's own buffers: no copies or moves.
    Tokenizer(const Tokenizer &) = delete;
    Tokenizer & operator=(const Tokenizer &) = delete;

    // Text -> ids. add_special: BOS / EOS as the model asks (add_bos / add_eos). parse_special: also
    // match CONTROL and UNKNOWN token texts (USER_DEFINED ones always match). When `offsets` is given it
    // receives, per id, the byte offset in `text` where the token starts (BOS: 0, EOS: text.size(); a
    // byte-fallback token: the offset of its byte), e.g. to build loss masks. Offsets never decrease.
    std::vector<int32_t> encode(std::string_view text, bool add_special = true, bool parse_special = false,
                                std::vector<size_t> * offsets = nullptr) const;

    // Ids -> text, like llama.cpp's llama_detokenize. remove_special drops a leading BOS / trailing EOS the
    // model adds; unparse_special renders CONTROL / UNKNOWN tokens as their text (else as nothing). The
    // SPM leading space that add_space_prefix inserted is removed unless the first id is a removed BOS.
    // BPE vocabularies other than Qwen also apply llama.cpp's clean-up (" ?" -> "?", " 's" -> "'s", ...).
    std::string decode(const std::vector<int32_t> & ids, bool remove_special = false,
                       bool unparse_special = true) const;
    // The text of one token as decode renders it (▁ -> space, <0xXX> -> the byte, GPT-2 map reversed).
    // Throws rp::Error for an id outside [0, n_vocab).
    std::string token_to_piece(int32_t id, bool special = true) const;
    // The raw vocabulary entry (tokenizer.ggml.tokens[id]).
    std::string_view token_text(int32_t id) const;
    // The id whose text is exactly `text` (the last one when the vocabulary repeats it), or kTokenNull.
    int32_t text_to_token(std::string_view text) const;

    int32_t n_vocab() const { return n_vocab_; }
    int32_t bos() const { return bos_; }
    int32_t eos() const { return eos_; }
    int32_t eot() const { return eot_; }  // end of turn (<|eot_id|>, <|im_end|>, ...), kTokenNull if none
    int32_t unk() const { return unk_; }
    int32_t pad() const { return pad_; }
    bool add_bos() const { return add_bos_; }
    bool add_eos() const { return add_eos_; }
    bool add_space_prefix() const { return add_space_prefix_; }
    // BPE: a pre-tokenized word that is a token whole is taken as it is, before any merge (llama3, tekken).
    bool ignore_merges() const { return ignore_merges_; }
    // decode's clean-up of spaces before punctuation (BPE vocabularies other than Qwen's and o200k's).
    bool clean_spaces() const { return clean_spaces_; }
    // End of generation: eos, eot, eom and tokens whose text llama.cpp treats as such.
    bool is_eog(int32_t id) const;
    uint32_t attr(int32_t id) const;
    bool is_control(int32_t id) const { return (attr(id) & kAttrControl) != 0; }
    float score(int32_t id) const;

    TokenizerModel model() const { return model_; }
    PreTokenizer pre() const { return pre_; }
    const std::string & model_name() const { return model_name_; }  // tokenizer.ggml.model
    const std::string & pre_name() const { return pre_name_; }      // tokenizer.ggml.pre ("" if absent)
    // tokenizer.chat_template, empty when absent.
    const std::string & chat_template() const { return chat_template_; }

private:
    struct Fragment {
        int32_t token;  // kTokenNull: raw text [off, off + len)
        size_t off, len;
    };
    std::vector<Fragment> partition(std::string_view text, bool parse_special) const;
    void encode_spm(std::string_view text, size_t base, bool prefix_space, std::vector<int32_t> & out,
                    std::vector<size_t> * offsets) const;
    void encode_bpe(std::string_view text, size_t base, std::vector<int32_t> & out,
                    std::vector<size_t> * offsets) const;
    void load_vocab(const gguf::Reader & r);
    void load_merges(const gguf::Reader & r);
    void load_special_ids(const gguf::Reader & r);
    int32_t add_piece(std::string_view text);  // id of a piece string, adding it when new

    TokenizerModel model_ = TokenizerModel::Spm;
    PreTokenizer pre_ = PreTokenizer::Default;
    std::string model_name_, pre_name_, chat_template_, path_;
    int32_t n_vocab_ = 0;

    std::string pool_;                     // every token text, back to back
    std::vector<std::string_view> text_;   // id -> text (into pool_)
    std::vector<float> scores_;
    std::vector<uint32_t> attrs_;
    // Pieces: every token text (id = token id) plus the merge parts and results that are not tokens
    // (ids >= n_vocab, texts in extra_). Merges are keyed by the pair of piece ids.
    StrMap pieces_;
    std::deque<std::string> extra_;
    U64Map merge_rank_;                    // (left piece << 32 | right piece) -> rank (merges index)
    std::vector<int32_t> merge_result_;    // rank -> piece id of left + right
    int32_t byte_piece_[256];              // BPE: piece id of each byte's GPT-2 character (-1: none)
    int32_t byte_token_[256];              // SPM: token of each byte (<0xXX>, else the 1-char text; -1)

    std::vector<int32_t> special_;         // CONTROL / USER_DEFINED / UNKNOWN ids, longest text first
    std::vector<int32_t> eog_;             // sorted

    int32_t bos_ = kTokenNull, eos_ = kTokenNull, eot_ = kTokenNull, eom_ = kTokenNull;
    int32_t unk_ = kTokenNull, sep_ = kTokenNull, pad_ = kTokenNull, mask_ = kTokenNull;
    int32_t fim_pre_ = kTokenNull, fim_suf_ = kTokenNull, fim_mid_ = kTokenNull;
    int32_t fim_pad_ = kTokenNull, fim_rep_ = kTokenNull, fim_sep_ = kTokenNull;
    bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
    bool ignore_merges_ = false, clean_spaces_ = false;
};

} // namespace rp
