#include "models/convert/hf_tokenizer.h"

#include "base/atomic_file.h"
#include "base/error.h"
#include "ggml_rp/core/json.h"
#include "gguf/gguf.h"
#include "models/text/tokenizer.h"
#include "models/text/unicode.h"

#include <algorithm>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace rp {

namespace {

// The split regex of each pre-tokenizer as the model's own tokenizer.json states it (llama.cpp's matchers in
// text/tokenizer_pretokenize.cpp follow these); GPT-2's is ByteLevel's built-in one.
const char * split_regex(PreTokenizer kind) {
    switch (kind) {
    case PreTokenizer::Llama3:
        return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    case PreTokenizer::Qwen2:
        return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    case PreTokenizer::Qwen35:
        return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    case PreTokenizer::Gpt4o:
        return R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    case PreTokenizer::Tekken:
        return R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    case PreTokenizer::Gpt2:
    case PreTokenizer::Default:
        break;
    }
    return nullptr;
}

std::string pre_tokenizer_json(PreTokenizer kind) {
    if (kind == PreTokenizer::Gpt2)
        return R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})";
    std::string s = R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": )";
    json::append_string(s, split_regex(kind));
    s += R"(}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})";
    return s;
}

// BOS / EOS around each sequence as the file asks (TemplateProcessing), else ByteLevel's offsets only.
std::string post_processor_json(const Tokenizer & tok) {
    const bool bos = tok.add_bos() && tok.bos() != kTokenNull, eos = tok.add_eos() && tok.eos() != kTokenNull;
    if (!bos && !eos) return R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false})";
    auto special = [&](int32_t id, int type_id) {
        std::string s = R"({"SpecialToken": {"id": )";
        json::append_string(s, std::string(tok.token_text(id)));
        return s + ", \"type_id\": " + std::to_string(type_id) + "}}";
    };
    auto sequence = [](const char * id, int type_id) { return std::string(R"({"Sequence": {"id": ")") + id + "\", \"type_id\": " + std::to_string(type_id) + "}}"; };
    auto template_of = [&](bool pair) {
        std::string s = "[";
        for (int part = 0; part < (pair ? 2 : 1); ++part) {
            if (part) s += ", ";
            if (bos) s += special(tok.bos(), part) + ", ";
            s += sequence(part ? "B" : "A", part);
            if (eos) s += ", " + special(tok.eos(), part);
        }
        return s + "]";
    };
    std::vector<int32_t> ids;  // each special token once (BOS and EOS may be one token)
    if (bos) ids.push_back(tok.bos());
    if (eos && !(bos && tok.eos() == tok.bos())) ids.push_back(tok.eos());
    std::string specials = "{";
    for (int32_t id : ids) {
        const std::string text(tok.token_text(id));
        if (specials.size() > 1) specials += ", ";
        json::append_string(specials, text);
        specials += R"(: {"id": )";
        json::append_string(specials, text);
        specials += ", \"ids\": [" + std::to_string(id) + "], \"tokens\": [";
        json::append_string(specials, text);
        specials += "]}";
    }
    specials += "}";
    return R"({"type": "TemplateProcessing", "single": )" + template_of(false) + ", \"pair\": " + template_of(true) +
           ", \"special_tokens\": " + specials + "}";
}

// One added token's fields (tokenizer.json's "added_tokens" and tokenizer_config.json's "added_tokens_decoder");
// rstrip: the whitespace after it is absorbed (llama.cpp's RSTRIP attribute: Phi-3's special tokens).
std::string added_token_fields(std::string_view text, bool special, bool rstrip) {
    std::string s = R"("content": )";
    json::append_string(s, std::string(text));
    s += R"(, "single_word": false, "lstrip": false, "rstrip": )";
    s += rstrip ? "true" : "false";
    s += R"(, "normalized": false, "special": )";
    return s + (special ? "true" : "false");
}

std::string token_or_null(const Tokenizer & tok, int32_t id) {
    if (id == kTokenNull) return "null";
    std::string s;
    json::append_string(s, std::string(tok.token_text(id)));
    return s;
}

// A SentencePiece vocabulary's merges as a BPE list, as transformers' converter (SentencePieceExtractor) makes
// them for the tokenizer.json of Llama 2, Mistral and Gemma: every split of every token into two tokens, ranked by
// the whole token's score (highest first), then by its id, then by the parts' ids. llama.cpp merges the pair whose
// token scores highest, the leftmost on a tie; BPE takes the lowest rank, the leftmost on a tie. The two differ only
// where overlapping pairs make different tokens of the same score (Llama 2's runs of ▁ all score -1e9: its own
// tokenizer.json has the same ranks).
struct SpmMerge {
    std::string_view left, right;
    float score;
    int32_t id, left_id, right_id;
};

std::vector<SpmMerge> spm_merges(const Tokenizer & tok, const std::unordered_map<std::string_view, int32_t> & ids) {
    std::vector<SpmMerge> merges;
    for (int32_t id = 0; id < tok.n_vocab(); ++id) {
        const std::string_view t = tok.token_text(id);
        for (size_t cut = utf8_len(static_cast<uint8_t>(t[0])); cut < t.size(); cut += utf8_len(static_cast<uint8_t>(t[cut]))) {
            const auto l = ids.find(t.substr(0, cut)), r = ids.find(t.substr(cut));
            if (l != ids.end() && r != ids.end()) merges.push_back({l->first, r->first, tok.score(id), id, l->second, r->second});
        }
    }
    std::sort(merges.begin(), merges.end(), [](const SpmMerge & a, const SpmMerge & b) {
        if (a.score != b.score) return a.score > b.score;
        if (a.id != b.id) return a.id < b.id;
        return a.left_id != b.left_id ? a.left_id < b.left_id : a.right_id < b.right_id;
    });
    return merges;
}

} // namespace

HfTokenizerFiles hf_tokenizer_files(const gguf::Reader & file, uint32_t model_max_length) {
    const Tokenizer tok(file);
    auto refuse = [&](const std::string & why) { throw Error(file.path() + ": the vocabulary cannot be written as tokenizer.json exactly: " + why); };
    const bool spm = tok.model() == TokenizerModel::Spm;
    if (!spm && tok.pre() == PreTokenizer::Default)
        refuse(tok.pre_name().empty() ? std::string("no tokenizer.ggml.pre: llama.cpp's fallback pre-tokenizer is no Hugging Face tokenizer's")
                                      : "tokenizer.ggml.pre '" + tok.pre_name() + "' is llama.cpp's fallback, no Hugging Face tokenizer's");

    // The vocabulary: every token (ids as the GGUF's), each text once and valid UTF-8.
    const int32_t n = tok.n_vocab();
    std::unordered_map<std::string_view, int32_t> ids;
    ids.reserve(static_cast<size_t>(n));
    for (int32_t id = 0; id < n; ++id) {
        const std::string_view text = tok.token_text(id);
        if (first_invalid_utf8(text) != std::string_view::npos) refuse("token " + std::to_string(id) + "'s text is not valid UTF-8");
        if (!ids.emplace(text, id).second)
            refuse("token " + std::to_string(id) + " repeats the text of token " + std::to_string(ids[text]));
    }
    std::string vocab = "{";
    for (int32_t id = 0; id < n; ++id) {
        if (id) vocab += ", ";
        json::append_string(vocab, std::string(tok.token_text(id)));
        vocab += ": " + std::to_string(id);
    }
    vocab += "}";

    std::string merges = "[";
    auto add_merge = [&](std::string_view left, std::string_view right) {
        merges += merges.size() > 1 ? ", [" : "[";
        json::append_string(merges, std::string(left));
        merges += ", ";
        json::append_string(merges, std::string(right));
        merges += "]";
    };
    if (spm) {
        for (const SpmMerge & m : spm_merges(tok, ids)) add_merge(m.left, m.right);
    } else {
        // The merges in rank order, as the GGUF holds them ("left right", split at the first space after the first byte).
        const std::vector<std::string> & ms = file.get_string_array("tokenizer.ggml.merges");
        for (size_t i = 0; i < ms.size(); ++i) {
            const std::string & m = ms[i];
            const size_t pos = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
            if (pos == std::string::npos) refuse("merge " + std::to_string(i) + " ('" + m + "') is not two parts");
            const std::string left = m.substr(0, pos), right = m.substr(pos + 1);
            const std::string joined = left + right;
            for (const std::string * part : {&left, &right, &joined})
                if (!ids.count(*part)) refuse("merge " + std::to_string(i) + " ('" + m + "') makes or uses '" + *part + "', which is no token");
            add_merge(left, right);
        }
    }
    merges += "]";

    // Added tokens: CONTROL and UNKNOWN (special) and USER_DEFINED (not special) ones, which llama.cpp cuts out of the
    // text first.
    std::string added, decoder_map;  // the entries, one a line
    for (int32_t id = 0; id < n; ++id) {
        const uint32_t a = tok.attr(id);
        if (!(a & (kAttrControl | kAttrUnknown | kAttrUserDefined))) continue;
        const std::string fields = added_token_fields(tok.token_text(id), (a & (kAttrControl | kAttrUnknown)) != 0, (a & kAttrRstrip) != 0);
        const char * sep = added.empty() ? "\n    " : ",\n    ";
        added += sep + ("{\"id\": " + std::to_string(id) + ", " + fields + "}");
        decoder_map += sep + ("\"" + std::to_string(id) + "\": {" + fields + "}");
    }
    const char * close = added.empty() ? "" : "\n  ";

    HfTokenizerFiles out;
    std::string & j = out.tokenizer_json;
    j = "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [" + added + close + "],\n";
    if (spm) {
        // Spaces as ▁, and one before each piece of text between added tokens when the file adds a space prefix
        // (llama.cpp: before the first fragment and after each token fragment); no pre-tokenizer (one word).
        j += tok.add_space_prefix() ? R"(  "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, )"
                                      R"({"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},)" "\n"
                                    : R"(  "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},)" "\n";
        j += "  \"pre_tokenizer\": null,\n";
    } else {
        j += "  \"normalizer\": null,\n";
        j += "  \"pre_tokenizer\": " + pre_tokenizer_json(tok.pre()) + ",\n";
    }
    j += "  \"post_processor\": " + post_processor_json(tok) + ",\n";
    if (spm) {
        j += R"(  "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, )"
             R"({"type": "ByteFallback"}, {"type": "Fuse"})";
        j += tok.add_space_prefix() ? R"(, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},)" "\n" : "]},\n";
        j += R"(  "model": {"type": "BPE", "dropout": null, "unk_token": )" + token_or_null(tok, tok.unk()) +
             R"(, "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false)";
    } else {
        j += R"(  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},)" "\n";
        j += R"(  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null, )"
             R"("fuse_unk": false, "byte_fallback": false, "ignore_merges": )";
        j += tok.ignore_merges() ? "true" : "false";
    }
    j += ",\n    \"vocab\": " + vocab + ",\n    \"merges\": " + merges + "}\n}\n";

    std::string & c = out.tokenizer_config_json;
    c = "{\n";
    c += "  \"add_bos_token\": " + std::string(tok.add_bos() ? "true" : "false") + ",\n";
    c += "  \"add_eos_token\": " + std::string(tok.add_eos() ? "true" : "false") + ",\n";
    c += "  \"added_tokens_decoder\": {" + decoder_map + close + "},\n";
    c += "  \"bos_token\": " + token_or_null(tok, tok.bos()) + ",\n";
    c += "  \"eos_token\": " + token_or_null(tok, tok.eos()) + ",\n";
    c += "  \"pad_token\": " + token_or_null(tok, tok.pad()) + ",\n";
    c += "  \"unk_token\": " + token_or_null(tok, tok.unk()) + ",\n";
    if (!tok.chat_template().empty()) c += "  \"chat_template\": " + json::quoted(tok.chat_template()) + ",\n";
    c += "  \"clean_up_tokenization_spaces\": " + std::string(tok.clean_spaces() ? "true" : "false") + ",\n";
    if (model_max_length) c += "  \"model_max_length\": " + std::to_string(model_max_length) + ",\n";
    c += "  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n}\n";
    return out;
}

void export_hf_tokenizer(const std::string & path, const std::string & dir) {
    const auto file = gguf::Reader::open(path);
    uint32_t context = 0;
    if (file->has("general.architecture")) {
        const std::string key = file->get_string("general.architecture") + ".context_length";
        if (file->has(key)) context = file->get_u32(key);
    }
    const HfTokenizerFiles files = hf_tokenizer_files(*file, context);
    OutputDir out(dir);
    AtomicFile json(out.file("tokenizer.json")), config(out.file("tokenizer_config.json"));
    json.write(files.tokenizer_json);
    config.write(files.tokenizer_config_json);
    json.commit();
    config.commit();
    out.commit();
}

} // namespace rp
