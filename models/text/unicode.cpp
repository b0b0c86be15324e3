#include "models/text/unicode.h"

#include <algorithm>
#include <array>

namespace rp {

namespace unicode_tables {
extern const char kUnicodeVersion[];
extern const uint32_t kUcatRangeCount;
extern const uint32_t kUcatRangeStart[];
extern const uint8_t kUcatRangeClass[];
} // namespace unicode_tables

namespace {

// ASCII is looked up on every character of typical text: answer it from a 128-entry copy of the table.
struct AsciiClasses {
    std::array<Ucat, 128> cls{};
    AsciiClasses() {
        uint32_t r = 0;
        for (uint32_t cp = 0; cp < 128; ++cp) {
            while (r + 1 < unicode_tables::kUcatRangeCount && unicode_tables::kUcatRangeStart[r + 1] <= cp) {
                ++r;
            }
            cls[cp] = static_cast<Ucat>(unicode_tables::kUcatRangeClass[r]);
        }
    }
};

} // namespace

Ucat ucat(uint32_t cp) {
    static const AsciiClasses ascii;
    if (cp < 128) {
        return ascii.cls[cp];
    }
    if (cp > 0x10FFFF) {
        return Ucat::undefined;
    }
    const uint32_t * begin = unicode_tables::kUcatRangeStart;
    const uint32_t * end = begin + unicode_tables::kUcatRangeCount;
    const uint32_t * it = std::upper_bound(begin, end, cp);  // first range starting after cp
    return static_cast<Ucat>(unicode_tables::kUcatRangeClass[(it - begin) - 1]);
}

bool is_whitespace(uint32_t cp) {
    // White_Space from PropList.txt; unchanged since Unicode 6.
    if (cp < 0x80) {
        return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20;
    }
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

const char * unicode_version() { return unicode_tables::kUnicodeVersion; }

std::vector<uint32_t> utf8_to_cpts(std::string_view text, std::vector<uint32_t> * byte_offsets) {
    std::vector<uint32_t> cpts;
    cpts.reserve(text.size());
    if (byte_offsets) {
        byte_offsets->clear();
        byte_offsets->reserve(text.size());
    }
    const auto * s = reinterpret_cast<const uint8_t *>(text.data());
    const size_t n = text.size();
    size_t i = 0;
    auto cont = [&](size_t k) { return i + k < n && (s[i + k] & 0xC0) == 0x80; };
    while (i < n) {
        const uint8_t b = s[i];
        uint32_t cp = kReplacementChar;
        size_t len = 1;
        if (b < 0x80) {
            cp = b;
        } else if ((b & 0xE0) == 0xC0) {
            if (cont(1)) {
                cp = ((b & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu);
                len = 2;
            }
        } else if ((b & 0xF0) == 0xE0) {
            if (cont(1) && cont(2)) {
                cp = ((b & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3Fu);
                len = 3;
            }
        } else if ((b & 0xF8) == 0xF0) {
            if (cont(1) && cont(2) && cont(3)) {
                cp = ((b & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) |
                     (s[i + 3] & 0x3Fu);
                len = 4;
                if (cp > 0x10FFFF) {
                    cp = kReplacementChar;
                    len = 1;
                }
            }
        }
        // else: a continuation byte or 0xF8..0xFF as lead -> U+FFFD, one byte
        cpts.push_back(cp);
        if (byte_offsets) {
            byte_offsets->push_back(static_cast<uint32_t>(i));
        }
        i += len;
    }
    return cpts;
}

size_t first_invalid_utf8(std::string_view text) {
    const auto * b = reinterpret_cast<const unsigned char *>(text.data());
    const size_t n = text.size();
    for (size_t i = 0; i < n;) {
        const unsigned c = b[i];
        if (c < 0x80) {
            ++i;
            continue;
        }
        size_t len = 0;
        uint32_t cp = 0, min = 0;
        if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
        else return i;  // a continuation byte, or 0xF8..0xFF
        if (i + len > n) return i;
        for (size_t k = 1; k < len; ++k) {
            if ((b[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (b[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += len;
    }
    return std::string_view::npos;
}

void append_utf8(std::string & out, uint32_t cp) {
    if (cp <= 0x7F) {
        out.push_back(static_cast<char>(cp));
    } else if (cp <= 0x7FF) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp <= 0xFFFF) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | ((cp >> 18) & 0x07)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

namespace {

struct Gpt2ByteMap {
    std::array<uint32_t, 256> to_cpt{};
    std::array<uint8_t, 68> remapped_to_byte{};  // U+0100 + i -> byte
    Gpt2ByteMap() {
        uint32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool same = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            if (same) {
                to_cpt[b] = static_cast<uint32_t>(b);
            } else {
                remapped_to_byte[next - 256] = static_cast<uint8_t>(b);
                to_cpt[b] = next++;
            }
        }
    }
};

const Gpt2ByteMap & gpt2_map() {
    static const Gpt2ByteMap map;
    return map;
}

} // namespace

uint32_t gpt2_byte_to_cpt(uint8_t byte) { return gpt2_map().to_cpt[byte]; }

int gpt2_cpt_to_byte(uint32_t cp) {
    // Identity-mapped ranges first; the 68 remapped bytes occupy U+0100..U+0143.
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) {
        return static_cast<int>(cp);
    }
    if (cp >= 0x100 && cp < 0x100 + 68) {
        return gpt2_map().remapped_to_byte[cp - 0x100];
    }
    return -1;
}

} // namespace rp
