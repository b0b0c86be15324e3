#include "models/text/tokenizer_pretokenize.h"

#include "models/text/unicode.h"

#include <cassert>

namespace rp {

namespace {

constexpr uint32_t kOutOfRange = 0xFFFFFFFF;

// What the regexes ask about one position. Outside the chunk nothing is true (not even `any`), which is
// how the lookaheads `(?!\S)` and "next char is a letter" see the end of the text.
struct Flags {
    bool any = false;  // inside the chunk
    bool letter = false;
    bool number = false;
    bool mark = false;
    bool space = false;  // White_Space
};

// One chunk [ini, end) of the code points being split, and the words cut from it so far.
struct Chunk {
    const uint32_t * cpts;
    size_t ini, end;
    std::vector<uint32_t> & out;
    size_t prev_end;

    Chunk(const uint32_t * c, size_t i, size_t e, std::vector<uint32_t> & o) : cpts(c), ini(i), end(e), out(o), prev_end(i) {}

    uint32_t cpt(size_t pos) const { return pos >= ini && pos < end ? cpts[pos] : kOutOfRange; }
    Flags flags(size_t pos) const {
        Flags f;
        if (pos < ini || pos >= end) {
            return f;
        }
        const uint32_t c = cpts[pos];
        const Ucat k = ucat(c);
        f.any = true;
        f.letter = k == Ucat::letter;
        f.number = k == Ucat::number;
        f.mark = k == Ucat::mark;
        f.space = is_whitespace(c);
        return f;
    }
    // Ends the current word at `pos` (nothing when empty); returns its length.
    size_t cut(size_t pos) {
        assert(prev_end <= pos && pos <= end);
        const size_t len = pos - prev_end;
        if (len > 0) {
            out.push_back(static_cast<uint32_t>(len));
        }
        prev_end = pos;
        return len;
    }
};

inline uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// Contractions 's 't 're 've 'm 'll 'd at pos; returns their length (0: none). Case-insensitive for the
// Llama-3 family (only ASCII letters can lower-case to these, so ASCII folding is exact).
size_t contraction(const Chunk & ch, size_t pos, bool ignore_case) {
    if (ch.cpt(pos) != '\'' || pos + 1 >= ch.end) {
        return 0;
    }
    auto fold = [&](uint32_t c) { return ignore_case ? ascii_lower(c) : c; };
    const uint32_t c1 = fold(ch.cpt(pos + 1));
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        return 2;
    }
    if (pos + 2 < ch.end) {
        const uint32_t c2 = fold(ch.cpt(pos + 2));
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
            return 3;
        }
    }
    return 0;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void split_gpt2(Chunk & ch) {
    for (size_t pos = ch.ini; pos < ch.end;) {
        const uint32_t c = ch.cpt(pos);
        if (const size_t n = contraction(ch, pos, false)) {
            pos += ch.cut(pos + n);
            continue;
        }
        // an optional leading space belongs to the run that follows it
        Flags f2 = c == ' ' ? ch.flags(pos + 1) : ch.flags(pos);
        if (f2.letter) {
            pos += (c == ' ');
            while (f2.letter) {
                f2 = ch.flags(++pos);
            }
            ch.cut(pos);
            continue;
        }
        if (f2.number) {
            pos += (c == ' ');
            while (f2.number) {
                f2 = ch.flags(++pos);
            }
            ch.cut(pos);
            continue;
        }
        if (!(f2.space || f2.letter || f2.number) && f2.any) {
            pos += (c == ' ');
            while (!(f2.space || f2.letter || f2.number) && f2.any) {
                f2 = ch.flags(++pos);
            }
            ch.cut(pos);
            continue;
        }
        size_t n_space = 0;
        while (ch.flags(pos + n_space).space) {
            ++n_space;
        }
        if (n_space > 1 && ch.cpt(pos + n_space) != kOutOfRange) {
            // \s+(?!\S): leave the last space to the word that follows
            pos += n_space - 1;
            ch.cut(pos);
            continue;
        }
        if (n_space > 0) {
            pos += n_space;
            ch.cut(pos);
            continue;
        }
        ch.cut(++pos);  // matched by no branch: a word of its own
    }
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+      with_marks: [\p{L}\p{M}] in place of \p{L} (Qwen3.5)
void split_llama3(Chunk & ch, size_t max_digits, bool with_marks) {
    auto letter = [&](const Flags & f) { return f.letter || (with_marks && f.mark); };
    for (size_t pos = ch.ini; pos < ch.end;) {
        const uint32_t c = ch.cpt(pos);
        const Flags f = ch.flags(pos);
        if (const size_t n = contraction(ch, pos, true)) {
            pos += ch.cut(pos + n);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if (!(c == '\r' || c == '\n' || f.number)) {
            if (letter(f) || letter(ch.flags(pos + 1))) {
                ++pos;
                while (letter(ch.flags(pos))) {
                    ++pos;
                }
                ch.cut(pos);
                continue;
            }
        }
        // \p{N}{1,max_digits}
        if (f.number) {
            size_t ini = pos;
            while (ch.flags(pos).number) {
                if (++pos - ini >= max_digits) {
                    ch.cut(pos);
                    ini = pos;
                }
            }
            ch.cut(pos);
            continue;
        }
        // <space>?[^\s\p{L}\p{N}]+[\r\n]*
        Flags f2 = c == ' ' ? ch.flags(pos + 1) : f;
        if (!(f2.space || letter(f2) || f2.number) && f2.any) {
            pos += (c == ' ');
            while (!(f2.space || letter(f2) || f2.number) && f2.any) {
                f2 = ch.flags(++pos);
            }
            uint32_t c2 = ch.cpt(pos);
            while (c2 == '\r' || c2 == '\n') {
                c2 = ch.cpt(++pos);
            }
            ch.cut(pos);
            continue;
        }
        size_t n_space = 0;
        size_t last_newline_end = 0;
        while (ch.flags(pos + n_space).space) {
            const uint32_t c2 = ch.cpt(pos + n_space);
            if (c2 == '\r' || c2 == '\n') {
                last_newline_end = pos + n_space + 1;
            }
            ++n_space;
        }
        if (last_newline_end > 0) {  // \s*[\r\n]+
            pos = last_newline_end;
            ch.cut(pos);
            continue;
        }
        if (n_space > 1 && ch.cpt(pos + n_space) != kOutOfRange) {  // \s+(?!\S)
            pos += n_space - 1;
            ch.cut(pos);
            continue;
        }
        if (n_space > 0) {  // \s+
            pos += n_space;
            ch.cut(pos);
            continue;
        }
        ch.cut(++pos);
    }
}

// What GPT-4o's regex sees of a code point. llama.cpp runs that regex through std::regex on "collapsed" text:
// ASCII as it is, every other code point one byte for its class (whitespace, letter, number, or one of the
// others: punctuation, mark, symbol, anything else). So \s is ASCII's " \t\n\v\f\r" or non-ASCII
// whitespace, letters' case is ASCII's ([^a-z] / [^A-Z] among letters: a non-ASCII letter is both upper and
// lower), and marks are not letters.
struct Gpt4oClass {
    bool any = false, letter = false, upper = false, lower = false, number = false, space = false;
    bool other() const { return any && !space && !letter && !number; }
};

Gpt4oClass gpt4o_class(const Chunk & ch, size_t pos) {
    Gpt4oClass k;
    const uint32_t c = ch.cpt(pos);
    if (c == kOutOfRange) {
        return k;
    }
    k.any = true;
    if (c < 128) {
        const bool up = c >= 'A' && c <= 'Z', low = c >= 'a' && c <= 'z';
        k.letter = up || low;
        k.upper = up;
        k.lower = low;
        k.number = c >= '0' && c <= '9';
        k.space = c == ' ' || (c >= '\t' && c <= '\r');
        return k;
    }
    k.space = is_whitespace(c);
    if (!k.space) {
        const Ucat u = ucat(c);
        k.letter = k.upper = k.lower = u == Ucat::letter;
        k.number = u == Ucat::number;
    }
    return k;
}

// (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])? after position e: where the word ends.
size_t gpt4o_contraction_end(const Chunk & ch, size_t e) {
    const size_t n = contraction(ch, e, true);
    return e + n;
}

// The two letter alternatives from s (a letter): U*L+ (the engine's backtracking: the U run gives back
// until a lower-case letter follows), else U+L*; then the contraction (GPT-4o's; tekken has none). 0 when
// neither matches.
size_t gpt4o_letters(const Chunk & ch, size_t s, bool contractions) {
    auto word_end = [&](size_t e) { return contractions ? gpt4o_contraction_end(ch, e) : e; };
    size_t u = 0;
    while (gpt4o_class(ch, s + u).upper) {
        ++u;
    }
    for (size_t j = u + 1; j-- > 0;) {
        if (gpt4o_class(ch, s + j).lower) {
            size_t e = s + j;
            while (gpt4o_class(ch, e).lower) {
                ++e;
            }
            return word_end(e);
        }
    }
    if (u > 0) {
        size_t e = s + u;
        while (gpt4o_class(ch, e).lower) {
            ++e;
        }
        return word_end(e);
    }
    return 0;
}

// GPT-4o's regex (PreTokenizer::Gpt4o; tekken's without contractions and with single digits),
// leftmost-first like std::regex; text no alternative matches stays a word of its own between the matches
// (llama.cpp's unicode_regex_split_stl).
void split_gpt4o(Chunk & ch, bool contractions, size_t max_digits) {
    size_t pos = ch.ini;
    auto match = [&](size_t start, size_t end) {
        ch.cut(start);  // the unmatched text before it, if any
        ch.cut(end);
        pos = end;
    };
    while (pos < ch.end) {
        const Gpt4oClass k = gpt4o_class(ch, pos);
        const uint32_t c = ch.cpt(pos);
        // [^\r\n\p{L}\p{N}]? then the letters (the prefix is never a letter: with or without it, never both)
        const bool prefix = k.any && c != '\r' && c != '\n' && !k.letter && !k.number;
        if (prefix || k.letter) {
            if (const size_t e = gpt4o_letters(ch, prefix ? pos + 1 : pos, contractions)) {
                match(pos, e);
                continue;
            }
        }
        if (k.number) {  // \p{N}{1,3} (tekken: \p{N})
            size_t e = pos;
            while (e - pos < max_digits && gpt4o_class(ch, e).number) {
                ++e;
            }
            match(pos, e);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n/]*'
        const size_t o = (c == ' ' && gpt4o_class(ch, pos + 1).other()) ? pos + 1 : pos;
        if (gpt4o_class(ch, o).other()) {
            size_t e = o;
            while (gpt4o_class(ch, e).other()) {
                ++e;
            }
            for (uint32_t c2 = ch.cpt(e); c2 == '\r' || c2 == '\n' || c2 == '/'; c2 = ch.cpt(++e)) {
            }
            match(pos, e);
            continue;
        }
        size_t n_space = 0, last_newline_end = 0;
        while (gpt4o_class(ch, pos + n_space).space) {
            const uint32_t c2 = ch.cpt(pos + n_space);
            if (c2 == '\r' || c2 == '\n') {
                last_newline_end = pos + n_space + 1;
            }
            ++n_space;
        }
        if (last_newline_end > 0) {  // \s*[\r\n]+
            match(pos, last_newline_end);
            continue;
        }
        if (n_space > 1 && ch.cpt(pos + n_space) != kOutOfRange) {  // \s+(?!\S)
            match(pos, pos + n_space - 1);
            continue;
        }
        if (n_space > 0) {  // \s+
            match(pos, pos + n_space);
            continue;
        }
        ++pos;  // no alternative matches here: part of the text between matches
    }
    ch.cut(ch.end);
}

// A regex "[class]+" as llama.cpp applies it: every maximal run of class members becomes a word, and so
// does every gap between runs.
template <typename Pred>
void split_runs(Chunk & ch, Pred in_class) {
    size_t pos = ch.ini;
    while (pos < ch.end) {
        const bool run = in_class(ch.cpts[pos]);
        while (pos < ch.end && in_class(ch.cpts[pos]) == run) {
            ++pos;
        }
        ch.cut(pos);
    }
}

// [0-9][0-9][0-9]: leftmost non-overlapping triples of ASCII digits become words; the rest stays as gaps.
void split_digit_triples(Chunk & ch) {
    auto digit = [&](size_t p) { return p < ch.end && ch.cpts[p] >= '0' && ch.cpts[p] <= '9'; };
    size_t pos = ch.ini;
    while (pos < ch.end) {
        if (digit(pos) && digit(pos + 1) && digit(pos + 2)) {
            ch.cut(pos);  // the gap before the triple
            pos += 3;
            ch.cut(pos);
        } else {
            ++pos;
        }
    }
    ch.cut(ch.end);
}

// \p{P} plus $ + < = > ^ ~ |  (the ASCII symbols the default regex lists; not `)
bool default_punct(uint32_t c) {
    if (c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '~' || c == '|') {
        return true;
    }
    return ucat(c) == Ucat::punctuation;
}

// Applies one splitting stage to every word of `words` (lengths), returning the refined lengths.
template <typename Stage>
std::vector<uint32_t> refine(const uint32_t * cpts, const std::vector<uint32_t> & words, Stage stage) {
    std::vector<uint32_t> out;
    out.reserve(words.size() * 2);
    size_t start = 0;
    for (uint32_t len : words) {
        Chunk ch(cpts, start, start + len, out);
        stage(ch);
        start += len;
    }
    return out;
}

} // namespace

std::vector<uint32_t> pretokenize(PreTokenizer kind, const uint32_t * cpts, size_t n) {
    std::vector<uint32_t> words;
    if (n == 0) {
        return words;
    }
    words.push_back(static_cast<uint32_t>(n));
    switch (kind) {
        case PreTokenizer::Gpt2:
            return refine(cpts, words, [](Chunk & ch) { split_gpt2(ch); });
        case PreTokenizer::Llama3:
            return refine(cpts, words, [](Chunk & ch) { split_llama3(ch, 3, false); });
        case PreTokenizer::Qwen2:
            return refine(cpts, words, [](Chunk & ch) { split_llama3(ch, 1, false); });
        case PreTokenizer::Qwen35:
            return refine(cpts, words, [](Chunk & ch) { split_llama3(ch, 1, true); });
        case PreTokenizer::Gpt4o:
            return refine(cpts, words, [](Chunk & ch) { split_gpt4o(ch, true, 3); });
        case PreTokenizer::Tekken:
            return refine(cpts, words, [](Chunk & ch) { split_gpt4o(ch, false, 1); });
        case PreTokenizer::Default:
            words = refine(cpts, words, [](Chunk & ch) { split_runs(ch, default_punct); });
            words = refine(cpts, words, [](Chunk & ch) { split_gpt2(ch); });
            words = refine(cpts, words, [](Chunk & ch) { split_runs(ch, [](uint32_t c) { return is_number(c); }); });
            return refine(cpts, words, [](Chunk & ch) { split_digit_triples(ch); });
    }
    return words;
}

} // namespace rp
