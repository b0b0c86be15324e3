// Jinja lexer: template source -> tokens (text between tags, and the tokens inside {{ }} / {% %}).
//
// Whitespace follows llama.cpp's engine (which follows huggingface.js and transformers' settings for chat
// templates, trim_blocks = lstrip_blocks = true), applied while the text is cut, not by rewriting the source:
//   - \r\n and \r become \n, and one trailing newline of the template is dropped (Jinja's default);
//   - lstrip_blocks: spaces and tabs between the start of a line and a {% or {# tag are removed;
//   - trim_blocks: one newline right after a tag ending in %}, #} or -} is removed;
//   - {%- {{- {#- strip all whitespace before the tag, -%} -}} -#} all whitespace after it.
// The same rules reproduce llama.cpp's two quirks, needed for byte parity: a text that is the very first
// byte of the template before a {% or {# tag is dropped whatever it is, and a {{ }} tag does not trim the
// newline after it (only -}} does).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace rp::jinja {

struct Token {
    enum class Kind {
        Text,        // literal text between tags (already whitespace-controlled)
        OpenStmt,    // {%
        CloseStmt,   // %}
        OpenExpr,    // {{
        CloseExpr,   // }}
        Name,        // identifier or keyword
        String,      // string literal, escapes resolved
        Int,
        Float,
        Op,          // punctuation and operators: ( ) [ ] { } , . : | = + - ~ * / % == != < > <= >=
        End,
    };
    Kind kind;
    std::string text;
    size_t pos;  // byte offset in the normalized source
};

struct Lexed {
    std::string source;  // after newline normalization; positions refer to it
    std::vector<Token> tokens;
};

// Throws rp::Error naming the line and column of a lexical error (unterminated string, comment or tag,
// an unknown escape or character).
Lexed lex(const std::string & source);

// "line L, column C" of byte `pos` of `source`.
std::string where(const std::string & source, size_t pos);
// Throws rp::Error("jinja: line L, column C: msg").
[[noreturn]] void fail_at(const std::string & source, size_t pos, const std::string & msg);

} // namespace rp::jinja
