#include "ggml_rp/ops/view.h"

#include "ggml_rp/ops/autodiff.h"
#include "ggml_rp/ops/copy.h"
#include "ggml_rp/ops/binary.h"
#include "ggml_rp/ops/op_util.h"

namespace rp {

namespace {

enum ViewKind : int32_t { kReshape = 0, kPermute = 1, kWindow = 2, kAfter = 3, kAux = 4 };

Tensor * make_view(Context & ctx, Tensor * x, const int64_t ne[4], const size_t nb[4], size_t offs, ViewKind kind) {
    Tensor * v = ctx.new_view(x, x->type, ne, nb, offs);
    v->set_param_i32(0, kind);
    return v;
}

} // namespace

Tensor * reshape(Context & ctx, Tensor * x, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    detail::require(ne0 >= 1 && ne1 >= 1 && ne2 >= 1 && ne3 >= 1 && ne0 * ne1 * ne2 * ne3 == x->nelements(), "reshape",
                    describe(x) + " cannot be reshaped to [" + std::to_string(ne0) + ", " + std::to_string(ne1) + ", " +
                        std::to_string(ne2) + ", " + std::to_string(ne3) + "]");
    detail::require(x->is_contiguous(), "reshape", describe(x) + " is not contiguous (cont() it first)");
    Tensor tmp;
    tmp.type = x->type;
    for (int i = 0; i < 4; ++i) tmp.ne[i] = ne[i];
    set_contiguous_strides(&tmp);
    return make_view(ctx, x, ne, tmp.nb, 0, kReshape);
}

Tensor * view(Context & ctx, Tensor * x, const int64_t ne[4], const size_t nb[4], size_t offset) {
    Tensor * v = make_view(ctx, x, ne, nb, offset, kWindow);
    v->set_param_i32(1, static_cast<int32_t>(offset & 0xffffffffu));
    v->set_param_i32(2, static_cast<int32_t>(static_cast<uint64_t>(offset) >> 32));
    return v;
}

Tensor * permute(Context & ctx, Tensor * x, int a0, int a1, int a2, int a3) {
    const int a[4] = {a0, a1, a2, a3};
    bool seen[4] = {false, false, false, false};
    for (int i = 0; i < 4; ++i) {
        detail::require(a[i] >= 0 && a[i] < 4 && !seen[a[i]], "permute",
                        "axes (" + std::to_string(a0) + ", " + std::to_string(a1) + ", " + std::to_string(a2) + ", " +
                            std::to_string(a3) + ") are not a permutation of 0..3 (tensor " + describe(x) + ")");
        seen[a[i]] = true;
    }
    detail::require(!dtype_is_quantized(x->type) || a[0] == 0, "permute", "cannot move axis 0 of quantized " + describe(x));
    int64_t ne[4];
    size_t nb[4];
    for (int i = 0; i < 4; ++i) { ne[a[i]] = x->ne[i]; nb[a[i]] = x->nb[i]; }
    Tensor * v = make_view(ctx, x, ne, nb, 0, kPermute);
    for (int i = 0; i < 4; ++i) v->set_param_i32(1 + i, a[i]);
    return v;
}

Tensor * transpose(Context & ctx, Tensor * x) { return permute(ctx, x, 1, 0, 2, 3); }

void move_window(Tensor * v, size_t offset, int64_t rows) {
    detail::require(v->view_src != nullptr, "move_window", describe(v) + " is not a view");
    Tensor moved = *v;
    moved.view_offs = offset;
    if (rows >= 0) {
        detail::require(rows >= 1, "move_window", describe(v) + ": " + std::to_string(rows) + " rows");
        moved.ne[2] = rows;
        if (moved.ne[3] == 1) moved.nb[3] = moved.nb[2] * static_cast<size_t>(rows);
    }
    const Tensor * root = v->view_src;
    const size_t avail = root->nbytes() + root->aux_bytes;
    detail::require(offset + moved.nbytes() <= avail, "move_window",
                    describe(v) + " moved to offset " + std::to_string(offset) + " with " + shape_str(&moved) +
                        " reaches outside " + describe(root) + " (" + std::to_string(avail) + " bytes)");
    v->view_offs = moved.view_offs;
    for (int i = 0; i < kMaxDims; ++i) v->ne[i] = moved.ne[i], v->nb[i] = moved.nb[i];
}

Tensor * after(Context & ctx, Tensor * x, Tensor * dep) {
    Tensor * v = make_view(ctx, x, x->ne, x->nb, 0, kAfter);
    v->src[1] = dep;
    return v;
}

Tensor * aux_view(Context & ctx, Tensor * x, const int64_t ne[4], size_t aux_offset) {
    Tensor tmp;
    for (int i = 0; i < 4; ++i) tmp.ne[i] = ne[i];
    set_contiguous_strides(&tmp);
    detail::require(!x->is_view() && aux_offset + tmp.nbytes() <= x->aux_bytes, "aux_view",
                    shape_str(&tmp) + " at +" + std::to_string(aux_offset) + " is outside the aux bytes of " + describe(x));
    return make_view(ctx, x, ne, tmp.nb, x->nbytes() + aux_offset, kAux);
}

namespace rules {

void backward_view(Backward & b, Tensor * node) {
    Tensor * x = node->src[0];
    if (!b.needs(x)) return;
    Tensor * dy = b.grad(node);
    Context & ctx = b.ctx;
    switch (node->param_i32(0)) {
    case kReshape: {
        // A gradient the reshape owns is read by nothing after this rule: x may own its reshaped view (so that x's rule
        // may add into it, or overwrite it, in place). Else the view is handed on unowned.
        const bool owned = b.owns_grad(node) && dy->is_contiguous();
        Tensor * g = reshape(ctx, dy->is_contiguous() ? dy : cont(ctx, dy), x->ne[0], x->ne[1], x->ne[2], x->ne[3]);
        if (owned) b.set_own(x, g);
        else b.add(x, g);
        return;
    }
    case kPermute: {
        int inv[4];
        for (int i = 0; i < 4; ++i) inv[node->param_i32(1 + i)] = i;
        b.add(x, permute(ctx, dy, inv[0], inv[1], inv[2], inv[3]));
        return;
    }
    case kAfter:
        b.add(x, dy);
        return;
    case kAux:
        return;  // a second output (statistics saved for a backward): not differentiable
    case kWindow: {
        // The gradient of a window is zero outside it: dy is added into an x-shaped buffer at the same place (the
        // window's strides index it as they index x, which must be contiguous). The other windows of x (a split's
        // other parts) add into the same buffer (Backward::add_part).
        detail::require(x->is_contiguous() && x->type == DType::F32, "view backward",
                        "the source " + describe(x) + " of a window must be contiguous f32");
        const uint64_t offs = static_cast<uint32_t>(node->param_i32(1)) | (static_cast<uint64_t>(static_cast<uint32_t>(node->param_i32(2))) << 32);
        b.add_part(x, dy, [&ctx, node, dy, offs](Tensor * into) {
            return add_inplace(ctx, view(ctx, into, node->ne, node->nb, offs), dy);
        });
        return;
    }
    default:
        detail::op_error("view backward", "unknown view kind of " + describe(node));
    }
}

} // namespace rules

} // namespace rp
