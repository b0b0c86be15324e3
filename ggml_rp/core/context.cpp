#include "ggml_rp/core/context.h"

#include "base/error.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace rp {

void Context::FreeAligned::operator()(void * p) const { ::operator delete(p, std::align_val_t(64)); }

Tensor * Context::push() {
    Tensor & t = tensors_.emplace_back();
    t.id = static_cast<int32_t>(tensors_.size() - 1);
    return &t;
}

Tensor * Context::new_tensor(DType type, const int64_t ne[kMaxDims]) {
    for (int i = 0; i < kMaxDims; ++i)
        if (ne[i] < 1)
            throw Error("new_tensor: size ne[" + std::to_string(i) + "] = " + std::to_string(ne[i]) + " must be >= 1");
    dtype_row_bytes(type, ne[0]);  // throws for an unknown type or a partial block
    Tensor * t = push();
    t->type = type;
    for (int i = 0; i < kMaxDims; ++i) t->ne[i] = ne[i];
    set_contiguous_strides(t);
    return t;
}

Tensor * Context::new_tensor(DType type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    const int64_t ne[kMaxDims] = {ne0, ne1, ne2, ne3};
    return new_tensor(type, ne);
}

Tensor * Context::new_tensor_like(DType type, const Tensor * like) { return new_tensor(type, like->ne); }

Tensor * Context::new_view(Tensor * src, DType type, const int64_t ne[kMaxDims], const size_t nb[kMaxDims], size_t offs) {
    Tensor * root = src->view_src ? src->view_src : src;
    const size_t root_offs = (src->view_src ? src->view_offs : 0) + offs;
    Tensor shape;  // validated before anything is added to the arena
    shape.type = type;
    for (int i = 0; i < kMaxDims; ++i) {
        if (ne[i] < 1) throw Error("view of " + describe(src) + ": size ne[" + std::to_string(i) + "] must be >= 1");
        shape.ne[i] = ne[i];
        shape.nb[i] = nb[i];
    }
    const size_t avail = root->nbytes() + root->aux_bytes;
    if (root_offs + shape.nbytes() > avail)
        throw Error("view " + shape_str(&shape) + " at offset " + std::to_string(root_offs) + " reaches outside " +
                    describe(root) + " (" + std::to_string(avail) + " bytes)");
    Tensor * t = push();
    t->type = type;
    for (int i = 0; i < kMaxDims; ++i) { t->ne[i] = ne[i]; t->nb[i] = nb[i]; }
    t->op = Op::VIEW;
    t->src[0] = src;
    t->view_src = root;
    t->view_offs = root_offs;
    if (root->data) t->data = static_cast<char *>(root->data) + root_offs;
    return t;
}

void * Context::alloc_data(Tensor * t) {
    if (t->is_view()) throw Error("alloc_data: " + describe(t) + " is a view");
    const size_t n = t->nbytes() + t->aux_bytes;
    const size_t size = (n + 63) / 64 * 64;
    void * p = ::operator new(size == 0 ? 64 : size, std::align_val_t(64));
    std::memset(p, 0, size == 0 ? 64 : size);
    blocks_.emplace_back(p);
    t->data = p;
    return p;
}

Tensor * Context::find(const std::string & name) {
    for (Tensor & t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

} // namespace rp
