#include "ggml_rp/core/dtype.h"

#include "base/error.h"

#include <string>

namespace rp {

const gguf::TypeTraits & dtype_traits(DType t) {
    const gguf::TypeTraits * tt = gguf::type_traits(static_cast<uint32_t>(t));
    if (!tt) throw Error(std::string("unknown tensor type ") + gguf::type_name(static_cast<uint32_t>(t)));
    return *tt;
}

const char * dtype_name(DType t) { return gguf::type_name(static_cast<uint32_t>(t)); }

bool dtype_is_quantized(DType t) { return dtype_traits(t).block_size > 1; }

bool dtype_is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

size_t dtype_row_bytes(DType t, int64_t n) {
    const gguf::TypeTraits & tt = dtype_traits(t);
    if (n < 0 || n % tt.block_size != 0)
        throw Error(std::string("a row of ") + std::to_string(n) + " elements is not a whole number of " +
                    tt.name + " blocks of " + std::to_string(tt.block_size));
    return static_cast<size_t>(n / tt.block_size) * tt.type_size;
}

} // namespace rp
