#include "gguf/types.h"

#include <cctype>
#include <cstdio>
#include <cstring>

namespace gguf {

namespace {

// Indexed by type id. Sizes from ggml's type table at the reference snapshot (formats.md §2).
const TypeTraits kTraits[kTensorTypeCount] = {
    /*  0 */ {"f32", 1, 4, true},
    /*  1 */ {"f16", 1, 2, true},
    /*  2 */ {"q4_0", 32, 18, true},
    /*  3 */ {"q4_1", 32, 20, true},
    /*  4 */ {nullptr, 0, 0, false},
    /*  5 */ {nullptr, 0, 0, false},
    /*  6 */ {"q5_0", 32, 22, true},
    /*  7 */ {"q5_1", 32, 24, true},
    /*  8 */ {"q8_0", 32, 34, true},
    /*  9 */ {"q8_1", 32, 36, true},
    /* 10 */ {"q2_k", 256, 84, true},
    /* 11 */ {"q3_k", 256, 110, true},
    /* 12 */ {"q4_k", 256, 144, true},
    /* 13 */ {"q5_k", 256, 176, true},
    /* 14 */ {"q6_k", 256, 210, true},
    /* 15 */ {"q8_k", 256, 292, true},
    /* 16 */ {"iq2_xxs", 256, 66, true},
    /* 17 */ {"iq2_xs", 256, 74, true},
    /* 18 */ {"iq3_xxs", 256, 98, true},
    /* 19 */ {"iq1_s", 256, 50, true},
    /* 20 */ {"iq4_nl", 32, 18, true},
    /* 21 */ {"iq3_s", 256, 110, true},
    /* 22 */ {"iq2_s", 256, 82, true},
    /* 23 */ {"iq4_xs", 256, 136, true},
    /* 24 */ {"i8", 1, 1, true},
    /* 25 */ {"i16", 1, 2, true},
    /* 26 */ {"i32", 1, 4, true},
    /* 27 */ {"i64", 1, 8, true},
    /* 28 */ {"f64", 1, 8, true},
    /* 29 */ {"iq1_m", 256, 56, true},
    /* 30 */ {"bf16", 1, 2, true},
    /* 31 */ {nullptr, 0, 0, false},
    /* 32 */ {nullptr, 0, 0, false},
    /* 33 */ {nullptr, 0, 0, false},
    /* 34 */ {"tq1_0", 256, 54, true},
    /* 35 */ {"tq2_0", 256, 66, true},
    /* 36 */ {nullptr, 0, 0, false},
    /* 37 */ {nullptr, 0, 0, false},
    /* 38 */ {nullptr, 0, 0, false},
    /* 39 */ {"mxfp4", 32, 17, true},
    /* 40 */ {"nvfp4", 64, 36, true},
    /* 41 */ {"q1_0", 128, 18, true},
    /* 42 */ {"q2_0", 64, 18, true},
};

} // namespace

const TypeTraits * type_traits(uint32_t id) {
    if (id >= kTensorTypeCount || !kTraits[id].known) return nullptr;
    return &kTraits[id];
}

const char * type_name(uint32_t id) {
    static thread_local char buf[32];
    const TypeTraits * tt = type_traits(id);
    if (tt) return tt->name;
    std::snprintf(buf, sizeof buf, "type#%u", id);
    return buf;
}

bool type_from_name(const char * name, TensorType & out) {
    if (!name) return false;
    for (uint32_t id = 0; id < kTensorTypeCount; ++id) {
        const char * n = kTraits[id].name;
        if (!n || std::strlen(n) != std::strlen(name)) continue;
        bool eq = true;
        for (size_t i = 0; n[i]; ++i)
            if (std::tolower(static_cast<unsigned char>(name[i])) != n[i]) { eq = false; break; }
        if (eq) { out = static_cast<TensorType>(id); return true; }
    }
    return false;
}

size_t row_bytes(TensorType t, int64_t n) {
    const TypeTraits * tt = type_traits(static_cast<uint32_t>(t));
    return tt ? static_cast<size_t>(n / tt->block_size) * tt->type_size : 0;
}

} // namespace gguf
