// SentencePiece-style tokenization (tokenizer.ggml.model = llama), formats.md §4.6: spaces become ▁, the
// text starts as one symbol per UTF-8 character, and the adjacent pair whose concatenation is the
// vocabulary token with the highest score is merged until no pair is a token. Symbols that are not tokens
// fall back to byte tokens <0xXX>.
#include "models/text/tokenizer.h"

#include "base/error.h"
#include "models/text/unicode.h"

#include <algorithm>
#include <queue>

namespace rp {

namespace {

struct Symbol {
    uint32_t start;  // byte offset in the escaped text
    uint32_t n;      // byte length; 0 once merged into its left neighbour
    int32_t prev, next;
};

struct Bigram {
    float score;
    int32_t left, right;
    uint32_t size;  // bytes of left + right when queued: a mismatch later means the entry is stale
};

// Highest score first; on a tie the leftmost pair (llama.cpp's llm_bigram_spm::comparator).
struct BigramLess {
    bool operator()(const Bigram & l, const Bigram & r) const {
        return l.score < r.score || (l.score == r.score && l.left > r.left);
    }
};

} // namespace

void Tokenizer::encode_spm(std::string_view frag, size_t base, bool prefix_space, std::vector<int32_t> & out,
                           std::vector<size_t> * offsets) const {
    // Escaped text, and (when offsets are wanted) for each of its bytes the offset of the input byte it
    // came from.
    static constexpr std::string_view kSpace = "\xe2\x96\x81";  // ▁
    std::string text;
    std::vector<size_t> src;
    text.reserve(frag.size() + 8);
    if (prefix_space) {
        text += kSpace;
        if (offsets) {
            src.insert(src.end(), 3, base);
        }
    }
    for (size_t i = 0; i < frag.size(); ++i) {
        if (frag[i] == ' ') {
            text += kSpace;
            if (offsets) {
                src.insert(src.end(), 3, base + i);
            }
        } else {
            text += frag[i];
            if (offsets) {
                src.push_back(base + i);
            }
        }
    }

    std::vector<Symbol> sym;
    sym.reserve(text.size());
    for (size_t off = 0; off < text.size();) {
        const size_t len = std::min(utf8_len(static_cast<uint8_t>(text[off])), text.size() - off);
        const int32_t idx = static_cast<int32_t>(sym.size());
        sym.push_back({static_cast<uint32_t>(off), static_cast<uint32_t>(len), idx - 1,
                       off + len == text.size() ? -1 : idx + 1});
        off += len;
    }

    std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
    auto try_add = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0) {
            return;
        }
        const uint32_t size = sym[static_cast<size_t>(l)].n + sym[static_cast<size_t>(r)].n;
        const int32_t id = text_to_token(std::string_view(text.data() + sym[static_cast<size_t>(l)].start, size));
        if (id == kTokenNull) {
            return;
        }
        queue.push({scores_[static_cast<size_t>(id)], l, r, size});
    };
    for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) {
        try_add(i - 1, i);
    }
    while (!queue.empty()) {
        const Bigram b = queue.top();
        queue.pop();
        Symbol & l = sym[static_cast<size_t>(b.left)];
        Symbol & r = sym[static_cast<size_t>(b.right)];
        if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) {
            continue;  // one side was merged since this pair was queued
        }
        l.n += r.n;
        r.n = 0;
        l.next = r.next;
        if (r.next >= 0) {
            sym[static_cast<size_t>(r.next)].prev = b.left;
        }
        try_add(l.prev, b.left);
        try_add(b.left, l.next);
    }

    // A merged symbol is always a token (it was queued because it is); a lone character that is not one
    // becomes byte tokens. (llama.cpp's resegment() also consults a reverse-merge map, which can only
    // match merged symbols, so it never changes the result.)
    for (int32_t i = sym.empty() ? -1 : 0; i != -1; i = sym[static_cast<size_t>(i)].next) {
        const Symbol & s = sym[static_cast<size_t>(i)];
        const int32_t id = text_to_token(std::string_view(text.data() + s.start, s.n));
        if (id != kTokenNull) {
            out.push_back(id);
            if (offsets) {
                offsets->push_back(src[s.start]);
            }
            continue;
        }
        for (uint32_t j = 0; j < s.n; ++j) {
            const uint8_t byte = static_cast<uint8_t>(text[s.start + j]);
            int32_t bt = byte_token_[byte];
            if (bt == kTokenNull) {
                bt = unk_;  // no <0xXX> token: llama.cpp would throw; SentencePiece emits <unk>
            }
            if (bt == kTokenNull) {
                throw Error(path_ + ": byte value " + std::to_string(byte) +
                            " has no byte token (<0xXX>) and the vocabulary has no unknown token");
            }
            out.push_back(bt);
            if (offsets) {
                offsets->push_back(src[s.start + j]);
            }
        }
    }
}

} // namespace rp
