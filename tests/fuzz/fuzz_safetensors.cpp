// libFuzzer target: arbitrary bytes -> rp::SafetensorsReader::parse. The only acceptable failure is
// rp::Error; after a successful parse every tensor is read end to end (to_f32), so ASan catches any byte
// range the reader let through that is not inside the input.
#include "base/error.h"
#include "models/convert/safetensors.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    try {
        const auto r = rp::SafetensorsReader::parse(data, size, "fuzz");
        volatile float sink = 0;
        for (const rp::SafetensorsTensor & t : r->tensors())
            for (float v : r->to_f32(t)) sink = sink + v;
        for (const auto & [k, v] : r->metadata()) sink = sink + static_cast<float>(k.size() + v.size());
    } catch (const rp::Error &) {
    }
    return 0;
}
