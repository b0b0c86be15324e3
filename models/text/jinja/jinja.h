// A small Jinja interpreter for chat templates (tokenizer.chat_template), written to render exactly what
// llama.cpp's own engine (common/jinja) renders for the templates of the model families we support.
//
// Supported: {{ }}, {% %}, {# #} with llama.cpp's whitespace rules (lexer.h); if/elif/else, for (loop.*,
// else, tuple targets, `if` filter, break/continue), set (also `set ns.x` and block set), macro, call, filter
// blocks; literals, attributes, subscripts, slices, calls with keyword arguments, the usual operators,
// filters (builtins.h lists them), tests, string / list / dict methods, and the globals raise_exception,
// namespace, range, dict and strftime_now. Everything else (include, extends, block, raw, with, recursive
// loops, `**`, `//`, unknown filters / tests / methods) throws rp::Error naming the construct and its line
// and column: a template is never rendered silently differently. Errors at render time also throw
// rp::Error; nothing aborts.
#pragma once

#include "models/text/jinja/value.h"

#include <ctime>
#include <memory>
#include <string>

namespace rp::jinja {

struct Program;

class Template {
public:
    // Parses `source`. Throws rp::Error (with line and column) on a syntax error or unsupported construct.
    explicit Template(const std::string & source);
    ~Template();
    Template(Template &&) noexcept;
    Template & operator=(Template &&) noexcept;

    // Renders with `vars` (an object: the template's global variables); `now` is the time strftime_now
    // formats. Throws rp::Error. The template may modify the lists and objects in `vars` (they are shared,
    // as in Python), so pass fresh ones. Thread-safe: a Template is not changed by rendering.
    std::string render(const Value & vars, const std::tm & now) const;

private:
    std::unique_ptr<Program> prog_;
};

} // namespace rp::jinja
