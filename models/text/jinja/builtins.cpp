#include "models/text/jinja/builtins.h"

#include "base/error.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace rp::jinja {

namespace {

[[noreturn]] void bad(const std::string & msg) { throw Error(msg); }

bool ascii_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Python's str.strip family on bytes: ASCII whitespace (as llama.cpp), or the bytes of `chars`.
std::string strip(const std::string & s, bool left, bool right, const Value & chars) {
    auto match = [&](char c) {
        return chars.is_string() ? chars.str().find(c) != std::string::npos : ascii_space(static_cast<unsigned char>(c));
    };
    size_t b = 0, e = s.size();
    if (left)
        while (b < e && match(s[b])) ++b;
    if (right)
        while (e > b && match(s[e - 1])) --e;
    return s.substr(b, e - b);
}

const std::string & need_string(const Value & v, const char * what) {
    if (!v.is_string()) bad(std::string(what) + " needs a string, got " + v.type_name());
    return v.str();
}

int64_t need_int(const Value & v, const char * what) {
    if (!v.is_int()) bad(std::string(what) + " needs an integer, got " + v.type_name());
    return v.as_int();
}

std::string replace_all(std::string s, const std::string & from, const std::string & to, int64_t count) {
    if (from.empty() && s.size() * (to.size() + 1) + to.size() > (size_t(64) << 20))
        bad("replace() result longer than 64 MiB");
    if (from.empty()) {  // Python: insert `to` around every character
        std::string out = to;
        for (char c : s) {
            if (count == 0) { out += c; continue; }
            out += c;
            out += to;
            if (count > 0) --count;
        }
        return out;
    }
    size_t pos = 0;
    while (count != 0 && (pos = s.find(from, pos)) != std::string::npos) {
        s.replace(pos, from.size(), to);
        pos += to.size();
        if (count > 0) --count;
    }
    return s;
}

// Python's str.split / rsplit. Without a separator: runs of whitespace, no empty strings.
Value split(const std::string & s, const Value & sep, int64_t maxsplit, bool from_right) {
    Array parts;
    if (sep.is_undefined() || sep.is_none()) {
        std::vector<std::string> words;
        size_t i = 0;
        while (i < s.size()) {
            while (i < s.size() && ascii_space(static_cast<unsigned char>(s[i]))) ++i;
            if (i >= s.size()) break;
            size_t j = i;
            while (j < s.size() && !ascii_space(static_cast<unsigned char>(s[j]))) ++j;
            words.push_back(s.substr(i, j - i));
            i = j;
        }
        if (maxsplit >= 0) bad("split() without a separator but with maxsplit is not supported");
        for (auto & w : words) parts.push_back(Value::string(std::move(w)));
        return Value::array(std::move(parts));
    }
    const std::string & d = need_string(sep, "split()");
    if (d.empty()) bad("split(): empty separator");
    std::vector<std::string> out;
    if (!from_right) {
        size_t start = 0, pos;
        while (maxsplit != 0 && (pos = s.find(d, start)) != std::string::npos) {
            out.push_back(s.substr(start, pos - start));
            start = pos + d.size();
            if (maxsplit > 0) --maxsplit;
        }
        out.push_back(s.substr(start));
    } else {
        std::string rest = s;
        size_t pos;
        while (maxsplit != 0 && (pos = rest.rfind(d)) != std::string::npos) {
            out.push_back(rest.substr(pos + d.size()));
            rest.erase(pos);
            if (maxsplit > 0) --maxsplit;
        }
        out.push_back(rest);
        std::reverse(out.begin(), out.end());
    }
    for (auto & p : out) parts.push_back(Value::string(std::move(p)));
    return Value::array(std::move(parts));
}

// The items a filter iterates: an array's elements, a string's bytes, an object's keys.
Array items_of(const Value & v, const char * what) {
    if (v.is_array()) return v.arr();
    if (v.is_object()) {
        Array keys;
        for (size_t k = 0; k < v.obj().items.size(); ++k) keys.push_back(v.obj().key(k));
        return keys;
    }
    if (v.is_string()) {
        Array chars;
        for (char c : v.str()) chars.push_back(Value::string(std::string(1, c)));
        return chars;
    }
    if (v.is_undefined()) return {};
    bad(std::string(what) + " needs a sequence, got " + v.type_name());
}

Value attr_of(const Value & v, const std::string & path) {
    Value cur = v;
    size_t b = 0;
    for (;;) {  // "a.b.c" walks nested objects, as Jinja's attribute= arguments do
        const size_t e = path.find('.', b);
        const std::string key = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
        if (!cur.is_object()) return Value();
        const Value * f = cur.obj().find(key);
        if (!f) return Value();
        cur = *f;
        if (e == std::string::npos) return cur;
        b = e + 1;
    }
}

int compare(const Value & a, const Value & b) {
    if (a.is_number() && b.is_number()) return a.as_float() < b.as_float() ? -1 : a.as_float() > b.as_float() ? 1 : 0;
    if (a.is_string() && b.is_string()) return a.str().compare(b.str()) < 0 ? -1 : a.str() == b.str() ? 0 : 1;
    if (a.is_bool() && b.is_bool()) return static_cast<int>(a.as_bool()) - static_cast<int>(b.as_bool());
    bad(std::string("cannot compare ") + a.type_name() + " with " + b.type_name());
}

Value select(const Value & input, CallArgs & args, bool reject, bool by_attr) {
    Array out;
    const Value attr = by_attr ? args.get(0, "attribute") : Value();
    if (by_attr && !attr.is_string()) bad("selectattr / rejectattr need an attribute name");
    const size_t t = by_attr ? 1 : 0;
    const Value test = args.get(t, "test");
    CallArgs targs;
    for (size_t i = t + 1; i < args.pos.size(); ++i) targs.pos.push_back(args.pos[i]);
    for (const Value & item : items_of(input, reject ? "reject" : "select")) {
        const Value v = by_attr ? attr_of(item, attr.str()) : item;
        bool ok;
        if (test.is_undefined()) ok = v.truthy();
        else ok = apply_test(need_string(test, "select / reject test"), v, targs);
        if (ok != reject) out.push_back(item);
    }
    return Value::array(std::move(out));
}

std::string join(const Value & input, const std::string & sep, const Value & attr) {
    std::string out;
    bool first = true;
    for (const Value & item : items_of(input, "join")) {
        if (!first) out += sep;
        if (out.size() > (size_t(64) << 20)) bad("join() result longer than 64 MiB");
        first = false;
        out += (attr.is_string() ? attr_of(item, attr.str()) : item).to_str();
    }
    return out;
}

Value tojson(const Value & input, const CallArgs & args) {
    const Value indent = args.get(0, "indent");
    const Value ascii = args.get(1, "ensure_ascii");
    const Value seps = args.get(2, "separators");
    if (args.get(3, "sort_keys").truthy()) bad("tojson(sort_keys=true) is not supported");
    const int ind = indent.is_int() ? static_cast<int>(std::clamp<int64_t>(indent.as_int(), -1, 64)) : -1;
    // Python's json.dumps defaults (which llama.cpp follows): ", " / ": " on one line, "," / ": " indented.
    std::string item_sep = ind < 0 ? ", " : ",", key_sep = ": ";
    if (seps.is_array()) {
        if (seps.arr().size() > 0) item_sep = seps.arr()[0].to_str();
        if (seps.arr().size() > 1) key_sep = seps.arr()[1].to_str();
    }
    return Value::string(to_json(input, ind, item_sep, key_sep, ascii.truthy()));
}

Value to_int(const Value & v, const Value & dflt) {
    if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
    if (v.is_float()) return Value::integer(std::isfinite(v.as_float()) ? static_cast<int64_t>(v.as_float()) : 0);
    if (v.is_string()) {
        const std::string t = strip(v.str(), true, true, Value());
        char * end = nullptr;
        const long long x = std::strtoll(t.c_str(), &end, 10);
        if (!t.empty() && end && *end == '\0') return Value::integer(x);
    }
    return dflt.is_undefined() ? Value::integer(0) : dflt;
}

Value to_float(const Value & v, const Value & dflt) {
    if (v.is_number() || v.is_bool()) return Value::number(v.as_float());
    if (v.is_string()) {
        const std::string t = strip(v.str(), true, true, Value());
        char * end = nullptr;
        const double x = std::strtod(t.c_str(), &end);
        if (!t.empty() && end && *end == '\0') return Value::number(x);
    }
    return dflt.is_undefined() ? Value::number(0) : dflt;
}

} // namespace

Value apply_filter(const std::string & name, const Value & in, CallArgs & args) {
    // What llama.cpp's engine gives for a filter of an undefined value or of none (its value_undefined_t and
    // value_none_t builtins): empty sequences, empty text, length 0, ... rather than an error.
    if (in.is_undefined()) {
        for (const char * f : {"items", "list", "map", "reject", "rejectattr", "reverse", "select", "selectattr", "sort", "unique"})
            if (name == f) return Value::array();
        for (const char * f : {"capitalize", "join", "lower", "replace", "safe", "string", "strip", "title", "truncate", "upper"})
            if (name == f) return Value::string("");
        if (name == "length" || name == "sum" || name == "wordcount") return Value::integer(0);
        if (name == "first" || name == "last" || name == "max" || name == "min") return Value();
    }
    if (in.is_none()) {
        for (const char * f : {"items", "map", "reject", "rejectattr", "select", "selectattr", "unique"})
            if (name == f) return Value::array();
        if (name == "string" || name == "safe") return Value::string("None");
    }
    // Like llama.cpp, the string filters turn a non-string input into its text first.
    auto text = [&]() { return in.is_string() ? in.str() : in.to_str(); };
    if (name == "trim" || name == "strip") return Value::string(strip(text(), true, true, args.get(0, "chars")));
    if (name == "upper" || name == "lower") {
        std::string s = text();
        for (char & c : s)
            if (c >= 'a' && c <= 'z' && name == "upper") c = static_cast<char>(c - 32);
            else if (c >= 'A' && c <= 'Z' && name == "lower") c = static_cast<char>(c + 32);
        return Value::string(s);
    }
    if (name == "capitalize" || name == "title") {
        std::string s = text();
        bool start = true;
        for (size_t i = 0; i < s.size(); ++i) {
            char & c = s[i];
            const bool up = name == "capitalize" ? i == 0 : start;
            if (up && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
            else if (!up && c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
            start = ascii_space(static_cast<unsigned char>(c));
        }
        return Value::string(s);
    }
    if (name == "replace") {
        const Value count = args.get(2, "count");
        return Value::string(replace_all(text(), args.get(0, "old").to_str(), args.get(1, "new").to_str(),
                                         count.is_undefined() ? -1 : need_int(count, "replace()")));
    }
    if (name == "length" || name == "count") {
        if (in.is_string()) return Value::integer(static_cast<int64_t>(in.str().size()));
        if (in.is_array()) return Value::integer(static_cast<int64_t>(in.arr().size()));
        if (in.is_object()) return Value::integer(static_cast<int64_t>(in.obj().items.size()));
        bad(std::string("length of ") + in.type_name());
    }
    if (name == "default" || name == "d") {
        const bool use = in.is_undefined() || (args.get(1, "boolean").truthy() && !in.truthy());
        if (!use) return in;
        const Value d = args.get(0, "default_value");
        return d.is_undefined() ? Value::string("") : d;
    }
    if (name == "safe") return in;
    if (name == "string") return in.is_string() ? in : Value::string(in.to_str());
    if (name == "tojson") return tojson(in, args);
    if (name == "int") return to_int(in, args.get(0, "default"));
    if (name == "float") return to_float(in, args.get(0, "default"));
    if (name == "abs") {
        if (in.is_int()) return Value::integer(in.as_int() < 0 ? -in.as_int() : in.as_int());
        if (in.is_float()) return Value::number(std::fabs(in.as_float()));
        bad(std::string("abs of ") + in.type_name());
    }
    if (name == "first" || name == "last") {
        const Array a = items_of(in, name.c_str());
        if (a.empty()) return Value();
        return name == "first" ? a.front() : a.back();
    }
    if (name == "list") return Value::array(items_of(in, "list"));
    if (name == "reverse") {
        if (in.is_string()) return Value::string(std::string(in.str().rbegin(), in.str().rend()));
        Array a = items_of(in, "reverse");
        std::reverse(a.begin(), a.end());
        return Value::array(std::move(a));
    }
    if (name == "join") return Value::string(join(in, args.get(0, "d").to_str(), args.get(1, "attribute")));
    if (name == "items") {
        if (in.is_undefined() || in.is_none()) return Value::array();
        if (!in.is_object()) bad(std::string("items of ") + in.type_name());
        Array out;
        for (size_t k = 0; k < in.obj().items.size(); ++k) out.push_back(Value::array({in.obj().key(k), in.obj().items[k].second}));
        return Value::array(std::move(out));
    }
    if (name == "dictsort") {
        if (!in.is_object()) bad(std::string("dictsort of ") + in.type_name());
        Array out;
        for (size_t k = 0; k < in.obj().items.size(); ++k) out.push_back(Value::array({in.obj().key(k), in.obj().items[k].second}));
        std::stable_sort(out.begin(), out.end(), [](const Value & x, const Value & y) { return compare(x.arr()[0], y.arr()[0]) < 0; });
        return Value::array(std::move(out));
    }
    if (name == "select" || name == "reject") return select(in, args, name == "reject", false);
    if (name == "selectattr" || name == "rejectattr") return select(in, args, name == "rejectattr", true);
    if (name == "map") {
        Array out;
        const Value attr = args.kwarg("attribute");
        if (attr.is_string()) {
            const Value dflt = args.kwarg("default");
            for (const Value & item : items_of(in, "map")) {
                Value v = attr_of(item, attr.str());
                out.push_back(v.is_undefined() && !dflt.is_undefined() ? dflt : v);
            }
            return Value::array(std::move(out));
        }
        if (args.pos.empty() || !args.pos[0].is_string()) bad("map() needs a filter name or attribute=");
        CallArgs fargs;
        fargs.pos.assign(args.pos.begin() + 1, args.pos.end());
        fargs.kw = args.kw;
        for (const Value & item : items_of(in, "map")) out.push_back(apply_filter(args.pos[0].str(), item, fargs));
        return Value::array(std::move(out));
    }
    if (name == "unique") {
        Array out;
        for (const Value & item : items_of(in, "unique")) {
            bool seen = false;
            for (const Value & o : out) seen = seen || equal(o, item);
            if (!seen) out.push_back(item);
        }
        return Value::array(std::move(out));
    }
    if (name == "sort") {
        Array a = items_of(in, "sort");
        const bool rev = args.get(0, "reverse").truthy();
        const Value attr = args.get(2, "attribute");
        auto key = [&](const Value & v) { return attr.is_string() ? attr_of(v, attr.str()) : v; };
        std::stable_sort(a.begin(), a.end(), [&](const Value & x, const Value & y) {
            const int c = compare(key(x), key(y));
            return rev ? c > 0 : c < 0;
        });
        return Value::array(std::move(a));
    }
    if (name == "min" || name == "max") {
        const Array a = items_of(in, name.c_str());
        if (a.empty()) return Value();
        Value best = a[0];
        for (const Value & v : a)
            if (name == "min" ? compare(v, best) < 0 : compare(v, best) > 0) best = v;
        return best;
    }
    if (name == "sum") {
        Value acc = Value::integer(0);
        for (const Value & v : items_of(in, "sum")) {
            if (!v.is_number()) bad(std::string("sum of ") + v.type_name());
            acc = acc.is_int() && v.is_int() ? Value::integer(acc.as_int() + v.as_int())
                                              : Value::number(acc.as_float() + v.as_float());
        }
        return acc;
    }
    if (name == "wordcount") return Value::integer(static_cast<int64_t>(split(text(), Value(), -1, false).arr().size()));
    if (name == "indent") {
        const Value w = args.get(0, "width");
        const std::string pad = w.is_string() ? w.str() : std::string(static_cast<size_t>(std::clamp<int64_t>(w.is_undefined() ? 4 : need_int(w, "indent()"), 0, 1024)), ' ');
        const bool first = args.get(1, "first").truthy(), blank = args.get(2, "blank").truthy();
        const std::string s = text();
        std::string out;
        size_t b = 0;
        for (bool line0 = true;; line0 = false) {
            const size_t e = s.find('\n', b);
            const std::string line = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
            if ((!line0 || first) && (blank || !line.empty())) out += pad;
            out += line;
            if (e == std::string::npos) break;
            out += '\n';
            b = e + 1;
        }
        return Value::string(out);
    }
    bad("unsupported filter '" + name + "'");
}

bool apply_test(const std::string & name, const Value & v, const CallArgs & args) {
    const Value arg = args.get(0, "value");
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.is_int();
    if (name == "float") return v.is_float();
    if (name == "boolean") return v.is_bool();
    if (name == "mapping") return v.is_object();
    // llama.cpp: strings, arrays and undefined are iterable / sequences; objects are not.
    if (name == "iterable" || name == "sequence") return v.is_array() || v.is_string() || v.is_undefined();
    if (name == "callable") return v.is_function();
    if (name == "true") return v.is_bool() && v.as_bool();
    if (name == "false") return v.is_bool() && !v.as_bool();
    if (name == "odd") return need_int(v, "odd") % 2 != 0;
    if (name == "even") return need_int(v, "even") % 2 == 0;
    if (name == "divisibleby") {
        const int64_t d = need_int(arg, "divisibleby");
        if (d == 0) bad("divisibleby(0)");
        return need_int(v, "divisibleby") % d == 0;
    }
    if (name == "lower" || name == "upper") {
        for (char c : need_string(v, name.c_str()))
            if (name == "lower" ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z')) return false;
        return true;
    }
    if (name == "eq" || name == "equalto" || name == "sameas") return equal(v, arg);
    if (name == "ne") return !equal(v, arg);
    if (name == "lt" || name == "lessthan") return compare(v, arg) < 0;
    if (name == "le") return compare(v, arg) <= 0;
    if (name == "gt" || name == "greaterthan") return compare(v, arg) > 0;
    if (name == "ge") return compare(v, arg) >= 0;
    if (name == "in") {
        if (arg.is_string()) return v.is_string() && arg.str().find(v.str()) != std::string::npos;
        if (arg.is_object()) return has_key(arg.obj(), v);
        if (arg.is_array()) {
            for (const Value & x : arg.arr())
                if (equal(x, v)) return true;
            return false;
        }
        return false;
    }
    bad("unsupported test '" + name + "'");
}

Value bound_method(const Value & self, const std::string & name) {
    auto method = [&](Function f) { return Value::function(name, std::move(f)); };
    if (self.is_string()) {
        const std::string s = self.str();
        if (name == "strip" || name == "lstrip" || name == "rstrip")
            return method([s, name](CallArgs & a) {
                return Value::string(strip(s, name != "rstrip", name != "lstrip", a.get(0, "chars")));
            });
        if (name == "startswith" || name == "endswith")
            return method([s, name](CallArgs & a) {
                const Value p = a.get(0, "prefix");
                auto one = [&](const std::string & x) {
                    return x.size() <= s.size() &&
                           (name == "startswith" ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0);
                };
                if (p.is_array()) {
                    for (const Value & x : p.arr())
                        if (one(need_string(x, name.c_str()))) return Value::boolean(true);
                    return Value::boolean(false);
                }
                return Value::boolean(one(need_string(p, name.c_str())));
            });
        if (name == "format")  // Python's str.format with '{}' placeholders only, as llama.cpp's engine has it
            return method([s](CallArgs & a) {
                std::string out;
                size_t arg = 0;
                for (size_t i = 0; i < s.size(); ++i) {
                    if (s[i] != '{') {
                        out += s[i];
                        continue;
                    }
                    if (i + 1 >= s.size() || s[i + 1] != '}') bad("format() supports only '{}' placeholders");
                    ++i;
                    out += a.get(arg++, "").to_str();
                }
                return Value::string(out);
            });
        if (name == "split" || name == "rsplit")
            return method([s, name](CallArgs & a) {
                const Value m = a.get(1, "maxsplit");
                return split(s, a.get(0, "sep"), m.is_undefined() ? -1 : need_int(m, "split()"), name == "rsplit");
            });
        if (name == "replace")
            return method([s](CallArgs & a) {
                const Value c = a.get(2, "count");
                return Value::string(replace_all(s, need_string(a.get(0, "old"), "replace()"),
                                                 need_string(a.get(1, "new"), "replace()"),
                                                 c.is_undefined() ? -1 : need_int(c, "replace()")));
            });
        if (name == "upper" || name == "lower" || name == "title" || name == "capitalize")
            return method([self, name](CallArgs &) {
                CallArgs none;
                return apply_filter(name, self, none);
            });
        if (name == "find" || name == "rfind" || name == "count")
            return method([s, name](CallArgs & a) {
                const Value arg = a.get(0, "sub");  // named: need_string returns a reference into it
                const std::string & sub = need_string(arg, name.c_str());
                if (name == "count") {
                    if (sub.empty()) return Value::integer(static_cast<int64_t>(s.size()) + 1);
                    int64_t n = 0;
                    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
                    return Value::integer(n);
                }
                const size_t p = name == "find" ? s.find(sub) : s.rfind(sub);
                return Value::integer(p == std::string::npos ? -1 : static_cast<int64_t>(p));
            });
        if (name == "join")
            return method([s](CallArgs & a) { return Value::string(join(a.get(0, "iterable"), s, Value())); });
        return Value();
    }
    if (self.is_array()) {
        if (name == "append")
            return method([self](CallArgs & a) {
                const Value x = a.get(0, "x");
                if (contains(x, self)) bad("cannot append a list to itself");
                self.arr().push_back(x);
                return Value::none();
            });
        if (name == "pop")
            return method([self](CallArgs & a) {
                Array & arr = self.arr();
                if (arr.empty()) bad("pop from an empty list");
                const Value iv = a.get(0, "index");
                int64_t i = iv.is_undefined() ? -1 : need_int(iv, "pop()");
                if (i < 0) i += static_cast<int64_t>(arr.size());
                if (i < 0 || i >= static_cast<int64_t>(arr.size())) bad("pop index out of range");
                Value v = arr[static_cast<size_t>(i)];
                arr.erase(arr.begin() + i);
                return v;
            });
        return Value();
    }
    if (self.is_object()) {
        if (name == "items" || name == "keys" || name == "values")
            return method([self, name](CallArgs &) {
                Array out;
                const Object & o = self.obj();
                for (size_t k = 0; k < o.items.size(); ++k)
                    out.push_back(name == "items" ? Value::array({o.key(k), o.items[k].second}) : name == "keys" ? o.key(k) : o.items[k].second);
                return Value::array(std::move(out));
            });
        if (name == "get")
            return method([self](CallArgs & a) {
                const Value k = a.get(0, "key");
                const Value * v = k.is_string() ? self.obj().find(k.str()) : nullptr;
                if (v) return *v;
                const Value d = a.get(1, "default");
                return d.is_undefined() ? Value::none() : d;
            });
    }
    return Value();
}

} // namespace rp::jinja
