// Context: the arena that owns Tensor structs (and, on request, host memory for leaf data).
// Tensors live as long as their Context and never move (pointers stay valid). Graph nodes get their memory
// from the graph allocator, not from here; a Context never guesses sizes up front.
#pragma once

#include "ggml_rp/core/tensor.h"

#include <cstddef>
#include <deque>
#include <memory>

namespace rp {

class Context {
public:
    Context() = default;
    Context(const Context &) = delete;
    Context & operator=(const Context &) = delete;

    // A new contiguous leaf (op NONE, no data). Sizes must be >= 1; ne[0] a multiple of the block size.
    Tensor * new_tensor(DType type, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, int64_t ne3 = 1);
    Tensor * new_tensor(DType type, const int64_t ne[kMaxDims]);
    // A new contiguous tensor with the shape of `like` (type given).
    Tensor * new_tensor_like(DType type, const Tensor * like);
    // A view of `src` (its root memory at root offset `offs`) with the given shape and strides. Op VIEW,
    // src[0] = src. Throws when the view reaches outside src's bytes.
    Tensor * new_view(Tensor * src, DType type, const int64_t ne[kMaxDims], const size_t nb[kMaxDims], size_t offs);

    // Gives t zero-filled host memory owned by this context (64-byte aligned). Returns t->data.
    void * alloc_data(Tensor * t);

    size_t n_tensors() const { return tensors_.size(); }
    Tensor * tensor(size_t i) { return &tensors_[i]; }
    // The first tensor with that name, or nullptr.
    Tensor * find(const std::string & name);

private:
    Tensor * push();

    struct FreeAligned { void operator()(void * p) const; };
    std::deque<Tensor> tensors_;
    std::deque<std::unique_ptr<void, FreeAligned>> blocks_;
};

// Sets the name and returns t (for chaining: `auto * h = set_name(rp::add(ctx, a, b), "h")`).
inline Tensor * set_name(Tensor * t, std::string name) { t->name = std::move(name); return t; }

} // namespace rp
