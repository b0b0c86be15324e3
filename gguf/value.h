// Metadata value types: byte sizes and decoding of one packed scalar. Shared by the reader's accessors,
// the writer and rp-gguf; no I/O here.
#pragma once

#include "gguf/gguf.h"

#include <cstdint>
#include <cstring>

namespace gguf {

// Bytes of one packed element of a fixed-size type; 0 for STRING and ARRAY (and invalid ids).
size_t value_type_size(ValueType t);

bool value_type_is_integer(ValueType t);

// One integer element, sign-aware, so every conversion can be range-checked exactly.
struct IntValue {
    bool negative = false;   // true only for signed types holding a value < 0
    uint64_t magnitude = 0;  // the value when !negative; -value when negative (may be 2^63)
    int64_t as_signed() const {
        return negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
    }
};

// Decodes element `i` of an integer-typed payload (little-endian, packed). `t` must be an integer type.
IntValue read_int(ValueType t, const uint8_t * data, size_t i);

// Decodes element `i` of an F32 or F64 payload as a double.
double read_float(ValueType t, const uint8_t * data, size_t i);

// The element type of a KV as a type name for messages: "u32", "string", "array[string]".
std::string kv_type_name(const KV & kv);

} // namespace gguf
