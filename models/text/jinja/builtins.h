// The interpreter's builtins: filters (`x | f(...)`), tests (`x is t(...)`), methods (`s.split(...)`).
// Each throws rp::Error (without a position; the interpreter adds the template's line and column) on a
// bad argument, and `unsupported` names the ones we do not have.
#pragma once

#include "models/text/jinja/value.h"

#include <string>

namespace rp::jinja {

// Filters: abs, capitalize, count, default / d, dictsort, first, float, indent, int, items, join, last,
// length, list, lower, map, max, min, reject, rejectattr, replace, reverse, safe, select, selectattr, sort,
// string, strip, sum, title, tojson, trim, unique, upper, wordcount.
// `call` invokes a callable value (for map / select with a test by name it is not needed).
Value apply_filter(const std::string & name, const Value & input, CallArgs & args);
// Tests: boolean, callable, defined, divisibleby, eq / equalto / ==, even, false, float, ge, gt / greaterthan,
// in, integer, iterable, le, lower, lt / lessthan, mapping, ne, none, number, odd, sequence, string, true,
// undefined, upper.
bool apply_test(const std::string & name, const Value & input, const CallArgs & args);
// `obj.name` when it names a method of obj's type (string, array and object methods), else undefined.
Value bound_method(const Value & obj, const std::string & name);

} // namespace rp::jinja
