// gguf::Writer: byte-exact round trips of every shared model, agreement with a hand encoding of the
// format, the temp-file + rename contract, argument checks; and the Reader's typed accessors.
#include "gguf/gguf.h"
#include "gguf_test_util.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>

using namespace gguf_test;
using gguf::TensorType;
using gguf::ValueType;

namespace {

// Rewrites `path` through Reader -> copy_kvs + add_tensor -> Writer into `out`.
void rewrite(const std::string & path, const std::string & out) {
    const auto r = gguf::Reader::open(path);
    gguf::Writer w(r->alignment());
    gguf::copy_kvs(*r, w);
    for (const auto & t : r->tensors()) w.add_tensor(t.name, t.type, t.n_dims, t.ne, r->tensor_data(t));
    w.write(out);
}

std::string error_of(const std::function<void()> & fn) {
    try {
        fn();
    } catch (const rp::Error & e) {
        return e.what();
    }
    return "(no error)";
}

#define EXPECT_ERROR_HAS(stmt, phrase)                                                                    \
    do {                                                                                                   \
        const std::string m_ = error_of([&] { stmt; });                                                    \
        EXPECT_NE(m_.find(phrase), std::string::npos) << "expected '" << (phrase) << "' in: " << m_;       \
    } while (0)

} // namespace

TEST(GgufWriter, RoundTripOfEverySharedModelIsByteIdentical) {
    TempDir dir;
    for (const std::string & f : valid_model_files()) {
        SCOPED_TRACE(f);
        const std::string out = dir.file("rt.gguf");
        const auto t0 = std::chrono::steady_clock::now();
        rewrite(f, out);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const auto a = read_bytes(f), b = read_bytes(out);
        EXPECT_EQ(a.size(), b.size());
        EXPECT_TRUE(a == b) << "round trip differs";
        std::printf("[ info ] round trip %-60s %9zu bytes %s (%.1f ms)\n", fs::path(f).filename().c_str(), a.size(),
                    a == b ? "identical" : "DIFFERENT", ms);
        EXPECT_FALSE(fs::exists(out + ".tmp"));
    }
}

TEST(GgufWriter, RewritingStories260KGivesTheSameBytesTwice) {
    TempDir dir;
    rewrite(stories(), dir.file("one.gguf"));
    rewrite(dir.file("one.gguf"), dir.file("two.gguf"));
    const auto orig = read_bytes(stories());
    EXPECT_TRUE(read_bytes(dir.file("one.gguf")) == orig);
    EXPECT_TRUE(read_bytes(dir.file("two.gguf")) == orig);
}

TEST(GgufWriter, MatchesAHandEncoding) {
    // The same content encoded by hand from formats.md §1 (v3, u64 counts, packed KVs, infos, pad to 32,
    // tensors each padded to 32 — including the last one).
    const float a[6] = {1, 2, 3, 4, 5, 6};
    const uint8_t q[34] = {0x00, 0x3C};   // one q8_0 block: d = 1.0, all quants 0
    Bytes h;
    h.raw("GGUF", 4);
    h.u32(3);
    h.u64(2);
    h.u64(3);
    h.str("general.architecture");
    h.u32(8);
    h.str("llama");
    h.str("x.count");
    h.u32(4);
    h.u32(7);
    h.str("x.list");
    h.u32(9);
    h.u32(6);
    h.u64(2);
    h.f32(0.5f);
    h.f32(-1.0f);
    h.str("w");
    h.u32(2);
    h.u64(3);
    h.u64(2);
    h.u32(0);
    h.u64(0);
    h.str("q");
    h.u32(1);
    h.u64(32);
    h.u32(8);
    h.u64(32);   // PAD(24, 32)
    h.pad(32);
    h.raw(a, sizeof a);
    h.pad(32);
    h.raw(q, sizeof q);
    h.pad(32);

    TempDir dir;
    gguf::Writer w;
    w.set_string("general.architecture", "llama");
    w.set_u32("x.count", 7);
    w.set_f32_array("x.list", {0.5f, -1.0f});
    const int64_t ne_w[2] = {3, 2}, ne_q[1] = {32};
    w.add_tensor("w", TensorType::F32, 2, ne_w, a);
    w.add_tensor("q", TensorType::Q8_0, 1, ne_q, q);
    w.write(dir.file("w.gguf"));
    EXPECT_TRUE(read_bytes(dir.file("w.gguf")) == h.b);
}

TEST(GgufWriter, VocabOnlyFileHasNoTrailingPadding) {
    TempDir dir;
    gguf::Writer w;
    w.set_string("a", "xyz");   // 8+1 + 4 + 8+3 = 24 bytes after the 24-byte header: 48, not a multiple of 32
    w.write(dir.file("v.gguf"));
    const auto bytes = read_bytes(dir.file("v.gguf"));
    EXPECT_EQ(bytes.size(), 4u + 4 + 8 + 8 + (8 + 1) + 4 + (8 + 3));
    const auto r = gguf::Reader::open(dir.file("v.gguf"));
    EXPECT_TRUE(r->tensors().empty());
    EXPECT_EQ(r->get_string("a"), "xyz");
}

TEST(GgufWriter, EveryValueTypeAndSetKvReplacesInPlace) {
    TempDir dir;
    gguf::Writer w;
    w.set_u32("k.u32", 1);
    w.set_i32("k.i32", -5);
    w.set_u64("k.u64", uint64_t(1) << 40);
    w.set_f32("k.f32", 0.25f);
    w.set_bool("k.bool", true);
    w.set_string("k.str", std::string("with\0nul", 8));
    w.set_string_array("k.strs", {"", "b", "ccc"});
    w.set_i32_array("k.i32s", {-1, 0, 1});
    w.set_u32_array("k.u32s", {});
    w.set_u32("k.u32", 2);   // replaced, keeps its place
    w.remove("k.nothing");
    w.set_bool("k.gone", false);
    w.remove("k.gone");
    EXPECT_EQ(w.find("k.gone"), nullptr);
    ASSERT_NE(w.find("k.i32"), nullptr);
    w.write(dir.file("kv.gguf"));

    const auto r = gguf::Reader::open(dir.file("kv.gguf"));
    ASSERT_EQ(r->kvs().size(), 9u);
    EXPECT_EQ(r->kvs()[0].key, "k.u32");
    EXPECT_EQ(r->kvs()[0].type, ValueType::U32);
    EXPECT_EQ(r->get_u32("k.u32"), 2u);
    EXPECT_EQ(r->get_i64("k.i32"), -5);
    EXPECT_EQ(r->find("k.i32")->type, ValueType::I32);
    EXPECT_EQ(r->get_u64("k.u64"), uint64_t(1) << 40);
    EXPECT_EQ(r->find("k.u64")->type, ValueType::U64);
    EXPECT_EQ(r->get_f32("k.f32"), 0.25f);
    EXPECT_TRUE(r->get_bool("k.bool"));
    EXPECT_EQ(r->get_string("k.str"), std::string("with\0nul", 8));
    EXPECT_EQ(r->get_string_array("k.strs"), (std::vector<std::string>{"", "b", "ccc"}));
    EXPECT_EQ(r->get_int_array("k.i32s"), (std::vector<int64_t>{-1, 0, 1}));
    EXPECT_TRUE(r->get_int_array("k.u32s").empty());
    EXPECT_EQ(r->find("k.u32s")->arr_type, ValueType::U32);
}

TEST(GgufWriter, AlignmentOtherThan32) {
    TempDir dir;
    const float v[3] = {1, 2, 3};
    const int64_t ne[1] = {3};
    {
        gguf::Writer w(64);   // no general.alignment key: write() adds it
        w.set_string("general.architecture", "llama");
        w.add_tensor("t0", TensorType::F32, 1, ne, v);
        w.add_tensor("t1", TensorType::F32, 1, ne, v);
        w.write(dir.file("a64.gguf"));
    }
    const auto r = gguf::Reader::open(dir.file("a64.gguf"));
    EXPECT_EQ(r->alignment(), 64u);
    EXPECT_EQ(r->get_u32("general.alignment"), 64u);
    EXPECT_EQ(r->data_offset() % 64, 0u);
    EXPECT_EQ(r->tensors()[1].offset, 64u);
    EXPECT_EQ(r->file_size(), r->data_offset() + 128);
    // Rewriting keeps the key and the layout.
    rewrite(dir.file("a64.gguf"), dir.file("again.gguf"));
    EXPECT_TRUE(read_bytes(dir.file("again.gguf")) == read_bytes(dir.file("a64.gguf")));

    EXPECT_ERROR_HAS(gguf::Writer(0), "not a power of two");
    EXPECT_ERROR_HAS(gguf::Writer(48), "not a power of two");
    gguf::Writer w;
    EXPECT_ERROR_HAS(w.set_u32("general.alignment", 3), "general.alignment");
    EXPECT_ERROR_HAS(w.set_u64("general.alignment", 32), "must have type u32");
}

TEST(GgufWriter, FailingFillLeavesNoFile) {
    TempDir dir;
    const std::string path = dir.file("out.gguf");
    const float v[4] = {};
    const int64_t ne[1] = {4};
    gguf::Writer w;
    w.add_tensor("ok", TensorType::F32, 1, ne, v);
    w.add_tensor("bad", TensorType::F32, 1, ne, [](uint8_t *, size_t) { throw rp::Error("fill failed on purpose"); });
    EXPECT_ERROR_HAS(w.write(path), "fill failed on purpose");
    EXPECT_FALSE(fs::exists(path));
    EXPECT_FALSE(fs::exists(path + ".tmp"));

    // An existing file at the path is left untouched by a failed write.
    write_bytes(path, {1, 2, 3});
    EXPECT_THROW(w.write(path), rp::Error);
    EXPECT_TRUE(read_bytes(path) == (std::vector<uint8_t>{1, 2, 3}));
    EXPECT_FALSE(fs::exists(path + ".tmp"));

    // A directory that does not exist: the error names the temp file.
    gguf::Writer ok;
    EXPECT_ERROR_HAS(ok.write(dir.file("no/such/dir.gguf")), "no/such/dir.gguf.tmp");
}

TEST(GgufWriter, AddTensorChecks) {
    gguf::Writer w;
    const int64_t ne[4] = {32, 2, 1, 1};
    const uint8_t data[68] = {};
    w.add_tensor("t", TensorType::Q8_0, 2, ne, data);
    EXPECT_ERROR_HAS(w.add_tensor("t", TensorType::F32, 2, ne, data), "duplicate tensor name");
    EXPECT_ERROR_HAS(w.add_tensor(std::string(64, 'x'), TensorType::F32, 2, ne, data), "the limit is 63");
    EXPECT_NO_THROW(w.add_tensor(std::string(63, 'x'), TensorType::F32, 2, ne, data));
    const int64_t ne16[1] = {16};
    EXPECT_ERROR_HAS(w.add_tensor("u", TensorType::Q8_0, 1, ne16, data), "ne[0] = 16 is not a multiple of the block size 32");
    EXPECT_ERROR_HAS(w.add_tensor("u", TensorType::F32, 0, ne, data), "n_dims 0");
    EXPECT_ERROR_HAS(w.add_tensor("u", TensorType::F32, 5, ne, data), "n_dims 5");
    EXPECT_ERROR_HAS(w.add_tensor("u", static_cast<TensorType>(4), 1, ne, data), "unsupported tensor type 4");
    const int64_t neg[2] = {4, -1};
    EXPECT_ERROR_HAS(w.add_tensor("u", TensorType::F32, 2, neg, data), "ne[1] = -1 is negative");
    const int64_t huge[2] = {int64_t(1) << 62, 8};
    EXPECT_ERROR_HAS(w.add_tensor("u", TensorType::F32, 2, huge, data), "overflows");
}

TEST(GgufWriter, SetKvChecksConsistency) {
    gguf::Writer w;
    gguf::KV kv;
    kv.key = "x";
    kv.type = ValueType::U32;
    kv.data = {1, 2};   // 2 bytes for a u32
    EXPECT_ERROR_HAS(w.set_kv(kv), "key 'x'");
    kv.type = ValueType::ARRAY;
    kv.arr_type = ValueType::ARRAY;
    EXPECT_ERROR_HAS(w.set_kv(kv), "nested arrays");
    kv.arr_type = ValueType::BOOL;
    kv.count = 2;
    kv.data = {1, 3};
    EXPECT_ERROR_HAS(w.set_kv(kv), "bool value out of range");
    kv.key = "";
    EXPECT_ERROR_HAS(w.set_kv(kv), "empty key");
}

// ---- Reader accessors --------------------------------------------------------------------------------

namespace {

std::unique_ptr<gguf::Reader> accessor_file(const TempDir & dir) {
    auto put = [](gguf::Writer & w, const char * key, ValueType t, const void * p, size_t n) {
        gguf::KV kv;
        kv.key = key;
        kv.type = t;
        kv.data.assign(static_cast<const uint8_t *>(p), static_cast<const uint8_t *>(p) + n);
        w.set_kv(kv);
    };
    gguf::Writer w;
    const uint8_t u8 = 200;
    const int8_t i8 = -3;
    const uint16_t u16 = 65535;
    const int16_t i16 = -300;
    const double f64 = 0.1;
    const int64_t i64min = std::numeric_limits<int64_t>::min();
    const uint64_t u64big = uint64_t(1) << 63;
    put(w, "u8", ValueType::U8, &u8, 1);
    put(w, "i8", ValueType::I8, &i8, 1);
    put(w, "u16", ValueType::U16, &u16, 2);
    put(w, "i16", ValueType::I16, &i16, 2);
    put(w, "f64", ValueType::F64, &f64, 8);
    put(w, "i64min", ValueType::I64, &i64min, 8);
    put(w, "u64big", ValueType::U64, &u64big, 8);
    w.set_u32("u32max", 0xFFFFFFFFu);
    w.set_u64("u64_2p32", uint64_t(1) << 32);
    w.set_u64("u64small", 77);
    w.set_i32("i32neg", -1);
    w.set_i32("i32pos", 12);
    w.set_f32("f32", 1.5f);
    w.set_bool("flag", false);
    w.set_string("s", "text");
    w.set_f32_array("fa", {1.0f, -2.0f});
    w.set_u32_array("ua", {1, 2, 0xFFFFFFFFu});
    w.set_string_array("sa", {"x"});
    gguf::KV da;
    da.key = "da";
    da.type = ValueType::ARRAY;
    da.arr_type = ValueType::F64;
    da.count = 2;
    const double dv[2] = {0.5, 3.0};
    da.data.assign(reinterpret_cast<const uint8_t *>(dv), reinterpret_cast<const uint8_t *>(dv) + 16);
    w.set_kv(da);
    gguf::KV ua64;
    ua64.key = "ua64";
    ua64.type = ValueType::ARRAY;
    ua64.arr_type = ValueType::U64;
    ua64.count = 1;
    ua64.data.assign(reinterpret_cast<const uint8_t *>(&u64big), reinterpret_cast<const uint8_t *>(&u64big) + 8);
    w.set_kv(ua64);
    w.write(dir.file("acc.gguf"));
    return gguf::Reader::open(dir.file("acc.gguf"));
}

} // namespace

TEST(GgufAccessors, IntegerConversionsWithRangeChecks) {
    TempDir dir;
    const auto r = accessor_file(dir);
    // Any integer type converts when the value fits.
    EXPECT_EQ(r->get_u32("u8"), 200u);
    EXPECT_EQ(r->get_u64("u16"), 65535u);
    EXPECT_EQ(r->get_i64("i8"), -3);
    EXPECT_EQ(r->get_i64("i16"), -300);
    EXPECT_EQ(r->get_u32("u32max"), 0xFFFFFFFFu);
    EXPECT_EQ(r->get_u32("u64small"), 77u);
    EXPECT_EQ(r->get_u32("i32pos"), 12u);
    EXPECT_EQ(r->get_u64("i32pos"), 12u);
    EXPECT_EQ(r->get_i64("u32max"), 4294967295);
    EXPECT_EQ(r->get_i64("i64min"), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(r->get_u64("u64big"), uint64_t(1) << 63);
    EXPECT_EQ(r->get_u32_or("u64small", 5), 77u);
    EXPECT_EQ(r->get_u32_or("absent", 5), 5u);
    // Range errors name the file, the key, the value and both types.
    EXPECT_ERROR_HAS(r->get_u32("u64_2p32"), "key 'u64_2p32' value 4294967296 (u64) does not fit u32");
    EXPECT_ERROR_HAS(r->get_u32("u64_2p32"), "acc.gguf");
    EXPECT_ERROR_HAS(r->get_u32("i32neg"), "key 'i32neg' value -1 (i32) does not fit u32");
    EXPECT_ERROR_HAS(r->get_u64("i8"), "key 'i8' value -3 (i8) does not fit u64");
    EXPECT_ERROR_HAS(r->get_i64("u64big"), "key 'u64big' value 9223372036854775808 (u64) does not fit i64");
    EXPECT_ERROR_HAS(r->get_u32_or("i32neg", 1), "does not fit u32");
    // Wrong types.
    EXPECT_ERROR_HAS(r->get_u32("f32"), "key 'f32' has type f32, expected an integer");
    EXPECT_ERROR_HAS(r->get_u64("s"), "key 's' has type string");
    EXPECT_ERROR_HAS(r->get_u32("flag"), "has type bool");
    EXPECT_ERROR_HAS(r->get_u32("missing.key"), "key 'missing.key' is missing");
}

TEST(GgufAccessors, FloatsBoolsStringsArrays) {
    TempDir dir;
    const auto r = accessor_file(dir);
    EXPECT_EQ(r->get_f32("f32"), 1.5f);
    EXPECT_EQ(r->get_f32("f64"), 0.1f);   // f64 narrowed to the nearest float
    EXPECT_EQ(r->get_f32_or("absent", 2.5f), 2.5f);
    EXPECT_ERROR_HAS(r->get_f32("u8"), "key 'u8' has type u8, expected f32 or f64");
    EXPECT_FALSE(r->get_bool("flag"));
    EXPECT_TRUE(r->get_bool_or("absent", true));
    EXPECT_ERROR_HAS(r->get_bool("u8"), "expected bool");
    EXPECT_EQ(r->get_string("s"), "text");
    EXPECT_EQ(r->get_string_or("absent", "dflt"), "dflt");
    EXPECT_ERROR_HAS(r->get_string("u8"), "expected string");
    EXPECT_ERROR_HAS(r->get_string_or("sa", "x"), "has type array[string], expected string");

    EXPECT_EQ(r->get_f32_array("fa"), (std::vector<float>{1.0f, -2.0f}));
    EXPECT_EQ(r->get_f32_array("da"), (std::vector<float>{0.5f, 3.0f}));
    EXPECT_ERROR_HAS(r->get_f32_array("ua"), "key 'ua' has type array[u32]");
    EXPECT_ERROR_HAS(r->get_f32_array("f32"), "has type f32");
    EXPECT_EQ(r->get_int_array("ua"), (std::vector<int64_t>{1, 2, 4294967295}));
    EXPECT_ERROR_HAS(r->get_int_array("ua64"), "key 'ua64'");
    EXPECT_ERROR_HAS(r->get_int_array("ua64"), "does not fit i64");
    EXPECT_ERROR_HAS(r->get_int_array("fa"), "expected an integer array");
    EXPECT_EQ(r->get_string_array("sa"), (std::vector<std::string>{"x"}));
    EXPECT_ERROR_HAS(r->get_string_array("fa"), "has type array[f32], expected array[string]");
    EXPECT_ERROR_HAS(r->get_string_array("nope"), "is missing");
}

// A hole (a tensor without data) takes another type in place: its byte size follows, the order stays, the file
// reads back with it; a tensor with data, an unknown name or a row length the type's blocks do not divide are
// refused naming the tensor.
TEST(GgufWriter, AHoleTakesAnotherTypeInPlace) {
    TempDir dir;
    gguf::Writer w;
    const int64_t ne[2] = {256, 3}, odd[2] = {96, 2};
    const float data[96 * 2] = {};
    w.add_tensor("a.weight", gguf::TensorType::F32, 2, ne, gguf::Writer::Fill{});
    w.add_tensor("b.weight", gguf::TensorType::F32, 2, odd, data);
    w.add_tensor("c.weight", gguf::TensorType::F32, 2, odd, gguf::Writer::Fill{});
    w.set_hole_type("a.weight", gguf::TensorType::Q4_K);
    const std::vector<gguf::TensorInfo> infos = w.tensor_infos();
    ASSERT_EQ(infos.size(), 3u);
    EXPECT_EQ(infos[0].name, "a.weight");
    EXPECT_EQ(infos[0].type, gguf::TensorType::Q4_K);
    EXPECT_EQ(infos[0].nbytes, 3u * 144u);
    auto refused = [&](const std::string & name, gguf::TensorType t, const std::string & why) {
        try {
            w.set_hole_type(name, t);
            ADD_FAILURE() << name << " retyped";
        } catch (const rp::Error & e) {
            EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
        }
    };
    refused("b.weight", gguf::TensorType::Q8_0, "has data");
    refused("d.weight", gguf::TensorType::Q8_0, "no tensor");
    refused("c.weight", gguf::TensorType::Q4_K, "block size");
    EXPECT_EQ(w.tensor_infos()[2].type, gguf::TensorType::F32) << "a refused retype changes nothing";
    const std::string path = dir.file("holes.gguf");
    w.write(path);
    const auto r = gguf::Reader::open(path);
    ASSERT_EQ(r->tensors().size(), 3u);
    EXPECT_EQ(r->tensors()[0].type, gguf::TensorType::Q4_K);
    EXPECT_EQ(r->tensors()[0].nbytes, 3u * 144u);
}
