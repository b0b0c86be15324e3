// libFuzzer target: arbitrary bytes -> rp::json::parse (the JSONL reader's parser). The only acceptable
// failure is rp::Error; a parsed value is walked to the end (ASan checks every string and container it
// built), and parsing is deterministic (the same bytes give the same tree).
#include "base/error.h"
#include "ggml_rp/core/json.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace {

size_t walk(const rp::json::Value & v, int depth) {
    if (depth > 100000) __builtin_trap();
    size_t n = 1 + v.string.size();
    for (const rp::json::Value & e : v.array) n += walk(e, depth + 1);
    for (const auto & kv : v.object) n += kv.first.size() + walk(kv.second, depth + 1);
    return n;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string text(reinterpret_cast<const char *>(data), size);
    try {
        const rp::json::Value a = rp::json::parse(text, "fuzz-input");
        const rp::json::Value b = rp::json::parse(text, "fuzz-input");
        if (walk(a, 0) != walk(b, 0)) __builtin_trap();
    } catch (const rp::Error &) {
        // a rejected input: fine
    }
    return 0;
}
