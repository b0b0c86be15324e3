// Tensor: one struct for weights, activations, gradients and views (ggml's design).
//
// Layout: ne[0..3] are the sizes, ne[0] the contiguous (fastest) axis, exactly GGUF's order; nb[0..3] are
// byte strides. For a contiguous tensor nb[0] = type size, nb[1] = row bytes (whole blocks for quantized
// types), nb[i] = nb[i-1] * ne[i-1]. Element (i0, i1, i2, i3) of a plain type sits at
// data + i0*nb[0] + i1*nb[1] + i2*nb[2] + i3*nb[3]. Views, permutes and transposes change only ne/nb/offset.
//
// A tensor with op == Op::NONE is a leaf (weight, input, gradient buffer): its data belongs to the caller or
// to a Context. Any other tensor is a node of a lazy graph: `src` are its inputs, `op_params` its scalar
// arguments, and its data is assigned by the graph allocator. A view (view_src != nullptr) has no memory of
// its own: data = view_src->data + view_offs, where view_src is always the root (non-view) tensor.
#pragma once

#include "ggml_rp/core/dtype.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace rp {

constexpr int kMaxDims = 4;
constexpr int kMaxSrc = 10;  // DELTA_NET_BACK: q, k, v, g, beta, the optional state0 and seg_start, the chunk states, dout
constexpr int kMaxOpParams = 16;  // 32-bit words

// Every op, from the op list (core/ops.def: its rows say what each op computes and its shape rule).
enum class Op : uint8_t {
#define RP_OP(op, shape, backward, cuda) op,
#include "ggml_rp/core/ops.def"
#undef RP_OP
    COUNT,
};

// The op's name ("MUL_MAT"); "?" out of range.
const char * op_name(Op op);

enum TensorFlag : uint32_t {
    kFlagInput = 1u << 0,   // set by the caller before compute
    kFlagOutput = 1u << 1,  // read by the caller after compute: the allocator never reuses its memory
    kFlagParam = 1u << 2,   // trainable: build_backward accumulates into its `grad`
    kFlagLoss = 1u << 3,    // the scalar that build_backward differentiates
};

struct Tensor {
    DType type = DType::F32;
    int64_t ne[kMaxDims] = {1, 1, 1, 1};
    size_t nb[kMaxDims] = {0, 0, 0, 0};

    Op op = Op::NONE;
    int32_t op_params[kMaxOpParams] = {};
    Tensor * src[kMaxSrc] = {};
    uint32_t flags = 0;

    Tensor * grad = nullptr;      // params: the persistent f32 gradient buffer (accumulated into)
    Tensor * view_src = nullptr;  // root tensor whose memory this view uses
    size_t view_offs = 0;         // byte offset into view_src
    size_t aux_bytes = 0;         // extra bytes after the tensor's own data that the op also writes
                                  // (second outputs such as attention's logsumexp; read through views)
    void * data = nullptr;

    int32_t id = -1;              // index in its Context, for dumps and messages
    std::string name;

    int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t nrows() const { return ne[1] * ne[2] * ne[3]; }
    // Bytes spanned by the tensor's elements (for a contiguous tensor: its size).
    size_t nbytes() const;
    bool is_leaf() const { return op == Op::NONE; }
    bool is_view() const { return view_src != nullptr; }
    bool has_flag(uint32_t f) const { return (flags & f) != 0; }
    // Rows packed back to back in ggml order (no gaps, no permutation).
    bool is_contiguous() const;
    // Elements of a row are adjacent (nb[0] == type size); rows may be anywhere.
    bool rows_contiguous() const;

    float param_f32(int i) const { float v; std::memcpy(&v, &op_params[i], sizeof v); return v; }
    int32_t param_i32(int i) const { return op_params[i]; }
    void set_param_f32(int i, float v) { std::memcpy(&op_params[i], &v, sizeof v); }
    void set_param_i32(int i, int32_t v) { op_params[i] = v; }

    template <typename T> T * data_as() const { return static_cast<T *>(data); }
};

// "[4, 3, 1, 1]"
std::string shape_str(const Tensor * t);
// "'name' f32 [4, 3, 1, 1]" (or "#id" when unnamed), for error messages.
std::string describe(const Tensor * t);
// The name, or "<op>#<id>" when unnamed.
std::string display_name(const Tensor * t);

bool same_shape(const Tensor * a, const Tensor * b);
// b can be broadcast over a: every b.ne[i] divides a.ne[i].
bool can_repeat(const Tensor * b, const Tensor * a);

// Sets contiguous strides for t's type and ne.
void set_contiguous_strides(Tensor * t);

// Host data access (CPU backend, tests, tools). Elements are in logical order (i0 fastest) and may be read
// from any strided float tensor or any dequantizable weight type; writes need a contiguous tensor (f32,
// f16, bf16 or a quantizable block type) with data. Throw rp::Error naming the tensor.
std::vector<float> tensor_get_f32(const Tensor * t);
void tensor_set_f32(Tensor * t, const float * values, int64_t n);
inline void tensor_set_f32(Tensor * t, const std::vector<float> & v) { tensor_set_f32(t, v.data(), (int64_t) v.size()); }
std::vector<int32_t> tensor_get_i32(const Tensor * t);
void tensor_set_i32(Tensor * t, const int32_t * values, int64_t n);
inline void tensor_set_i32(Tensor * t, const std::vector<int32_t> & v) { tensor_set_i32(t, v.data(), (int64_t) v.size()); }

} // namespace rp
