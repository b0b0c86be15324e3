// Run files: the subset of TOML the tools read their options from (`rp-finetune --config RUN.toml`) and write
// their effective configuration in (`--print-config`, OUT.gguf.config.toml). One `key = value` per option,
// the key being the option's long name without its dashes; values are strings ("..." or '...'), integers,
// floats, booleans and arrays of those; comments start with #. Tables ([section]) are refused: the keys are
// flat, like the command line they stand for.
#pragma once

#include <string>
#include <vector>

namespace rp::cli {

enum class TomlType { Bool, Int, Float, String, Array };

struct TomlValue {
    TomlType type = TomlType::String;
    std::string text;               // a string's content (unescaped), or the literal of a number / bool
    std::vector<TomlValue> items;   // Array
};

struct RunFileEntry {
    int line = 0;                   // 1-based, where the key stands
    std::string key;
    TomlValue value;
};

// Throws rp::Error "ORIGIN:LINE: ..." on a syntax error, a table or a repeated key.
std::vector<RunFileEntry> parse_run_file(const std::string & text, const std::string & origin);

const char * toml_type_name(TomlType t);   // "a string", "an integer", ...

// TOML literals, for writing: a quoted, escaped string; a float that reads back bit for bit (and as a float).
std::string toml_string(const std::string & s);
std::string toml_float(double x, int digits);
std::string toml_array(const std::vector<std::string> & strings);   // ["a", "b"]

} // namespace rp::cli
