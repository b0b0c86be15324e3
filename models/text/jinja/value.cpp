#include "models/text/jinja/value.h"

#include <cstdlib>

#include "ggml_rp/core/json.h"

#include "base/error.h"

#include <cstdio>
#include <sstream>

namespace rp::jinja {

Value Value::array(Array a) {
    Value v;
    v.kind_ = Kind::Array;
    v.arr_ = std::make_shared<Array>(std::move(a));
    return v;
}

Value Value::object() {
    Value v;
    v.kind_ = Kind::Object;
    v.obj_ = std::make_shared<Object>();
    return v;
}

Value Value::function(std::string name, Function f) {
    Value v;
    v.kind_ = Kind::Function;
    v.s_ = std::move(name);
    v.fn_ = std::make_shared<const Function>(std::move(f));
    return v;
}

const char * Value::type_name() const {
    switch (kind_) {
        case Kind::Undefined: return "undefined";
        case Kind::None: return "none";
        case Kind::Bool: return "bool";
        case Kind::Int: return "int";
        case Kind::Float: return "float";
        case Kind::String: return "string";
        case Kind::Array: return "array";
        case Kind::Object: return "object";
        case Kind::Function: return "function";
    }
    return "?";
}

bool Value::truthy() const {
    switch (kind_) {
        case Kind::Undefined:
        case Kind::None: return false;
        case Kind::Bool:
        case Kind::Int: return i_ != 0;
        case Kind::Float: return f_ != 0.0;
        case Kind::String: return !s_.empty();
        case Kind::Array: return !arr_->empty();
        case Kind::Object: return !obj_->items.empty();
        case Kind::Function: return true;
    }
    return false;
}

namespace {

// llama.cpp prints a float with std::to_string and drops trailing zeros, keeping one after the point.
std::string float_str(double d) {
    std::string out = std::to_string(d);
    out.erase(out.find_last_not_of('0') + 1);
    if (!out.empty() && out.back() == '.') out.push_back('0');
    return out;
}

} // namespace

namespace {

void check_depth(int depth) {
    if (depth > kMaxValueDepth) throw Error("value nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
}

} // namespace

void Value::append_output(std::string & out) const { append_output(out, 0); }

void Value::append_output(std::string & out, int depth) const {
    check_depth(depth);
    switch (kind_) {
        case Kind::String: out += s_; break;
        case Kind::Int:
        case Kind::Float:
        case Kind::Bool: out += to_str(); break;
        case Kind::Array:
            for (const Value & v : *arr_) v.append_output(out, depth + 1);
            break;
        default: break;
    }
}

std::string Value::to_str() const { return to_str(0); }

std::string Value::to_str(int depth) const {
    check_depth(depth);
    switch (kind_) {
        case Kind::Undefined: return "";
        case Kind::None: return "None";
        case Kind::Bool: return i_ ? "True" : "False";
        case Kind::Int: return std::to_string(i_);
        case Kind::Float: return float_str(f_);
        case Kind::String: return s_;
        case Kind::Array: {
            std::string s = "[";
            for (size_t i = 0; i < arr_->size(); ++i) {
                const Value & v = (*arr_)[i];
                s += (i ? ", " : "") + (v.is_string() ? v.repr() : v.to_str(depth + 1));
            }
            return s + "]";
        }
        case Kind::Object: {
            std::string s = "{";
            for (size_t i = 0; i < obj_->items.size(); ++i)
            {
                const Value & v = obj_->items[i].second;
                s += (i ? ", " : "") + Value::string(obj_->items[i].first).repr() + ": " + (v.is_string() ? v.repr() : v.to_str(depth + 1));
            }
            return s + "}";
        }
        case Kind::Function: return "<function " + s_ + ">";
    }
    return "";
}

std::string Value::repr() const {
    if (kind_ != Kind::String) return to_str();
    // Python's repr: single quotes unless the text has a single quote and no double quote.
    const bool dq = s_.find('\'') != std::string::npos && s_.find('"') == std::string::npos;
    const char q = dq ? '"' : '\'';
    std::string r(1, q);
    for (char c : s_) {
        if (c == q || c == '\\') r += '\\';
        if (c == '\n') { r += "\\n"; continue; }
        r += c;
    }
    return r + q;
}

const Value * Object::find(std::string_view key) const {
    for (const auto & kv : items)
        if (kv.first == key) return &kv.second;
    return nullptr;
}

Value Object::key(size_t i) const {
    return int_keys ? Value::integer(std::strtoll(items[i].first.c_str(), nullptr, 10)) : Value::string(items[i].first);
}

bool has_key(const Object & o, const Value & key) {
    if (o.int_keys) return key.is_int() && o.find(std::to_string(key.as_int())) != nullptr;
    return key.is_string() && o.find(key.str()) != nullptr;
}

void Object::set(const std::string & key, Value v) {
    for (auto & kv : items) {
        if (kv.first == key) {
            kv.second = std::move(v);
            return;
        }
    }
    items.emplace_back(key, std::move(v));
}

bool contains(const Value & inner, const Value & outer) {
    if (!outer.is_array() && !outer.is_object()) return false;
    const void * target = outer.is_array() ? static_cast<const void *>(outer.arr_.get()) : outer.obj_.get();
    std::vector<const Value *> todo = {&inner};
    while (!todo.empty()) {  // iterative: the values may be deep
        const Value * v = todo.back();
        todo.pop_back();
        if (v->is_array()) {
            if (v->arr_.get() == target) return true;
            for (const Value & x : *v->arr_) todo.push_back(&x);
        } else if (v->is_object()) {
            if (v->obj_.get() == target) return true;
            for (const auto & kv : v->obj_->items) todo.push_back(&kv.second);
        }
    }
    return false;
}

namespace {

bool equal_at(const Value & a, const Value & b, int depth);

} // namespace

bool equal(const Value & a, const Value & b) { return equal_at(a, b, 0); }

namespace {

bool equal_at(const Value & a, const Value & b, int depth) {
    check_depth(depth);
    if (a.is_number() && b.is_number()) {
        if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
        return a.as_float() == b.as_float();
    }
    // Python: True == 1; llama.cpp compares by type, and so do we for bools against numbers.
    if (a.kind() != b.kind()) return false;
    switch (a.kind()) {
        case Value::Kind::Undefined:
        case Value::Kind::None: return true;
        case Value::Kind::Bool: return a.as_bool() == b.as_bool();
        case Value::Kind::String: return a.str() == b.str();
        case Value::Kind::Array: {
            if (a.arr().size() != b.arr().size()) return false;
            for (size_t i = 0; i < a.arr().size(); ++i)
                if (!equal_at(a.arr()[i], b.arr()[i], depth + 1)) return false;
            return true;
        }
        case Value::Kind::Object: {
            if (a.obj().items.size() != b.obj().items.size()) return false;
            for (const auto & kv : a.obj().items) {
                const Value * o = b.obj().find(kv.first);
                if (!o || !equal_at(kv.second, *o, depth + 1)) return false;
            }
            return true;
        }
        case Value::Kind::Function: return &a.fn() == &b.fn();
        default: return false;
    }
}


// Rewrites every non-ASCII UTF-8 sequence as \uXXXX escapes (a surrogate pair above U+FFFF), as Python's
// ensure_ascii. Invalid bytes are escaped as themselves (U+00XX) rather than dropped.
std::string ascii_only(const std::string & s) {
    std::string out;
    auto esc = [&](unsigned cp) {
        char buf[16];  // "\\uXXXX" and its NUL; the compiler cannot see cp <= 0xFFFF
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
        out += buf;
    };
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        if (c < 0x80) {
            out += static_cast<char>(c);
            ++i;
            continue;
        }
        const int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
        unsigned cp = n == 3 ? c & 0x07u : n == 2 ? c & 0x0Fu : c & 0x1Fu;
        bool ok = n > 0;
        for (int k = 1; ok && k <= n; ++k) {
            if (i + static_cast<size_t>(k) >= s.size() || (static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) ok = false;
            else cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
        }
        if (!ok) {
            esc(c);
            ++i;
            continue;
        }
        if (cp >= 0x10000) {
            cp -= 0x10000;
            esc(0xD800 + (cp >> 10));
            esc(0xDC00 + (cp & 0x3FF));
        } else {
            esc(cp);
        }
        i += static_cast<size_t>(n) + 1;
    }
    return out;
}

// llama.cpp's layout: with indent >= 0 every item goes on its own line (indent 0: no spaces), an empty
// container stays "[]" / "{}"; undefined and callables become null.
void json_value(std::string & out, const Value & v, int level, int indent, std::string_view item_sep,
                std::string_view key_sep) {
    check_depth(level);
    const std::string nl = indent >= 0 ? "\n" : "";
    auto pad = [&](int lvl) { return indent > 0 ? std::string(static_cast<size_t>(lvl * indent), ' ') : std::string(); };
    switch (v.kind()) {
        case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; break;
        case Value::Kind::Int: out += std::to_string(v.as_int()); break;
        case Value::Kind::Float: {
            std::ostringstream ss;  // llama.cpp streams the double: 6 significant digits, %g style
            ss << v.as_float();
            out += ss.str();
            break;
        }
        case Value::Kind::String: json::append_string(out, v.str()); break;
        case Value::Kind::Array: {
            out += '[';
            const Array & a = v.arr();
            if (!a.empty()) {
                out += nl;
                for (size_t i = 0; i < a.size(); ++i) {
                    out += pad(level + 1);
                    json_value(out, a[i], level + 1, indent, item_sep, key_sep);
                    if (i + 1 < a.size()) out += item_sep;
                    out += nl;
                }
                out += pad(level);
            }
            out += ']';
            break;
        }
        case Value::Kind::Object: {
            out += '{';
            const auto & items = v.obj().items;
            if (!items.empty()) {
                out += nl;
                for (size_t i = 0; i < items.size(); ++i) {
                    out += pad(level + 1);
                    json::append_string(out, items[i].first);
                    out += key_sep;
                    json_value(out, items[i].second, level + 1, indent, item_sep, key_sep);
                    if (i + 1 < items.size()) out += item_sep;
                    out += nl;
                }
                out += pad(level);
            }
            out += '}';
            break;
        }
        default: out += "null"; break;
    }
}

} // namespace

std::string to_json(const Value & v, int indent, std::string_view item_sep, std::string_view key_sep, bool ensure_ascii) {
    std::string out;
    json_value(out, v, 0, indent, item_sep, key_sep);
    return ensure_ascii ? ascii_only(out) : out;
}

Value CallArgs::get(size_t i, const char * name) const {
    if (i < pos.size()) return pos[i];
    for (const auto & kv : kw)
        if (kv.first == name) return kv.second;
    return Value();
}

Value CallArgs::kwarg(const char * name) const {
    for (const auto & kv : kw)
        if (kv.first == name) return kv.second;
    return Value();
}

} // namespace rp::jinja
