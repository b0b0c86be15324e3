// Finetuning data: a text or JSONL file -> fixed-length token sequences with next-token labels, a seeded
// train / validation split, and batches over epochs with a position that can be saved for a bit-exact resume.
//
// Every sequence has seq_len input tokens and seq_len labels; labels[t] is the token the model should
// predict after inputs[0..t], or kIgnoreLabel (-1: no loss) for masked and padding positions.
//
// Plain text (any file not ending in .jsonl):
//   - The file is cut into documents at every occurrence of DatasetOptions::doc_separator. The default, an
//     empty separator, makes the whole file one document: one token stream, as llama.cpp's finetune does.
//     "\n\n" splits at blank lines; "<|endoftext|>" suits TinyStories dumps. Leading and trailing whitespace
//     of every document is dropped, and empty documents are skipped.
//   - Each document is tokenized with the model's special tokens (BOS when the tokenizer adds one),
//     special-token texts are NOT parsed, and EOS is appended. The documents are concatenated into one
//     stream S and cut into windows of seq_len + 1 tokens with stride seq_len: sequence k has inputs
//     S[k*L .. k*L+L) and labels S[k*L+1 .. k*L+L+1), so every token after the first is predicted exactly
//     once and windows do not overlap. Windows ignore document bounds (tokens attend across an EOS, as in
//     pretraining); a label that would be the BOS of the next document is masked. The last window is padded.
// JSONL (.jsonl; one JSON object per line, blank lines skipped), one example per line, each line one of:
//   {"text": T}                          everything is trained; EOS appended
//   {"prompt": P, "completion": C}       P + C tokenized together (the text the model sees), loss only on
//                                        tokens that start inside C, and on the appended EOS
//   {"messages": [{"role", "content"}, ...]}  rendered with the chat template (special tokens parsed), loss
//                                        only on the assistant replies and their end-of-turn marker
//   {"prompt": P, "chosen": A, "rejected": B}   a preference pair (DPO, IPO, SimPO, ORPO): strings, or TRL's
//                                        conversational form (P a list of messages, A and B lists of assistant
//                                        messages) rendered with the chat template. Every line of the file must
//                                        then be a pair. As TRL does, the prompt and each answer are tokenized
//                                        separately and concatenated: the prompt with BOS, the answer without,
//                                        EOS appended (strings; a rendered answer carries its own end of turn).
//                                        The pair becomes two sequences, prompt + chosen then prompt + rejected
//                                        (a unit of the split and the batches: Dataset::group() is 2), trained on
//                                        the answer tokens only. Too long: the prompt keeps its last
//                                        DatasetOptions::max_prompt_len tokens (when > 0), then each answer is cut
//                                        to what seq_len + 1 leaves (counted in n_truncated); a prompt that leaves
//                                        no answer token, an empty answer or chosen == rejected is an error
//                                        naming the line. Packed (DatasetOptions::pack_preference): see below.
//   {"prompt": P, "completion": C, "label": true|false}   a KTO example (TRL's unpaired preference form; strings or
//                                        conversational, tokenized as pairs are). Every line must then be one,
//                                        with both labels present. Unit k is two sequences: prompt_k +
//                                        completion_k, then its KL sequence prompt_k + completion_(k+1 mod n)
//                                        (TRL's mismatched pairs, over the file's order); Dataset::desirable(k).
//   Other keys (ids, metadata) are ignored; any other combination of these keys is an error.
//   An example is truncated to its first seq_len + 1 tokens when longer (the rest is dropped; counted in
//   DatasetStats::n_truncated); it then fills min(tokens, seq_len) positions. An example left with no trained
//   token after truncation is skipped (DatasetStats::n_skipped).
//   Unpacked (DatasetOptions::pack false): each example is one sequence, padded to seq_len.
//   Packed: examples share sequences (best-fit decreasing: longest first, each into the sequence it fills
//   most tightly; ties to the earliest), each attending only to itself: its RoPE positions restart at 0
//   (Dataset::positions) and the attention of its tokens starts at its first token (block-diagonal causal,
//   models/layer.h TokenPositions). The loss and gradients of a packed sequence are those of its examples
//   run one by one (up to float summation order). The tail of a sequence is padding (masked labels).
//   Packed preference data (pairs, KTO examples; DatasetOptions::pack_preference): a pair's two documents (prompt + chosen, prompt + rejected; a
//   KTO example and its KL sequence) are one item, packed whole and in that order into one sequence, as separate
//   documents sharing nothing; a sequence then holds several pairs and is itself the unit of the split and the
//   batches (group() 1). A document of n tokens fills n - 1 positions (its last token is only a label), so a pair
//   must fit seq_len together: the prompt keeps its last max_prompt_len tokens (when > 0), a prompt longer than
//   seq_len / 2 is an error naming the line, and over-long answers are cut (counted in n_truncated): the longer
//   one first, down to what the shorter leaves, then both evenly (the chosen keeps the odd token).
//   Dataset::answers() tells where each answer's log-probability goes (its slot) and what it is.
//
// Errors throw rp::Error naming the file, and for JSONL the line number and what is wrong.
#pragma once

#include "ggml_rp/core/json.h"
#include "models/text/chat_template.h"

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rp {

class Tokenizer;

constexpr int32_t kIgnoreLabel = -1;

enum class DatasetFormat { Auto, Text, Jsonl };  // Auto: Jsonl for a ".jsonl" file name, else Text

struct DatasetOptions {
    int32_t seq_len = 0;              // tokens per sequence, >= 1
    uint32_t n_ctx = 0;               // the model's context length; seq_len may not exceed it (0: unchecked)
    DatasetFormat format = DatasetFormat::Auto;
    std::string doc_separator;        // plain text: cut documents here ("" = one document)
    std::optional<ChatTemplate> chat; // for "messages" lines; required when such a line appears
    bool train_on_inputs = false;     // "messages" lines: train every token, not only the assistant spans
    bool train_analysis = false;      // "messages" lines, gpt-oss: the assistant spans take in the analysis channel
    bool allow_binary = false;        // train on text with NUL bytes or invalid UTF-8 (refused otherwise)
    bool pack = false;                // JSONL SFT examples: several per sequence (see above); text: no effect
    bool pack_preference = false;     // JSONL preference pairs and KTO examples: several pairs per sequence
    int32_t max_prompt_len = 0;       // preference pairs: the prompt keeps at most its last this many tokens (0: all)
};

struct DatasetStats {
    size_t n_examples = 0;       // documents (text) or lines (JSONL; preference pairs) read
    size_t n_truncated = 0;      // JSONL examples longer than seq_len + 1 tokens
    size_t n_skipped = 0;        // JSONL examples without a trained token after truncation
    size_t n_tokens = 0;         // input tokens that are not padding
    size_t n_trained = 0;        // labels that are not kIgnoreLabel
    size_t n_sequences = 0;      // sequences built
    size_t n_unpacked = 0;       // sequences the same examples would take one per sequence (JSONL)
    int32_t seq_len = 0;
    // Padding: the share of sequence positions that hold no token, as built and (JSONL) without packing.
    double padding_fraction() const;
    double unpacked_padding_fraction() const;
};

// A preference sequence's answer documents, in slots: slot j of sequence i is global slot i * answer_slots() + j,
// and global slots 2k and 2k + 1 are a pair (chosen, rejected) or a KTO example and its KL sequence. Unpacked:
// one slot per sequence (the sequence itself); packed: answer_slots() per sequence, the unused ones empty.
struct AnswerSlot {
    int32_t tokens = 0;  // the answer's trained tokens; 0: an empty slot
    int32_t kind = 0;    // KTO: +1 a desirable example, -1 an undesirable one, 0 its KL sequence; pairs: 0
};

class Dataset {
public:
    // Reads and tokenizes `path`. Throws rp::Error for an unreadable file, a bad line, an empty result, or a
    // seq_len outside [1, n_ctx] ("seq_len N exceeds the model's context M").
    static Dataset load(const std::string & path, const Tokenizer & tok, const DatasetOptions & opt);
    // The same from text in memory; `source` names it in error messages.
    static Dataset from_text(std::string_view text, const std::string & source, const Tokenizer & tok,
                             const DatasetOptions & opt);
    static Dataset from_jsonl(std::string_view text, const std::string & source, const Tokenizer & tok,
                              const DatasetOptions & opt);

    int32_t seq_len() const { return seq_len_; }
    size_t size() const { return size_; }  // number of sequences
    // Sequences per example unit: 1, or 2 for unpacked preference pairs (sequences 2k and 2k + 1: the chosen and
    // the rejected answer of pair k). The split and the batches deal in units, never splitting a pair (packed
    // preference data: a unit is a sequence of whole pairs).
    int32_t group() const { return group_; }
    size_t units() const { return size_ / static_cast<size_t>(group_); }
    bool pairs() const { return pairs_; }  // preference pairs
    bool rollouts() const { return rollouts_; }  // GRPO's prompts (PromptSet::frame): each step samples the sequences
    bool kto() const { return kto_; }      // KTO examples (each with its KL sequence)
    // Preference data: answer slots per sequence (1 unpacked; packed: the most answers a sequence holds, even),
    // sequence i's slots, and the slots of the whole dataset (size() * answer_slots()).
    int32_t answer_slots() const { return answer_slots_; }
    std::span<const AnswerSlot> answers(size_t i) const;
    size_t n_answer_slots() const { return slots_.size(); }
    size_t n_answers() const;  // the slots that hold an answer (two per pair or KTO example)
    std::span<const int32_t> inputs(size_t i) const;
    std::span<const int32_t> labels(size_t i) const;
    // Packed datasets: the RoPE positions of sequence i (restarting at 0 at each example); empty otherwise.
    bool packed() const { return !positions_.empty(); }
    std::span<const int32_t> positions(size_t i) const;
    const DatasetStats & stats() const { return stats_; }
    // FNV-1a over seq_len, the group and every input, label (and position): tells a resumed run that the data
    // did not change.
    uint64_t fingerprint() const;

private:
    Dataset() = default;
    // Appends one sequence (inputs.size() == labels.size() == seq_len).
    void push(const std::vector<int32_t> & inputs, const std::vector<int32_t> & labels);
    void push_positions(const std::vector<int32_t> & positions) { positions_.insert(positions_.end(), positions.begin(), positions.end()); }
    void finish(const std::string & source);
    // Packs examples' (input, label) runs into sequences with positions: items of `per_item` consecutive runs
    // (a preference pair's two documents), each item at most seq_len long, placed whole. `kinds` (preference data:
    // each run's AnswerSlot::kind) lays out the answer slots.
    void pack(const std::vector<std::vector<int32_t>> & inputs, const std::vector<std::vector<int32_t>> & labels, int32_t pad,
              size_t per_item = 1, const std::vector<int32_t> & kinds = {});

    int32_t seq_len_ = 0;
    int32_t group_ = 1;
    bool pairs_ = false, kto_ = false, rollouts_ = false;
    friend class PromptSet;
    int32_t answer_slots_ = 1;
    std::vector<AnswerSlot> slots_;  // preference data: [size][answer_slots]
    size_t size_ = 0;
    std::vector<int32_t> inputs_, labels_;  // [size][seq_len]
    std::vector<int32_t> positions_;        // [size][seq_len] when packed, else empty
    DatasetStats stats_;
};

// GRPO's prompts: JSONL, one object a line with "prompt" (a string, tokenized with BOS and special texts not
// parsed, as pairs' prompts are; or a list of messages rendered with the chat template and its generation prompt,
// special texts parsed) and any other keys, kept for the rewards. A prompt keeps its last max_prompt_len tokens
// when longer (0: all; counted in n_truncated). Errors name the file and line.
struct Prompt {
    std::vector<int32_t> tokens;
    std::string text;     // as rendered (what the reward program is sent)
    json::Value example;  // the line's object
    size_t line = 0;      // 1-based
};

class PromptSet {
public:
    static PromptSet load(const std::string & path, const Tokenizer & tok, const DatasetOptions & opt);
    static PromptSet from_jsonl(std::string_view text, const std::string & source, const Tokenizer & tok, const DatasetOptions & opt);
    size_t size() const { return prompts_.size(); }
    const Prompt & operator[](size_t i) const { return prompts_[i]; }
    const std::string & source() const { return source_; }
    size_t n_truncated() const { return n_truncated_; }
    size_t max_tokens() const;  // the longest prompt's tokens
    // The frame a TrainingSession batches: unit k is prompt k as `group` sequences of seq_len (the prompt's tokens,
    // labels masked; the rollouts fill them in each step: Dataset::rollouts()).
    Dataset frame(int32_t seq_len, int32_t group) const;

private:
    std::vector<Prompt> prompts_;
    std::string source_;
    size_t n_truncated_ = 0;
};

// A uniform integer in [0, n) from a 64-bit generator by rejection (the same on every standard library,
// unlike std::uniform_int_distribution). n >= 1.
uint64_t uniform_below(std::mt19937_64 & rng, uint64_t n);
// Fisher-Yates with uniform_below, from std::mt19937_64 seeded with `seed`.
void shuffle_indices(std::vector<uint32_t> & idx, uint64_t seed);
// Mixes a stream id into a seed (splitmix64), so the split and every epoch draw independent streams.
uint64_t mix_seed(uint64_t seed, uint64_t stream);

// Unit (sequence, or pair: Dataset::units()) indices of the training and validation parts, each sorted ascending. round(fraction * n)
// sequences (at least one when fraction > 0) chosen by a seeded shuffle go to validation. Throws rp::Error
// when fraction is outside [0, 1) or nothing would be left to train on.
struct DatasetSplit {
    std::vector<uint32_t> train, val;
};
DatasetSplit split_dataset(size_t n, double val_fraction, uint64_t seed);

// A batch of sequences laid out [n_seq][seq_len] (an i32 tensor ne = [seq_len, n_seq]).
struct Batch {
    int32_t n_seq = 0;
    int32_t seq_len = 0;
    std::vector<int32_t> inputs, labels;
    std::vector<int32_t> positions;  // packed data only ([n_seq][seq_len]); empty: 0..seq_len-1 in every sequence
    std::vector<uint32_t> units;     // the dataset units it holds, in order (Dataset::group() sequences each)
    const int32_t * positions_or_null(size_t offset = 0) const { return positions.empty() ? nullptr : positions.data() + offset; }
    size_t n_trained() const;  // labels that are not kIgnoreLabel (for the loss scale)
};

// The units `idx` of `data` (Dataset::group() sequences each), in that order.
Batch make_batch(const Dataset & data, std::span<const uint32_t> idx);

// Where a Batcher stands: enough to resume the same sequence stream bit for bit.
struct DataPosition {
    uint64_t seed = 0;
    uint64_t fingerprint = 0;  // of the dataset and the index set
    uint64_t consumed = 0;     // sequences handed out so far, over all epochs
};

// Training batches of units (sequences, or preference pairs: Dataset::group()): epoch e visits the given indices in the order of a permutation drawn from
// mix_seed(seed, e) (or in the given order when shuffle is false); batches of batch_size sequences follow
// each other across epoch bounds, so no sequence is dropped or repeated within an epoch and any batch size
// works, even one larger than an epoch. `data` must outlive the Batcher.
class Batcher {
public:
    Batcher(const Dataset & data, std::vector<uint32_t> indices, int32_t batch_size, uint64_t seed,
            bool shuffle = true);

    Batch next();
    uint64_t epoch() const;              // of the next sequence to hand out
    size_t epoch_size() const { return indices_.size(); }
    DataPosition position() const { return {seed_, fingerprint_, consumed_}; }
    // Resumes at a saved position. Throws rp::Error when it belongs to another seed or other data.
    void seek(const DataPosition & pos);

private:
    const std::vector<uint32_t> & order_for(uint64_t epoch);

    const Dataset & data_;
    std::vector<uint32_t> indices_;
    int32_t batch_size_;
    uint64_t seed_;
    bool shuffle_;
    uint64_t fingerprint_;
    uint64_t consumed_ = 0;
    uint64_t order_epoch_ = UINT64_MAX;
    std::vector<uint32_t> order_;
};

} // namespace rp
