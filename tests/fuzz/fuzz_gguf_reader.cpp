// libFuzzer target: arbitrary bytes -> gguf::Reader::from_memory. The only acceptable failure is
// rp::Error; after a successful parse every accessor is called on every key and every tensor's byte range
// is read end to end, so ASan catches any range the reader let through that is not inside the input.
#include "gguf/gguf.h"

#include <cstddef>
#include <cstdint>

namespace {

template <typename Fn> void quietly(Fn fn) {
    try {
        fn();
    } catch (const rp::Error &) {
        // type mismatches and range errors are expected on random keys
    }
}

void touch_kv(const gguf::Reader & r, const gguf::KV & kv, volatile uint64_t & sink) {
    const std::string & k = kv.key;
    quietly([&] { sink = sink + r.get_u64(k); });
    quietly([&] { sink = sink + r.get_u32(k); });
    quietly([&] { sink = sink + static_cast<uint64_t>(r.get_i64(k)); });
    quietly([&] { sink = sink + static_cast<uint64_t>(r.get_f32(k) != 0); });
    quietly([&] { sink = sink + r.get_bool(k); });
    quietly([&] { sink = sink + r.get_string(k).size(); });
    quietly([&] { sink = sink + r.get_u32_or(k, 7); });
    quietly([&] { sink = sink + static_cast<uint64_t>(r.get_f32_or(k, 1.0f) != 0); });
    quietly([&] { sink = sink + r.get_bool_or(k, true); });
    quietly([&] { sink = sink + r.get_string_or(k, "x").size(); });
    quietly([&] {
        for (const std::string & s : r.get_string_array(k)) sink = sink + s.size();
    });
    quietly([&] {
        for (float f : r.get_f32_array(k)) sink = sink + static_cast<uint64_t>(f != 0);
    });
    quietly([&] {
        for (int64_t v : r.get_int_array(k)) sink = sink + static_cast<uint64_t>(v);
    });
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    volatile uint64_t sink = 0;
    try {
        const auto r = gguf::Reader::from_memory(data, size, "fuzz-input");
        for (const gguf::KV & kv : r->kvs()) {
            touch_kv(*r, kv, sink);
            if (r->find(kv.key) == nullptr) __builtin_trap();   // every parsed key is findable
        }
        quietly([&] { sink = sink + r->get_u32("no.such.key"); });
        for (const gguf::TensorInfo & t : r->tensors()) {
            if (r->find_tensor(t.name) != &t) __builtin_trap();
            const uint8_t * p = r->tensor_data(t);
            for (uint64_t i = 0; i < t.nbytes; ++i) sink = sink + p[i];
        }
        if (r->data_offset() > r->file_size() && !r->tensors().empty()) __builtin_trap();
    } catch (const rp::Error &) {
        // a rejected input: fine
    }
    return 0;
}
