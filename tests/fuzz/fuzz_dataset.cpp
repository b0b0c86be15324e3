// libFuzzer target: arbitrary bytes -> the dataset builder, as plain text and as JSONL (text, prompt /
// completion, chat messages with a ChatML template), with the SentencePiece and the byte-level BPE
// tokenizer, at a seq_len taken from the first byte. The only acceptable failure is rp::Error; a built
// dataset has whole sequences of seq_len inputs and labels, every id in the vocabulary, every label an id
// or the ignore label, and the same fingerprint when built twice; packed (when the first byte says so), the
// positions restart at 0 or count up by one; preference pairs and KTO examples come in units of two unpacked
// sequences that each train at least one token, or packed, in answer slots that pair up and count the trained
// labels (max_prompt_len from the first byte's low bits).
#include "base/error.h"
#include "models/text/chat_template.h"
#include "models/data/dataset.h"
#include "models/text/tokenizer.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace {

const rp::Tokenizer & vocab(bool bpe) {
    static std::unique_ptr<rp::Tokenizer> spm = rp::Tokenizer::load(std::string(RP_SHARED_DIR) + "/models/vocab/ggml-vocab-llama-spm.gguf");
    static std::unique_ptr<rp::Tokenizer> q = rp::Tokenizer::load(std::string(RP_SHARED_DIR) + "/models/vocab/ggml-vocab-qwen2.gguf");
    return bpe ? *q : *spm;
}

void check(const rp::Dataset & d, const rp::Tokenizer & tok, int32_t seq_len) {
    if (d.seq_len() != seq_len) __builtin_trap();
    for (size_t i = 0; i < d.size(); ++i) {
        const auto in = d.inputs(i), lab = d.labels(i);
        if (in.size() != static_cast<size_t>(seq_len) || lab.size() != static_cast<size_t>(seq_len)) __builtin_trap();
        for (int32_t id : in)
            if (id < 0 || id >= tok.n_vocab()) __builtin_trap();
        for (int32_t l : lab)
            if (l != rp::kIgnoreLabel && (l < 0 || l >= tok.n_vocab())) __builtin_trap();
        size_t trained = 0;
        for (int32_t l : lab) trained += l != rp::kIgnoreLabel;
        if (d.group() != 1) {  // unpacked pairs and KTO: two sequences per unit, each with an answer token to train
            if (d.group() != 2 || d.size() % 2 != 0 || d.packed() || d.units() * 2 != d.size() || d.answer_slots() != 1) __builtin_trap();
            if (trained == 0 || d.answers(i)[0].tokens != static_cast<int32_t>(trained)) __builtin_trap();
        } else if (d.pairs() || d.kto()) {  // packed: answer slots in pairs, the present ones first, their tokens the labels
            const int32_t D = d.answer_slots();
            if (!d.packed() || D < 2 || D % 2 != 0 || d.n_answer_slots() != d.size() * static_cast<size_t>(D)) __builtin_trap();
            const auto slots = d.answers(i);
            size_t sum = 0;
            bool ended = false;
            for (int32_t j = 0; j < D; j += 2) {
                const bool present = slots[size_t(j)].tokens > 0;
                if (present != (slots[size_t(j) + 1].tokens > 0) || (present && ended)) __builtin_trap();
                ended |= !present;
                sum += static_cast<size_t>(slots[size_t(j)].tokens + slots[size_t(j) + 1].tokens);
            }
            if (sum != trained || slots[0].tokens == 0) __builtin_trap();
        }
        if (!d.packed()) continue;
        // packed: every position restarts at 0 or follows the previous one (so the attention starts are valid)
        const auto pos = d.positions(i);
        if (pos.size() != static_cast<size_t>(seq_len) || pos[0] != 0) __builtin_trap();
        for (size_t t = 1; t < pos.size(); ++t)
            if (pos[t] != 0 && pos[t] != pos[t - 1] + 1) __builtin_trap();
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size < 1) return 0;
    const int32_t seq_len = 1 + data[0] % 64;
    const std::string_view text(reinterpret_cast<const char *>(data) + 1, size - 1);
    for (const bool bpe : {false, true}) {
        const rp::Tokenizer & tok = vocab(bpe);
        rp::DatasetOptions o;
        o.seq_len = seq_len;
        o.chat = rp::chat_template_from_name("chatml");
        o.allow_binary = (data[0] & 0x80) != 0;
        o.pack = (data[0] & 0x40) != 0;  // JSONL examples packed several to a sequence
        o.pack_preference = (data[0] & 0x20) != 0;  // and pairs
        o.max_prompt_len = data[0] & 0x07;  // pairs and KTO examples: prompts cut to their last 0..7 tokens (0: whole)
        for (const bool jsonl : {false, true}) {
            try {
                const rp::Dataset a = jsonl ? rp::Dataset::from_jsonl(text, "fuzz", tok, o) : rp::Dataset::from_text(text, "fuzz", tok, o);
                check(a, tok, seq_len);
                const rp::Dataset b = jsonl ? rp::Dataset::from_jsonl(text, "fuzz", tok, o) : rp::Dataset::from_text(text, "fuzz", tok, o);
                if (a.fingerprint() != b.fingerprint()) __builtin_trap();
            } catch (const rp::Error &) {
                // a rejected input: fine
            }
        }
    }
    return 0;
}
