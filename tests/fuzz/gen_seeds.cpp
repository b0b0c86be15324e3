// Writes a few small, valid GGUF files (every value type, several tensor types, alignment 64, a
// vocab-only file, an empty file) into a directory: seeds for fuzz_gguf_reader that fit in -max_len.
// Usage: fuzz_gguf_seeds DIR
#include "gguf/gguf.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

gguf::KV raw_kv(const std::string & key, gguf::ValueType t, const void * p, size_t n, gguf::ValueType elem = gguf::ValueType::U8,
                uint64_t count = 1) {
    gguf::KV kv;
    kv.key = key;
    kv.type = t;
    kv.arr_type = elem;
    kv.count = count;
    kv.data.assign(static_cast<const uint8_t *>(p), static_cast<const uint8_t *>(p) + n);
    return kv;
}

void every_value_type(gguf::Writer & w) {
    using gguf::ValueType;
    const uint8_t u8 = 7;
    const int8_t i8 = -7;
    const uint16_t u16 = 700;
    const int16_t i16 = -700;
    const int64_t i64 = -70000000000;
    const double f64 = 0.125;
    w.set_kv(raw_kv("s.u8", ValueType::U8, &u8, 1));
    w.set_kv(raw_kv("s.i8", ValueType::I8, &i8, 1));
    w.set_kv(raw_kv("s.u16", ValueType::U16, &u16, 2));
    w.set_kv(raw_kv("s.i16", ValueType::I16, &i16, 2));
    w.set_u32("s.u32", 70000);
    w.set_i32("s.i32", -70000);
    w.set_f32("s.f32", 1e-5f);
    w.set_bool("s.bool", true);
    w.set_string("s.string", "hello");
    w.set_u64("s.u64", 70000000000ull);
    w.set_kv(raw_kv("s.i64", ValueType::I64, &i64, 8));
    w.set_kv(raw_kv("s.f64", ValueType::F64, &f64, 8));
    w.set_string_array("a.string", {"<unk>", "<s>", "</s>", "", "a b"});
    w.set_f32_array("a.f32", {0.0f, -1.0f, 2.5f});
    w.set_i32_array("a.i32", {1, -2, 3});
    w.set_u32_array("a.u32", {});
    const uint8_t bools[3] = {0, 1, 1};
    w.set_kv(raw_kv("a.bool", ValueType::ARRAY, bools, 3, ValueType::BOOL, 3));
    const uint64_t u64s[2] = {1, ~0ull};
    w.set_kv(raw_kv("a.u64", ValueType::ARRAY, u64s, 16, ValueType::U64, 2));
    const double f64s[2] = {0.5, -0.25};
    w.set_kv(raw_kv("a.f64", ValueType::ARRAY, f64s, 16, ValueType::F64, 2));
}

void add(gguf::Writer & w, const char * name, gguf::TensorType t, std::vector<int64_t> ne) {
    w.add_tensor(name, t, static_cast<uint32_t>(ne.size()), ne.data(), [](uint8_t * dst, size_t n) {
        for (size_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(i * 37 + 11);
    });
}

} // namespace

int main(int argc, char ** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: fuzz_gguf_seeds DIR\n");
        return 1;
    }
    const std::string dir = argv[1];
    using gguf::TensorType;
    try {
        {
            gguf::Writer w;
            every_value_type(w);
            w.write(dir + "/seed-vocab-only.gguf");
        }
        {
            gguf::Writer w;
            w.set_string("general.architecture", "llama");
            w.set_u32("llama.block_count", 1);
            add(w, "token_embd.weight", TensorType::F32, {8, 4});
            add(w, "output_norm.weight", TensorType::F32, {8});
            add(w, "blk.0.attn_q.weight", TensorType::F16, {8, 8});
            add(w, "blk.0.ffn_up.weight", TensorType::Q8_0, {32, 2});
            add(w, "blk.0.ffn_down.weight", TensorType::Q4_0, {32, 1, 2});
            add(w, "blk.0.ffn_gate.weight", TensorType::BF16, {4, 1, 1, 2});
            w.write(dir + "/seed-model.gguf");
        }
        {
            gguf::Writer w(64);
            every_value_type(w);
            add(w, "a", TensorType::Q4_K, {256});
            add(w, "b", TensorType::Q6_K, {256});
            add(w, "c", TensorType::I32, {3, 0});
            w.write(dir + "/seed-align64.gguf");
        }
        {
            gguf::Writer w;
            w.write(dir + "/seed-empty.gguf");
        }
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
