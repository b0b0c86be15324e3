// Byte-level BPE (tokenizer.ggml.model = gpt2), formats.md §4.5: the pre-tokenizer cuts the text into
// words; each word's bytes are seen through the GPT-2 byte map (one symbol per byte) and the adjacent pair
// with the lowest merge rank is merged until no pair has a rank. Pairs are looked up by piece ids, so the
// loop never builds a string.
#include "models/text/tokenizer.h"

#include "models/text/unicode.h"

#include <algorithm>

namespace rp {

namespace {

struct Symbol {
    int32_t piece;   // piece id of the symbol's text (-1: not a known piece, cannot merge)
    uint32_t start;  // first byte in the word
    uint32_t n;      // bytes; 0 once merged into its left neighbour
    int32_t prev, next;
};

struct Bigram {
    int32_t rank;
    int32_t left, right;
    uint32_t size;  // bytes of left + right when queued: a mismatch later means the entry is stale
};

// std heap functions keep the "largest" on top: make that the lowest rank, then the leftmost pair
// (llama.cpp's llm_bigram_bpe::comparator).
struct BigramAfter {
    bool operator()(const Bigram & l, const Bigram & r) const {
        return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
    }
};

void append_mapped(std::string & out, uint8_t byte) { append_utf8(out, gpt2_byte_to_cpt(byte)); }

} // namespace

void Tokenizer::encode_bpe(std::string_view frag, size_t base, std::vector<int32_t> & out,
                           std::vector<size_t> * offsets) const {
    auto emit = [&](int32_t id, size_t at) {
        out.push_back(id);
        if (offsets) {
            offsets->push_back(at);
        }
    };
    std::vector<uint32_t> cpt_off;
    const std::vector<uint32_t> cpts = utf8_to_cpts(frag, &cpt_off);
    const std::vector<uint32_t> words = pretokenize(pre_, cpts.data(), cpts.size());

    std::string bytes;        // the word re-encoded as UTF-8 (malformed input became U+FFFD)
    std::vector<size_t> src;  // input offset of each of those bytes
    std::string mapped;
    std::vector<Symbol> sym;
    std::vector<Bigram> heap;

    auto add_bigram = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0) {
            return;
        }
        const Symbol & a = sym[static_cast<size_t>(l)];
        const Symbol & b = sym[static_cast<size_t>(r)];
        if (a.piece < 0 || b.piece < 0) {
            return;
        }
        const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a.piece)) << 32) | static_cast<uint32_t>(b.piece);
        const int32_t rank = merge_rank_.find(key);
        if (rank < 0) {
            return;
        }
        heap.push_back({rank, l, r, a.n + b.n});
        std::push_heap(heap.begin(), heap.end(), BigramAfter());
    };

    size_t c0 = 0;
    for (const uint32_t wlen : words) {
        bytes.clear();
        src.clear();
        for (size_t k = c0; k < c0 + wlen; ++k) {
            const size_t before = bytes.size();
            append_utf8(bytes, cpts[k]);
            const size_t src_len = (k + 1 < cpts.size() ? cpt_off[k + 1] : frag.size()) - cpt_off[k];
            for (size_t j = 0; j < bytes.size() - before; ++j) {
                src.push_back(base + cpt_off[k] + std::min(j, src_len - 1));
            }
        }
        c0 += wlen;

        if (ignore_merges_) {
            // Llama 3: a word that is a token as a whole is emitted as is, whatever the merges would do.
            mapped.clear();
            for (char c : bytes) {
                append_mapped(mapped, static_cast<uint8_t>(c));
            }
            const int32_t id = text_to_token(mapped);
            if (id != kTokenNull) {
                emit(id, src[0]);
                continue;
            }
        }

        sym.clear();
        for (size_t j = 0; j < bytes.size(); ++j) {
            const int32_t idx = static_cast<int32_t>(j);
            sym.push_back({byte_piece_[static_cast<uint8_t>(bytes[j])], static_cast<uint32_t>(j), 1, idx - 1,
                           j + 1 == bytes.size() ? -1 : idx + 1});
        }
        heap.clear();
        for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) {
            add_bigram(i - 1, i);
        }
        while (!heap.empty()) {
            std::pop_heap(heap.begin(), heap.end(), BigramAfter());
            const Bigram b = heap.back();
            heap.pop_back();
            Symbol & l = sym[static_cast<size_t>(b.left)];
            Symbol & r = sym[static_cast<size_t>(b.right)];
            if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) {
                continue;  // one side changed since this pair was queued
            }
            l.piece = merge_result_[static_cast<size_t>(b.rank)];
            l.n += r.n;
            r.n = 0;
            l.next = r.next;
            if (r.next >= 0) {
                sym[static_cast<size_t>(r.next)].prev = b.left;
            }
            add_bigram(l.prev, b.left);
            add_bigram(b.left, l.next);
        }

        for (const Symbol & s : sym) {
            if (s.n == 0) {
                continue;
            }
            if (s.piece >= 0 && s.piece < n_vocab_) {
                emit(s.piece, src[s.start]);
                continue;
            }
            // Not a token: llama.cpp looks up each byte of the mapped text as a one-byte token and drops
            // the bytes that are not one.
            for (uint32_t j = 0; j < s.n; ++j) {
                mapped.clear();
                append_mapped(mapped, static_cast<uint8_t>(bytes[s.start + j]));
                for (char c : mapped) {
                    const int32_t id = text_to_token(std::string_view(&c, 1));
                    if (id != kTokenNull) {
                        emit(id, src[s.start + j]);
                    }
                }
            }
        }
    }
}

} // namespace rp
