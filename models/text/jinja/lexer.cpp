#include "models/text/jinja/lexer.h"

#include "base/error.h"

namespace rp::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_word(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

void lstrip(std::string & s) {
    size_t b = 0;
    while (b < s.size() && (s[b] == ' ' || s[b] == '\t' || s[b] == '\r' || s[b] == '\n')) ++b;
    s.erase(0, b);
}

void rstrip(std::string & s) {
    size_t e = s.size();
    while (e > 0 && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r' || s[e - 1] == '\n')) --e;
    s.erase(e);
}

class Lexer {
public:
    explicit Lexer(std::string src) : s_(std::move(src)) {}

    Lexed run() {
        while (pos_ < s_.size()) {
            text();
            if (pos_ >= s_.size()) break;
            if (at("{#")) {
                comment();
            } else {
                tag();
            }
        }
        out_.push_back({Token::Kind::End, "", s_.size()});
        return {std::move(s_), std::move(out_)};
    }

private:
    bool at(const char * lit) const { return s_.compare(pos_, std::char_traits<char>::length(lit), lit) == 0; }
    char peek(size_t n) const { return pos_ + n < s_.size() ? s_[pos_ + n] : '\0'; }
    bool tag_start(size_t p) const {
        return s_[p] == '{' && p + 1 < s_.size() && (s_[p + 1] == '%' || s_[p + 1] == '{' || s_[p + 1] == '#');
    }

    // The text up to the next tag, with the whitespace rules of lexer.h.
    void text() {
        const size_t start = pos_;
        // The tag just closed: "-%}" / "-}}" / "-#}" strips what follows; a tag ending in "%}", "#}" or
        // "-}" (not a plain "}}") drops one newline after it.
        bool strip_after = false, drop_newline = false;
        if (pos_ > 3) {
            const char c0 = s_[pos_ - 3], c1 = s_[pos_ - 2], c2 = s_[pos_ - 1];
            strip_after = c0 == '-' && (c1 == '%' || c1 == '}' || c1 == '#') && c2 == '}';
            drop_newline = (c1 == '#' || c1 == '%' || c1 == '-') && c2 == '}';
        }
        while (pos_ < s_.size() && !tag_start(pos_)) ++pos_;
        size_t end = pos_;
        const bool block_next = pos_ < s_.size() && (peek(1) == '%' || peek(1) == '#');
        if (block_next) {
            // lstrip_blocks: drop the blanks that start the tag's line. At byte 1 of the template llama.cpp
            // drops the first byte unconditionally; kept for parity (see lexer.h).
            for (size_t cur = end; cur > start; --cur) {
                const char c = s_[cur - 1];
                if (cur == 1) { end = 0; break; }
                if (c == '\n') { end = cur; break; }
                if (!is_space(c)) break;
            }
        }
        std::string t = s_.substr(start, end > start ? end - start : 0);
        if (drop_newline && !t.empty() && t.front() == '\n') t.erase(0, 1);
        if (strip_after) lstrip(t);
        if (pos_ < s_.size() && peek(2) == '-') rstrip(t);  // {%- {{- {#-
        if (!t.empty()) out_.push_back({Token::Kind::Text, std::move(t), start});
    }

    void comment() {
        const size_t start = pos_;
        pos_ += 2;
        while (!(s_[pos_] == '#' && peek(1) == '}')) {
            if (pos_ + 2 >= s_.size()) fail_at(s_, start, "unterminated comment (no '#}')");
            ++pos_;
        }
        pos_ += 2;
    }

    // One {{ ... }} or {% ... %}: its tokens up to and including the closing one.
    void tag() {
        const size_t open = pos_;
        const bool expr = peek(1) == '{';
        out_.push_back({expr ? Token::Kind::OpenExpr : Token::Kind::OpenStmt, expr ? "{{" : "{%", pos_});
        pos_ += 2;
        if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
        int braces = 0;  // "}}" inside an object literal closes braces, not the tag
        for (;;) {
            while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
            if (pos_ >= s_.size()) fail_at(s_, open, std::string("unterminated tag (no '") + (expr ? "}}" : "%}") + "')");
            const size_t p = pos_;
            if (at("-%}") || at("%}")) {
                pos_ += s_[p] == '-' ? 3 : 2;
                out_.push_back({Token::Kind::CloseStmt, "%}", p});
                if (expr) fail_at(s_, p, "'%}' closes a '{{' tag");
                return;
            }
            if (braces == 0 && (at("-}}") || at("}}"))) {
                pos_ += s_[p] == '-' ? 3 : 2;
                out_.push_back({Token::Kind::CloseExpr, "}}", p});
                if (!expr) fail_at(s_, p, "'}}' closes a '{%' tag");
                return;
            }
            const char c = s_[p];
            if (c == '\'' || c == '"') {
                string_literal(c);
            } else if (is_digit(c)) {
                while (pos_ < s_.size() && is_digit(s_[pos_])) ++pos_;
                bool flt = false;
                if (peek(0) == '.' && is_digit(peek(1))) {
                    flt = true;
                    ++pos_;
                    while (pos_ < s_.size() && is_digit(s_[pos_])) ++pos_;
                }
                out_.push_back({flt ? Token::Kind::Float : Token::Kind::Int, s_.substr(p, pos_ - p), p});
            } else if (is_word(c)) {
                while (pos_ < s_.size() && is_word(s_[pos_])) ++pos_;
                out_.push_back({Token::Kind::Name, s_.substr(p, pos_ - p), p});
            } else {
                static const char * const two[] = {"<=", ">=", "==", "!="};
                std::string op;
                for (const char * t : two)
                    if (at(t)) op = t;
                if (op.empty()) {
                    if (std::string("()[]{},.:|<>+-~*/%=").find(c) == std::string::npos)
                        fail_at(s_, p, std::string("unexpected character '") + c + "'");
                    op = std::string(1, c);
                }
                if (op == "{") ++braces;
                if (op == "}" && braces > 0) --braces;
                pos_ += op.size();
                out_.push_back({Token::Kind::Op, op, p});
            }
        }
    }

    void string_literal(char quote) {
        const size_t start = pos_++;
        std::string v;
        for (;;) {
            if (pos_ >= s_.size()) fail_at(s_, start, "unterminated string literal");
            const char c = s_[pos_++];
            if (c == quote) break;
            if (c != '\\') {
                v += c;
                continue;
            }
            if (pos_ >= s_.size()) fail_at(s_, start, "unterminated string literal");
            const char e = s_[pos_++];
            switch (e) {
                case 'n': v += '\n'; break;
                case 't': v += '\t'; break;
                case 'r': v += '\r'; break;
                case 'b': v += '\b'; break;
                case 'f': v += '\f'; break;
                case 'v': v += '\v'; break;
                case '\\': v += '\\'; break;
                case '\'': v += '\''; break;
                case '"': v += '"'; break;
                default: fail_at(s_, pos_ - 2, std::string("unsupported escape '\\") + e + "' in a string literal");
            }
        }
        out_.push_back({Token::Kind::String, std::move(v), start});
    }

    std::string s_;
    size_t pos_ = 0;
    std::vector<Token> out_;
};

} // namespace

std::string where(const std::string & source, size_t pos) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && i < source.size(); ++i) {
        if (source[i] == '\n') {
            ++line;
            col = 1;
        } else {
            ++col;
        }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

void fail_at(const std::string & source, size_t pos, const std::string & msg) {
    throw Error("jinja: " + where(source, pos) + ": " + msg);
}

Lexed lex(const std::string & source) {
    std::string s;
    s.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
        if (source[i] == '\r') {
            s += '\n';
            if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
        } else {
            s += source[i];
        }
    }
    if (!source.empty() && source.back() == '\n') s.pop_back();
    return Lexer(std::move(s)).run();
}

} // namespace rp::jinja
