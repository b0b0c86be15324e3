// Unicode helpers for the tokenizers: lenient UTF-8 decoding (llama.cpp's rules), general-category
// classes for the pre-tokenizer regexes, White_Space, and GPT-2's byte <-> code point map.
// The category table is generated (models/unicode_tables.cpp, see models/tools_gen/); its Unicode
// version is unicode_version().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rp {

// One class per code point, from its general category. Keep in sync with the generator.
enum class Ucat : uint8_t {
    undefined = 0,    // Cn (unassigned)
    letter = 1,       // L*   regex \p{L}
    number = 2,       // N*   regex \p{N}
    punctuation = 3,  // P*   regex \p{P}
    symbol = 4,       // S*   regex \p{S}
    mark = 5,         // M*   regex \p{M}
    separator = 6,    // Z*
    control = 7,      // Cc, Cf, Co, Cs
};

Ucat ucat(uint32_t cp);
inline bool is_number(uint32_t cp) { return ucat(cp) == Ucat::number; }
// Unicode White_Space (what regex \s means for the tokenizers).
bool is_whitespace(uint32_t cp);
const char * unicode_version();

constexpr uint32_t kReplacementChar = 0xFFFD;

// Byte length of the UTF-8 sequence a lead byte announces (1 for continuation or invalid bytes), from
// the high nibble only, exactly as llama.cpp's unicode_len_utf8.
inline size_t utf8_len(uint8_t lead) {
    static constexpr uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[lead >> 4];
}

// Decodes UTF-8 the way llama.cpp does: a malformed sequence (bad lead byte, missing continuation bytes,
// truncated) becomes one U+FFFD and consumes one byte. We also replace decoded values above U+10FFFF
// (where llama.cpp would throw later). Overlong forms and surrogates are accepted as decoded, as there.
// When `byte_offsets` is given it receives, per code point, the offset of its first byte.
std::vector<uint32_t> utf8_to_cpts(std::string_view text, std::vector<uint32_t> * byte_offsets = nullptr);
// Strict validation (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF, no truncated
// sequence): the byte offset of the first invalid sequence, or npos when `text` is valid UTF-8.
size_t first_invalid_utf8(std::string_view text);
// Appends the UTF-8 encoding of a code point <= U+10FFFF.
void append_utf8(std::string & out, uint32_t cp);

// GPT-2 byte-level map (formats.md §4.5): bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF map to the same
// code point, the other 68 bytes to U+0100, U+0101, ... in increasing byte order.
uint32_t gpt2_byte_to_cpt(uint8_t byte);
// The inverse; -1 for a code point that no byte maps to.
int gpt2_cpt_to_byte(uint32_t cp);

} // namespace rp
