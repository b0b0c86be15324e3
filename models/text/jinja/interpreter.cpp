// Tree-walking interpreter. Scopes: a for loop, a macro call and a call block get a child scope; `set`
// writes the innermost scope, lookups walk outwards (the observable behaviour of Jinja and of llama.cpp,
// which copies the variables into each new scope). Errors from builtins get the node's line and column.
#include "models/text/jinja/jinja.h"

#include "base/error.h"
#include "models/text/jinja/ast.h"
#include "models/text/jinja/builtins.h"
#include "models/text/jinja/lexer.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>

namespace rp::jinja {

namespace {

struct Scope {
    std::shared_ptr<Scope> parent;
    Object vars;

    const Value * find(const std::string & k) const {
        for (const Scope * s = this; s; s = s->parent.get())
            if (const Value * v = s->vars.find(k)) return v;
        return nullptr;
    }
};
using ScopePtr = std::shared_ptr<Scope>;

struct LoopSignal {
    bool brk;
};

// Thrown by raise_exception(); carries the template's own message out unchanged.
struct Raised {
    std::string msg;
};

constexpr int kMaxDepth = 200;  // macro recursion and nesting; a template that goes deeper is refused
// Work limits: a chat template renders a few kilobytes in a few thousand steps; these bound what a hostile
// or broken template (or a fuzzer) can make us do, and are far above anything a real one needs.
constexpr int64_t kMaxSteps = int64_t(1) << 22;     // loop iterations and macro calls per render
constexpr size_t kMaxBytes = size_t(64) << 20;      // any string or the output

class Interp {
public:
    Interp(const Program & p, const std::tm & now) : p_(p), now_(now) {}

    void run(const Nodes & body, const ScopePtr & s, std::string & out) {
        for (const NodePtr & n : body) exec(*n, s, out);
    }

private:
    [[noreturn]] void fail(const Node & n, const std::string & msg) const { fail_at(p_.source, n.pos, msg); }

    void step(const Node & n, const std::string & out) {
        if (++steps_ > kMaxSteps) fail(n, "the template does too much work (more than " + std::to_string(kMaxSteps) + " loop iterations and macro calls)");
        if (out.size() > kMaxBytes) fail(n, "the rendering is longer than " + std::to_string(kMaxBytes) + " bytes");
    }
    Value checked(const Node & n, Value v) {
        if (v.is_string() && v.str().size() > kMaxBytes) fail(n, "a string longer than " + std::to_string(kMaxBytes) + " bytes");
        if (v.is_array() && v.arr().size() > kMaxBytes / 16) fail(n, "a list longer than " + std::to_string(kMaxBytes / 16) + " items");
        return v;
    }

    void exec(const Node & n, const ScopePtr & s, std::string & out) {
        switch (n.kind) {
            case Node::Kind::Text: out += n.name; return;
            case Node::Kind::Output: eval(*n.a, s).append_output(out); return;
            case Node::Kind::If:
                run(eval(*n.a, s).truthy() ? n.body : n.orelse, s, out);
                return;
            case Node::Kind::For: exec_for(n, s, out); return;
            case Node::Kind::Set: {
                Value v;
                if (n.b) {
                    v = eval(*n.b, s);
                } else {
                    std::string body;
                    run(n.body, s, body);
                    v = Value::string(std::move(body));
                }
                assign(*n.a, v, s);
                return;
            }
            case Node::Kind::Macro: s->vars.set(n.name, make_macro(n, s)); return;
            case Node::Kind::CallBlock: {
                const Node & call = *n.a;
                Value callee = eval(*call.a, s);
                CallArgs args = eval_args(call, s);
                args.kw.emplace_back("caller", make_macro(n, s));
                invoke(call, callee, args).append_output(out);
                return;
            }
            case Node::Kind::FilterBlock: {
                std::string body;
                run(n.body, s, body);
                CallArgs args = eval_args(*n.a, s);
                guarded(*n.a, [&] { return apply_filter(n.a->name, Value::string(body), args); }).append_output(out);
                return;
            }
            case Node::Kind::Break: throw LoopSignal{true};
            case Node::Kind::Continue: throw LoopSignal{false};
            default: eval(n, s).append_output(out); return;
        }
    }

    void exec_for(const Node & n, const ScopePtr & s, std::string & out) {
        const Value it = eval(*n.a, s);
        Array items;
        if (it.is_array()) items = it.arr();
        else if (it.is_object()) for (size_t k = 0; k < it.obj().items.size(); ++k) items.push_back(it.obj().key(k));
        else if (it.is_string()) for (char c : it.str()) items.push_back(Value::string(std::string(1, c)));
        else if (!it.is_undefined() && !it.is_none()) fail(*n.a, std::string("cannot iterate over ") + it.type_name());
        auto scope = std::make_shared<Scope>();
        scope->parent = s;
        auto bind = [&](const Value & item) {
            if (n.targets.size() == 1) {
                scope->vars.set(n.targets[0], item);
                return;
            }
            if (!item.is_array()) fail(n, std::string("cannot unpack ") + item.type_name() + " into loop variables");
            if (item.arr().size() != n.targets.size()) fail(n, "wrong number of values to unpack in a for loop");
            for (size_t k = 0; k < n.targets.size(); ++k) scope->vars.set(n.targets[k], item.arr()[k]);
        };
        if (n.b) {  // `for x in xs if cond`: filter first, so loop.* count the kept items
            Array kept;
            for (const Value & item : items) {
                bind(item);
                if (eval(*n.b, scope).truthy()) kept.push_back(item);
            }
            items = std::move(kept);
        }
        const int64_t len = static_cast<int64_t>(items.size());
        for (int64_t i = 0; i < len; ++i) {
            Value loop = Value::object();
            Object & o = loop.obj();
            o.set("index", Value::integer(i + 1));
            o.set("index0", Value::integer(i));
            o.set("revindex", Value::integer(len - i));
            o.set("revindex0", Value::integer(len - i - 1));
            o.set("first", Value::boolean(i == 0));
            o.set("last", Value::boolean(i == len - 1));
            o.set("length", Value::integer(len));
            o.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value());
            o.set("nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value());
            scope->vars.set("loop", loop);
            bind(items[static_cast<size_t>(i)]);
            step(n, out);
            try {
                run(n.body, scope, out);
            } catch (const LoopSignal & sig) {
                if (sig.brk) break;
            }
        }
        if (len == 0) run(n.orelse, s, out);
    }

    void assign(const Node & target, const Value & v, const ScopePtr & s) {
        if (target.kind == Node::Kind::Name) {
            s->vars.set(target.name, v);
        } else if (target.kind == Node::Kind::Attr) {
            const Value obj = eval(*target.a, s);
            if (!obj.is_object()) fail(target, std::string("cannot set an attribute of ") + obj.type_name());
            if (contains(v, obj)) fail(target, "cannot store an object inside itself");
            obj.obj().set(target.name, v);
        } else {
            if (!v.is_array() || v.arr().size() != target.items.size())
                fail(target, "wrong number of values to unpack in set");
            for (size_t k = 0; k < target.items.size(); ++k) {
                if (target.items[k]->kind != Node::Kind::Name) fail(*target.items[k], "cannot assign to this expression");
                s->vars.set(target.items[k]->name, v.arr()[k]);
            }
        }
    }

    Value make_macro(const Node & n, const ScopePtr & defined_in) {
        const Node * node = &n;
        // A weak reference: the scope holds the macro, so a strong one would be a cycle (a leak).
        std::weak_ptr<Scope> weak = defined_in;
        return Value::function(n.name, [this, node, weak](CallArgs & args) {
            const ScopePtr home = weak.lock();
            if (!home) fail(*node, "macro called after the scope it was defined in has ended");
            if (++depth_ > kMaxDepth) fail(*node, "macro recursion deeper than " + std::to_string(kMaxDepth));
            step(*node, std::string());
            auto scope = std::make_shared<Scope>();
            scope->parent = home;
            for (size_t k = 0; k < node->params.size(); ++k) {
                const Node & p = *node->params[k];
                Value v = args.get(k, p.name.c_str());
                if (v.is_undefined() && p.b) v = eval(*p.b, scope);
                scope->vars.set(p.name, v);
            }
            for (const auto & kv : args.kw)
                if (kv.first == "caller") scope->vars.set("caller", kv.second);
            std::string out;
            run(node->body, scope, out);
            --depth_;
            return Value::string(std::move(out));
        });
    }

    template <class F>
    Value guarded(const Node & n, F && f) {
        try {
            return f();
        } catch (const Raised &) {
            throw;
        } catch (const LoopSignal &) {
            throw;
        } catch (const Error & e) {
            const std::string what = e.what();
            if (what.rfind("jinja: line ", 0) == 0) throw;  // already placed (a macro's body)
            fail(n, what);
        }
    }

    CallArgs eval_args(const Node & n, const ScopePtr & s) {
        CallArgs a;
        for (const NodePtr & x : n.items) a.pos.push_back(eval(*x, s));
        for (const auto & kv : n.kwargs) a.kw.emplace_back(kv.first, eval(*kv.second, s));
        return a;
    }

    Value invoke(const Node & n, const Value & callee, CallArgs & args) {
        if (!callee.is_function()) fail(n, std::string("cannot call ") + callee.type_name() + (callee.is_undefined() ? " (an undefined name or attribute)" : ""));
        return guarded(n, [&] { return callee.fn()(args); });
    }

    Value global(const std::string & name) {
        if (name == "true" || name == "True") return Value::boolean(true);
        if (name == "false" || name == "False") return Value::boolean(false);
        if (name == "none" || name == "None") return Value::none();
        if (name == "raise_exception")
            return Value::function(name, [](CallArgs & a) -> Value { throw Raised{a.get(0, "message").to_str()}; });
        if (name == "namespace" || name == "dict")
            return Value::function(name, [](CallArgs & a) {
                Value o = Value::object();
                for (auto & kv : a.kw) o.obj().set(kv.first, kv.second);
                return o;
            });
        if (name == "strftime_now")
            return Value::function(name, [this](CallArgs & a) {
                const Value f = a.get(0, "format");
                if (!f.is_string()) throw Error("strftime_now() needs a format string");
                char buf[256];
                const size_t k = std::strftime(buf, sizeof buf, f.str().c_str(), &now_);
                if (k == 0 && !f.str().empty()) throw Error("strftime_now: cannot format '" + f.str() + "'");
                return Value::string(std::string(buf, k));
            });
        if (name == "range")
            return Value::function(name, [](CallArgs & a) {
                for (const Value & v : a.pos)
                    if (!v.is_int()) throw Error("range() needs integers");
                int64_t start = 0, stop = 0, step = 1;
                if (a.pos.size() == 1) stop = a.pos[0].as_int();
                else if (a.pos.size() >= 2) { start = a.pos[0].as_int(); stop = a.pos[1].as_int(); }
                if (a.pos.size() >= 3) step = a.pos[2].as_int();
                if (a.pos.empty() || a.pos.size() > 3 || step == 0) throw Error("range() needs 1 to 3 arguments and a non-zero step");
                Array out;
                for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
                    out.push_back(Value::integer(i));
                    if (out.size() > (1u << 22)) throw Error("range() too long");
                }
                return Value::array(std::move(out));
            });
        return Value();
    }

    Value eval(const Node & n, const ScopePtr & s) {
        switch (n.kind) {
            case Node::Kind::Literal: return n.value;
            case Node::Kind::Name: {
                if (const Value * v = s->find(n.name)) return *v;
                return global(n.name);
            }
            case Node::Kind::Attr: {
                const Value obj = eval(*n.a, s);
                // A method of the value's type wins over a key of the same name (Jinja's getattr, and
                // llama.cpp): `d.items` is the method even when d has an "items" key.
                Value m = bound_method(obj, n.name);
                if (!m.is_undefined()) return m;
                if (obj.is_object()) {
                    const Value * v = obj.obj().find(n.name);
                    return v ? *v : Value();
                }
                if (obj.is_array() && !n.name.empty() && n.name[0] >= '0' && n.name[0] <= '9') {
                    const size_t k = std::strtoull(n.name.c_str(), nullptr, 10);
                    return k < obj.arr().size() ? obj.arr()[k] : Value();
                }
                return Value();
            }
            case Node::Kind::Index: {
                const Value obj = eval(*n.a, s);
                const Value key = eval(*n.b, s);
                if (obj.is_object()) {
                    if (key.is_int() != obj.obj().int_keys || (!key.is_string() && !key.is_int())) return Value();
                    const Value * v = obj.obj().find(key.is_int() ? std::to_string(key.as_int()) : key.str());
                    return v ? *v : Value();
                }
                if (obj.is_array() && key.is_int()) {
                    int64_t k = key.as_int();
                    const int64_t len = static_cast<int64_t>(obj.arr().size());
                    if (k < 0) k += len;
                    return k >= 0 && k < len ? obj.arr()[static_cast<size_t>(k)] : Value();
                }
                if (obj.is_string() && key.is_int()) {
                    // llama.cpp: a byte; no negative indices on strings
                    const int64_t k = key.as_int();
                    return k >= 0 && k < static_cast<int64_t>(obj.str().size()) ? Value::string(obj.str().substr(static_cast<size_t>(k), 1)) : Value();
                }
                if (key.is_string()) return bound_method(obj, key.str());
                if (obj.is_undefined() || obj.is_none()) return Value();
                fail(n, std::string("cannot subscript ") + obj.type_name() + " with " + key.type_name());
            }
            case Node::Kind::Slice: return eval_slice(n, s);
            case Node::Kind::Call: {
                const Value callee = eval(*n.a, s);
                CallArgs args = eval_args(n, s);
                return checked(n, invoke(n, callee, args));
            }
            case Node::Kind::Filter: {
                const Value in = eval(*n.a, s);
                CallArgs args = eval_args(n, s);
                return checked(n, guarded(n, [&] { return apply_filter(n.name, in, args); }));
            }
            case Node::Kind::Test: {
                const Value in = eval(*n.a, s);
                CallArgs args = eval_args(n, s);
                const bool r = guarded(n, [&] { return Value::boolean(apply_test(n.name, in, args)); }).as_bool();
                return Value::boolean(r != n.negate);
            }
            case Node::Kind::Not: return Value::boolean(!eval(*n.a, s).truthy());
            case Node::Kind::Neg: {
                const Value v = eval(*n.a, s);
                if (v.is_int()) return Value::integer(-v.as_int());
                if (v.is_float()) return Value::number(-v.as_float());
                fail(n, std::string("unary '-' on ") + v.type_name());
            }
            case Node::Kind::Binary: return checked(n, eval_binary(n, s));
            case Node::Kind::Cond:
                if (eval(*n.b, s).truthy()) return eval(*n.a, s);
                return n.c ? eval(*n.c, s) : Value();
            case Node::Kind::List:
            case Node::Kind::Tuple: {
                Array a;
                for (const NodePtr & x : n.items) a.push_back(eval(*x, s));
                return Value::array(std::move(a));
            }
            case Node::Kind::Dict: {
                Value o = Value::object();
                for (size_t k = 0; k + 1 < n.items.size(); k += 2) {
                    const Value key = eval(*n.items[k], s);
                    if (!key.is_string() && !key.is_int()) fail(*n.items[k], "unsupported: a dict key that is neither a string nor an integer");
                    if (k > 0 && key.is_int() != o.obj().int_keys) fail(*n.items[k], "unsupported: a dict with both string and integer keys");
                    o.obj().int_keys = key.is_int();
                    o.obj().set(key.is_int() ? std::to_string(key.as_int()) : key.str(), eval(*n.items[k + 1], s));
                }
                return o;
            }
            default: fail(n, "a statement used as an expression");
        }
    }

    Value eval_slice(const Node & n, const ScopePtr & s) {
        const Value obj = eval(*n.a, s);
        auto opt = [&](const NodePtr & x) -> std::optional<int64_t> {
            if (!x) return std::nullopt;
            const Value v = eval(*x, s);
            if (v.is_none() || v.is_undefined()) return std::nullopt;
            if (!v.is_int()) fail(*x, std::string("slice index must be an integer, got ") + v.type_name());
            return v.as_int();
        };
        const auto b = opt(n.b), e = opt(n.c), st = opt(n.d);
        const int64_t step = st.value_or(1);
        if (step == 0) fail(n, "slice step cannot be zero");
        int64_t len;
        if (obj.is_array()) len = static_cast<int64_t>(obj.arr().size());
        else if (obj.is_string()) len = static_cast<int64_t>(obj.str().size());
        else fail(n, std::string("cannot slice ") + obj.type_name());
        // Python's slice.indices()
        auto clampi = [&](std::optional<int64_t> v, int64_t dflt, int64_t lo, int64_t hi) {
            if (!v) return dflt;
            int64_t x = *v < 0 ? *v + len : *v;
            return x < lo ? lo : x > hi ? hi : x;
        };
        const int64_t start = step > 0 ? clampi(b, 0, 0, len) : clampi(b, len - 1, -1, len - 1);
        const int64_t stop = step > 0 ? clampi(e, len, 0, len) : clampi(e, -1, -1, len - 1);
        Array out;
        std::string str;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (obj.is_array()) out.push_back(obj.arr()[static_cast<size_t>(i)]);
            else str += obj.str()[static_cast<size_t>(i)];
        }
        return obj.is_array() ? Value::array(std::move(out)) : Value::string(std::move(str));
    }

    Value eval_binary(const Node & n, const ScopePtr & s) {
        const std::string & op = n.op;
        if (op == "and") {
            Value l = eval(*n.a, s);
            return l.truthy() ? eval(*n.b, s) : l;
        }
        if (op == "or") {
            Value l = eval(*n.a, s);
            return l.truthy() ? l : eval(*n.b, s);
        }
        const Value l = eval(*n.a, s), r = eval(*n.b, s);
        if (op == "==") return Value::boolean(equal(l, r));
        if (op == "!=") return Value::boolean(!equal(l, r));
        if (op == "in" || op == "not in") {
            bool found = false;
            if (r.is_undefined() || r.is_none()) found = false;
            else if (r.is_array()) for (const Value & x : r.arr()) found = found || equal(x, l);
            else if (r.is_string()) {
                if (!l.is_string()) fail(n, std::string("'in <string>' needs a string on the left, got ") + l.type_name());
                found = r.str().find(l.str()) != std::string::npos;
            } else if (r.is_object()) found = has_key(r.obj(), l);
            else fail(n, std::string("'in' needs a container on the right, got ") + r.type_name());
            return Value::boolean(found == (op == "in"));
        }
        // llama.cpp: `+` and `~` join a string with none / undefined as if it were "".
        const bool l_null = l.is_none() || l.is_undefined(), r_null = r.is_none() || r.is_undefined();
        if ((op == "+" || op == "~") && ((l_null && r.is_string()) || (r_null && l.is_string())))
            return Value::string((l_null ? std::string() : l.str()) + (r_null ? std::string() : r.str()));
        if (l_null || r_null) fail(n, "operator '" + op + "' on " + l.type_name() + " and " + r.type_name());
        if (l.is_number() && r.is_number()) {
            const bool flt = l.is_float() || r.is_float();
            const double a = l.as_float(), b = r.as_float();
            if (op == "+" || op == "-" || op == "*" || op == "~") {
                if (!flt) {
                    const int64_t x = l.as_int(), y = r.as_int();
                    int64_t res;
                    const bool ovf = op == "*" ? __builtin_mul_overflow(x, y, &res)
                                     : op == "-" ? __builtin_sub_overflow(x, y, &res) : __builtin_add_overflow(x, y, &res);
                    if (ovf) fail(n, "integer overflow");
                    return Value::integer(res);
                }
                return Value::number(op == "*" ? a * b : op == "-" ? a - b : a + b);
            }
            if (op == "/") return Value::number(a / b);
            if (op == "%") {
                if (!flt) {
                    if (r.as_int() == 0) fail(n, "modulo by zero");
                    if (l.as_int() == INT64_MIN && r.as_int() == -1) return Value::integer(0);
                    return Value::integer(l.as_int() % r.as_int());
                }
                return Value::number(std::fmod(a, b));
            }
            if (op == "<") return Value::boolean(a < b);
            if (op == ">") return Value::boolean(a > b);
            if (op == "<=") return Value::boolean(a <= b);
            if (op == ">=") return Value::boolean(a >= b);
        }
        if (l.is_array() && r.is_array() && op == "+") {
            Array a = l.arr();
            a.insert(a.end(), r.arr().begin(), r.arr().end());
            return Value::array(std::move(a));
        }
        if ((l.is_string() || r.is_string()) && (op == "+" || op == "~"))
            return Value::string(l.to_str() + r.to_str());
        if (op == "*" && ((l.is_string() && r.is_int()) || (l.is_int() && r.is_string()))) {
            const std::string & str = l.is_string() ? l.str() : r.str();
            const int64_t k = l.is_int() ? l.as_int() : r.as_int();
            if (k > 0 && str.size() * static_cast<size_t>(k) > (64u << 20)) fail(n, "string repetition too long");
            std::string out;
            for (int64_t i = 0; i < k; ++i) out += str;
            return Value::string(out);
        }
        if (l.is_string() && r.is_string()) {
            const int c = l.str().compare(r.str());
            if (op == "<") return Value::boolean(c < 0);
            if (op == ">") return Value::boolean(c > 0);
            if (op == "<=") return Value::boolean(c <= 0);
            if (op == ">=") return Value::boolean(c >= 0);
        }
        fail(n, "unsupported operator '" + op + "' between " + l.type_name() + " and " + r.type_name());
    }

    const Program & p_;
    std::tm now_;
    int depth_ = 0;
    int64_t steps_ = 0;
};

} // namespace

Template::Template(const std::string & source) : prog_(std::make_unique<Program>(parse(source))) {}
Template::~Template() = default;
Template::Template(Template &&) noexcept = default;
Template & Template::operator=(Template &&) noexcept = default;

std::string Template::render(const Value & vars, const std::tm & now) const {
    auto root = std::make_shared<Scope>();
    if (vars.is_object()) root->vars = vars.obj();
    std::string out;
    Interp in(*prog_, now);
    try {
        in.run(prog_->body, root, out);
    } catch (const Raised & r) {
        throw Error("chat template raised an exception: " + r.msg);
    } catch (const LoopSignal &) {
        throw Error("jinja: {% break %} or {% continue %} outside a for loop");
    }
    return out;
}

} // namespace rp::jinja
