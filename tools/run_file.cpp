#include "tools/run_file.h"

#include "base/error.h"
#include "models/text/unicode.h"

#include <cctype>
#include <cstdio>
#include <set>

namespace rp::cli {

namespace {

class Reader {
public:
    Reader(const std::string & text, const std::string & origin) : s_(text), origin_(origin) {}

    std::vector<RunFileEntry> entries() {
        std::vector<RunFileEntry> out;
        std::set<std::string> seen;
        for (;;) {
            skip_blank_lines();
            if (at_end()) break;
            if (peek() == '[') fail("tables ([...]) are not used in a run file: write each option as `key = value` at the top level");
            RunFileEntry e;
            e.line = line_;
            e.key = key();
            skip_spaces();
            if (peek() != '=') fail("expected '=' after the key '" + e.key + "'");
            ++pos_;
            skip_spaces();
            e.value = value();
            end_of_line();
            if (!seen.insert(e.key).second) fail_at(e.line, "the key '" + e.key + "' is given twice");
            out.push_back(std::move(e));
        }
        return out;
    }

private:
    const std::string & s_;
    const std::string & origin_;
    size_t pos_ = 0;
    int line_ = 1;

    bool at_end() const { return pos_ >= s_.size(); }
    char peek() const { return at_end() ? '\0' : s_[pos_]; }
    [[noreturn]] void fail(const std::string & what) const { fail_at(line_, what); }
    [[noreturn]] void fail_at(int line, const std::string & what) const {
        throw rp::Error(origin_ + ":" + std::to_string(line) + ": " + what);
    }
    void skip_spaces() {
        while (peek() == ' ' || peek() == '\t') ++pos_;
    }
    void skip_comment() {
        if (peek() == '#')
            while (!at_end() && peek() != '\n') ++pos_;
    }
    void newline() {
        if (peek() == '\r') ++pos_;
        if (peek() != '\n') fail("expected the end of the line");
        ++pos_;
        ++line_;
    }
    void skip_blank_lines() {  // and comments
        for (;;) {
            skip_spaces();
            skip_comment();
            if (at_end()) return;
            if (peek() != '\n' && peek() != '\r') return;
            newline();
        }
    }
    void end_of_line() {
        skip_spaces();
        skip_comment();
        if (!at_end()) newline();
    }
    // Inside an array: spaces, comments and newlines.
    void skip_array_space() {
        for (;;) {
            skip_spaces();
            skip_comment();
            if (peek() == '\n' || peek() == '\r') newline();
            else return;
        }
    }

    std::string key() {
        if (peek() == '"' || peek() == '\'') return quoted();
        const size_t b = pos_;
        while (std::isalnum(static_cast<unsigned char>(peek())) || peek() == '-' || peek() == '_') ++pos_;
        if (pos_ == b) fail("expected a key (an option name, e.g. lora-rank = 8)");
        if (peek() == '.') fail("dotted keys are not used in a run file: the keys are the option names");
        return s_.substr(b, pos_ - b);
    }

    std::string quoted() {
        const char q = s_[pos_++];
        if (s_.compare(pos_, 2, std::string(2, q)) == 0) fail("multi-line strings are not used in a run file");
        std::string out;
        for (;;) {
            if (at_end() || peek() == '\n') fail("the string is not closed on its line");
            const char c = s_[pos_++];
            if (c == q) return out;
            if (c != '\\' || q == '\'') {
                out += c;
                continue;
            }
            const char e = s_[pos_++];
            switch (e) {
                case 'n': out += '\n'; break;
                case 't': out += '\t'; break;
                case 'r': out += '\r'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case 'u':
                case 'U': {
                    const size_t n = e == 'u' ? 4 : 8;
                    if (pos_ + n > s_.size()) fail("a \\" + std::string(1, e) + " escape needs " + std::to_string(n) + " hex digits");
                    unsigned long cp = 0;
                    for (size_t i = 0; i < n; ++i) {
                        const char h = s_[pos_ + i];
                        if (!std::isxdigit(static_cast<unsigned char>(h))) fail("a \\" + std::string(1, e) + " escape needs hex digits");
                        cp = cp * 16 + static_cast<unsigned long>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
                    }
                    pos_ += n;
                    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("the escape is not a Unicode scalar value");
                    append_utf8(out, static_cast<uint32_t>(cp));
                    break;
                }
                default: fail(std::string("unknown escape \\") + e + " in a string");
            }
        }
    }

    TomlValue value() {
        TomlValue v;
        const char c = peek();
        if (c == '"' || c == '\'') {
            v.type = TomlType::String;
            v.text = quoted();
            return v;
        }
        if (c == '[') {
            ++pos_;
            v.type = TomlType::Array;
            for (;;) {
                skip_array_space();
                if (peek() == ']') break;
                TomlValue item = value();
                if (item.type == TomlType::Array) fail("nested arrays are not used in a run file");
                v.items.push_back(std::move(item));
                skip_array_space();
                if (peek() == ',') {
                    ++pos_;
                    continue;
                }
                if (peek() != ']') fail("expected ',' or ']' in the array");
                break;
            }
            ++pos_;
            return v;
        }
        if (c == '{') fail("inline tables are not used in a run file");
        // A bare literal: a boolean or a number, up to a space, a comma, a bracket or a comment.
        const size_t b = pos_;
        while (!at_end() && peek() != ' ' && peek() != '\t' && peek() != '\n' && peek() != '\r' && peek() != ',' && peek() != ']' &&
               peek() != '#')
            ++pos_;
        const std::string lit = s_.substr(b, pos_ - b);
        if (lit.empty()) fail("expected a value");
        if (lit == "true" || lit == "false") {
            v.type = TomlType::Bool;
            v.text = lit;
            return v;
        }
        std::string digits;  // without the '_' separators
        bool is_float = false, ok = true;
        for (size_t i = 0; i < lit.size(); ++i) {
            const char d = lit[i];
            if (d == '_') {
                ok = ok && i > 0 && i + 1 < lit.size() && std::isdigit(static_cast<unsigned char>(lit[i - 1])) &&
                     std::isdigit(static_cast<unsigned char>(lit[i + 1]));
                continue;
            }
            if (d == '.' || d == 'e' || d == 'E') is_float = true;
            else if (!std::isdigit(static_cast<unsigned char>(d)) && d != '+' && d != '-') ok = false;
            digits += d;
        }
        if (!ok || digits.empty() || !(std::isdigit(static_cast<unsigned char>(digits[0])) ||
                                       ((digits[0] == '+' || digits[0] == '-') && digits.size() > 1)))
            fail("'" + lit + "' is not a value (a string needs quotes: \"" + lit + "\")");
        v.type = is_float ? TomlType::Float : TomlType::Int;
        v.text = digits;
        return v;
    }
};

} // namespace

std::vector<RunFileEntry> parse_run_file(const std::string & text, const std::string & origin) {
    return Reader(text, origin).entries();
}

const char * toml_type_name(TomlType t) {
    switch (t) {
        case TomlType::Bool: return "a boolean";
        case TomlType::Int: return "an integer";
        case TomlType::Float: return "a float";
        case TomlType::String: return "a string";
        case TomlType::Array: return "an array";
    }
    return "?";
}

std::string toml_string(const std::string & s) {
    std::string out = "\"";
    for (const char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') out += '\\', out += c;
        else if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c == '\r') out += "\\r";
        else if (u < 0x20 || u == 0x7F) {
            char esc[8];
            std::snprintf(esc, sizeof esc, "\\u%04x", u);
            out += esc;
        } else {
            out += c;
        }
    }
    return out + "\"";
}

std::string toml_float(double x, int digits) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    std::string s = buf;
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
}

std::string toml_array(const std::vector<std::string> & strings) {
    std::string out = "[";
    for (const std::string & s : strings) out += (out.size() > 1 ? ", " : "") + toml_string(s);
    return out + "]";
}

} // namespace rp::cli
