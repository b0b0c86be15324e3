#include "ggml_rp/core/tensor.h"

#include "ggml_rp/core/fp16.h"
#include "ggml_rp/core/quant.h"
#include "base/error.h"

#include <algorithm>

namespace rp {

namespace {

const char * need_data(const Tensor * t, const char * what) {
    if (!t->data) throw Error(std::string(what) + ": tensor " + describe(t) + " has no data");
    return static_cast<const char *>(t->data);
}

} // namespace

size_t Tensor::nbytes() const {
    for (int i = 0; i < kMaxDims; ++i)
        if (ne[i] <= 0) return 0;
    const int64_t bs = dtype_block_size(type);
    size_t n = bs == 1 ? dtype_type_size(type) : static_cast<size_t>(ne[0] / bs) * nb[0];
    if (bs == 1) n += static_cast<size_t>(ne[0] - 1) * nb[0];
    for (int i = 1; i < kMaxDims; ++i) n += static_cast<size_t>(ne[i] - 1) * nb[i];
    return n;
}

bool Tensor::is_contiguous() const {
    if (ne[0] != 1 && nb[0] != dtype_type_size(type)) return false;
    size_t next = dtype_row_bytes(type, ne[0]);
    for (int i = 1; i < kMaxDims; ++i) {
        if (ne[i] != 1 && nb[i] != next) return false;
        next *= static_cast<size_t>(ne[i]);
    }
    return true;
}

bool Tensor::rows_contiguous() const { return ne[0] == 1 || nb[0] == dtype_type_size(type); }

// (Strings are built by appending: GCC 12 warns falsely (-Wrestrict) on "x" + std::string&&.)
std::string shape_str(const Tensor * t) {
    std::string s(1, '[');
    for (int i = 0; i < kMaxDims; ++i) {
        if (i) s += ", ";
        s += std::to_string(t->ne[i]);
    }
    s += ']';
    return s;
}

const char * op_name(Op op) {
    static constexpr const char * kNames[] = {
#define RP_OP(op, shape, backward, cuda) #op,
#include "ggml_rp/core/ops.def"
#undef RP_OP
    };
    static_assert(sizeof kNames / sizeof kNames[0] == static_cast<size_t>(Op::COUNT));
    const size_t i = static_cast<size_t>(op);
    return i < static_cast<size_t>(Op::COUNT) ? kNames[i] : "?";
}

std::string display_name(const Tensor * t) {
    if (!t->name.empty()) return t->name;
    std::string s = op_name(t->op);
    s += '#';
    s += std::to_string(t->id);
    return s;
}

std::string describe(const Tensor * t) {
    if (!t) return "(null)";
    std::string s(1, '\'');
    s += display_name(t);
    s += "' ";
    s += dtype_name(t->type);
    s += ' ';
    s += shape_str(t);
    return s;
}

bool same_shape(const Tensor * a, const Tensor * b) {
    for (int i = 0; i < kMaxDims; ++i)
        if (a->ne[i] != b->ne[i]) return false;
    return true;
}

bool can_repeat(const Tensor * b, const Tensor * a) {
    for (int i = 0; i < kMaxDims; ++i)
        if (b->ne[i] <= 0 || a->ne[i] % b->ne[i] != 0) return false;
    return true;
}

void set_contiguous_strides(Tensor * t) {
    t->nb[0] = dtype_type_size(t->type);
    t->nb[1] = dtype_row_bytes(t->type, t->ne[0]);
    for (int i = 2; i < kMaxDims; ++i) t->nb[i] = t->nb[i - 1] * static_cast<size_t>(t->ne[i - 1]);
}

std::vector<float> tensor_get_f32(const Tensor * t) {
    const char * base = need_data(t, "tensor_get_f32");
    std::vector<float> out(static_cast<size_t>(t->nelements()));
    const int64_t ne0 = t->ne[0];
    std::vector<float> row(static_cast<size_t>(ne0));
    size_t k = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < t->ne[2]; ++i2)
    for (int64_t i1 = 0; i1 < t->ne[1]; ++i1) {
        const char * r = base + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
        switch (t->type) {
        case DType::F32:
            for (int64_t i0 = 0; i0 < ne0; ++i0) { float v; std::memcpy(&v, r + i0 * t->nb[0], 4); out[k++] = v; }
            break;
        case DType::F16:
            for (int64_t i0 = 0; i0 < ne0; ++i0) { uint16_t h; std::memcpy(&h, r + i0 * t->nb[0], 2); out[k++] = fp16_to_fp32(h); }
            break;
        case DType::BF16:
            for (int64_t i0 = 0; i0 < ne0; ++i0) { uint16_t h; std::memcpy(&h, r + i0 * t->nb[0], 2); out[k++] = bf16_to_fp32(h); }
            break;
        default:
            if (!can_dequantize(t->type) || !t->rows_contiguous())
                throw Error("tensor_get_f32: cannot read " + describe(t) + " as floats");
            dequantize_row(t->type, r, row.data(), ne0);
            std::copy(row.begin(), row.end(), out.begin() + static_cast<ptrdiff_t>(k));
            k += static_cast<size_t>(ne0);
        }
    }
    return out;
}

void tensor_set_f32(Tensor * t, const float * values, int64_t n) {
    need_data(t, "tensor_set_f32");
    if (n != t->nelements())
        throw Error("tensor_set_f32: " + std::to_string(n) + " values for " + describe(t));
    if (!t->is_contiguous()) throw Error("tensor_set_f32: " + describe(t) + " is not contiguous");
    char * dst = static_cast<char *>(t->data);
    switch (t->type) {
    case DType::F32: std::memcpy(dst, values, static_cast<size_t>(n) * 4); break;
    case DType::F16:
        for (int64_t i = 0; i < n; ++i) { const uint16_t h = fp32_to_fp16(values[i]); std::memcpy(dst + 2 * i, &h, 2); }
        break;
    case DType::BF16:
        for (int64_t i = 0; i < n; ++i) { const uint16_t h = fp32_to_bf16(values[i]); std::memcpy(dst + 2 * i, &h, 2); }
        break;
    default: {
        if (!can_quantize(t->type)) throw Error("tensor_set_f32: cannot write floats into " + describe(t));
        const int64_t ne0 = t->ne[0];
        const size_t rb = dtype_row_bytes(t->type, ne0);
        for (int64_t r = 0; r < t->nrows(); ++r) quantize_row(t->type, values + r * ne0, dst + r * rb, ne0);
    }
    }
}

std::vector<int32_t> tensor_get_i32(const Tensor * t) {
    const char * base = need_data(t, "tensor_get_i32");
    if (t->type != DType::I32) throw Error("tensor_get_i32: " + describe(t) + " is not i32");
    std::vector<int32_t> out;
    out.reserve(static_cast<size_t>(t->nelements()));
    for (int64_t i3 = 0; i3 < t->ne[3]; ++i3)
    for (int64_t i2 = 0; i2 < t->ne[2]; ++i2)
    for (int64_t i1 = 0; i1 < t->ne[1]; ++i1)
    for (int64_t i0 = 0; i0 < t->ne[0]; ++i0) {
        int32_t v;
        std::memcpy(&v, base + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3], 4);
        out.push_back(v);
    }
    return out;
}

void tensor_set_i32(Tensor * t, const int32_t * values, int64_t n) {
    need_data(t, "tensor_set_i32");
    if (t->type != DType::I32 || !t->is_contiguous() || n != t->nelements())
        throw Error("tensor_set_i32: " + std::to_string(n) + " values for " + describe(t) +
                    " (needs a contiguous i32 tensor of that many elements)");
    std::memcpy(t->data, values, static_cast<size_t>(n) * 4);
}

} // namespace rp
