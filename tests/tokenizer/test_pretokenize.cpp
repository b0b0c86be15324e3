// Unicode classes, lenient UTF-8, the GPT-2 byte map, and the pre-tokenizers: hand-derived splits of
// small strings, then every fixture input split by our matchers against std::regex running llama.cpp's
// regexes on llama.cpp's "collapsed" text (one byte per code point standing for its category) — the
// very mechanism llama.cpp falls back to, so an independent check of the hand-written matchers.
#include "tok_test_util.h"

#include "models/text/tokenizer_pretokenize.h"
#include "models/text/unicode.h"

#include <gtest/gtest.h>

// g++ 12 with -O3 -fsanitize=address reports -Wmaybe-uninitialized inside libstdc++'s regex (a known false
// positive); the pragma covers the header's lines, where the warning is located.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <regex>
#pragma GCC diagnostic pop

using namespace tok_test;
using rp::PreTokenizer;
using rp::Ucat;

namespace {

TEST(Unicode, Categories) {
    EXPECT_EQ(rp::ucat('A'), Ucat::letter);
    EXPECT_EQ(rp::ucat('z'), Ucat::letter);
    EXPECT_EQ(rp::ucat('5'), Ucat::number);
    EXPECT_EQ(rp::ucat('!'), Ucat::punctuation);
    EXPECT_EQ(rp::ucat('_'), Ucat::punctuation);
    EXPECT_EQ(rp::ucat('$'), Ucat::symbol);
    EXPECT_EQ(rp::ucat('`'), Ucat::symbol);
    EXPECT_EQ(rp::ucat(' '), Ucat::separator);
    EXPECT_EQ(rp::ucat('\n'), Ucat::control);
    EXPECT_EQ(rp::ucat(0xBD), Ucat::number);      // ½ (No)
    EXPECT_EQ(rp::ucat(0xB2), Ucat::number);      // ² (No)
    EXPECT_EQ(rp::ucat(0xC4), Ucat::letter);      // Ä
    EXPECT_EQ(rp::ucat(0x0301), Ucat::mark);      // combining acute
    EXPECT_EQ(rp::ucat(0x0416), Ucat::letter);    // Ж
    EXPECT_EQ(rp::ucat(0x17B6), Ucat::mark);      // Khmer vowel sign aa (Mc)
    EXPECT_EQ(rp::ucat(0x4E00), Ucat::letter);    // 一
    EXPECT_EQ(rp::ucat(0x1F999), Ucat::symbol);   // 🦙
    EXPECT_EQ(rp::ucat(0xFF5E), Ucat::symbol);    // ～ fullwidth tilde (Sm)
    EXPECT_EQ(rp::ucat(0x3001), Ucat::punctuation);
    EXPECT_EQ(rp::ucat(0x200D), Ucat::control);   // ZWJ (Cf)
    EXPECT_EQ(rp::ucat(0xE000), Ucat::control);   // private use (Co)
    EXPECT_EQ(rp::ucat(0x2028), Ucat::separator);
    EXPECT_EQ(rp::ucat(0x0378), Ucat::undefined);
    EXPECT_EQ(rp::ucat(0x10FFFF), Ucat::undefined);
    EXPECT_EQ(rp::ucat(0x110000), Ucat::undefined);
    EXPECT_EQ(rp::ucat(0x20000), Ucat::letter);   // CJK extension B
    EXPECT_EQ(rp::ucat(0x31350), Ucat::letter);   // CJK extension H (Unicode 15.0)
    EXPECT_STRNE(rp::unicode_version(), "");
}

TEST(Unicode, Whitespace) {
    for (uint32_t c : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u, 0x200Au, 0x2028u,
                       0x2029u, 0x202Fu, 0x205Fu, 0x3000u}) {
        EXPECT_TRUE(rp::is_whitespace(c)) << std::hex << c;
    }
    for (uint32_t c : {0x08u, 0x1Cu, 0x1Fu, 0x41u, 0x180Eu, 0x200Bu, 0xFEFFu}) {
        EXPECT_FALSE(rp::is_whitespace(c)) << std::hex << c;
    }
}

TEST(Unicode, LenientUtf8) {
    using V = std::vector<uint32_t>;
    EXPECT_EQ(rp::utf8_to_cpts("a\xc3\xa9\xe4\xb8\x80\xf0\x9f\xa6\x99"), (V{'a', 0xE9, 0x4E00, 0x1F999}));
    std::vector<uint32_t> offs;
    rp::utf8_to_cpts("a\xc3\xa9\xe4\xb8\x80", &offs);
    EXPECT_EQ(offs, (V{0, 1, 3}));
    const uint32_t R = rp::kReplacementChar;
    EXPECT_EQ(rp::utf8_to_cpts("\xc3"), (V{R}));                     // truncated
    EXPECT_EQ(rp::utf8_to_cpts("\x80x"), (V{R, 'x'}));               // stray continuation byte
    EXPECT_EQ(rp::utf8_to_cpts("\xe4\xb8x"), (V{R, R, 'x'}));        // missing continuation: one byte each
    EXPECT_EQ(rp::utf8_to_cpts("\xff\xf8"), (V{R, R}));
    EXPECT_EQ(rp::utf8_to_cpts("\xf4\x90\x80\x80"), (V{R, R, R, R}));  // above U+10FFFF
    EXPECT_EQ(rp::utf8_to_cpts("\xc0\x80"), (V{0}));                 // overlong: decoded, as llama.cpp
    std::string s;
    for (uint32_t c : {0x41u, 0xE9u, 0x4E00u, 0x1F999u}) {
        rp::append_utf8(s, c);
    }
    EXPECT_EQ(s, "A\xc3\xa9\xe4\xb8\x80\xf0\x9f\xa6\x99");
}

TEST(Unicode, Gpt2ByteMap) {
    EXPECT_EQ(rp::gpt2_byte_to_cpt(' '), 0x120u);  // Ġ
    EXPECT_EQ(rp::gpt2_byte_to_cpt('\n'), 0x10Au);  // Ċ
    EXPECT_EQ(rp::gpt2_byte_to_cpt(0x00), 0x100u);
    EXPECT_EQ(rp::gpt2_byte_to_cpt('A'), static_cast<uint32_t>('A'));
    EXPECT_EQ(rp::gpt2_byte_to_cpt(0x7F), 0x121u);  // after the 33 bytes 0x00..0x20
    EXPECT_EQ(rp::gpt2_byte_to_cpt(0xA0), 0x142u);
    EXPECT_EQ(rp::gpt2_byte_to_cpt(0xAD), 0x143u);  // the last of the 68
    EXPECT_EQ(rp::gpt2_byte_to_cpt(0xE9), 0xE9u);
    for (int b = 0; b < 256; ++b) {
        EXPECT_EQ(rp::gpt2_cpt_to_byte(rp::gpt2_byte_to_cpt(static_cast<uint8_t>(b))), b);
    }
    EXPECT_EQ(rp::gpt2_cpt_to_byte(0x20), -1);
    EXPECT_EQ(rp::gpt2_cpt_to_byte(0x144), -1);
}

std::vector<std::string> split(PreTokenizer kind, const std::string & text) {
    std::vector<uint32_t> offs;
    const std::vector<uint32_t> cpts = rp::utf8_to_cpts(text, &offs);
    std::vector<std::string> words;
    size_t c = 0;
    for (uint32_t len : rp::pretokenize(kind, cpts.data(), cpts.size())) {
        const size_t b = offs[c];
        const size_t e = c + len < cpts.size() ? offs[c + len] : text.size();
        words.push_back(text.substr(b, e - b));
        c += len;
    }
    EXPECT_EQ(c, cpts.size());
    return words;
}

using W = std::vector<std::string>;

TEST(Pretokenize, Gpt2) {
    EXPECT_EQ(split(PreTokenizer::Gpt2, "Hello world"), (W{"Hello", " world"}));
    EXPECT_EQ(split(PreTokenizer::Gpt2, "  Hello"), (W{" ", " Hello"}));
    EXPECT_EQ(split(PreTokenizer::Gpt2, "it's 123 !!"), (W{"it", "'s", " 123", " !!"}));
    EXPECT_EQ(split(PreTokenizer::Gpt2, "a  \n b"), (W{"a", "  \n", " b"}));
    EXPECT_EQ(split(PreTokenizer::Gpt2, "x   "), (W{"x", "   "}));
    EXPECT_EQ(split(PreTokenizer::Gpt2, "I'M"), (W{"I", "'", "M"}));  // case-sensitive contractions
    EXPECT_EQ(split(PreTokenizer::Gpt2, "4 \xc2\xbd"), (W{"4", " \xc2\xbd"}));  // ½ is a number
    EXPECT_TRUE(split(PreTokenizer::Gpt2, "").empty());
}

TEST(Pretokenize, Llama3) {
    EXPECT_EQ(split(PreTokenizer::Llama3, "I'M"), (W{"I", "'M"}));
    EXPECT_EQ(split(PreTokenizer::Llama3, "12345"), (W{"123", "45"}));
    EXPECT_EQ(split(PreTokenizer::Llama3, "ab12c"), (W{"ab", "12", "c"}));
    EXPECT_EQ(split(PreTokenizer::Llama3, "Hello\n\nworld"), (W{"Hello", "\n\n", "world"}));
    EXPECT_EQ(split(PreTokenizer::Llama3, "\n ="), (W{"\n", " ="}));
    EXPECT_EQ(split(PreTokenizer::Llama3, "'hello"), (W{"'hello"}));
    EXPECT_EQ(split(PreTokenizer::Llama3, "$$$\r\n\r\nx"), (W{"$$$\r\n\r\n", "x"}));
    EXPECT_EQ(split(PreTokenizer::Llama3, "a \n\n  b"), (W{"a", " \n\n", " ", " b"}));
}

TEST(Pretokenize, Qwen) {
    EXPECT_EQ(split(PreTokenizer::Qwen2, "12345"), (W{"1", "2", "3", "4", "5"}));
    EXPECT_EQ(split(PreTokenizer::Qwen2, "e\xcc\x81x"), (W{"e", "\xcc\x81x"}));  // a mark is not a letter
    EXPECT_EQ(split(PreTokenizer::Qwen35, "e\xcc\x81x"), (W{"e\xcc\x81x"}));     // ... unless qwen35
}

// GPT-4o's case-aware words (ASCII case: a non-ASCII letter is upper and lower at once, so it ends an upper
// run's backtracking), contractions as suffixes, digits by three, '/' after punctuation and newlines.
TEST(Pretokenize, Gpt4o) {
    EXPECT_EQ(split(PreTokenizer::Gpt4o, "HelloWorld"), (W{"Hello", "World"}));
    EXPECT_EQ(split(PreTokenizer::Gpt4o, "helloWORLD"), (W{"hello", "WORLD"}));
    EXPECT_EQ(split(PreTokenizer::Gpt4o, "HELLOworld"), (W{"HELLOworld"}));
    EXPECT_EQ(split(PreTokenizer::Gpt4o, "\xc3\x89" "COLE"), (W{"\xc3\x89", "COLE"}));  // U*L+ backtracks to the É alone
    EXPECT_EQ(split(PreTokenizer::Gpt4o, "don't I'M"), (W{"don't", " I'M"}));
    EXPECT_EQ(split(PreTokenizer::Gpt4o, "12345"), (W{"123", "45"}));
    EXPECT_EQ(split(PreTokenizer::Gpt4o, "a+=/\n/b"), (W{"a", "+=/\n/", "b"}));
    EXPECT_EQ(split(PreTokenizer::Gpt4o, "e\xcc\x81x"), (W{"e", "\xcc\x81x"}));  // marks are not letters
    EXPECT_EQ(split(PreTokenizer::Gpt4o, "a \n\n  b"), (W{"a", " \n\n", " ", " b"}));
}

// Mistral's tekken: GPT-4o's words without the contractions, digits one by one.
TEST(Pretokenize, Tekken) {
    EXPECT_EQ(split(PreTokenizer::Tekken, "HelloWorld"), (W{"Hello", "World"}));
    EXPECT_EQ(split(PreTokenizer::Tekken, "don't I'M"), (W{"don", "'t", " I", "'M"}));
    EXPECT_EQ(split(PreTokenizer::Tekken, "123"), (W{"1", "2", "3"}));
}

TEST(Pretokenize, Default) {
    EXPECT_EQ(split(PreTokenizer::Default, "Hello, world!! 12345 $x"),
              (W{"Hello", ",", " world", "!!", " ", "123", "45", " ", "$", "x"}));
    EXPECT_EQ(split(PreTokenizer::Default, "a1234567b"), (W{"a", "123", "456", "7", "b"}));
}

// ---- std::regex on llama.cpp's collapsed text ----------------------------------------------------------

std::string collapse(const std::vector<uint32_t> & cpts) {
    std::string s;
    for (uint32_t c : cpts) {
        if (c < 128) {
            s += static_cast<char>(c);
        } else if (rp::is_whitespace(c)) {
            s += '\x0B';
        } else {
            switch (rp::ucat(c)) {
                case Ucat::number: s += '\xD1'; break;
                case Ucat::letter: s += '\xD2'; break;
                case Ucat::punctuation: s += '\xD3'; break;
                case Ucat::mark: s += '\xD4'; break;
                case Ucat::symbol: s += '\xD5'; break;
                default: s += '\xD0'; break;
            }
        }
    }
    return s;
}

// llama.cpp's unicode_regex_split_stl: each match is a word, and so is each gap between matches.
std::vector<uint32_t> regex_split(const std::string & text, const std::string & re, const std::vector<uint32_t> & words) {
    const std::regex expr(re, std::regex_constants::optimize | std::regex_constants::nosubs);
    std::vector<uint32_t> out;
    size_t start = 0;
    for (uint32_t len : words) {
        std::sregex_iterator it(text.begin() + static_cast<std::ptrdiff_t>(start),
                                text.begin() + static_cast<std::ptrdiff_t>(start + len), expr);
        int64_t at = 0;
        for (; it != std::sregex_iterator(); ++it) {
            if (it->position() > at) {
                out.push_back(static_cast<uint32_t>(it->position() - at));
            }
            out.push_back(static_cast<uint32_t>(it->length()));
            at = it->position() + it->length();
        }
        if (at < static_cast<int64_t>(len)) {
            out.push_back(static_cast<uint32_t>(len - at));
        }
        start += len;
    }
    return out;
}

const std::string L = "\xD2" "A-Za-z";
const std::string N = "\xD1" "0-9";
const std::string P = "\xD3" "\\x21-\\x23\\x25-\\x2A\\x2C-\\x2F\\x3A-\\x3B\\x3F-\\x40\\x5B-\\x5D\\x5F\\x7B\\x7D";
const std::string kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?[" + L + "]+| ?[" + N + "]+| ?[^\\s" + L + N + "]+|\\s+(?!\\S)";
std::string llama3_re(const std::string & digits) {
    return "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n" + L + N + "]?[" + L + "]+|[" + N +
           "]" + digits + "| ?[^\\s" + L + N + "]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
}

// GPT-4o's regex as llama.cpp rewrites it for std::regex (its tokenizer.json form needs \p{Lu} and friends);
// tekken's is the same without the contractions and with single digits.
std::string gpt4o_re(bool tekken = false) {
    const std::string up = "((?=[" + L + "])([^a-z]))", low = "((?=[" + L + "])([^A-Z]))";
    const std::string c = tekken ? "" : "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?";
    const std::string pre = "[^\\r\\n" + L + N + "]?";
    return pre + up + "*" + low + "+" + c + "|" + pre + up + "+" + low + "*" + c + "|[" + N + "]" + (tekken ? "" : "{1,3}") + "| ?[^\\s" + L + N +
           "]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
}

std::vector<uint32_t> regex_pretokenize(PreTokenizer kind, const std::vector<uint32_t> & cpts) {
    const std::string text = collapse(cpts);
    std::vector<uint32_t> words;
    if (cpts.empty()) {
        return words;
    }
    words.push_back(static_cast<uint32_t>(cpts.size()));
    switch (kind) {
        case PreTokenizer::Gpt2: return regex_split(text, kGpt2, words);
        case PreTokenizer::Llama3: return regex_split(text, llama3_re("{1,3}"), words);
        case PreTokenizer::Qwen2: return regex_split(text, llama3_re(""), words);
        case PreTokenizer::Gpt4o: return regex_split(text, gpt4o_re(), words);
        case PreTokenizer::Tekken: return regex_split(text, gpt4o_re(true), words);
        case PreTokenizer::Default:
            words = regex_split(text, "[" + P + "\\$\\+<=>\\^~\\|]+", words);
            words = regex_split(text, kGpt2, words);
            words = regex_split(text, "[" + N + "]+", words);
            return regex_split(text, "[0-9][0-9][0-9]", words);
        default: break;
    }
    return words;
}

TEST(Pretokenize, MatchesStdRegexOnFixtureInputs) {
    std::vector<std::string> inputs;
    for (const char * v : {"llama-spm", "llama-bpe", "qwen2", "gpt-2"}) {
        for (std::string & s : read_inp(models_dir() + "/vocab/ggml-vocab-" + std::string(v) + ".gguf.inp")) {
            inputs.push_back(std::move(s));
        }
    }
    inputs.push_back("a\r\n\r\n b\t\t c \xe3\x80\x80 d\xc2\xa0\xc2\xa0" "e 'S 'Ll 'x ''' ...\n\n");
    inputs.push_back("1\xc2\xbd\xc2\xb2 \xd9\xa3\xd9\xa4 x\xe2\x80\x8d" "y <|im_start|> $+<=>^~|` \xe2\x82\xac\xe2\x82\xac");
    inputs.push_back("HelloWorld HELLOworld \xc3\x89" "COLE \xc3\x89" "cole McDONALD'S iPhone a/b\n/c\r\n//d");
    int n = 0;
    for (PreTokenizer kind :
         {PreTokenizer::Gpt2, PreTokenizer::Llama3, PreTokenizer::Qwen2, PreTokenizer::Gpt4o, PreTokenizer::Tekken, PreTokenizer::Default}) {
        for (const std::string & s : inputs) {
            const std::vector<uint32_t> cpts = rp::utf8_to_cpts(s);
            EXPECT_EQ(rp::pretokenize(kind, cpts.data(), cpts.size()), regex_pretokenize(kind, cpts))
                << "kind " << static_cast<int>(kind) << " on '" << s << "'";
            ++n;
        }
    }
    EXPECT_EQ(n, 6 * (4 * 46 + 3));
}

} // namespace
