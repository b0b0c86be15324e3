// Hand-encoded GGUF bytes (formats.md §1, written field by field here, not with gguf::Writer): a valid
// small file reads back to exactly what was encoded; then truncations, absurd counts and lengths, bad
// offsets, duplicates, bad alignment, bad type ids... each throw rp::Error naming the file, the key or
// tensor, the problem and the byte offset. Nothing crashes (this also runs under ASan/UBSan).
#include "gguf/gguf.h"
#include "gguf_test_util.h"

#include <gtest/gtest.h>

#include <functional>

using namespace gguf_test;
using gguf::TensorType;

namespace {

const char * const kName = "hand.gguf";

struct SampleOptions {
    std::string key3 = "test.flag0";
    std::string name_b = "b";
};

// Header, 5 KVs (string, general.alignment, string array, bool, i32 array), tensors a (f32 [8, 2]) and
// b (q8_0 [32]), each field marked by name.
Bytes make_sample(const SampleOptions & o = {}) {
    Bytes b;
    b.raw("GGUF", 4);
    b.mark("version");
    b.u32(3);
    b.mark("n_tensors");
    b.i64(2);
    b.mark("n_kv");
    b.i64(5);

    b.mark("kv0");
    b.str("general.architecture");
    b.mark("kv0.type");
    b.u32(8);   // STRING
    b.mark("kv0.strlen");
    b.str("llama");

    b.mark("kv1");
    b.str("general.alignment");
    b.mark("kv1.type");
    b.u32(4);   // U32
    b.mark("kv1.value");
    b.u32(32);

    b.mark("kv2");
    b.str("test.tokens");
    b.u32(9);   // ARRAY
    b.mark("kv2.elemtype");
    b.u32(8);   // of STRING
    b.mark("kv2.count");
    b.u64(2);
    b.mark("kv2.s0");
    b.str("ab");
    b.str("c");

    b.mark("kv3");
    b.str(o.key3);
    b.mark("kv3.type");
    b.u32(7);   // BOOL
    b.mark("kv3.value");
    b.u8(1);

    b.mark("kv4");
    b.str("test.flag1");
    b.mark("kv4.type");
    b.u32(9);   // ARRAY
    b.mark("kv4.elemtype");
    b.u32(5);   // of I32
    b.mark("kv4.count");
    b.u64(3);
    b.i32(-1);
    b.i32(2);
    b.i32(3);

    b.mark("t0");
    b.str("a");
    b.mark("t0.ndims");
    b.u32(2);
    b.mark("t0.ne0");
    b.i64(8);
    b.mark("t0.ne1");
    b.i64(2);
    b.mark("t0.type");
    b.u32(0);   // F32
    b.mark("t0.offset");
    b.u64(0);

    b.mark("t1");
    b.str(o.name_b);
    b.mark("t1.ndims");
    b.u32(1);
    b.mark("t1.ne0");
    b.i64(32);
    b.mark("t1.type");
    b.u32(8);   // Q8_0
    b.mark("t1.offset");
    b.u64(64);

    b.mark("info_end");
    b.pad(32);
    b.mark("data");
    for (int i = 0; i < 16; ++i) b.f32(0.5f * static_cast<float>(i) - 3.0f);
    b.mark("data.b");
    b.u8(0x00);   // d = f16 1.0 (0x3C00)
    b.u8(0x3C);
    for (int i = 0; i < 32; ++i) b.u8(static_cast<uint8_t>(i - 16));
    b.mark("end_b");
    b.pad(32);
    return b;
}

std::unique_ptr<gguf::Reader> parse(const Bytes & b) { return gguf::Reader::from_memory(b.b.data(), b.b.size(), kName); }

// Parses `b`, expects rp::Error with every phrase in `phrases`, the file name, and "byte offset <at>" when
// at >= 0. Any other exception type fails the test.
void expect_error(const Bytes & b, const std::vector<std::string> & phrases, int64_t at = -1) {
    try {
        parse(b);
        ADD_FAILURE() << "accepted; expected an error containing '" << phrases[0] << "'";
    } catch (const rp::Error & e) {
        const std::string m = e.what();
        for (const std::string & p : phrases) EXPECT_NE(m.find(p), std::string::npos) << "missing '" << p << "' in: " << m;
        EXPECT_NE(m.find(kName), std::string::npos) << m;
        const std::string off = at >= 0 ? "byte offset " + std::to_string(at) + ")" : "byte offset ";
        EXPECT_NE(m.find(off), std::string::npos) << "missing '" << off << "' in: " << m;
    }
}

} // namespace

TEST(GgufBroken, HandMadeSampleReadsBackExactly) {
    const Bytes b = make_sample();
    const auto r = parse(b);
    EXPECT_EQ(r->version(), 3u);
    EXPECT_EQ(r->alignment(), 32u);
    EXPECT_EQ(r->data_offset(), b.at("data"));
    EXPECT_EQ(r->data_offset() % 32, 0u);
    ASSERT_EQ(r->kvs().size(), 5u);
    EXPECT_EQ(r->kvs()[0].key, "general.architecture");
    EXPECT_EQ(r->get_string("general.architecture"), "llama");
    EXPECT_EQ(r->get_u32("general.alignment"), 32u);
    EXPECT_EQ(r->get_string_array("test.tokens"), (std::vector<std::string>{"ab", "c"}));
    EXPECT_TRUE(r->get_bool("test.flag0"));
    EXPECT_EQ(r->get_int_array("test.flag1"), (std::vector<int64_t>{-1, 2, 3}));
    ASSERT_EQ(r->tensors().size(), 2u);
    const gguf::TensorInfo & a = r->tensors()[0];
    EXPECT_EQ(a.name, "a");
    EXPECT_EQ(a.n_dims, 2u);
    EXPECT_EQ(a.ne[0], 8);
    EXPECT_EQ(a.ne[1], 2);
    EXPECT_EQ(a.ne[2], 1);
    EXPECT_EQ(a.type, TensorType::F32);
    EXPECT_EQ(a.nbytes, 64u);
    EXPECT_EQ(a.offset, 0u);
    float first;
    std::memcpy(&first, r->tensor_data(a), 4);
    EXPECT_EQ(first, -3.0f);
    const gguf::TensorInfo & tb = r->tensors()[1];
    EXPECT_EQ(tb.type, TensorType::Q8_0);
    EXPECT_EQ(tb.nbytes, 34u);
    EXPECT_EQ(tb.offset, 64u);
    EXPECT_EQ(r->tensor_data(tb), b.b.data() + b.at("data.b"));
}

TEST(GgufBroken, TruncatedAnywhereBeforeTheLastTensorEnds) {
    const Bytes full = make_sample();
    // Every cut point: inside and at the boundary of the header, each KV, each tensor info, the padding
    // and each tensor's data (well over the 20 points asked for).
    size_t cuts = 0;
    for (size_t cut = 0; cut < full.at("end_b"); ++cut) {
        SCOPED_TRACE("cut at " + std::to_string(cut));
        Bytes b = full;
        b.b.resize(cut);
        expect_error(b, {"truncated"});
        ++cuts;
    }
    EXPECT_GT(cuts, 300u);
    // The last tensor's trailing padding is optional (llama.cpp checks each tensor's own bytes only).
    for (size_t cut = full.at("end_b"); cut <= full.b.size(); ++cut) {
        Bytes b = full;
        b.b.resize(cut);
        EXPECT_NO_THROW(parse(b)) << "cut at " << cut;
    }
}

TEST(GgufBroken, HeaderErrors) {
    Bytes b = make_sample();
    b.b[0] = 'X';
    expect_error(b, {"bad magic 'XGUF'", "not a GGUF file"}, 0);

    const std::pair<uint32_t, const char *> versions[] = {
        {1, "GGUF v1 is not supported"}, {0x03000000u, "byte-swapped"}, {0x02000000u, "byte-swapped"},
        {0, "byte-swapped"}, {4, "unsupported GGUF version 4"}, {0xFFFFFFFFu, "unsupported GGUF version"}};
    for (const auto & [v, phrase] : versions) {
        b = make_sample();
        b.put<uint32_t>(b.at("version"), v);
        expect_error(b, {phrase}, 4);
    }
}

TEST(GgufBroken, AbsurdCounts) {
    const int64_t big[] = {INT64_MAX, int64_t(1) << 40, int64_t(1) << 30, 1000};
    for (int64_t n : big) {
        SCOPED_TRACE(n);
        Bytes b = make_sample();
        b.put<int64_t>(b.at("n_kv"), n);
        expect_error(b, {"kv count " + std::to_string(n), "larger than the file can hold"}, 16);
        b = make_sample();
        b.put<int64_t>(b.at("n_tensors"), n);
        expect_error(b, {"tensor count " + std::to_string(n), "larger than the file can hold"}, 8);
    }
    for (int64_t n : {int64_t(-1), INT64_MIN}) {
        Bytes b = make_sample();
        b.put<int64_t>(b.at("n_kv"), n);
        expect_error(b, {"kv count " + std::to_string(n) + " is negative"}, 16);
        b = make_sample();
        b.put<int64_t>(b.at("n_tensors"), n);
        expect_error(b, {"tensor count " + std::to_string(n) + " is negative"}, 8);
    }
    // Array counts: above ggml's 2^30 cap, or more than the bytes left.
    for (uint64_t n : {uint64_t(1) << 63, uint64_t(1) << 40, (uint64_t(1) << 30) + 1}) {
        Bytes b = make_sample();
        b.put<uint64_t>(b.at("kv2.count"), n);
        expect_error(b, {"key 'test.tokens'", "array count " + std::to_string(n) + " exceeds the limit of 2^30"}, b.at("kv2.count"));
        b = make_sample();
        b.put<uint64_t>(b.at("kv4.count"), n);
        expect_error(b, {"key 'test.flag1'", "exceeds the limit"}, b.at("kv4.count"));
    }
    for (uint64_t n : {uint64_t(1) << 30, uint64_t(1) << 29, uint64_t(100)}) {
        Bytes b = make_sample();
        b.put<uint64_t>(b.at("kv2.count"), n);
        expect_error(b, {"key 'test.tokens'", "truncated"});
        b = make_sample();
        b.put<uint64_t>(b.at("kv4.count"), n);
        expect_error(b, {"key 'test.flag1'", "truncated"});
    }
}

TEST(GgufBroken, AbsurdStringLengths) {
    for (uint64_t n : {uint64_t(1) << 63, ~uint64_t(0), uint64_t(1) << 40, (uint64_t(1) << 30) + 1}) {
        SCOPED_TRACE(n);
        Bytes b = make_sample();
        b.put<uint64_t>(b.at("kv0"), n);   // the first key's length
        expect_error(b, {"key #0", "length " + std::to_string(n), "1 GiB"}, b.at("kv0"));
        b = make_sample();
        b.put<uint64_t>(b.at("kv0.strlen"), n);   // a string value
        expect_error(b, {"key 'general.architecture'", "1 GiB"}, b.at("kv0.strlen"));
        b = make_sample();
        b.put<uint64_t>(b.at("kv2.s0"), n);   // a string array element
        expect_error(b, {"key 'test.tokens'", "1 GiB"}, b.at("kv2.s0"));
        b = make_sample();
        b.put<uint64_t>(b.at("t1"), n);   // a tensor name
        expect_error(b, {"tensor #1", "1 GiB"}, b.at("t1"));
    }
    for (uint64_t n : {uint64_t(1) << 30, uint64_t(1) << 20, uint64_t(600)}) {
        Bytes b = make_sample();
        b.put<uint64_t>(b.at("kv0.strlen"), n);
        expect_error(b, {"key 'general.architecture'", "truncated"});
    }
}

TEST(GgufBroken, BadValueTypes) {
    for (uint32_t t : {13u, 100u, 0xFFFFFFFFu}) {
        Bytes b = make_sample();
        b.put<uint32_t>(b.at("kv3.type"), t);
        expect_error(b, {"key 'test.flag0'", "invalid value type " + std::to_string(t)}, b.at("kv3.type"));
        b = make_sample();
        b.put<uint32_t>(b.at("kv4.elemtype"), t);
        expect_error(b, {"key 'test.flag1'", "invalid array element type " + std::to_string(t)}, b.at("kv4.elemtype"));
    }
    Bytes b = make_sample();
    b.put<uint32_t>(b.at("kv4.elemtype"), 9);
    expect_error(b, {"key 'test.flag1'", "nested arrays are not supported"}, b.at("kv4.elemtype"));
    for (uint8_t v : {uint8_t(2), uint8_t(255)}) {
        b = make_sample();
        b.b[b.at("kv3.value")] = v;
        expect_error(b, {"key 'test.flag0'", "bool value " + std::to_string(v) + " is out of range"}, b.at("kv3.value"));
    }
}

TEST(GgufBroken, DuplicateAndEmptyKeys) {
    Bytes b = make_sample();
    b.b[b.at("kv4") + 8 + 9] = '0';   // "test.flag1" -> "test.flag0"
    expect_error(b, {"key 'test.flag0'", "duplicate key"}, b.at("kv4"));
    SampleOptions o;
    o.key3 = "";
    b = make_sample(o);
    expect_error(b, {"key #3", "empty key name"}, b.at("kv3"));
}

TEST(GgufBroken, BadAlignment) {
    for (uint32_t a : {0u, 3u, 48u, 0x80000001u}) {
        Bytes b = make_sample();
        b.put<uint32_t>(b.at("kv1.value"), a);
        expect_error(b, {"general.alignment", "alignment " + std::to_string(a) + " is not a power of two"}, b.at("kv1"));
    }
    const std::pair<uint32_t, const char *> types[] = {{5, "has type i32, expected u32"}, {6, "has type f32, expected u32"}};
    for (const auto & [t, phrase] : types) {
        Bytes b = make_sample();
        b.put<uint32_t>(b.at("kv1.type"), t);
        expect_error(b, {"general.alignment", phrase}, b.at("kv1"));
    }
}

TEST(GgufBroken, BadTensorInfos) {
    for (uint32_t t : {4u, 5u, 31u, 36u, 43u, 1000u, 0xFFFFFFFFu}) {
        Bytes b = make_sample();
        b.put<uint32_t>(b.at("t1.type"), t);
        expect_error(b, {"tensor 'b'", "unsupported tensor type " + std::to_string(t)}, b.at("t1.type"));
    }
    for (uint32_t n : {0u, 5u, 0xFFFFFFFFu}) {
        Bytes b = make_sample();
        b.put<uint32_t>(b.at("t1.ndims"), n);
        expect_error(b, {"tensor 'b'", "n_dims " + std::to_string(n) + " is out of range"}, b.at("t1.ndims"));
    }
    Bytes b = make_sample();
    b.put<int64_t>(b.at("t1.ne0"), 16);
    expect_error(b, {"tensor 'b'", "ne[0] = 16 is not a multiple of the block size 32 of type q8_0"}, b.at("t1.ndims"));

    b = make_sample();
    b.put<int64_t>(b.at("t0.ne1"), -2);
    expect_error(b, {"tensor 'a'", "ne[1] = -2 is negative"}, b.at("t0.ne1"));

    b = make_sample();
    b.put<int64_t>(b.at("t0.ne0"), int64_t(1) << 62);
    b.put<int64_t>(b.at("t0.ne1"), 4);
    expect_error(b, {"tensor 'a'", "element count overflows int64"}, b.at("t0.ndims"));

    b = make_sample();
    b.put<int64_t>(b.at("t0.ne0"), int64_t(1) << 61);   // 2^62 elements fit int64, 2^64 bytes do not
    b.put<int64_t>(b.at("t0.ne1"), 2);
    expect_error(b, {"tensor 'a'", "byte size overflows"}, b.at("t0.ndims"));

    b = make_sample();
    b.put<int64_t>(b.at("t0.ne1"), int64_t(1) << 30);   // a plausible size, far more than the file holds
    expect_error(b, {"tensor 'a'", "past the end of the file", "truncated"}, b.at("t0.offset"));

    b = make_sample();
    b.b[b.at("t1") + 8] = 'a';
    expect_error(b, {"tensor 'a'", "duplicate tensor name"}, b.at("t1"));

    SampleOptions o;
    o.name_b = std::string(64, 'n');
    b = make_sample(o);
    expect_error(b, {"name is 64 bytes, the limit is 63"}, b.at("t1"));
    o.name_b = std::string(63, 'n');
    EXPECT_NO_THROW(parse(make_sample(o)));
}

TEST(GgufBroken, OffsetsMustBeTheRunningPaddedSum) {
    const std::pair<uint64_t, uint64_t> b_offsets[] = {{65, 64}, {96, 64}, {32, 64}, {0, 64}, {uint64_t(1) << 63, 64}};
    for (const auto & [got, want] : b_offsets) {
        Bytes b = make_sample();
        b.put<uint64_t>(b.at("t1.offset"), got);
        expect_error(b, {"tensor 'b' has offset " + std::to_string(got) + ", expected " + std::to_string(want)}, b.at("t1.offset"));
    }
    Bytes b = make_sample();
    b.put<uint64_t>(b.at("t0.offset"), 32);
    expect_error(b, {"tensor 'a' has offset 32, expected 0"}, b.at("t0.offset"));

    // Offsets consistent with the infos but past the end of the data: a grows to 96 bytes, b moves to 96.
    b = make_sample();
    b.put<int64_t>(b.at("t0.ne1"), 3);
    b.put<uint64_t>(b.at("t1.offset"), 96);
    expect_error(b, {"tensor 'b' data", "past the end of the file"}, b.at("t1.offset"));
}

TEST(GgufBroken, NoByteFlipCrashes) {
    // Every byte of the sample set to a few values: each parse either succeeds or throws rp::Error.
    const Bytes full = make_sample();
    size_t errors = 0, ok = 0;
    for (size_t i = 0; i < full.at("end_b"); ++i) {
        for (uint8_t v : {uint8_t(0x00), uint8_t(0xFF), uint8_t(0x80), uint8_t(full.b[i] + 1), uint8_t(0x40)}) {
            Bytes b = full;
            b.b[i] = v;
            try {
                parse(b);
                ++ok;
            } catch (const rp::Error &) {
                ++errors;
            }
        }
    }
    EXPECT_GT(errors, 0u);
    EXPECT_GT(ok, 0u);
}
