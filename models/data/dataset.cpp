#include "models/data/dataset.h"

#include "ggml_rp/core/json.h"
#include "base/error.h"
#include "models/text/tokenizer.h"
#include "models/text/unicode.h"

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

namespace rp {

namespace {

// One tokenized example before it is cut into sequences: trained[i] says whether tokens[i] is a label.
struct Tokens {
    std::vector<int32_t> ids;
    std::vector<uint8_t> trained;
};

std::string_view strip_bom(std::string_view s) {
    return s.substr(0, 3) == "\xEF\xBB\xBF" ? s.substr(3) : s;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

std::string_view trim(std::string_view s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

std::vector<std::string_view> split_documents(std::string_view text, std::string_view sep) {
    std::vector<std::string_view> docs;
    auto add = [&](std::string_view d) {
        d = trim(d);
        if (!d.empty()) docs.push_back(d);
    };
    if (sep.empty()) {
        add(text);
        return docs;
    }
    size_t pos = 0;
    for (;;) {
        const size_t hit = text.find(sep, pos);
        if (hit == std::string_view::npos) break;
        add(text.substr(pos, hit - pos));
        pos = hit + sep.size();
    }
    add(text.substr(pos));
    return docs;
}

// The token padding positions get (their labels are always masked).
int32_t pad_token(const Tokenizer & tok) {
    if (tok.pad() != kTokenNull) return tok.pad();
    if (tok.eos() != kTokenNull) return tok.eos();
    return 0;
}

// Appends EOS as a trained token unless the tokenizer already added it.
void append_eos(const Tokenizer & tok, Tokens & t) {
    if (tok.add_eos() || tok.eos() == kTokenNull) return;
    t.ids.push_back(tok.eos());
    t.trained.push_back(1);
}

// Training text must be text: a NUL byte or invalid UTF-8 (a binary file given as data, a wrong encoding) is
// refused at its byte offset unless the caller allows it.
void check_text(std::string_view text, const std::string & source, const DatasetOptions & opt) {
    if (opt.allow_binary) return;
    const size_t nul = text.find('\0');
    const size_t bad = first_invalid_utf8(text);
    const size_t at = std::min(nul, bad);
    if (at == std::string_view::npos) return;
    size_t line = 1;
    for (size_t i = 0; i < at; ++i) line += text[i] == '\n';
    throw Error("dataset " + source + ": byte offset " + std::to_string(at) + " (line " + std::to_string(line) + ") " +
                (at == nul ? "is a NUL byte" : "is not valid UTF-8") +
                ": this does not look like training text (a binary file, another encoding?); allow_binary trains on it anyway");
}

// The text of a data file ("dataset", "prompt" file), whole; errors name it.
std::string read_data_file(const std::string & path, const char * what) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(std::string("cannot open ") + what + " file '" + path + "': " + std::strerror(errno));
    std::ostringstream ss;
    ss << f.rdbuf();
    if (f.bad()) throw Error(std::string("cannot read ") + what + " file '" + path + "'");
    return ss.str();
}

// Calls fn(value, line number) for each non-blank line of JSONL text (a byte-order mark skipped), in order; a line
// that is not JSON is an error naming `source` and the line.
template <class Fn>
void for_each_json_line(std::string_view text, const std::string & source, Fn fn) {
    text = strip_bom(text);
    size_t line_no = 0, pos = 0;
    while (pos < text.size()) {
        size_t eol = text.find('\n', pos);
        if (eol == std::string_view::npos) eol = text.size();
        const std::string_view line = text.substr(pos, eol - pos);
        pos = eol + 1;
        ++line_no;
        if (trim(line).empty()) continue;
        fn(json::parse(std::string(line), source + " line " + std::to_string(line_no)), line_no);
    }
}

void check_options(const DatasetOptions & opt) {
    if (opt.seq_len < 1) throw Error("seq_len " + std::to_string(opt.seq_len) + " must be at least 1");
    if (opt.n_ctx != 0 && static_cast<uint32_t>(opt.seq_len) > opt.n_ctx) {
        throw Error("seq_len " + std::to_string(opt.seq_len) + " exceeds the model's context " +
                    std::to_string(opt.n_ctx));
    }
}

uint64_t fnv1a(uint64_t h, const void * data, size_t n) {
    const auto * p = static_cast<const unsigned char *>(data);
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 0x100000001B3ull;
    }
    return h;
}

constexpr uint64_t kFnvBasis = 0xCBF29CE484222325ull;
constexpr uint64_t kSplitStream = ~0ull;

uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// ---- JSONL --------------------------------------------------------------------------------------------

class JsonlReader {
public:
    JsonlReader(const std::string & source, const Tokenizer & tok, const DatasetOptions & opt)
        : source_(source), tok_(tok), opt_(opt) {}

    // Whether a line is a preference pair (it has "chosen" or "rejected"), or a KTO example (it has "label").
    static bool is_pair(const json::Value & v) { return v.is_object() && (v.find("chosen") || v.find("rejected")); }
    static bool is_kto(const json::Value & v) { return v.is_object() && v.find("label") && !is_pair(v); }

    // A KTO example: the prompt's tokens, the completion's (trained) and whether it is desirable.
    struct KtoTokens {
        std::vector<int32_t> prompt, completion;
        bool desirable = false;
    };
    KtoTokens kto(const json::Value & v, size_t line) {
        line_ = line;
        const json::Value * prompt = v.find("prompt");
        const json::Value * completion = v.find("completion");
        const json::Value * label = v.find("label");
        if (!prompt || !completion || v.find("text") || v.find("messages"))
            fail("a KTO example has the keys {\"prompt\", \"completion\", \"label\"} and no \"text\" or \"messages\"");
        if (label->type != json::Value::Type::Bool) fail("\"label\" must be true (desirable) or false (undesirable)");
        KtoTokens t;
        t.desirable = label->boolean;
        if (prompt->is_string()) {
            const std::string & c = string_field(*completion, "completion");
            if (c.empty()) fail("the completion is empty");
            t.prompt = tok_.encode(prompt->string, true, false);
            t.completion = answer_tokens(c, false);
        } else {
            require_chat("a conversational KTO example");
            std::string prompt_text, answer_text;
            render_answer(chat_messages(*prompt, "prompt"), answer_messages(*completion, "completion"), prompt_text, answer_text);
            t.prompt = tok_.encode(prompt_text, true, true);
            t.completion = answer_tokens(answer_text, true);
        }
        if (t.completion.empty()) fail("the completion has no tokens");
        return t;
    }

    // A preference pair: the prompt's tokens and each answer's (all trained), tokenized separately (TRL's rule).
    struct PairTokens {
        std::vector<int32_t> prompt, chosen, rejected;
    };
    PairTokens pair(const json::Value & v, size_t line) {
        line_ = line;
        const json::Value * prompt = v.find("prompt");
        const json::Value * chosen = v.find("chosen");
        const json::Value * rejected = v.find("rejected");
        if (!prompt || !chosen || !rejected || v.find("text") || v.find("completion") || v.find("messages"))
            fail("a preference pair has the keys {\"prompt\", \"chosen\", \"rejected\"} and no \"text\", \"completion\" or \"messages\"");
        PairTokens t;
        if (prompt->is_string()) {
            const std::string & c = string_field(*chosen, "chosen");
            const std::string & r = string_field(*rejected, "rejected");
            if (c.empty() || r.empty()) fail(std::string("the ") + (c.empty() ? "chosen" : "rejected") + " answer is empty");
            if (c == r) fail("the chosen and the rejected answer are the same text: the pair prefers nothing");
            t.prompt = tok_.encode(prompt->string, true, false);
            t.chosen = answer_tokens(c, false);
            t.rejected = answer_tokens(r, false);
        } else {
            require_chat("a conversational pair");
            const std::vector<ChatMessage> p = chat_messages(*prompt, "prompt");
            std::string prompt_c, prompt_r, answer_c, answer_r;
            render_answer(p, answer_messages(*chosen, "chosen"), prompt_c, answer_c);
            render_answer(p, answer_messages(*rejected, "rejected"), prompt_r, answer_r);
            if (prompt_c != prompt_r) fail("the chat template renders the prompt differently before the two answers");
            if (answer_c == answer_r) fail("the chosen and the rejected answer render to the same text: the pair prefers nothing");
            t.prompt = tok_.encode(prompt_c, true, true);
            t.chosen = answer_tokens(answer_c, true);
            t.rejected = answer_tokens(answer_r, true);
        }
        if (t.chosen.empty() || t.rejected.empty()) fail(std::string("the ") + (t.chosen.empty() ? "chosen" : "rejected") + " answer has no tokens");
        return t;
    }

    [[noreturn]] void fail_at(size_t line, const std::string & what) {
        line_ = line;
        fail(what);
    }

    // A GRPO prompt line: its tokens and rendered text (messages: with the generation prompt).
    void prompt(const json::Value & v, size_t line, Prompt & out) {
        line_ = line;
        const json::Value * p = v.is_object() ? v.find("prompt") : nullptr;
        if (!p) fail("a prompt line is an object with a \"prompt\" (a string or a list of messages)");
        if (p->is_string()) {
            if (p->string.empty()) fail("the prompt is empty");
            out.text = p->string;
            out.tokens = tok_.encode(out.text, true, false);
        } else {
            require_chat("a conversational prompt");
            ChatOptions co;
            co.add_generation_prompt = true;
            out.text = opt_.chat->apply(chat_messages(*p, "prompt"), co);
            out.tokens = tok_.encode(out.text, true, true);
        }
        if (out.tokens.empty()) fail("the prompt has no tokens");
    }

    // One line's example. `line` is 1-based.
    Tokens example(const json::Value & v, size_t line) {
        line_ = line;
        if (!v.is_object()) fail("expected a JSON object");
        const json::Value * text = v.find("text");
        const json::Value * prompt = v.find("prompt");
        const json::Value * completion = v.find("completion");
        const json::Value * messages = v.find("messages");
        const int kinds = (text != nullptr) + (prompt != nullptr || completion != nullptr) + (messages != nullptr);
        if (kinds != 1 || (prompt != nullptr) != (completion != nullptr)) {
            std::string keys;
            for (const auto & kv : v.object) keys += (keys.empty() ? "" : ", ") + ("\"" + kv.first + "\"");
            fail("expected the keys {\"text\"}, {\"prompt\", \"completion\"} or {\"messages\"}, got {" + keys + "}");
        }
        if (text) return from_text(string_field(*text, "text"));
        if (prompt) return from_prompt(string_field(*prompt, "prompt"), string_field(*completion, "completion"));
        return from_messages(*messages);
    }

private:
    [[noreturn]] void fail(const std::string & what) const {
        throw Error(source_ + " line " + std::to_string(line_) + ": " + what);
    }

    const std::string & string_field(const json::Value & v, const char * key) const {
        if (!v.is_string()) fail(std::string("\"") + key + "\" must be a string");
        return v.string;
    }

    Tokens from_text(const std::string & text) const {
        Tokens t;
        t.ids = tok_.encode(text, true, false);
        t.trained.assign(t.ids.size(), 1);
        append_eos(tok_, t);
        return t;
    }

    // Tokenized as one text, so the tokens are those the model sees at training time; a token that starts
    // in the prompt (one straddling the boundary) belongs to the prompt.
    Tokens from_prompt(const std::string & prompt, const std::string & completion) const {
        Tokens t;
        std::vector<size_t> offsets;
        t.ids = tok_.encode(prompt + completion, true, false, &offsets);
        t.trained.resize(t.ids.size());
        for (size_t i = 0; i < t.ids.size(); ++i) t.trained[i] = offsets[i] >= prompt.size();
        append_eos(tok_, t);
        return t;
    }

    // A string answer: no BOS, EOS appended (the template's end of turn ends a rendered one).
    std::vector<int32_t> answer_tokens(const std::string & text, bool rendered) const {
        std::vector<int32_t> ids = tok_.encode(text, false, rendered);
        if (!rendered && tok_.eos() != kTokenNull) ids.push_back(tok_.eos());
        return ids;
    }

    // The prompt's messages and the answer's rendered together (the training chat); the answer's text starts at
    // its first assistant span (the assistant header before it is the prompt's, as a generation prompt).
    void render_answer(const std::vector<ChatMessage> & prompt, const std::vector<ChatMessage> & answer, std::string & prompt_text,
                       std::string & answer_text) const {
        std::vector<ChatMessage> chat = prompt;
        chat.insert(chat.end(), answer.begin(), answer.end());
        const RenderedChat r = render_training_chat(*opt_.chat, chat, opt_.train_analysis);
        const size_t first = static_cast<size_t>(std::count_if(prompt.begin(), prompt.end(), [](const ChatMessage & m) { return m.role == "assistant"; }));
        if (r.assistant.size() <= first) fail("the chat template rendered no assistant turn for the answer");
        prompt_text = r.text.substr(0, r.assistant[first].begin);
        answer_text = r.text.substr(r.assistant[first].begin);
    }

    void require_chat(const char * what) const {
        if (!opt_.chat) fail(std::string(what) + " needs a chat template: the model has none (name one: chatml, llama3 or FILE.jinja)");
    }

    // An answer's messages (a pair's chosen or rejected, a KTO completion): assistant messages only.
    std::vector<ChatMessage> answer_messages(const json::Value & messages, const std::string & key) const {
        std::vector<ChatMessage> chat = chat_messages(messages, key);
        for (const ChatMessage & m : chat)
            if (m.role != "assistant") fail("\"" + key + "\" holds assistant messages only, got a \"" + m.role + "\" message");
        return chat;
    }

    std::vector<ChatMessage> chat_messages(const json::Value & messages, const std::string & key) const {
        if (!messages.is_array() || messages.array.empty()) fail("\"" + key + "\" must be a string or a non-empty array of messages");
        std::vector<ChatMessage> chat;
        for (size_t i = 0; i < messages.array.size(); ++i) {
            const json::Value & m = messages.array[i];
            const std::string where = key + "[" + std::to_string(i) + "]";
            if (!m.is_object()) fail(where + " must be an object with \"role\" and \"content\"");
            const json::Value * role = m.find("role");
            const json::Value * content = m.find("content");
            if (!role || !role->is_string()) fail(where + " needs a string \"role\"");
            if (role->string != "system" && role->string != "user" && role->string != "assistant")
                fail(where + ": role \"" + role->string + "\" is not one the chat template knows (system, user, assistant)");
            if (!content || !content->is_string()) fail(where + " needs a string \"content\"");
            // A reply's reasoning: "reasoning_content" (llama.cpp's, OpenAI's API) or "thinking" (gpt-oss's template).
            const json::Value * reasoning = m.find("reasoning_content");
            if (!reasoning) reasoning = m.find("thinking");
            if (reasoning && !reasoning->is_string()) fail(where + ": \"reasoning_content\" / \"thinking\" must be a string");
            chat.push_back({role->string, content->string, reasoning ? reasoning->string : std::string()});
        }
        return chat;
    }

    Tokens from_messages(const json::Value & messages) const {
        if (!messages.is_array() || messages.array.empty()) fail("\"messages\" must be a non-empty array");
        const std::vector<ChatMessage> chat = chat_messages(messages, "messages");
        require_chat("\"messages\"");
        const RenderedChat r = render_training_chat(*opt_.chat, chat, opt_.train_analysis);
        if (r.assistant.empty()) fail("\"messages\" has no assistant turn: nothing to train on");
        Tokens t;
        std::vector<size_t> offsets;
        t.ids = tok_.encode(r.text, true, true, &offsets);
        t.trained.resize(t.ids.size());
        size_t s = 0;  // offsets never decrease, nor do the spans
        for (size_t i = 0; i < t.ids.size(); ++i) {
            while (s < r.assistant.size() && offsets[i] >= r.assistant[s].end) ++s;
            t.trained[i] = opt_.train_on_inputs || (s < r.assistant.size() && offsets[i] >= r.assistant[s].begin);
        }
        return t;
    }

    const std::string & source_;
    const Tokenizer & tok_;
    const DatasetOptions & opt_;
    size_t line_ = 0;
};

} // namespace

// ---- Dataset --------------------------------------------------------------------------------------------

std::span<const int32_t> Dataset::inputs(size_t i) const {
    assert(i < size_);
    return {inputs_.data() + i * seq_len_, static_cast<size_t>(seq_len_)};
}

std::span<const int32_t> Dataset::labels(size_t i) const {
    assert(i < size_);
    return {labels_.data() + i * seq_len_, static_cast<size_t>(seq_len_)};
}

std::span<const int32_t> Dataset::positions(size_t i) const {
    assert(i < size_);
    if (positions_.empty()) return {};
    return {positions_.data() + i * seq_len_, static_cast<size_t>(seq_len_)};
}

double DatasetStats::padding_fraction() const {
    const double slots = static_cast<double>(n_sequences) * seq_len;
    return slots > 0 ? 1.0 - static_cast<double>(n_tokens) / slots : 0.0;
}

double DatasetStats::unpacked_padding_fraction() const {
    const double slots = static_cast<double>(n_unpacked) * seq_len;
    return slots > 0 ? 1.0 - static_cast<double>(n_tokens) / slots : padding_fraction();
}

void Dataset::push(const std::vector<int32_t> & in, const std::vector<int32_t> & lab) {
    assert(in.size() == static_cast<size_t>(seq_len_) && lab.size() == in.size());
    inputs_.insert(inputs_.end(), in.begin(), in.end());
    labels_.insert(labels_.end(), lab.begin(), lab.end());
    ++size_;
    for (const int32_t l : lab) stats_.n_trained += l != kIgnoreLabel;
}

void Dataset::finish(const std::string & source) {
    stats_.n_sequences = size_;
    stats_.seq_len = seq_len_;
    if (size_ == 0 || stats_.n_trained == 0) {
        throw Error("dataset " + source + ": no training sequences (" + std::to_string(stats_.n_examples) +
                    " examples read, " + std::to_string(stats_.n_skipped) + " skipped)");
    }
}

uint64_t Dataset::fingerprint() const {
    uint64_t h = fnv1a(kFnvBasis, &seq_len_, sizeof seq_len_);
    if (group_ != 1) h = fnv1a(h, &group_, sizeof group_);  // (SFT data keeps the fingerprints it had)
    if (kto_ && group_ == 2) {  // unpacked KTO: whether each example is desirable
        std::vector<uint8_t> desirable(units());
        for (size_t u = 0; u < desirable.size(); ++u) desirable[u] = slots_[2 * u].kind > 0;
        h = fnv1a(h, desirable.data(), desirable.size());
    }
    if (answer_slots_ > 1) h = fnv1a(h, slots_.data(), slots_.size() * sizeof(AnswerSlot));  // packed preference data
    if (rollouts_) h = fnv1a(h, "rollouts", 8);
    h = fnv1a(h, inputs_.data(), inputs_.size() * sizeof(int32_t));
    h = fnv1a(h, labels_.data(), labels_.size() * sizeof(int32_t));
    return positions_.empty() ? h : fnv1a(h, positions_.data(), positions_.size() * sizeof(int32_t));
}

Dataset Dataset::from_text(std::string_view text, const std::string & source, const Tokenizer & tok,
                           const DatasetOptions & opt) {
    check_options(opt);
    check_text(text, source, opt);
    Dataset d;
    d.seq_len_ = opt.seq_len;
    // One stream of every document; a BOS that starts a document is never a label.
    Tokens s;
    for (const std::string_view doc : split_documents(strip_bom(text), opt.doc_separator)) {
        ++d.stats_.n_examples;
        Tokens t;
        t.ids = tok.encode(doc, true, false);
        t.trained.assign(t.ids.size(), 1);
        if (tok.add_bos() && !t.ids.empty() && t.ids[0] == tok.bos()) t.trained[0] = 0;
        append_eos(tok, t);
        s.ids.insert(s.ids.end(), t.ids.begin(), t.ids.end());
        s.trained.insert(s.trained.end(), t.trained.begin(), t.trained.end());
    }
    const size_t L = static_cast<size_t>(opt.seq_len), n = s.ids.size();
    const int32_t pad = pad_token(tok);
    std::vector<int32_t> in(L), lab(L);
    for (size_t start = 0; start + 1 < n; start += L) {
        for (size_t t = 0; t < L; ++t) {
            const size_t i = start + t;
            in[t] = i < n ? s.ids[i] : pad;
            lab[t] = i + 1 < n && s.trained[i + 1] ? s.ids[i + 1] : kIgnoreLabel;
            d.stats_.n_tokens += i < n;
        }
        d.push(in, lab);
    }
    d.finish(source);
    return d;
}

Dataset Dataset::from_jsonl(std::string_view text, const std::string & source, const Tokenizer & tok,
                            const DatasetOptions & opt) {
    check_options(opt);
    check_text(text, source, opt);
    Dataset d;
    d.seq_len_ = opt.seq_len;
    JsonlReader reader(source, tok, opt);
    const size_t L = static_cast<size_t>(opt.seq_len);
    const int32_t pad = pad_token(tok);
    std::vector<int32_t> in(L), lab(L);
    // Packed: the examples' (input, label) runs, placed into sequences once all are read.
    std::vector<std::vector<int32_t>> ex_in, ex_lab;
    // Preference data: each answer document's AnswerSlot::kind (packed: its run's; unpacked: its sequence's).
    std::vector<int32_t> kinds;
    // A prompt with two answers (a pair's chosen and rejected; a KTO example's completion and its KL sequence's):
    // two documents, labels on the answers only, each a sequence of its own or (packed) the two one item. Too
    // long: the prompt keeps its last max_prompt_len tokens, then the answers are cut to what the sequence leaves
    // (packed: the two share it; see dataset.h).
    auto add_answers = [&](std::vector<int32_t> prompt, const std::vector<int32_t> * const (&answers)[2], const char * const (&names)[2],
                           const int32_t (&answer_kinds)[2], size_t line) {
        ++d.stats_.n_examples;
        bool truncated = false;
        if (opt.max_prompt_len > 0 && prompt.size() > static_cast<size_t>(opt.max_prompt_len)) {
            prompt.erase(prompt.begin(), prompt.end() - opt.max_prompt_len);  // keeps the prompt's end
            truncated = true;
        }
        const size_t P = prompt.size();
        size_t keep[2];
        if (!opt.pack_preference) {
            if (P > L)
                reader.fail_at(line, "the prompt takes " + std::to_string(P) + " tokens, more than the sequence's " + std::to_string(L) +
                                         ": no answer token fits (a longer seq_len, or cut prompts with max_prompt_len)");
            for (int a = 0; a < 2; ++a) keep[a] = std::min(answers[a]->size(), L + 1 - P);
        } else {
            // Both documents in one sequence: (P + a_c - 1) + (P + a_r - 1) <= L positions.
            if (2 * P > L)
                reader.fail_at(line, "the prompt takes " + std::to_string(P) + " tokens: a packed pair's two documents (the prompt before each answer) " +
                                         "leave no answer token in a sequence of " + std::to_string(L) +
                                         " (a longer seq_len, or cut prompts with max_prompt_len)");
            const size_t budget = L + 2 - 2 * P, ac = answers[0]->size(), ar = answers[1]->size();
            keep[0] = ac, keep[1] = ar;
            if (ac + ar > budget) {
                const size_t shorter = std::min(ac, ar);
                if (shorter <= budget / 2) {
                    (ac <= ar ? keep[1] : keep[0]) = budget - shorter;
                } else {
                    keep[0] = budget - budget / 2;
                    keep[1] = budget / 2;
                }
            }
        }
        for (int a = 0; a < 2; ++a) {
            const std::vector<int32_t> & answer = *answers[a];
            truncated |= answer.size() > keep[a];
            const size_t n = P + keep[a];
            auto id = [&](size_t i) { return i < P ? prompt[i] : answer[i - P]; };
            size_t trained = 0;
            for (size_t i = 0; i < L; ++i) {
                in[i] = i < n ? id(i) : pad;
                lab[i] = i + 1 < n && i + 1 >= P ? id(i + 1) : kIgnoreLabel;
                trained += lab[i] != kIgnoreLabel;
            }
            if (trained == 0) reader.fail_at(line, std::string("the ") + names[a] + " has no token to train on");
            ++d.stats_.n_unpacked;
            kinds.push_back(answer_kinds[a]);
            if (opt.pack_preference) {  // n - 1 positions: the last token is only a label
                d.stats_.n_tokens += n - 1;
                ex_in.emplace_back(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n - 1));
                ex_lab.emplace_back(lab.begin(), lab.begin() + static_cast<std::ptrdiff_t>(n - 1));
            } else {
                d.stats_.n_tokens += std::min(n, L);
                d.push(in, lab);
            }
        }
        d.stats_.n_truncated += truncated;
    };
    std::vector<JsonlReader::KtoTokens> kto;  // KTO: the examples, laid out once all are read
    std::vector<size_t> kto_lines;
    bool first = true;
    for_each_json_line(text, source, [&](json::Value && v, size_t line_no) {
        const int kind = JsonlReader::is_pair(v) ? 1 : JsonlReader::is_kto(v) ? 2 : 0;  // SFT, pair, KTO
        static const char * const kKinds[] = {"an SFT example", "a preference pair", "a KTO example"};
        if (first) {
            first = false;
            d.pairs_ = kind == 1;
            d.kto_ = kind == 2;
            if (kind != 0 && !opt.pack_preference) d.group_ = 2;  // (packed: a unit is a sequence of whole pairs)
        } else if (const int file_kind = d.kto_ ? 2 : d.pairs_ ? 1 : 0; kind != file_kind) {
            reader.fail_at(line_no, std::string(kKinds[kind]) + " in a file of " + (file_kind == 0 ? "SFT examples" : file_kind == 1 ? "preference pairs" : "KTO examples") +
                                        " (one kind per file)");
        }
        if (kind == 1) {
            const JsonlReader::PairTokens pt = reader.pair(v, line_no);
            add_answers(pt.prompt, {&pt.chosen, &pt.rejected}, {"chosen answer", "rejected answer"}, {0, 0}, line_no);
            return;
        }
        if (kind == 2) {
            kto.push_back(reader.kto(v, line_no));
            kto_lines.push_back(line_no);
            return;
        }
        const Tokens t = reader.example(v, line_no);
        ++d.stats_.n_examples;
        const size_t n = std::min(t.ids.size(), L + 1);  // truncation keeps the first seq_len + 1 tokens
        d.stats_.n_truncated += t.ids.size() > L + 1;
        bool any = false;
        for (size_t i = 0; i < L; ++i) {
            in[i] = i < n ? t.ids[i] : pad;
            lab[i] = i + 1 < n && t.trained[i + 1] ? t.ids[i + 1] : kIgnoreLabel;
            any |= lab[i] != kIgnoreLabel;
        }
        if (!any) {
            ++d.stats_.n_skipped;
            return;
        }
        const size_t m = std::min(n, L);  // positions the example fills
        d.stats_.n_tokens += m;
        ++d.stats_.n_unpacked;
        if (opt.pack) {
            ex_in.emplace_back(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(m));
            ex_lab.emplace_back(lab.begin(), lab.begin() + static_cast<std::ptrdiff_t>(m));
        } else {
            d.push(in, lab);
        }
    });
    if (d.kto_) {
        // Each example, then its KL sequence: its prompt with the next example's completion (TRL's mismatched
        // pairs, here over the file's order).
        size_t desirable = 0;
        for (const auto & e : kto) desirable += e.desirable;
        if (desirable == 0 || desirable == kto.size())
            throw Error("dataset " + source + ": every KTO example is " + (desirable ? "desirable (label true)" : "undesirable (label false)") +
                        ": KTO needs examples of both kinds");
        if (kto.size() < 2) throw Error("dataset " + source + ": KTO needs at least two examples (the KL sequences pair each prompt with another's completion)");
        for (size_t i = 0; i < kto.size(); ++i) {
            add_answers(kto[i].prompt, {&kto[i].completion, &kto[(i + 1) % kto.size()].completion}, {"completion", "KL sequence's completion"},
                        {kto[i].desirable ? 1 : -1, 0}, kto_lines[i]);
        }
    }
    const bool preference = d.pairs_ || d.kto_;
    if (preference ? opt.pack_preference : opt.pack) {
        d.pack(ex_in, ex_lab, pad, preference ? 2 : 1, kinds);
    } else if (preference) {  // one answer per sequence
        for (size_t i = 0; i < d.size_; ++i) {
            const auto seq_labels = d.labels(i);
            const auto trained = std::count_if(seq_labels.begin(), seq_labels.end(), [](int32_t l) { return l != kIgnoreLabel; });
            d.slots_.push_back({static_cast<int32_t>(trained), kinds[i]});
        }
    }
    d.finish(source);
    return d;
}

size_t Dataset::n_answers() const {
    return static_cast<size_t>(std::count_if(slots_.begin(), slots_.end(), [](const AnswerSlot & a) { return a.tokens > 0; }));
}

std::span<const AnswerSlot> Dataset::answers(size_t i) const {
    assert(i < size_ && !slots_.empty());
    return {slots_.data() + i * static_cast<size_t>(answer_slots_), static_cast<size_t>(answer_slots_)};
}

PromptSet PromptSet::load(const std::string & path, const Tokenizer & tok, const DatasetOptions & opt) {
    return from_jsonl(read_data_file(path, "prompt"), path, tok, opt);
}

PromptSet PromptSet::from_jsonl(std::string_view text, const std::string & source, const Tokenizer & tok, const DatasetOptions & opt) {
    check_text(text, source, opt);
    PromptSet s;
    s.source_ = source;
    JsonlReader reader(source, tok, opt);
    for_each_json_line(text, source, [&](json::Value && v, size_t line_no) {
        Prompt p;
        p.example = std::move(v);
        p.line = line_no;
        reader.prompt(p.example, line_no, p);
        if (opt.max_prompt_len > 0 && p.tokens.size() > static_cast<size_t>(opt.max_prompt_len)) {
            p.tokens.erase(p.tokens.begin(), p.tokens.end() - opt.max_prompt_len);  // keeps the prompt's end
            ++s.n_truncated_;
        }
        s.prompts_.push_back(std::move(p));
    });
    if (s.prompts_.empty()) throw Error("prompts " + source + ": no prompt lines");
    return s;
}

size_t PromptSet::max_tokens() const {
    size_t m = 0;
    for (const Prompt & p : prompts_) m = std::max(m, p.tokens.size());
    return m;
}

Dataset PromptSet::frame(int32_t seq_len, int32_t group) const {
    if (group < 1) throw Error("group " + std::to_string(group) + " must be at least 1");
    if (seq_len < 2 || static_cast<size_t>(seq_len) <= max_tokens())
        throw Error("prompts " + source_ + ": a sequence of " + std::to_string(seq_len) + " tokens leaves no room for a completion after the longest prompt's " +
                    std::to_string(max_tokens()));
    Dataset d;
    d.seq_len_ = seq_len;
    d.group_ = group;
    d.rollouts_ = true;
    std::vector<int32_t> in(static_cast<size_t>(seq_len)), lab(static_cast<size_t>(seq_len), kIgnoreLabel);
    for (const Prompt & p : prompts_) {
        std::fill(in.begin(), in.end(), 0);
        std::copy(p.tokens.begin(), p.tokens.end(), in.begin());
        for (int32_t k = 0; k < group; ++k) d.push(in, lab);
    }
    d.stats_.n_examples = prompts_.size();
    d.stats_.n_sequences = d.size_;
    d.stats_.seq_len = seq_len;
    return d;
}

void Dataset::pack(const std::vector<std::vector<int32_t>> & ex_in, const std::vector<std::vector<int32_t>> & ex_lab,
                   int32_t pad, size_t per_item, const std::vector<int32_t> & kinds) {
    const size_t L = static_cast<size_t>(seq_len_), n = ex_in.size() / per_item;
    assert(ex_in.size() == n * per_item && (kinds.empty() || kinds.size() == ex_in.size()));
    auto length = [&](size_t item) {
        size_t len = 0;
        for (size_t r = item * per_item; r < (item + 1) * per_item; ++r) len += ex_in[r].size();
        return len;
    };
    // Best-fit decreasing: the longest items first (ties in file order), each into the open sequence with
    // the least room that still holds it (ties: the one opened first), else a new one. Deterministic.
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return length(a) > length(b); });
    std::vector<std::vector<size_t>> bins;
    std::multimap<size_t, size_t> room;  // free positions -> bin; equal keys keep insertion order
    for (const size_t e : order) {
        const size_t len = length(e);
        assert(len <= L);
        auto it = room.lower_bound(len);
        size_t bin;
        if (it == room.end()) {
            bin = bins.size();
            bins.emplace_back();
            if (L > len) room.emplace(L - len, bin);
        } else {
            bin = it->second;
            const size_t left = it->first - len;
            room.erase(it);
            if (left > 0) room.emplace(left, bin);
        }
        bins[bin].push_back(e);
    }
    // Answer slots: the most documents a sequence holds.
    if (!kinds.empty())
        for (const std::vector<size_t> & bin : bins) answer_slots_ = std::max(answer_slots_, static_cast<int32_t>(bin.size() * per_item));
    // Bins take items in file order (deterministic and readable); the tail is padding, its positions a run of
    // their own (masked labels: it trains nothing and no example attends to it).
    std::vector<int32_t> in(L), lab(L), pos(L);
    for (std::vector<size_t> & bin : bins) {
        std::sort(bin.begin(), bin.end());
        size_t at = 0, slot = 0;
        for (const size_t item : bin) {
            for (size_t e = item * per_item; e < (item + 1) * per_item; ++e, ++slot) {
                int32_t trained = 0;
                for (size_t i = 0; i < ex_in[e].size(); ++i, ++at) {
                    in[at] = ex_in[e][i];
                    lab[at] = ex_lab[e][i];
                    pos[at] = static_cast<int32_t>(i);
                    trained += lab[at] != kIgnoreLabel;
                }
                if (!kinds.empty()) slots_.push_back({trained, kinds[e]});
            }
        }
        if (!kinds.empty()) slots_.resize(slots_.size() + static_cast<size_t>(answer_slots_) - slot);  // empty slots
        for (size_t i = 0; at < L; ++i, ++at) {
            in[at] = pad;
            lab[at] = kIgnoreLabel;
            pos[at] = static_cast<int32_t>(i);
        }
        push(in, lab);
        push_positions(pos);
    }
}

Dataset Dataset::load(const std::string & path, const Tokenizer & tok, const DatasetOptions & opt) {
    check_options(opt);
    const std::string text = read_data_file(path, "dataset");
    if (trim(strip_bom(text)).empty()) throw Error("dataset " + path + ": the file is empty");
    DatasetFormat fmt = opt.format;
    if (fmt == DatasetFormat::Auto) {
        const bool jsonl = path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
        fmt = jsonl ? DatasetFormat::Jsonl : DatasetFormat::Text;
    }
    return fmt == DatasetFormat::Jsonl ? from_jsonl(text, path, tok, opt) : from_text(text, path, tok, opt);
}

// ---- shuffling, split, batches ----------------------------------------------------------------------------

uint64_t uniform_below(std::mt19937_64 & rng, uint64_t n) {
    assert(n >= 1);
    // 2^64 mod n values at the top would make small residues likelier: draw again when x lands there.
    const uint64_t excess = (UINT64_MAX % n + 1) % n;
    uint64_t x = rng();
    while (excess != 0 && x > UINT64_MAX - excess) x = rng();
    return x % n;
}

void shuffle_indices(std::vector<uint32_t> & idx, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (size_t i = idx.size(); i > 1; --i) {
        const size_t j = static_cast<size_t>(uniform_below(rng, i));
        std::swap(idx[i - 1], idx[j]);
    }
}

uint64_t mix_seed(uint64_t seed, uint64_t stream) { return splitmix64(seed ^ splitmix64(stream)); }

DatasetSplit split_dataset(size_t n, double val_fraction, uint64_t seed) {
    if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
        throw Error("val_split " + std::to_string(val_fraction) + " is outside [0, 1)");
    }
    size_t n_val = static_cast<size_t>(std::llround(val_fraction * static_cast<double>(n)));
    if (val_fraction > 0.0 && n_val == 0) n_val = 1;
    if (n_val >= n) {
        throw Error("val_split " + std::to_string(val_fraction) + " leaves no training sequences (" +
                    std::to_string(n) + " in total)");
    }
    std::vector<uint32_t> perm(n);
    for (size_t i = 0; i < n; ++i) perm[i] = static_cast<uint32_t>(i);
    shuffle_indices(perm, mix_seed(seed, kSplitStream));
    DatasetSplit s;
    s.val.assign(perm.begin(), perm.begin() + static_cast<std::ptrdiff_t>(n_val));
    s.train.assign(perm.begin() + static_cast<std::ptrdiff_t>(n_val), perm.end());
    std::sort(s.val.begin(), s.val.end());
    std::sort(s.train.begin(), s.train.end());
    return s;
}

size_t Batch::n_trained() const {
    return static_cast<size_t>(std::count_if(labels.begin(), labels.end(), [](int32_t l) { return l != kIgnoreLabel; }));
}

Batch make_batch(const Dataset & data, std::span<const uint32_t> idx) {
    Batch b;
    b.n_seq = static_cast<int32_t>(idx.size());
    b.seq_len = data.seq_len();
    b.inputs.reserve(idx.size() * static_cast<size_t>(data.group()) * static_cast<size_t>(b.seq_len));
    b.labels.reserve(b.inputs.capacity());
    const size_t g = static_cast<size_t>(data.group());
    b.n_seq = static_cast<int32_t>(idx.size() * g);
    b.units.assign(idx.begin(), idx.end());
    for (const uint32_t u : idx)
        for (size_t i = u * g; i < (u + 1) * g; ++i) {
            const auto in = data.inputs(i);
            const auto lab = data.labels(i);
            const auto pos = data.positions(i);
            b.inputs.insert(b.inputs.end(), in.begin(), in.end());
            b.labels.insert(b.labels.end(), lab.begin(), lab.end());
            b.positions.insert(b.positions.end(), pos.begin(), pos.end());
        }
    return b;
}

Batcher::Batcher(const Dataset & data, std::vector<uint32_t> indices, int32_t batch_size, uint64_t seed, bool shuffle)
    : data_(data), indices_(std::move(indices)), batch_size_(batch_size), seed_(seed), shuffle_(shuffle) {
    if (indices_.empty()) throw Error("batches: no training sequences");
    if (batch_size_ < 1) throw Error("batch_size " + std::to_string(batch_size_) + " must be at least 1");
    for (const uint32_t i : indices_) {
        if (i >= data_.units()) {
            throw Error("batches: " + std::string(data_.pairs() ? "pair" : data_.kto() ? "KTO example" : "sequence") + " index " + std::to_string(i) +
                        " outside the dataset of " + std::to_string(data_.units()));
        }
    }
    uint64_t h = data_.fingerprint();
    h = fnv1a(h, indices_.data(), indices_.size() * sizeof(uint32_t));
    const uint8_t sh = shuffle_;
    fingerprint_ = fnv1a(h, &sh, 1);
}

const std::vector<uint32_t> & Batcher::order_for(uint64_t epoch) {
    if (epoch != order_epoch_) {
        order_ = indices_;
        if (shuffle_) shuffle_indices(order_, mix_seed(seed_, epoch));
        order_epoch_ = epoch;
    }
    return order_;
}

uint64_t Batcher::epoch() const { return consumed_ / indices_.size(); }

Batch Batcher::next() {
    std::vector<uint32_t> idx(static_cast<size_t>(batch_size_));
    for (uint32_t & i : idx) {
        i = order_for(consumed_ / indices_.size())[consumed_ % indices_.size()];
        ++consumed_;
    }
    return make_batch(data_, idx);
}

void Batcher::seek(const DataPosition & pos) {
    if (pos.seed != seed_) {
        throw Error("data position: saved with seed " + std::to_string(pos.seed) + ", this run uses " +
                    std::to_string(seed_));
    }
    if (pos.fingerprint != fingerprint_) {
        throw Error("data position: the dataset or its split differs from the saved run's (fingerprint mismatch)");
    }
    consumed_ = pos.consumed;
}

} // namespace rp
