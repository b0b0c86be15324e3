// The syntax tree of a parsed template. One node type keeps the parser and the interpreter small: `kind`
// says what a node is and which of its fields are used (see the comments on Kind).
#pragma once

#include "models/text/jinja/value.h"

#include <memory>
#include <string>
#include <vector>

namespace rp::jinja {

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Nodes = std::vector<NodePtr>;

struct Node {
    enum class Kind {
        // statements
        Text,      // name = the text
        Output,    // a = expression
        If,        // a = test, body, orelse
        For,       // targets (names), a = iterable, b = filter (or null), body, orelse
        Set,       // a = target (Name, Attr or Tuple), b = value (null: block form, body)
        Macro,     // name, params (Name nodes; b of a param = default), body
        CallBlock, // a = Call, params = caller's parameters, body
        FilterBlock, // a = filter (Name or Call), body
        Break,
        Continue,
        // expressions
        Literal,   // value
        Name,      // name
        Attr,      // a.name
        Index,     // a[b]
        Slice,     // a[b:c:d]; any of b, c, d may be null
        Call,      // a(args, kwargs)
        Filter,    // a | name(args, kwargs)
        Test,      // a is [not] name(args); negate
        Not,       // not a
        Neg,       // -a
        Binary,    // a op b; op: + - ~ * / % == != < > <= >= in "not in" and or
        Cond,      // a if b else c (c null: a if b)
        List,      // items
        Dict,      // items = key, value, key, value, ...
        Tuple,     // items
    };

    Kind kind;
    size_t pos = 0;  // byte offset in the normalized source, for error messages
    std::string name;
    std::string op;
    bool negate = false;
    Value value;
    NodePtr a, b, c, d;
    Nodes body, orelse, items, params;
    std::vector<std::string> targets;
    std::vector<std::pair<std::string, NodePtr>> kwargs;
};

struct Program {
    std::string source;  // normalized; Node::pos refers to it
    Nodes body;
};

// Throws rp::Error naming the line and column of a syntax error or an unsupported statement.
Program parse(const std::string & source);

} // namespace rp::jinja
