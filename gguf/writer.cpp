// GGUF v3 writer. The output satisfies llama.cpp's strict reader: tensors in the order added, each at the
// running offset padded to the alignment, zero padding between them; a vocab-only file (no tensors) ends
// right after its metadata. The file is written to path + ".tmp" and renamed, so a failed write never
// leaves a partial file at `path`.
#include "gguf/gguf.h"

#include "base/atomic_file.h"
#include "gguf/value.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace gguf {

namespace {

constexpr uint32_t kVersion = 3;
constexpr uint32_t kDefaultAlignment = 32;
const char * const kAlignmentKey = "general.alignment";

bool is_pow2(uint64_t a) { return a != 0 && (a & (a - 1)) == 0; }

// Rejects a KV whose fields disagree, so the bytes we write always parse back to the same KV.
void check_kv(const KV & kv) {
    auto bad = [&](const std::string & why) { throw rp::Error("gguf writer: key '" + kv.key + "': " + why); };
    if (kv.key.empty()) throw rp::Error("gguf writer: empty key name");
    if (static_cast<uint32_t>(kv.type) >= kValueTypeCount) bad("invalid value type");
    ValueType elem = kv.type;
    uint64_t count = 1;
    if (kv.type == ValueType::ARRAY) {
        if (static_cast<uint32_t>(kv.arr_type) >= kValueTypeCount) bad("invalid array element type");
        if (kv.arr_type == ValueType::ARRAY) bad("nested arrays are not supported");
        elem = kv.arr_type;
        count = kv.count;
        if (count > (uint64_t(1) << 30)) bad("array count exceeds the limit of 2^30 elements");
    } else if (kv.count != 1) {
        bad("a scalar must have count 1");
    }
    if (elem == ValueType::STRING) {
        if (kv.strs.size() != count || !kv.data.empty()) bad("string payload does not match the count");
        for (const std::string & s : kv.strs)
            if (s.size() > (size_t(1) << 30)) bad("string longer than 1 GiB");
    } else {
        if (!kv.strs.empty() || kv.data.size() != count * value_type_size(elem)) bad("payload size does not match the count");
        if (elem == ValueType::BOOL)
            for (uint8_t b : kv.data)
                if (b > 1) bad("bool value out of range (0 or 1)");
    }
    if (kv.key == kAlignmentKey) {
        if (kv.type != ValueType::U32) bad("must have type u32, has " + kv_type_name(kv));
        if (!is_pow2(read_int(ValueType::U32, kv.data.data(), 0).magnitude)) bad("alignment is not a power of two");
    }
}

template <typename T> KV scalar(const std::string & key, ValueType t, T v) {
    KV kv;
    kv.key = key;
    kv.type = t;
    kv.data.resize(sizeof(T));
    std::memcpy(kv.data.data(), &v, sizeof(T));
    return kv;
}

template <typename T> KV array(const std::string & key, ValueType t, const std::vector<T> & v) {
    KV kv;
    kv.key = key;
    kv.type = ValueType::ARRAY;
    kv.arr_type = t;
    kv.count = v.size();
    kv.data.resize(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(kv.data.data(), v.data(), kv.data.size());
    return kv;
}

void put_bytes(std::vector<uint8_t> & out, const void * p, size_t n) {
    // resize + memcpy rather than insert(): g++ 12 warns falsely (-Wstringop-overflow) on the latter
    const size_t at = out.size();
    out.resize(at + n);
    if (n) std::memcpy(out.data() + at, p, n);
}
void put_u32(std::vector<uint8_t> & out, uint32_t v) { put_bytes(out, &v, 4); }
void put_u64(std::vector<uint8_t> & out, uint64_t v) { put_bytes(out, &v, 8); }
void put_str(std::vector<uint8_t> & out, const std::string & s) {
    put_u64(out, s.size());
    put_bytes(out, s.data(), s.size());
}

void put_kv(std::vector<uint8_t> & out, const KV & kv) {
    put_str(out, kv.key);
    put_u32(out, static_cast<uint32_t>(kv.type));
    if (kv.type == ValueType::ARRAY) {
        put_u32(out, static_cast<uint32_t>(kv.arr_type));
        put_u64(out, kv.count);
    }
    for (const std::string & s : kv.strs) put_str(out, s);
    put_bytes(out, kv.data.data(), kv.data.size());
}

uint64_t pad(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

using TempFile = rp::AtomicFile;  // base/atomic_file.h

} // namespace

Writer::Writer(uint32_t alignment) : alignment_(alignment) {
    if (!is_pow2(alignment)) throw rp::Error("gguf writer: alignment " + std::to_string(alignment) + " is not a power of two");
}

void Writer::set_kv(const KV & kv) {
    check_kv(kv);
    for (KV & k : kvs_)
        if (k.key == kv.key) {
            k = kv;
            return;
        }
    kvs_.push_back(kv);
}

void Writer::set_u32(const std::string & key, uint32_t v) { set_kv(scalar(key, ValueType::U32, v)); }
void Writer::set_i32(const std::string & key, int32_t v) { set_kv(scalar(key, ValueType::I32, v)); }
void Writer::set_u64(const std::string & key, uint64_t v) { set_kv(scalar(key, ValueType::U64, v)); }
void Writer::set_i64(const std::string & key, int64_t v) { set_kv(scalar(key, ValueType::I64, v)); }
void Writer::set_f32(const std::string & key, float v) { set_kv(scalar(key, ValueType::F32, v)); }
void Writer::set_bool(const std::string & key, bool v) { set_kv(scalar(key, ValueType::BOOL, uint8_t(v ? 1 : 0))); }

void Writer::set_string(const std::string & key, const std::string & v) {
    KV kv;
    kv.key = key;
    kv.type = ValueType::STRING;
    kv.strs.push_back(v);
    set_kv(kv);
}

void Writer::set_string_array(const std::string & key, const std::vector<std::string> & v) {
    KV kv;
    kv.key = key;
    kv.type = ValueType::ARRAY;
    kv.arr_type = ValueType::STRING;
    kv.count = v.size();
    kv.strs = v;
    set_kv(kv);
}

void Writer::set_f32_array(const std::string & key, const std::vector<float> & v) { set_kv(array(key, ValueType::F32, v)); }
void Writer::set_i32_array(const std::string & key, const std::vector<int32_t> & v) { set_kv(array(key, ValueType::I32, v)); }
void Writer::set_u32_array(const std::string & key, const std::vector<uint32_t> & v) { set_kv(array(key, ValueType::U32, v)); }

void Writer::remove(const std::string & key) {
    for (size_t i = 0; i < kvs_.size(); ++i)
        if (kvs_[i].key == key) {
            kvs_.erase(kvs_.begin() + static_cast<std::ptrdiff_t>(i));
            return;
        }
}

const KV * Writer::find(std::string_view key) const {
    for (const KV & kv : kvs_)
        if (kv.key == key) return &kv;
    return nullptr;
}

TensorInfo Writer::tensor_info(const std::string & name, TensorType type, uint32_t n_dims, const int64_t * ne) {
    auto bad = [&](const std::string & why) { throw rp::Error("gguf writer: tensor '" + name + "': " + why); };
    if (name.size() >= 64) bad("name is " + std::to_string(name.size()) + " bytes, the limit is 63");
    if (n_dims < 1 || n_dims > 4) bad("n_dims " + std::to_string(n_dims) + " is out of range (1..4)");
    const TypeTraits * tt = type_traits(static_cast<uint32_t>(type));
    if (!tt) bad("unsupported tensor type " + std::to_string(static_cast<uint32_t>(type)));
    TensorInfo ti;
    ti.name = name;
    ti.n_dims = n_dims;
    ti.type = type;
    for (uint32_t d = 0; d < n_dims; ++d) {
        if (ne[d] < 0) bad("ne[" + std::to_string(d) + "] = " + std::to_string(ne[d]) + " is negative");
        ti.ne[d] = ne[d];
    }
    if (ti.ne[0] % tt->block_size != 0)
        bad("ne[0] = " + std::to_string(ti.ne[0]) + " is not a multiple of the block size " + std::to_string(tt->block_size) +
            " of type " + tt->name);
    int64_t n = 1;
    for (int d = 0; d < 4; ++d)
        if (__builtin_mul_overflow(n, ti.ne[d], &n)) bad("element count overflows int64");
    uint64_t nbytes = static_cast<uint64_t>(ti.ne[0] / tt->block_size);
    bool ovf = __builtin_mul_overflow(nbytes, static_cast<uint64_t>(tt->type_size), &nbytes);
    for (int d = 1; d < 4 && !ovf; ++d) ovf = __builtin_mul_overflow(nbytes, static_cast<uint64_t>(ti.ne[d]), &nbytes);
    if (ovf || nbytes > (uint64_t(1) << 62)) bad("byte size overflows");
    ti.nbytes = nbytes;
    return ti;
}

void Writer::add_tensor(const std::string & name, TensorType type, uint32_t n_dims, const int64_t * ne, Fill fill) {
    for (const Tensor & t : tensors_)
        if (t.info.name == name) throw rp::Error("gguf writer: tensor '" + name + "': duplicate tensor name");
    tensors_.push_back(Tensor{tensor_info(name, type, n_dims, ne), std::move(fill)});
}

std::vector<TensorInfo> Writer::tensor_infos() const {
    std::vector<TensorInfo> out;
    for (const Tensor & t : tensors_) out.push_back(t.info);
    return out;
}

void Writer::set_hole_type(const std::string & name, TensorType type) {
    for (Tensor & t : tensors_) {
        if (t.info.name != name) continue;
        if (t.fill) throw rp::Error("gguf writer: tensor '" + name + "' has data: only a hole takes another type");
        t.info = tensor_info(name, type, t.info.n_dims, t.info.ne);
        return;
    }
    throw rp::Error("gguf writer: no tensor '" + name + "' to retype");
}

void Writer::add_tensor(const std::string & name, TensorType type, uint32_t n_dims, const int64_t * ne, const void * data) {
    add_tensor(name, type, n_dims, ne, [data](uint8_t * dst, size_t nbytes) {
        if (nbytes) std::memcpy(dst, data, nbytes);
    });
}

void Writer::write(const std::string & path) const {
    // The alignment in force is general.alignment when set, else the constructor's; a non-default
    // constructor alignment without the key gets the key appended, so readers agree with the layout.
    uint64_t align = alignment_;
    bool add_key = false;
    if (const KV * a = find(kAlignmentKey))
        align = read_int(ValueType::U32, a->data.data(), 0).magnitude;
    else
        add_key = alignment_ != kDefaultAlignment;

    std::vector<uint8_t> head;
    put_bytes(head, "GGUF", 4);
    put_u32(head, kVersion);
    put_u64(head, tensors_.size());
    put_u64(head, kvs_.size() + (add_key ? 1 : 0));
    for (const KV & kv : kvs_) put_kv(head, kv);
    if (add_key) put_kv(head, scalar(kAlignmentKey, ValueType::U32, alignment_));

    uint64_t offset = 0;
    for (const Tensor & t : tensors_) {
        put_str(head, t.info.name);
        put_u32(head, t.info.n_dims);
        for (uint32_t d = 0; d < t.info.n_dims; ++d) put_u64(head, static_cast<uint64_t>(t.info.ne[d]));
        put_u32(head, static_cast<uint32_t>(t.info.type));
        put_u64(head, offset);
        offset += pad(t.info.nbytes, align);
    }

    TempFile out(path);
    out.write(head.data(), head.size());
    if (!tensors_.empty()) out.zeros(static_cast<size_t>(pad(head.size(), align) - head.size()));
    std::vector<uint8_t> buf;   // one tensor at a time
    for (const Tensor & t : tensors_) {
        const size_t n = static_cast<size_t>(t.info.nbytes);
        if (!t.fill) {
            out.hole(static_cast<size_t>(pad(n, align)));
            continue;
        }
        buf.assign(n, 0);
        t.fill(buf.data(), n);
        out.write(buf.data(), n);
        out.zeros(static_cast<size_t>(pad(n, align) - n));
    }
    out.commit();
}

void copy_kvs(const Reader & from, Writer & to) {
    for (const KV & kv : from.kvs()) to.set_kv(kv);
}

} // namespace gguf
