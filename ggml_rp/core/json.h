// A small JSON reader (RFC 8259): Chrome traces (roundpipe/trace.cpp), jsonl datasets (models/dataset.cpp).
// Errors throw rp::Error with the source name and the byte offset. Nesting deeper than 64 levels is refused
// (a hostile file cannot overflow the stack). Numbers are doubles; strings are UTF-8 (\u escapes, surrogate
// pairs decoded).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rp::json {

struct Member;

struct Value {
    enum class Type { Null, Bool, Number, String, Array, Object };
    Type type = Type::Null;
    bool boolean = false;
    double number = 0;
    std::string string;
    std::vector<Value> array;
    std::vector<Member> object;  // in file order; duplicate keys: find() gets the last

    bool is_number() const { return type == Type::Number; }
    bool is_string() const { return type == Type::String; }
    bool is_object() const { return type == Type::Object; }
    bool is_array() const { return type == Type::Array; }
    const Value * find(const std::string & key) const;  // nullptr when absent or not an object
};

// A key and its value (a struct, not std::pair: a pair of an incomplete Value is not valid C++).
struct Member {
    std::string first;
    Value second;
};

Value parse(const std::string & text, const std::string & source_name);

// Appends s as a JSON string literal to out: quotes, and the escapes Python's json.dumps writes (\" \\ \b \f \n \r
// \t, other control bytes as \u00XX; UTF-8 as it is), so chat templates' tojson matches llama.cpp's.
void append_string(std::string & out, const std::string & s);
// s as a JSON string literal (append_string to an empty string).
std::string quoted(const std::string & s);
// v as JSON text on one line: objects in their order with ": " and ", " between, strings as append_string writes
// them, numbers as the shortest text that reads back to the same double (integers without a fraction).
std::string dump(const Value & v);

} // namespace rp::json
