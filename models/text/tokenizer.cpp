// Tokenizer loading (tokenizer.* keys -> tables), special-token partitioning, and decoding. The merge
// loops live in tokenizer_spm.cpp and tokenizer_bpe.cpp. Behaviour follows llama.cpp's llama-vocab.cpp
// (commit 80fb11ac); where it is odd on purpose (defaults, clean-up passes), comments say so.
#include "models/text/tokenizer.h"

#include "base/error.h"
#include "gguf/gguf.h"
#include "models/text/unicode.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace rp {

namespace {

// tokenizer.ggml.pre values llama.cpp accepts for the pre-tokenizers we implement (same regex and flags
// within a group).
struct PreGroup {
    const char * names[11];
    PreTokenizer kind;
    bool llama3_flags = false;  // llama.cpp's llama3 / tekken settings: merges ignored for whole-word tokens, BOS added
};
const PreGroup kPreGroups[] = {
    {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"},
     PreTokenizer::Llama3, true},
    {{"dbrx", "smaug-bpe"}, PreTokenizer::Llama3},  // Llama 3's regex without its settings (Phi-4's files say dbrx)
    {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"}, PreTokenizer::Qwen2},
    {{"qwen35"}, PreTokenizer::Qwen35},
    {{"gpt-4o", "llama4"}, PreTokenizer::Gpt4o},
    {{"tekken"}, PreTokenizer::Tekken, true},
    {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
      "modern-bert"},
     PreTokenizer::Gpt2},
    {{"default"}, PreTokenizer::Default},
};

// Texts by which llama.cpp recognises special tokens the file does not name (llama-vocab.cpp, "auto-detect
// special tokens by text"). A token found this way becomes CONTROL.
const char * const kEotTexts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                  "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                                  "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                  "<end_of_utterance>"};
const char * const kEomTexts[] = {"<|eom_id|>"};
const char * const kFimPreTexts[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                     "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>",
                                     "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"};
const char * const kFimSufTexts[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                     "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>", "<SUF>",
                                     "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"};
const char * const kFimMidTexts[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                     "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>",
                                     "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"};
const char * const kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
const char * const kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
const char * const kFimSepTexts[] = {"<|file_sep|>"};
// Texts that end generation.
const char * const kEogTexts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
                                  "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
                                  "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
                                  "<turn|>", "<|tool_response>",
                                  "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~["};

uint32_t attr_from_type(int64_t type) {
    switch (type) {
        case 1: return kAttrNormal;
        case 2: return kAttrUnknown;
        case 3: return kAttrControl;
        case 4: return kAttrUserDefined;
        case 5: return kAttrUnused;
        case 6: return kAttrByte;
        default: return kAttrUndefined;
    }
}

std::string hex2(uint8_t b) {
    char buf[3];
    std::snprintf(buf, sizeof buf, "%02X", b);
    return buf;
}

} // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string & path) {
    auto reader = gguf::Reader::open(path);
    return std::make_unique<Tokenizer>(*reader);
}

Tokenizer::Tokenizer(const gguf::Reader & r) : path_(r.path()) {
    auto fail = [&](const char * key, const std::string & msg) {
        throw Error(path_ + ": key '" + key + "' " + msg);
    };
    model_name_ = r.get_string("tokenizer.ggml.model");
    pre_name_ = r.get_string_or("tokenizer.ggml.pre", "");
    chat_template_ = r.get_string_or("tokenizer.chat_template", "");

    if (model_name_ == "llama") {
        model_ = TokenizerModel::Spm;
        bos_ = 1;
        eos_ = 2;
        unk_ = 0;
        // SentencePiece: BOS and a leading space by default; tokenizer.ggml.pre is not used.
        pre_ = PreTokenizer::Default;
        add_space_prefix_ = true;
        clean_spaces_ = false;
        add_bos_ = true;
        add_eos_ = false;
    } else if (model_name_ == "gpt2") {
        model_ = TokenizerModel::Bpe;
        bos_ = 11;  // llama.cpp's defaults for gpt2 vocabularies
        eos_ = 11;
        add_space_prefix_ = false;
        clean_spaces_ = true;
        if (pre_name_.empty()) {
            pre_ = PreTokenizer::Default;  // llama.cpp warns loudly: generation quality will suffer
        } else {
            bool found = false, llama3_flags = false;
            for (const PreGroup & g : kPreGroups) {
                for (const char * name : g.names) {
                    if (name && pre_name_ == name) {
                        pre_ = g.kind;
                        llama3_flags = g.llama3_flags;
                        found = true;
                    }
                }
            }
            if (!found) {
                fail("tokenizer.ggml.pre", "has unknown pre-tokenizer type '" + pre_name_ +
                                               "' (supported: llama-bpe/llama3, dbrx, qwen2, qwen35, gpt-4o, tekken, gpt-2, default)");
            }
            if (llama3_flags) {
                ignore_merges_ = true;
                add_bos_ = true;
            }
            if (pre_ == PreTokenizer::Qwen2 || pre_ == PreTokenizer::Qwen35 || pre_ == PreTokenizer::Gpt4o || pre_ == PreTokenizer::Tekken) {
                clean_spaces_ = false;
            }
        }
    } else {
        fail("tokenizer.ggml.model",
             "has unsupported tokenizer model '" + model_name_ + "' (supported: llama = SentencePiece, gpt2 = BPE)");
    }
    add_space_prefix_ = r.get_bool_or("tokenizer.ggml.add_space_prefix", add_space_prefix_);

    load_vocab(r);
    if (model_ == TokenizerModel::Bpe) {
        load_merges(r);
    }
    load_special_ids(r);

    // Byte tables used by the merge loops.
    for (int b = 0; b < 256; ++b) {
        std::string s;
        append_utf8(s, gpt2_byte_to_cpt(static_cast<uint8_t>(b)));
        byte_piece_[b] = pieces_.find(s);
        int32_t id = text_to_token("<0x" + hex2(static_cast<uint8_t>(b)) + ">");
        if (id == kTokenNull) {
            id = text_to_token(std::string(1, static_cast<char>(b)));
        }
        byte_token_[b] = id;
    }
}

void Tokenizer::load_vocab(const gguf::Reader & r) {
    const std::vector<std::string> & tokens = r.get_string_array("tokenizer.ggml.tokens");
    if (tokens.empty() || tokens.size() > static_cast<size_t>(INT32_MAX / 2)) {
        throw Error(path_ + ": key 'tokenizer.ggml.tokens' has " + std::to_string(tokens.size()) + " tokens");
    }
    n_vocab_ = static_cast<int32_t>(tokens.size());
    const size_t n = tokens.size();

    scores_.assign(n, 0.0f);
    if (const gguf::KV * kv = r.find("tokenizer.ggml.scores")) {
        std::vector<float> s;
        if (kv->type == gguf::ValueType::ARRAY && kv->arr_type == gguf::ValueType::I32) {
            for (int64_t v : r.get_int_array(kv->key)) {
                s.push_back(static_cast<float>(v));
            }
        } else {
            s = r.get_f32_array(kv->key);
        }
        if (s.size() < n) {
            throw Error(path_ + ": key 'tokenizer.ggml.scores' has " + std::to_string(s.size()) +
                        " entries for " + std::to_string(n) + " tokens");
        }
        std::copy(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n), scores_.begin());
    }
    attrs_.assign(n, kAttrNormal);
    if (r.has("tokenizer.ggml.token_type")) {
        const std::vector<int64_t> types = r.get_int_array("tokenizer.ggml.token_type");
        if (types.size() < n) {
            throw Error(path_ + ": key 'tokenizer.ggml.token_type' has " + std::to_string(types.size()) +
                        " entries for " + std::to_string(n) + " tokens");
        }
        for (size_t i = 0; i < n; ++i) {
            attrs_[i] = attr_from_type(types[i]);
        }
    }

    // One buffer for all texts; views into it are stable because it is sized once.
    size_t total = 0;
    for (size_t i = 0; i < n; ++i) {
        total += tokens[i].empty() ? 32 : tokens[i].size();
    }
    pool_.reserve(total);
    text_.resize(n);
    pieces_.reserve(n + 1024);  // merge parts that are not tokens are few; the map grows if needed
    for (size_t i = 0; i < n; ++i) {
        const size_t at = pool_.size();
        if (tokens[i].empty()) {
            pool_ += "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp: empty texts get a unique name
        } else {
            pool_ += tokens[i];
        }
        text_[i] = std::string_view(pool_.data() + at, pool_.size() - at);
    }
    for (size_t i = 0; i < n; ++i) {
        pieces_.set(text_[i], static_cast<int32_t>(i));  // a repeated text maps to its last id
    }
}

int32_t Tokenizer::add_piece(std::string_view text) {
    const int32_t id = pieces_.find(text);
    if (id >= 0) {
        return id;
    }
    extra_.emplace_back(text);
    const int32_t new_id = n_vocab_ + static_cast<int32_t>(extra_.size()) - 1;
    pieces_.set(extra_.back(), new_id);
    return new_id;
}

void Tokenizer::load_merges(const gguf::Reader & r) {
    if (!r.has("tokenizer.ggml.merges")) {
        throw Error(path_ + ": key 'tokenizer.ggml.merges' is missing (required by tokenizer.ggml.model = gpt2)");
    }
    const std::vector<std::string> & merges = r.get_string_array("tokenizer.ggml.merges");
    merge_rank_.reserve(merges.size() + 16);
    merge_result_.assign(merges.size(), -1);
    std::string joined;
    for (size_t i = 0; i < merges.size(); ++i) {
        const std::string & m = merges[i];
        // "left right", split at the first space after position 0 (a merge may start with a space)
        const size_t pos = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
        if (pos == std::string::npos) {
            continue;  // llama.cpp records ("", "") for it, which never matches
        }
        const std::string_view left(m.data(), pos);
        const std::string_view right(m.data() + pos + 1, m.size() - pos - 1);
        const int32_t l = add_piece(left);
        const int32_t rr = add_piece(right);
        joined.assign(left);
        joined += right;
        const int32_t res = add_piece(joined);
        const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(rr);
        if (merge_rank_.insert(key, static_cast<int32_t>(i))) {  // the first rank of a repeated pair wins
            merge_result_[i] = res;
        }
    }
}

void Tokenizer::load_special_ids(const gguf::Reader & r) {
    struct Slot {
        const char * key;
        int32_t * id;
    };
    const Slot slots[] = {
        {"tokenizer.ggml.bos_token_id", &bos_},         {"tokenizer.ggml.eos_token_id", &eos_},
        {"tokenizer.ggml.eot_token_id", &eot_},         {"tokenizer.ggml.eom_token_id", &eom_},
        {"tokenizer.ggml.unknown_token_id", &unk_},     {"tokenizer.ggml.seperator_token_id", &sep_},
        {"tokenizer.ggml.padding_token_id", &pad_},     {"tokenizer.ggml.mask_token_id", &mask_},
        {"tokenizer.ggml.fim_pre_token_id", &fim_pre_}, {"tokenizer.ggml.fim_suf_token_id", &fim_suf_},
        {"tokenizer.ggml.fim_mid_token_id", &fim_mid_}, {"tokenizer.ggml.fim_pad_token_id", &fim_pad_},
        {"tokenizer.ggml.fim_rep_token_id", &fim_rep_}, {"tokenizer.ggml.fim_sep_token_id", &fim_sep_},
        {"tokenizer.ggml.prefix_token_id", &fim_pre_},  {"tokenizer.ggml.suffix_token_id", &fim_suf_},
        {"tokenizer.ggml.middle_token_id", &fim_mid_},
    };
    for (const Slot & s : slots) {
        if (*s.id >= n_vocab_) {
            *s.id = kTokenNull;  // a default outside a small vocabulary is disabled
        }
        if (r.has(s.key)) {
            // Out of range (0xFFFFFFFF is common for "none"): llama.cpp warns and keeps the default.
            const int64_t v = r.get_i64(s.key);
            if (v >= 0 && v < n_vocab_) {
                *s.id = static_cast<int32_t>(v);
            }
        }
    }
    add_bos_ = r.get_bool_or("tokenizer.ggml.add_bos_token", add_bos_);
    add_eos_ = r.get_bool_or("tokenizer.ggml.add_eos_token", add_eos_);

    // Special tokens the file does not name, recognised by their text. llama.cpp walks a hash map, so when
    // several texts of one list are present the one it picks is arbitrary; we take the first in list order.
    auto detect = [&](int32_t & id, const auto & texts) {
        if (id != kTokenNull) {
            return;
        }
        for (const char * t : texts) {
            const int32_t found = text_to_token(t);
            if (found != kTokenNull) {
                id = found;
                attrs_[static_cast<size_t>(found)] |= kAttrControl;
                return;
            }
        }
    };
    detect(eot_, kEotTexts);
    detect(eom_, kEomTexts);
    detect(fim_pre_, kFimPreTexts);
    detect(fim_suf_, kFimSufTexts);
    detect(fim_mid_, kFimMidTexts);
    detect(fim_pad_, kFimPadTexts);
    detect(fim_rep_, kFimRepTexts);
    detect(fim_sep_, kFimSepTexts);

    for (int32_t id : {fim_pad_, fim_rep_, fim_sep_}) {
        if (id != kTokenNull) {
            eog_.push_back(id);
        }
    }
    for (const char * t : kEogTexts) {
        const int32_t id = text_to_token(t);
        if (id != kTokenNull) {
            eog_.push_back(id);
            attrs_[static_cast<size_t>(id)] |= kAttrControl;
        }
    }
    for (int32_t id : {eos_, eot_, eom_}) {
        if (id != kTokenNull) {
            eog_.push_back(id);
        }
    }
    std::sort(eog_.begin(), eog_.end());
    eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());

    // Special tokens to cut out of the text, longest first. std::sort (not stable) with llama.cpp's
    // comparator on the same id order gives the same order as llama.cpp for equal lengths too.
    for (int32_t id = 0; id < n_vocab_; ++id) {
        if (attrs_[static_cast<size_t>(id)] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
            special_.push_back(id);
        }
    }
    std::sort(special_.begin(), special_.end(), [&](int32_t a, int32_t b) {
        return text_[static_cast<size_t>(a)].size() > text_[static_cast<size_t>(b)].size();
    });

    // llama.cpp's attributes by model name (its vocabulary loader; GGUF has no place for them): a model named like
    // Phi-3 absorbs the whitespace after its special tokens (HF's rstrip), "</s>" too, but not after <unk>, <s>
    // and <|endoftext|>.
    std::string name = r.get_string_or("general.name", "");
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
        for (int32_t id : special_) {
            attrs_[static_cast<size_t>(id)] |= kAttrRstrip;
        }
        auto set = [&](const char * t, bool on) {
            const int32_t id = text_to_token(t);
            if (id == kTokenNull) {
                return;
            }
            attrs_[static_cast<size_t>(id)] = on ? attrs_[static_cast<size_t>(id)] | kAttrRstrip : attrs_[static_cast<size_t>(id)] & ~kAttrRstrip;
        };
        set("</s>", true);
        for (const char * t : {"<unk>", "<s>", "<|endoftext|>"}) {
            set(t, false);
        }
    }
}

std::string_view Tokenizer::token_text(int32_t id) const {
    if (id < 0 || id >= n_vocab_) {
        throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(n_vocab_) + ")");
    }
    return text_[static_cast<size_t>(id)];
}

int32_t Tokenizer::text_to_token(std::string_view text) const {
    const int32_t id = pieces_.find(text);
    return id < n_vocab_ ? id : kTokenNull;
}

uint32_t Tokenizer::attr(int32_t id) const {
    token_text(id);  // range check
    return attrs_[static_cast<size_t>(id)];
}

float Tokenizer::score(int32_t id) const {
    token_text(id);
    return scores_[static_cast<size_t>(id)];
}

bool Tokenizer::is_eog(int32_t id) const { return id != kTokenNull && std::binary_search(eog_.begin(), eog_.end(), id); }

std::vector<Tokenizer::Fragment> Tokenizer::partition(std::string_view text, bool parse_special) const {
    std::vector<Fragment> frags;
    if (text.empty()) {
        return frags;
    }
    frags.push_back({kTokenNull, 0, text.size()});
    // Qwen has ~290 special tokens: skip at once those whose first byte the text does not contain.
    bool has_byte[256] = {};
    for (char c : text) {
        has_byte[static_cast<uint8_t>(c)] = true;
    }
    std::vector<Fragment> next;
    for (int32_t id : special_) {
        const uint32_t a = attrs_[static_cast<size_t>(id)];
        if (!parse_special && (a & (kAttrControl | kAttrUnknown))) {
            continue;  // USER_DEFINED tokens are matched even then, as in HF tokenizers
        }
        const std::string_view st = text_[static_cast<size_t>(id)];
        if (!has_byte[static_cast<uint8_t>(st[0])]) {
            continue;
        }
        next.clear();
        bool changed = false;
        for (const Fragment & f : frags) {
            if (f.token != kTokenNull) {
                next.push_back(f);
                continue;
            }
            size_t off = f.off;
            const size_t end = f.off + f.len;
            while (off < end) {
                const size_t m = text.substr(0, end).find(st, off);
                if (m == std::string_view::npos) {
                    break;
                }
                if (m > off) {
                    next.push_back({kTokenNull, off, m - off});
                }
                next.push_back({id, m, st.size()});
                off = m + st.size();
                if (a & kAttrRstrip) {  // the whitespace after it is absorbed (C isspace, as llama.cpp)
                    while (off < end && std::isspace(static_cast<unsigned char>(text[off]))) {
                        ++off;
                    }
                }
                changed = true;
            }
            if (off < end) {
                next.push_back({kTokenNull, off, end - off});
            }
        }
        if (changed) {
            frags.swap(next);
        }
    }
    return frags;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special,
                                       std::vector<size_t> * offsets) const {
    std::vector<int32_t> out;
    if (offsets) {
        offsets->clear();
    }
    auto push = [&](int32_t id, size_t at) {
        out.push_back(id);
        if (offsets) {
            offsets->push_back(at);
        }
    };
    const std::vector<Fragment> frags = partition(text, parse_special);
    if (add_special && add_bos_) {
        if (bos_ == kTokenNull) {
            throw Error(path_ + ": the tokenizer asks for a BOS token but has none (tokenizer.ggml.bos_token_id)");
        }
        push(bos_, 0);
    }
    // SPM prefixes a space to the text at the start and after each special token.
    bool prev_special = true;
    for (const Fragment & f : frags) {
        if (f.token != kTokenNull) {
            push(f.token, f.off);
            prev_special = true;
            continue;
        }
        const std::string_view piece = text.substr(f.off, f.len);
        if (model_ == TokenizerModel::Spm) {
            encode_spm(piece, f.off, add_space_prefix_ && prev_special, out, offsets);
        } else {
            encode_bpe(piece, f.off, out, offsets);
        }
        prev_special = false;
    }
    if (add_special && add_eos_) {
        if (eos_ == kTokenNull) {
            throw Error(path_ + ": the tokenizer asks for an EOS token but has none (tokenizer.ggml.eos_token_id)");
        }
        push(eos_, text.size());
    }
    return out;
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
    const std::string_view t = token_text(id);
    const uint32_t a = attrs_[static_cast<size_t>(id)];
    if (!special && (a & (kAttrUnknown | kAttrControl))) {
        return "";
    }
    if (a & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
        return std::string(t);
    }
    if (a & kAttrNormal) {
        std::string s;
        if (model_ == TokenizerModel::Spm) {
            // ▁ (U+2581) -> space
            for (size_t i = 0; i < t.size();) {
                if (t.compare(i, 3, "\xe2\x96\x81") == 0) {
                    s += ' ';
                    i += 3;
                } else {
                    s += t[i++];
                }
            }
            return s;
        }
        // BPE: reverse the GPT-2 byte map; llama.cpp marks characters outside it like this
        const std::vector<uint32_t> cpts = utf8_to_cpts(t);
        for (uint32_t cp : cpts) {
            const int b = gpt2_cpt_to_byte(cp);
            if (b >= 0) {
                s += static_cast<char>(b);
            } else {
                std::string u;
                append_utf8(u, cp);
                s += "[UNK_BYTE_0x";
                for (unsigned char c : u) {
                    char buf[3];
                    std::snprintf(buf, sizeof buf, "%02x", c);
                    s += buf;
                }
                s += std::string(t) + "]";
            }
        }
        return s;
    }
    if (a & kAttrByte) {
        // <0xXX>: strtol of the two characters after "<0x", as llama.cpp
        if (t.size() < 4) {
            return std::string(1, '\0');
        }
        const std::string hex(t.substr(3, 2));
        return std::string(1, static_cast<char>(std::strtol(hex.c_str(), nullptr, 16)));
    }
    return "";  // UNUSED / UNDEFINED render as nothing
}

std::string Tokenizer::decode(const std::vector<int32_t> & ids, bool remove_special, bool unparse_special) const {
    size_t begin = 0, end = ids.size();
    bool remove_space = add_space_prefix_;  // the space SPM's add_space_prefix put in front
    if (remove_special && add_bos_ && end > begin && ids[begin] == bos_) {
        remove_space = false;  // llama.cpp keeps the space when it strips a BOS
        ++begin;
    }
    if (remove_special && add_eos_ && end > begin && ids[end - 1] == eos_) {
        --end;
    }
    std::string text;
    for (size_t i = begin; i < end; ++i) {
        std::string piece = token_to_piece(ids[i], unparse_special);
        if (remove_space && !piece.empty() && piece[0] == ' ') {
            piece.erase(0, 1);
        }
        remove_space = false;
        text += piece;
    }
    if (!clean_spaces_) {
        return text;
    }
    // llama.cpp's three clean-up passes, ported literally (in place, including how pass 2 blanks the
    // space it skipped, which changes what pass 2 sees next).
    std::string & s = text;
    int64_t total = static_cast<int64_t>(s.size());
    {  // " ?", " !", " .", " ," -> drop the space
        const int64_t n = total;
        total = n ? 1 : 0;
        for (int64_t i = 1; i < n; ++i) {
            const char x = s[i];
            if (s[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) {
                --total;
            }
            s[total++] = x;
        }
    }
    {  // " ' " -> "'"
        const int64_t n = total;
        total = n ? 1 : 0;
        for (int64_t i = 1; i < n; ++i) {
            const char x = s[i];
            if (x == '\'' && i + 1 < n && s[i - 1] == ' ' && s[i + 1] == ' ') {
                --total;
                s[++i] = '\0';
            }
            s[total++] = x;
        }
    }
    {  // " 's", " 'm", " 're", " 've" -> drop the space (not " 't", " 'd", " 'll")
        const int64_t n = total;
        total = n ? 1 : 0;
        for (int64_t i = 1; i < n; ++i) {
            const char x = s[i];
            if (s[i - 1] == ' ' && x == '\'' && i + 1 < n) {
                const char x1 = s[i + 1];
                if (x1 == 's' || x1 == 'm') {
                    --total;
                } else if (x1 != 't' && x1 != 'd' && i + 2 < n) {
                    const char x2 = s[i + 2];
                    if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) {
                        --total;
                    }
                }
            }
            s[total++] = x;
        }
    }
    s.resize(static_cast<size_t>(total));
    return s;
}

} // namespace rp
