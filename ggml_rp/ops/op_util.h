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

// The node of a gradient op that can add in place (out_prod, out_prod_id, get_rows_back): with `into`, a view
// of it that adds the op's result to its contents (op param 0 = 1); else a fresh f32 node shaped `ne` (param 0
// = 0). `into` must be contiguous f32 of that shape. The caller sets the sources.
inline Tensor * accumulating_node(Context & ctx, Op op, Tensor * into, const int64_t ne[kMaxDims]) {
    if (!into) {
        Tensor * t = new_node(ctx, op, DType::F32, ne, {});
        t->set_param_i32(0, 0);
        return t;
    }
    bool same = true;
    for (int i = 0; i < kMaxDims; ++i) same = same && into->ne[i] == ne[i];
    require(into->type == DType::F32 && same && into->is_contiguous(), op_name(op),
            "into " + describe(into) + " must be contiguous f32 of the gradient's shape [" + std::to_string(ne[0]) + ", " +
                std::to_string(ne[1]) + ", " + std::to_string(ne[2]) + ", " + std::to_string(ne[3]) + "]");
    Tensor * t = ctx.new_view(into, DType::F32, into->ne, into->nb, 0);
    t->op = op;
    t->set_param_i32(0, 1);  // accumulate
    return t;
}

inline void require_f32(const char * op, const Tensor * t, const char * role) {
    if (!t) op_error(op, std::string(role) + " is null");
    if (t->type != DType::F32) op_error(op, std::string(role) + " " + describe(t) + " must be f32");
}

inline void require_same_shape(const char * op, const Tensor * a, const Tensor * b) {
    if (!same_shape(a, b)) op_error(op, "shapes differ: " + describe(a) + " vs " + describe(b));
}

} // namespace rp::detail
