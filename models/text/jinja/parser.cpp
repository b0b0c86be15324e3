// Recursive-descent parser for the Jinja subset chat templates use. Operator precedence follows
// llama.cpp's engine, lowest first: `x if c else y`, or, and, not, comparisons and (not) in, + - ~, * / %,
// unary -, `is` tests, `|` filters, then calls, attributes and subscripts. (Unlike Python Jinja, `is` binds
// tighter than arithmetic and `~` shares the precedence of +; no chat template we know depends on either.)
#include "models/text/jinja/ast.h"
#include "models/text/jinja/lexer.h"

#include <cerrno>
#include <cstdlib>

namespace rp::jinja {

namespace {

using K = Token::Kind;

// Bounds on the tree's depth, so that rendering and freeing it cannot overflow the stack on a hostile
// template: nested expressions / blocks, and the length of one operator chain (a + b + c ... is a left-deep
// tree). Real chat templates stay far below them.
constexpr int kMaxNesting = 32;
constexpr int kMaxChain = 100;

class Parser {
public:
    explicit Parser(Lexed lx) : src_(std::move(lx.source)), t_(std::move(lx.tokens)) {}

    Program run() {
        Program p;
        p.body = block({});
        if (peek().kind != K::End) fail(peek().pos, "unexpected token '" + peek().text + "'");
        p.source = std::move(src_);
        return p;
    }

private:
    const Token & peek(size_t n = 0) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
    const Token & next() {
        const Token & t = t_[i_];
        if (i_ + 1 < t_.size()) ++i_;
        return t;
    }
    bool is_op(const char * op, size_t n = 0) const { return peek(n).kind == K::Op && peek(n).text == op; }
    bool is_name(const char * w, size_t n = 0) const { return peek(n).kind == K::Name && peek(n).text == w; }
    [[noreturn]] void fail(size_t pos, const std::string & msg) const { fail_at(src_, pos, msg); }
    void expect_op(const char * op) {
        if (!is_op(op)) fail(peek().pos, std::string("expected '") + op + "', found " + describe(peek()));
        next();
    }
    void expect_kind(K k, const char * what) {
        if (peek().kind != k) fail(peek().pos, std::string("expected ") + what + ", found " + describe(peek()));
        next();
    }
    void expect_name(const char * w) {
        if (!is_name(w)) fail(peek().pos, std::string("expected '") + w + "', found " + describe(peek()));
        next();
    }
    static std::string describe(const Token & t) {
        switch (t.kind) {
            case K::End: return "the end of the template";
            case K::Text: return "text";
            case K::CloseStmt: return "'%}'";
            case K::CloseExpr: return "'}}'";
            case K::String: return "a string";
            default: return "'" + t.text + "'";
        }
    }
    NodePtr node(Node::Kind k, size_t pos) {
        auto n = std::make_unique<Node>();
        n->kind = k;
        n->pos = pos;
        return n;
    }

    // Statements until a {% name %} with name in `ends` (not consumed) or the end of the template.
    Nodes block(std::initializer_list<const char *> ends) {
        const Nest guard(*this, peek().pos);
        Nodes out;
        for (;;) {
            const Token & t = peek();
            if (t.kind == K::End) {
                if (ends.size() != 0) fail(t.pos, std::string("missing {% ") + *(ends.end() - 1) + " %}");
                return out;
            }
            if (t.kind == K::OpenStmt && peek(1).kind == K::Name)
                for (const char * e : ends)
                    if (peek(1).text == e) return out;
            if (t.kind == K::Text) {
                auto n = node(Node::Kind::Text, t.pos);
                n->name = next().text;
                out.push_back(std::move(n));
            } else if (t.kind == K::OpenExpr) {
                auto n = node(Node::Kind::Output, next().pos);
                n->a = expression();
                expect_kind(K::CloseExpr, "'}}'");
                out.push_back(std::move(n));
            } else if (t.kind == K::OpenStmt) {
                if (NodePtr s = statement()) out.push_back(std::move(s));
            } else {
                fail(t.pos, "unexpected " + describe(t));
            }
        }
    }

    // {% end... %} after a block.
    void end_tag(const char * name) {
        expect_kind(K::OpenStmt, "'{%'");
        expect_name(name);
        expect_kind(K::CloseStmt, "'%}'");
    }

    NodePtr statement() {
        next();  // {%
        const Token kw = peek();
        if (kw.kind != K::Name) fail(kw.pos, "expected a statement name, found " + describe(kw));
        next();
        const std::string & w = kw.text;
        if (w == "if") return if_rest(kw.pos);
        if (w == "for") return for_rest(kw.pos);
        if (w == "set") return set_rest(kw.pos);
        if (w == "macro") return macro_rest(kw.pos);
        if (w == "call") return call_rest(kw.pos);
        if (w == "filter") {
            auto n = node(Node::Kind::FilterBlock, kw.pos);
            n->a = filter_callee();
            expect_kind(K::CloseStmt, "'%}'");
            n->body = block({"endfilter"});
            end_tag("endfilter");
            return n;
        }
        if (w == "break" || w == "continue") {
            expect_kind(K::CloseStmt, "'%}'");
            return node(w == "break" ? Node::Kind::Break : Node::Kind::Continue, kw.pos);
        }
        if (w == "generation" || w == "endgeneration") {
            // transformers' assistant-mask markers; they render nothing (as in llama.cpp).
            expect_kind(K::CloseStmt, "'%}'");
            return nullptr;
        }
        fail(kw.pos, "unsupported statement '{% " + w + " %}'");
    }

    NodePtr if_rest(size_t pos) {
        auto n = node(Node::Kind::If, pos);
        n->a = expression();
        expect_kind(K::CloseStmt, "'%}'");
        n->body = block({"elif", "else", "endif"});  // the last one is the required end
        if (is_name("elif", 1)) {
            next();
            const size_t p = next().pos;
            n->orelse.push_back(if_rest(p));  // the nested if consumes the {% endif %}
            return n;
        }
        if (is_name("else", 1)) {
            next();
            next();
            expect_kind(K::CloseStmt, "'%}'");
            n->orelse = block({"endif"});
        }
        end_tag("endif");
        return n;
    }

    NodePtr for_rest(size_t pos) {
        auto n = node(Node::Kind::For, pos);
        const bool paren = is_op("(");
        if (paren) next();
        for (;;) {
            if (peek().kind != K::Name) fail(peek().pos, "expected a loop variable name, found " + describe(peek()));
            n->targets.push_back(next().text);
            if (!is_op(",")) break;
            next();
        }
        if (paren) expect_op(")");
        expect_name("in");
        n->a = logical_or();
        if (is_name("if")) {
            next();
            n->b = logical_or();
        }
        if (is_name("recursive")) fail(peek().pos, "unsupported: recursive for loops");
        expect_kind(K::CloseStmt, "'%}'");
        n->body = block({"else", "endfor"});
        if (is_name("else", 1)) {
            next();
            next();
            expect_kind(K::CloseStmt, "'%}'");
            n->orelse = block({"endfor"});
        }
        end_tag("endfor");
        return n;
    }

    NodePtr set_rest(size_t pos) {
        auto n = node(Node::Kind::Set, pos);
        n->a = sequence(true);
        if (n->a->kind != Node::Kind::Name && n->a->kind != Node::Kind::Attr && n->a->kind != Node::Kind::Tuple)
            fail(n->a->pos, "cannot assign to this expression");
        if (is_op("=")) {
            next();
            n->b = sequence(false);
            expect_kind(K::CloseStmt, "'%}'");
            return n;
        }
        expect_kind(K::CloseStmt, "'%}'");
        n->body = block({"endset"});
        end_tag("endset");
        return n;
    }

    void param_list(Node & n) {
        expect_op("(");
        while (!is_op(")")) {
            if (peek().kind != K::Name) fail(peek().pos, "expected a parameter name, found " + describe(peek()));
            auto p = node(Node::Kind::Name, peek().pos);
            p->name = next().text;
            if (is_op("=")) {
                next();
                p->b = expression();
            }
            n.params.push_back(std::move(p));
            if (!is_op(",")) break;
            next();
        }
        expect_op(")");
    }

    NodePtr macro_rest(size_t pos) {
        auto n = node(Node::Kind::Macro, pos);
        if (peek().kind != K::Name) fail(peek().pos, "expected a macro name, found " + describe(peek()));
        n->name = next().text;
        param_list(*n);
        expect_kind(K::CloseStmt, "'%}'");
        n->body = block({"endmacro"});
        end_tag("endmacro");
        return n;
    }

    NodePtr call_rest(size_t pos) {
        auto n = node(Node::Kind::CallBlock, pos);
        if (is_op("(")) param_list(*n);
        n->a = postfix();
        if (n->a->kind != Node::Kind::Call) fail(n->a->pos, "{% call %} needs a macro call");
        expect_kind(K::CloseStmt, "'%}'");
        n->body = block({"endcall"});
        end_tag("endcall");
        return n;
    }

    // expression [, expression ...] as a tuple; `names_only` for assignment targets.
    NodePtr sequence(bool target) {
        const size_t pos = peek().pos;
        NodePtr first = target ? postfix() : expression();
        if (!is_op(",")) return first;
        auto t = node(Node::Kind::Tuple, pos);
        t->items.push_back(std::move(first));
        while (is_op(",")) {
            next();
            t->items.push_back(target ? postfix() : expression());
        }
        return t;
    }

    struct Nest {
        Parser & p;
        Nest(Parser & parser, size_t pos) : p(parser) {
            if (++p.nest_ > kMaxNesting) p.fail(pos, "expressions or blocks nested deeper than " + std::to_string(kMaxNesting));
        }
        ~Nest() { --p.nest_; }
    };
    void chain(int & n, size_t pos) const {
        if (++n > kMaxChain) fail(pos, "an expression chain longer than " + std::to_string(kMaxChain) + " operations");
    }

    NodePtr expression() {
        const Nest guard(*this, peek().pos);
        NodePtr a = logical_or();
        if (!is_name("if")) return a;
        auto n = node(Node::Kind::Cond, next().pos);
        n->a = std::move(a);
        n->b = logical_or();
        if (is_name("else")) {
            next();
            n->c = expression();
        }
        return n;
    }

    NodePtr binary(std::string op, NodePtr l, NodePtr r, size_t pos) {
        auto n = node(Node::Kind::Binary, pos);
        n->op = std::move(op);
        n->a = std::move(l);
        n->b = std::move(r);
        return n;
    }

    NodePtr logical_or() {
        NodePtr l = logical_and();
        int n = 0;
        while (is_name("or")) {
            chain(n, peek().pos);
            const size_t p = next().pos;
            l = binary("or", std::move(l), logical_and(), p);
        }
        return l;
    }

    NodePtr logical_and() {
        NodePtr l = logical_not();
        int n = 0;
        while (is_name("and")) {
            chain(n, peek().pos);
            const size_t p = next().pos;
            l = binary("and", std::move(l), logical_not(), p);
        }
        return l;
    }

    NodePtr logical_not() {
        if (!is_name("not")) return comparison();
        const Nest guard(*this, peek().pos);
        auto n = node(Node::Kind::Not, next().pos);
        n->a = logical_not();
        return n;
    }

    NodePtr comparison() {
        NodePtr l = additive();
        for (int n = 0;; chain(n, peek().pos)) {
            const size_t p = peek().pos;
            std::string op;
            if (is_name("not") && is_name("in", 1)) {
                next();
                next();
                op = "not in";
            } else if (is_name("in")) {
                next();
                op = "in";
            } else if (peek().kind == K::Op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                                peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
                op = next().text;
            } else {
                return l;
            }
            l = binary(op, std::move(l), additive(), p);
        }
    }

    NodePtr additive() {
        NodePtr l = multiplicative();
        int n = 0;
        while (is_op("+") || is_op("-") || is_op("~")) {
            chain(n, peek().pos);
            const Token & t = next();
            l = binary(t.text, std::move(l), multiplicative(), t.pos);
        }
        return l;
    }

    NodePtr multiplicative() {
        NodePtr l = unary();
        int n = 0;
        while (is_op("*") || is_op("/") || is_op("%")) {
            chain(n, peek().pos);
            const Token & t = next();
            if (is_op("*") || is_op("/")) fail(peek().pos, "unsupported operator '" + t.text + t.text + "'");
            l = binary(t.text, std::move(l), unary(), t.pos);
        }
        return l;
    }

    NodePtr unary() {
        if (is_op("-") || is_op("+")) {
            const Nest guard(*this, peek().pos);
            const Token & t = next();
            if (t.text == "+") return unary();
            auto n = node(Node::Kind::Neg, t.pos);
            n->a = unary();
            return n;
        }
        return test();
    }

    NodePtr test() {
        NodePtr l = filtered();
        int chained = 0;
        while (is_name("is")) {
            chain(chained, peek().pos);
            auto n = node(Node::Kind::Test, next().pos);
            if (is_name("not")) {
                next();
                n->negate = true;
            }
            // `is none` / `is true`: keywords as test names
            if (peek().kind != K::Name) fail(peek().pos, "expected a test name, found " + describe(peek()));
            n->name = next().text;
            if (is_op("(")) args(*n);
            n->a = std::move(l);
            l = std::move(n);
        }
        return l;
    }

    NodePtr filter_callee() {
        if (peek().kind != K::Name) fail(peek().pos, "expected a filter name, found " + describe(peek()));
        auto n = node(Node::Kind::Filter, peek().pos);
        n->name = next().text;
        if (is_op("(")) args(*n);
        return n;
    }

    NodePtr filtered() {
        NodePtr l = postfix();
        int n = 0;
        while (is_op("|")) {
            chain(n, peek().pos);
            next();
            NodePtr f = filter_callee();
            f->a = std::move(l);
            l = std::move(f);
        }
        return l;
    }

    void args(Node & n) {
        expect_op("(");
        while (!is_op(")")) {
            if (is_op("*")) fail(peek().pos, "unsupported: argument unpacking with '*'");
            if (peek().kind == K::Name && is_op("=", 1)) {
                std::string key = next().text;
                next();
                n.kwargs.emplace_back(std::move(key), expression());
            } else {
                if (!n.kwargs.empty()) fail(peek().pos, "positional argument after a keyword argument");
                n.items.push_back(expression());
            }
            if (!is_op(",")) break;
            next();
        }
        expect_op(")");
    }

    NodePtr postfix() {
        NodePtr l = primary();
        for (int links = 0;; chain(links, peek().pos)) {
            if (is_op(".")) {
                const size_t p = next().pos;
                if (peek().kind != K::Name && peek().kind != K::Int)
                    fail(peek().pos, "expected an attribute name after '.', found " + describe(peek()));
                auto n = node(Node::Kind::Attr, p);
                n->name = next().text;
                n->a = std::move(l);
                l = std::move(n);
            } else if (is_op("[")) {
                const size_t p = next().pos;
                NodePtr idx[3];
                int parts = 0;
                bool slice = false;
                for (;;) {
                    if (is_op("]")) break;
                    if (is_op(":")) {
                        next();
                        slice = true;
                        if (++parts > 2) fail(p, "a slice has at most three parts");
                        continue;
                    }
                    if (idx[parts]) fail(peek().pos, "expected ':' or ']' in a subscript");
                    idx[parts] = expression();
                }
                next();
                if (!slice && !idx[0]) fail(p, "empty subscript '[]'");
                auto n = node(slice ? Node::Kind::Slice : Node::Kind::Index, p);
                n->a = std::move(l);
                n->b = std::move(idx[0]);
                n->c = std::move(idx[1]);
                n->d = std::move(idx[2]);
                l = std::move(n);
            } else if (is_op("(")) {
                auto n = node(Node::Kind::Call, peek().pos);
                args(*n);
                n->a = std::move(l);
                l = std::move(n);
            } else {
                return l;
            }
        }
    }

    NodePtr primary() {
        const Token & t = peek();
        switch (t.kind) {
            case K::Int:
            case K::Float: {
                auto n = node(Node::Kind::Literal, t.pos);
                errno = 0;
                if (t.kind == K::Int) {
                    const long long v = std::strtoll(t.text.c_str(), nullptr, 10);
                    if (errno == ERANGE) fail(t.pos, "integer literal out of range");
                    n->value = Value::integer(v);
                } else {
                    n->value = Value::number(std::strtod(t.text.c_str(), nullptr));
                }
                next();
                return n;
            }
            case K::String: {
                auto n = node(Node::Kind::Literal, t.pos);
                std::string s;
                while (peek().kind == K::String) s += next().text;  // 'a' 'b' is 'ab', as in Python
                n->value = Value::string(std::move(s));
                return n;
            }
            case K::Name: {
                auto n = node(Node::Kind::Name, t.pos);
                n->name = next().text;
                return n;
            }
            case K::Op: {
                if (t.text == "(") {
                    const size_t p = next().pos;
                    if (is_op(")")) {
                        next();
                        return node(Node::Kind::Tuple, p);
                    }
                    NodePtr e = sequence(false);
                    expect_op(")");
                    return e;
                }
                if (t.text == "[") {
                    auto n = node(Node::Kind::List, next().pos);
                    while (!is_op("]")) {
                        n->items.push_back(expression());
                        if (!is_op(",")) break;
                        next();
                    }
                    expect_op("]");
                    return n;
                }
                if (t.text == "{") {
                    auto n = node(Node::Kind::Dict, next().pos);
                    while (!is_op("}")) {
                        n->items.push_back(expression());
                        expect_op(":");
                        n->items.push_back(expression());
                        if (!is_op(",")) break;
                        next();
                    }
                    expect_op("}");
                    return n;
                }
                break;
            }
            default: break;
        }
        fail(t.pos, "expected an expression, found " + describe(t));
    }

    std::string src_;
    std::vector<Token> t_;
    size_t i_ = 0;
    int nest_ = 0;
};

} // namespace

Program parse(const std::string & source) { return Parser(lex(source)).run(); }

} // namespace rp::jinja
