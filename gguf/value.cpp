#include "gguf/value.h"

#include <cassert>

namespace gguf {

const char * value_type_name(ValueType t) {
    switch (t) {
        case ValueType::U8: return "u8";
        case ValueType::I8: return "i8";
        case ValueType::U16: return "u16";
        case ValueType::I16: return "i16";
        case ValueType::U32: return "u32";
        case ValueType::I32: return "i32";
        case ValueType::F32: return "f32";
        case ValueType::BOOL: return "bool";
        case ValueType::STRING: return "string";
        case ValueType::ARRAY: return "array";
        case ValueType::U64: return "u64";
        case ValueType::I64: return "i64";
        case ValueType::F64: return "f64";
    }
    return "invalid";
}

size_t value_type_size(ValueType t) {
    switch (t) {
        case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
        case ValueType::U16: case ValueType::I16: return 2;
        case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
        case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
        case ValueType::STRING: case ValueType::ARRAY: return 0;
    }
    return 0;
}

bool value_type_is_integer(ValueType t) {
    switch (t) {
        case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16:
        case ValueType::U32: case ValueType::I32: case ValueType::U64: case ValueType::I64:
            return true;
        default:
            return false;
    }
}

namespace {

template <typename T> T load(const uint8_t * data, size_t i) {
    T v;
    std::memcpy(&v, data + i * sizeof(T), sizeof(T));   // files are little-endian, and so are our hosts
    return v;
}

template <typename S> IntValue from_signed(S v) {
    IntValue r;
    const int64_t w = v;
    r.negative = w < 0;
    r.magnitude = r.negative ? 0 - static_cast<uint64_t>(w) : static_cast<uint64_t>(w);
    return r;
}

template <typename U> IntValue from_unsigned(U v) {
    IntValue r;
    r.magnitude = v;
    return r;
}

} // namespace

IntValue read_int(ValueType t, const uint8_t * data, size_t i) {
    switch (t) {
        case ValueType::U8: return from_unsigned(load<uint8_t>(data, i));
        case ValueType::I8: return from_signed(load<int8_t>(data, i));
        case ValueType::U16: return from_unsigned(load<uint16_t>(data, i));
        case ValueType::I16: return from_signed(load<int16_t>(data, i));
        case ValueType::U32: return from_unsigned(load<uint32_t>(data, i));
        case ValueType::I32: return from_signed(load<int32_t>(data, i));
        case ValueType::U64: return from_unsigned(load<uint64_t>(data, i));
        case ValueType::I64: return from_signed(load<int64_t>(data, i));
        default: assert(!"read_int: not an integer type"); return {};
    }
}

double read_float(ValueType t, const uint8_t * data, size_t i) {
    if (t == ValueType::F32) return load<float>(data, i);
    assert(t == ValueType::F64);
    return load<double>(data, i);
}

std::string kv_type_name(const KV & kv) {
    if (kv.type == ValueType::ARRAY) return std::string("array[") + value_type_name(kv.arr_type) + "]";
    return value_type_name(kv.type);
}

} // namespace gguf
