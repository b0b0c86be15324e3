// Helpers shared by the op builders (internal header): node creation and the checks that turn a bad shape
// or type into an rp::Error naming the op and the shapes.
#pragma once

#include "ggml_rp/core/context.h"
#include "base/error.h"

#include <initializer_list>
#include <string>

namespace rp::detail {

// A new contiguous node of the given op, type and shape, with sources in slot order.
inline Tensor * new_node(Context & ctx, Op op, DType type, const int64_t ne[kMaxDims], std::initializer_list<Tensor *> srcs) {
    Tensor * t = ctx.new_tensor(type, ne);
    t->op = op;
    int i = 0;
    for (Tensor * s : srcs) t->src[i++] = s;
    return t;
}

[[noreturn]] inline void op_error(const char * op, const std::string & msg) { throw Error(std::string(op) + ": " + msg); }

inline void require(bool ok, const char * op, const std::string & msg) {
    if (!ok) op_error(op, msg);
}

inline void require_f32(const char * op, const Tensor * t, const char * role) {
    if (!t) op_error(op, std::string(role) + " is null");
    if (t->type != DType::F32) op_error(op, std::string(role) + " " + describe(t) + " must be f32");
}

inline void require_same_shape(const char * op, const Tensor * a, const Tensor * b) {
    if (!same_shape(a, b)) op_error(op, "shapes differ: " + describe(a) + " vs " + describe(b));
}

} // namespace rp::detail
