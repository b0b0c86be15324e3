// Typed metadata accessors of gguf::Reader. Integers convert between widths and signedness when the value
// fits (llama.cpp writes counts as u32, the spec says u64); every failure names the file, the key and both
// types.
#include "gguf/gguf.h"
#include "gguf/value.h"

#include <cstdint>
#include <cstdio>
#include <limits>

namespace gguf {

namespace {

[[noreturn]] void fail_key(const Reader & r, std::string_view key, const std::string & msg) {
    throw rp::Error(r.path() + ": key '" + std::string(key) + "' " + msg);
}

const KV & require(const Reader & r, std::string_view key) {
    const KV * kv = r.find(key);
    if (!kv) fail_key(r, key, "is missing");
    return *kv;
}

[[noreturn]] void wrong_type(const Reader & r, const KV & kv, const char * expected) {
    fail_key(r, kv.key, "has type " + kv_type_name(kv) + ", expected " + expected);
}

std::string int_text(const IntValue & v) {
    char buf[32];   // snprintf, not "-" + std::string: g++ 12 warns falsely (-Wrestrict) on the latter
    std::snprintf(buf, sizeof buf, "%s%llu", v.negative ? "-" : "", static_cast<unsigned long long>(v.magnitude));
    return buf;
}

IntValue scalar_int(const Reader & r, const KV & kv, const char * expected) {
    if (!value_type_is_integer(kv.type)) wrong_type(r, kv, expected);
    return read_int(kv.type, kv.data.data(), 0);
}

[[noreturn]] void out_of_range(const Reader & r, const KV & kv, const IntValue & v, const char * target) {
    fail_key(r, kv.key, "value " + int_text(v) + " (" + kv_type_name(kv) + ") does not fit " + target);
}

uint32_t to_u32(const Reader & r, const KV & kv) {
    const IntValue v = scalar_int(r, kv, "an integer (u32)");
    if (v.negative || v.magnitude > std::numeric_limits<uint32_t>::max()) out_of_range(r, kv, v, "u32");
    return static_cast<uint32_t>(v.magnitude);
}

float to_f32(const Reader & r, const KV & kv) {
    if (kv.type != ValueType::F32 && kv.type != ValueType::F64) wrong_type(r, kv, "f32 or f64");
    return static_cast<float>(read_float(kv.type, kv.data.data(), 0));
}

bool to_bool(const Reader & r, const KV & kv) {
    if (kv.type != ValueType::BOOL) wrong_type(r, kv, "bool");
    return kv.data[0] != 0;
}

const std::string & to_string(const Reader & r, const KV & kv) {
    if (kv.type != ValueType::STRING) wrong_type(r, kv, "string");
    return kv.strs[0];
}

} // namespace

uint64_t Reader::get_u64(std::string_view key) const {
    const KV & kv = require(*this, key);
    const IntValue v = scalar_int(*this, kv, "an integer (u64)");
    if (v.negative) out_of_range(*this, kv, v, "u64");
    return v.magnitude;
}

uint32_t Reader::get_u32(std::string_view key) const { return to_u32(*this, require(*this, key)); }

int64_t Reader::get_i64(std::string_view key) const {
    const KV & kv = require(*this, key);
    const IntValue v = scalar_int(*this, kv, "an integer (i64)");
    if (!v.negative && v.magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        out_of_range(*this, kv, v, "i64");
    return v.as_signed();
}

float Reader::get_f32(std::string_view key) const { return to_f32(*this, require(*this, key)); }
bool Reader::get_bool(std::string_view key) const { return to_bool(*this, require(*this, key)); }
const std::string & Reader::get_string(std::string_view key) const { return to_string(*this, require(*this, key)); }

uint32_t Reader::get_u32_or(std::string_view key, uint32_t dflt) const {
    const KV * kv = find(key);
    return kv ? to_u32(*this, *kv) : dflt;
}

float Reader::get_f32_or(std::string_view key, float dflt) const {
    const KV * kv = find(key);
    return kv ? to_f32(*this, *kv) : dflt;
}

bool Reader::get_bool_or(std::string_view key, bool dflt) const {
    const KV * kv = find(key);
    return kv ? to_bool(*this, *kv) : dflt;
}

std::string Reader::get_string_or(std::string_view key, const std::string & dflt) const {
    const KV * kv = find(key);
    return kv ? to_string(*this, *kv) : dflt;
}

const std::vector<std::string> & Reader::get_string_array(std::string_view key) const {
    const KV & kv = require(*this, key);
    if (kv.type != ValueType::ARRAY || kv.arr_type != ValueType::STRING) wrong_type(*this, kv, "array[string]");
    return kv.strs;
}

std::vector<float> Reader::get_f32_array(std::string_view key) const {
    const KV & kv = require(*this, key);
    if (kv.type != ValueType::ARRAY || (kv.arr_type != ValueType::F32 && kv.arr_type != ValueType::F64))
        wrong_type(*this, kv, "array[f32] or array[f64]");
    std::vector<float> out(static_cast<size_t>(kv.count));
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(read_float(kv.arr_type, kv.data.data(), i));
    return out;
}

std::vector<int64_t> Reader::get_int_array(std::string_view key) const {
    const KV & kv = require(*this, key);
    if (kv.type != ValueType::ARRAY || !value_type_is_integer(kv.arr_type)) wrong_type(*this, kv, "an integer array");
    std::vector<int64_t> out(static_cast<size_t>(kv.count));
    for (size_t i = 0; i < out.size(); ++i) {
        const IntValue v = read_int(kv.arr_type, kv.data.data(), i);
        if (!v.negative && v.magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            fail_key(*this, kv.key, "element " + std::to_string(i) + " = " + int_text(v) + " does not fit i64");
        out[i] = v.as_signed();
    }
    return out;
}

} // namespace gguf
