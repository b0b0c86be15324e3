#include "ggml_rp/core/json.h"

#include "base/error.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace rp::json {

const Value * Value::find(const std::string & key) const {
    if (type != Type::Object) return nullptr;
    for (auto it = object.rbegin(); it != object.rend(); ++it) {
        if (it->first == key) return &it->second;
    }
    return nullptr;
}

namespace {

constexpr int kMaxDepth = 64;

class Parser {
public:
    Parser(const std::string & text, const std::string & source) : s_(text), source_(source) {}

    Value run() {
        skip_ws();
        Value v = value(0);
        skip_ws();
        if (pos_ != s_.size()) fail("unexpected text after the JSON value");
        return v;
    }

private:
    [[noreturn]] void fail(const std::string & what) const {
        throw Error(source_ + ": invalid JSON at byte offset " + std::to_string(pos_) + ": " + what);
    }

    void skip_ws() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
            ++pos_;
        }
    }

    bool eat(char c) {
        if (pos_ < s_.size() && s_[pos_] == c) {
            ++pos_;
            return true;
        }
        return false;
    }

    void expect(char c) {
        if (!eat(c)) fail(std::string("expected '") + c + "'");
    }

    void literal(const char * word) {
        for (const char * p = word; *p; ++p) {
            if (pos_ >= s_.size() || s_[pos_] != *p) fail(std::string("expected '") + word + "'");
            ++pos_;
        }
    }

    Value value(int depth) {
        if (depth >= kMaxDepth) fail("nesting deeper than 64 levels");
        if (pos_ >= s_.size()) fail("unexpected end of input");
        Value v;
        const char c = s_[pos_];
        if (c == '{') {
            v.type = Value::Type::Object;
            ++pos_;
            skip_ws();
            if (eat('}')) return v;
            for (;;) {
                skip_ws();
                if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string key");
                std::string key = string();
                skip_ws();
                expect(':');
                skip_ws();
                Value item = value(depth + 1);
                v.object.push_back({std::move(key), std::move(item)});
                skip_ws();
                if (eat(',')) continue;
                expect('}');
                return v;
            }
        }
        if (c == '[') {
            v.type = Value::Type::Array;
            ++pos_;
            skip_ws();
            if (eat(']')) return v;
            for (;;) {
                skip_ws();
                v.array.push_back(value(depth + 1));
                skip_ws();
                if (eat(',')) continue;
                expect(']');
                return v;
            }
        }
        if (c == '"') {
            v.type = Value::Type::String;
            v.string = string();
            return v;
        }
        if (c == 't') { literal("true"); v.type = Value::Type::Bool; v.boolean = true; return v; }
        if (c == 'f') { literal("false"); v.type = Value::Type::Bool; return v; }
        if (c == 'n') { literal("null"); return v; }
        if (c == '-' || (c >= '0' && c <= '9')) {
            v.type = Value::Type::Number;
            v.number = number();
            return v;
        }
        fail(std::string("unexpected character '") + c + "'");
    }

    double number() {
        // Validate the RFC grammar, then let strtod convert the exact span.
        const size_t start = pos_;
        eat('-');
        if (eat('0')) {
        } else if (pos_ < s_.size() && s_[pos_] >= '1' && s_[pos_] <= '9') {
            while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
        } else {
            fail("invalid number");
        }
        if (eat('.')) {
            if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') fail("invalid number: digit expected after '.'");
            while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
        }
        if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
            ++pos_;
            if (!eat('+')) eat('-');
            if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') fail("invalid number: exponent digits expected");
            while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
        }
        const std::string span = s_.substr(start, pos_ - start);
        errno = 0;
        const double d = std::strtod(span.c_str(), nullptr);
        if (!std::isfinite(d)) {
            pos_ = start;
            fail("number out of range");
        }
        return d;
    }

    unsigned hex4() {
        if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
        unsigned v = 0;
        for (int i = 0; i < 4; ++i) {
            const char c = s_[pos_++];
            v <<= 4;
            if (c >= '0' && c <= '9') v |= unsigned(c - '0');
            else if (c >= 'a' && c <= 'f') v |= unsigned(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v |= unsigned(c - 'A' + 10);
            else fail("invalid hex digit in \\u escape");
        }
        return v;
    }

    static void put_utf8(std::string & out, unsigned cp) {
        if (cp < 0x80) {
            out += char(cp);
        } else if (cp < 0x800) {
            out += char(0xC0 | (cp >> 6));
            out += char(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += char(0xE0 | (cp >> 12));
            out += char(0x80 | ((cp >> 6) & 0x3F));
            out += char(0x80 | (cp & 0x3F));
        } else {
            out += char(0xF0 | (cp >> 18));
            out += char(0x80 | ((cp >> 12) & 0x3F));
            out += char(0x80 | ((cp >> 6) & 0x3F));
            out += char(0x80 | (cp & 0x3F));
        }
    }

    std::string string() {
        expect('"');
        std::string out;
        for (;;) {
            if (pos_ >= s_.size()) fail("unterminated string");
            const char c = s_[pos_++];
            if (c == '"') return out;
            if (static_cast<unsigned char>(c) < 0x20) {
                --pos_;
                fail("control character in string");
            }
            if (c != '\\') {
                out += c;
                continue;
            }
            if (pos_ >= s_.size()) fail("unterminated escape");
            const char e = s_[pos_++];
            switch (e) {
            case '"': out += '"'; break;
            case '\\': out += '\\'; break;
            case '/': out += '/'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'n': out += '\n'; break;
            case 'r': out += '\r'; break;
            case 't': out += '\t'; break;
            case 'u': {
                unsigned cp = hex4();
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (pos_ + 2 > s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') fail("unpaired surrogate");
                    pos_ += 2;
                    const unsigned lo = hex4();
                    if (lo < 0xDC00 || lo > 0xDFFF) fail("invalid low surrogate");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    fail("unpaired low surrogate");
                }
                put_utf8(out, cp);
                break;
            }
            default: --pos_; fail(std::string("invalid escape '\\") + e + "'");
            }
        }
    }

    const std::string & s_;
    const std::string & source_;
    size_t pos_ = 0;
};

} // namespace

Value parse(const std::string & text, const std::string & source_name) { return Parser(text, source_name).run(); }

std::string quoted(const std::string & s) {
    std::string q;
    append_string(q, s);
    return q;
}

std::string dump(const Value & v) {
    switch (v.type) {
    case Value::Type::Null: return "null";
    case Value::Type::Bool: return v.boolean ? "true" : "false";
    case Value::Type::Number: {
        char buf[32];
        for (int prec = 1; prec <= 17; ++prec) {  // the shortest that round-trips
            std::snprintf(buf, sizeof buf, "%.*g", prec, v.number);
            if (std::strtod(buf, nullptr) == v.number) break;
        }
        return buf;
    }
    case Value::Type::String: return quoted(v.string);
    case Value::Type::Array: {
        std::string s = "[";
        for (size_t i = 0; i < v.array.size(); ++i) s += (i ? ", " : "") + dump(v.array[i]);
        return s + "]";
    }
    case Value::Type::Object: {
        std::string s = "{";
        for (size_t i = 0; i < v.object.size(); ++i) {
            if (i) s += ", ";
            append_string(s, v.object[i].first);
            s += ": " + dump(v.object[i].second);
        }
        return s + "}";
    }
    }
    return "null";
}

void append_string(std::string & out, const std::string & s) {
    out += '"';
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\b': out += "\\b"; break;  // the short escapes Python's json.dumps writes (chat templates' tojson)
        case '\f': out += "\\f"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
            if (c < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", c);
                out += buf;
            } else {
                out += ch;
            }
        }
    }
    out += '"';
}

} // namespace rp::json
