// The value model of the Jinja interpreter: undefined, none, bool, int, float, string, array, object
// (string keys, insertion order kept, as Python dicts and llama.cpp's engine keep it) and callables.
//
// Arrays and objects are shared by reference (a shared_ptr), as in Python: `namespace(...)` objects are
// mutated through `{% set ns.x = ... %}` from inner scopes, and `list.append` changes the list every
// name bound to it sees. Everything else is a plain value.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rp::jinja {

class Value;
struct Object;
struct CallArgs;

using Array = std::vector<Value>;
// A callable: a builtin (bound to its receiver when it is a method) or a macro. Throws rp::Error.
using Function = std::function<Value(CallArgs & args)>;

class Value {
public:
    enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Function };

    Value() = default;  // undefined
    static Value none() { Value v; v.kind_ = Kind::None; return v; }
    static Value boolean(bool b) { Value v; v.kind_ = Kind::Bool; v.i_ = b; return v; }
    static Value integer(int64_t i) { Value v; v.kind_ = Kind::Int; v.i_ = i; return v; }
    static Value number(double d) { Value v; v.kind_ = Kind::Float; v.f_ = d; return v; }
    static Value string(std::string s) { Value v; v.kind_ = Kind::String; v.s_ = std::move(s); return v; }
    static Value array(Array a = {});
    static Value object();
    static Value function(std::string name, Function f);

    Kind kind() const { return kind_; }
    bool is_undefined() const { return kind_ == Kind::Undefined; }
    bool is_none() const { return kind_ == Kind::None; }
    bool is_bool() const { return kind_ == Kind::Bool; }
    bool is_int() const { return kind_ == Kind::Int; }
    bool is_float() const { return kind_ == Kind::Float; }
    bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float; }
    bool is_string() const { return kind_ == Kind::String; }
    bool is_array() const { return kind_ == Kind::Array; }
    bool is_object() const { return kind_ == Kind::Object; }
    bool is_function() const { return kind_ == Kind::Function; }

    bool as_bool() const { return i_ != 0; }  // for Kind::Bool; see truthy() for any value
    int64_t as_int() const { return kind_ == Kind::Float ? static_cast<int64_t>(f_) : i_; }
    double as_float() const { return kind_ == Kind::Float ? f_ : static_cast<double>(i_); }
    const std::string & str() const { return s_; }
    Array & arr() const { return *arr_; }
    Object & obj() const { return *obj_; }
    const Function & fn() const { return *fn_; }
    const std::string & fn_name() const { return s_; }

    // The type name used in error messages ("string", "array", ...).
    const char * type_name() const;
    // Python truthiness: undefined, none, false, 0, "", [], {} are false.
    bool truthy() const;
    // How `{{ v }}` prints v (llama.cpp's rule, which differs from Python's str() for containers): strings
    // as they are, numbers as Python prints them, True / False, arrays as the concatenation of their items
    // printed this way, and nothing for undefined, none, objects and callables.
    void append_output(std::string & out) const;
    // The text `v | string` and `'a' + v` use: Python's str() (repr of items inside containers).
    std::string to_str() const;
    // Python's repr() for strings inside containers ('a'), str() otherwise.
    std::string repr() const;

private:
    Kind kind_ = Kind::Undefined;
    int64_t i_ = 0;
    double f_ = 0;
    std::string s_;  // the string, or a function's name
    std::shared_ptr<Array> arr_;
    std::shared_ptr<Object> obj_;
    std::shared_ptr<const Function> fn_;

    friend bool contains(const Value & inner, const Value & outer);
    void append_output(std::string & out, int depth) const;
    std::string to_str(int depth) const;
};

struct Object {
    std::vector<std::pair<std::string, Value>> items;
    // Integer keys (a literal like {0: 0, 512: 128}, as llama.cpp's engine keeps them): each key's text is its
    // decimal form; iteration, items() and dictsort give them back as integers and only an integer subscript
    // finds them. A dict's keys are all strings or all integers.
    bool int_keys = false;

    const Value * find(std::string_view key) const;
    void set(const std::string & key, Value v);  // replaces in place or appends
    // Key i as a value: a string, or an integer for int_keys.
    Value key(size_t i) const;
};

// Whether `key` (a string, or an integer for an integer-keyed object) is a key of `o`.
bool has_key(const Object & o, const Value & key);

// Whether container `inner` is `outer` or holds it (at any depth): storing such a value would make a
// reference cycle, which we refuse rather than leak or recurse forever.
bool contains(const Value & inner, const Value & outer);

// Containers nest at most this deep for printing, comparing and tojson (deeper throws rp::Error).
constexpr int kMaxValueDepth = 128;

// Deep equality as Python's ==: 1 == 1.0, containers element-wise, objects by key set.
bool equal(const Value & a, const Value & b);

// `tojson`: indent < 0 gives one line; separators as Python's json.dumps (item, key). Non-ASCII bytes are
// written as they are unless ensure_ascii (then \uXXXX, surrogate pairs above the BMP).
std::string to_json(const Value & v, int indent, std::string_view item_sep, std::string_view key_sep, bool ensure_ascii);

// Positional and keyword arguments of a call.
struct CallArgs {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    // Argument `i` by position, else by keyword `name`, else undefined.
    Value get(size_t i, const char * name) const;
    // Keyword argument `name` only (for arguments Jinja takes by keyword, e.g. map(attribute=...)).
    Value kwarg(const char * name) const;
};

} // namespace rp::jinja
