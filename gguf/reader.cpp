// GGUF reader: maps a file and validates it with llama.cpp/ggml's rules (formats.md §1), plus bounds checks
// that make it safe on arbitrary bytes (it is fuzzed). Parsing never reads past `size_`; every length and
// count is checked against the bytes that are left before anything is allocated.
#include "gguf/gguf.h"
#include "gguf/value.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <unordered_set>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace gguf {

namespace {

constexpr uint64_t kMaxStringBytes = uint64_t(1) << 30;   // ggml's cap on one string
constexpr uint64_t kMaxArrayCount = uint64_t(1) << 30;    // ggml's cap on array elements
constexpr size_t kMaxTensorName = 64;                     // names must be shorter (63 bytes + NUL in ggml)
constexpr uint32_t kMaxDims = 4;
// Smallest possible records, used to reject counts the remaining bytes cannot hold before looping.
constexpr uint64_t kMinKVBytes = 8 + 1 + 4 + 1;           // key length, 1-byte key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;   // empty name, n_dims, one dim, type, offset

// Bounded little-endian cursor over the file. Every failure names the file, the current item and the
// absolute byte offset.
class Cursor {
public:
    Cursor(const std::string & path, const uint8_t * base, uint64_t size) : path_(path), base_(base), size_(size) {}

    uint64_t pos() const { return pos_; }
    uint64_t left() const { return size_ - pos_; }
    void set_item(std::string item) { item_ = std::move(item); }

    [[noreturn]] void fail(uint64_t at, const std::string & msg) const {
        std::string m = path_ + ": ";
        if (!item_.empty()) m += item_ + ": ";
        m += msg + " (at byte offset " + std::to_string(at) + ")";
        throw rp::Error(m);
    }

    void need(uint64_t n, const char * what) const {
        if (n > left())
            fail(pos_, std::string("file is truncated: ") + what + " needs " + std::to_string(n) +
                           " bytes, only " + std::to_string(left()) + " left");
    }

    const uint8_t * take(uint64_t n, const char * what) {
        need(n, what);
        const uint8_t * p = base_ + pos_;
        pos_ += n;
        return p;
    }

    uint32_t u32(const char * what) {
        uint32_t v;
        std::memcpy(&v, take(4, what), 4);
        return v;
    }
    uint64_t u64(const char * what) {
        uint64_t v;
        std::memcpy(&v, take(8, what), 8);
        return v;
    }
    int64_t i64(const char * what) {
        int64_t v;
        std::memcpy(&v, take(8, what), 8);
        return v;
    }

    std::string str(const char * what) {
        const uint64_t at = pos_;
        const uint64_t len = u64(what);
        if (len > kMaxStringBytes)
            fail(at, std::string(what) + " has length " + std::to_string(len) + ", more than the 1 GiB limit");
        const uint8_t * p = take(len, what);
        return std::string(reinterpret_cast<const char *>(p), static_cast<size_t>(len));
    }

private:
    const std::string & path_;
    const uint8_t * base_;
    uint64_t size_;
    uint64_t pos_ = 0;
    std::string item_;
};

uint64_t pad_to(uint64_t x, uint64_t align, bool & overflow) {
    uint64_t r;
    overflow = __builtin_add_overflow(x, align - 1, &r);
    return r & ~(align - 1);
}

} // namespace

std::unique_ptr<Reader> Reader::open(const std::string & path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw rp::Error(path + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        throw rp::Error(path + ": cannot stat: " + std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw rp::Error(path + ": not a regular file");
    }
    std::unique_ptr<Reader> r(new Reader());
    r->path_ = path;
    r->size_ = static_cast<uint64_t>(st.st_size);
    if (r->size_ > 0) {
        void * m = mmap(nullptr, static_cast<size_t>(r->size_), PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            const int e = errno;
            ::close(fd);
            throw rp::Error(path + ": cannot mmap " + std::to_string(r->size_) + " bytes: " + std::strerror(e));
        }
        r->map_ = m;
        r->map_size_ = r->size_;
        r->base_ = static_cast<const uint8_t *>(m);
    } else {
        static const uint8_t empty[1] = {0};
        r->base_ = empty;   // parse() reports the truncated header
    }
    ::close(fd);            // the mapping keeps the file alive
    r->parse();             // on a throw, ~Reader unmaps
    return r;
}

bool Reader::in_mapping(const void * p, size_t bytes) const {
    if (!map_ || !p) return false;
    const auto lo = reinterpret_cast<uintptr_t>(map_), hi = lo + static_cast<uintptr_t>(map_size_);
    const auto a = reinterpret_cast<uintptr_t>(p);
    return a >= lo && a <= hi && bytes <= hi - a;
}

size_t Reader::release_pages(const void * p, size_t bytes) const {
    if (bytes == 0 || !in_mapping(p, bytes)) return 0;
    const auto a = reinterpret_cast<uintptr_t>(p);
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t first = (a + page - 1) / page * page, last = (a + bytes) / page * page;
    if (last <= first) return 0;
    if (madvise(reinterpret_cast<void *>(first), last - first, MADV_DONTNEED) != 0) return 0;  // advice only
    return static_cast<size_t>(last - first);
}

std::optional<size_t> Reader::resident_bytes(const void * p, size_t bytes) const {
    if (!in_mapping(p, bytes)) return std::nullopt;
    if (bytes == 0) return size_t(0);
    const auto a = reinterpret_cast<uintptr_t>(p);
    const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    // One 64-bit entry per virtual page; bit 63: present in RAM (readable without privileges).
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t first = a / page, end = (a + bytes + page - 1) / page;
    size_t resident = 0;
    uint64_t entries[512];
    for (uintptr_t v = first; v < end;) {
        const size_t n = static_cast<size_t>(std::min<uintptr_t>(end - v, 512));
        const ssize_t got = ::pread(fd, entries, n * sizeof(uint64_t), static_cast<off_t>(v * sizeof(uint64_t)));
        if (got != static_cast<ssize_t>(n * sizeof(uint64_t))) {
            ::close(fd);
            return std::nullopt;
        }
        for (size_t i = 0; i < n; ++i) {
            if (!(entries[i] >> 63)) continue;
            const uintptr_t s = std::max(a, (v + i) * page), e = std::min(a + bytes, (v + i + 1) * page);
            resident += static_cast<size_t>(e - s);
        }
        v += n;
    }
    ::close(fd);
    return resident;
}

std::unique_ptr<Reader> Reader::from_memory(const void * data, size_t size, const std::string & name) {
    static const uint8_t empty[1] = {0};
    std::unique_ptr<Reader> r(new Reader());
    r->path_ = name;
    r->base_ = data ? static_cast<const uint8_t *>(data) : empty;
    r->size_ = data ? size : 0;
    r->parse();
    return r;
}

Reader::~Reader() {
    if (map_) munmap(map_, static_cast<size_t>(map_size_));
}

void Reader::parse() {
    Cursor c(path_, base_, size_);

    // ---- header ----
    c.set_item("header");
    const uint8_t * magic = c.take(4, "magic");
    if (std::memcmp(magic, "GGUF", 4) != 0) {
        std::string shown;
        for (int i = 0; i < 4; ++i) {
            const unsigned char ch = magic[i];
            if (ch >= 32 && ch < 127) {
                shown += static_cast<char>(ch);
            } else {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\x%02x", ch);
                shown += buf;
            }
        }
        c.fail(0, "bad magic '" + shown + "': not a GGUF file");
    }
    version_ = c.u32("version");
    if (version_ == 1) c.fail(4, "GGUF v1 is not supported (32-bit counts; convert the file with a current llama.cpp)");
    if ((version_ & 0xFFFF) == 0) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "0x%08x", version_);
        c.fail(4, std::string("version ") + buf + " looks byte-swapped: big-endian GGUF files are not supported");
    }
    if (version_ != 2 && version_ != 3) c.fail(4, "unsupported GGUF version " + std::to_string(version_));

    const uint64_t tensors_at = c.pos();
    const int64_t n_tensors = c.i64("tensor count");
    const uint64_t kvs_at = c.pos();
    const int64_t n_kv = c.i64("kv count");
    if (n_tensors < 0) c.fail(tensors_at, "tensor count " + std::to_string(n_tensors) + " is negative");
    if (n_kv < 0) c.fail(kvs_at, "kv count " + std::to_string(n_kv) + " is negative");
    // Each record needs a minimum number of bytes: an absurd count is rejected before any loop or allocation.
    if (static_cast<uint64_t>(n_kv) > c.left() / kMinKVBytes)
        c.fail(kvs_at, "kv count " + std::to_string(n_kv) + " is larger than the file can hold (" +
                           std::to_string(c.left()) + " bytes left): file is truncated or the count is corrupt");

    // ---- key/value pairs ----
    kvs_.clear();
    kvs_.reserve(static_cast<size_t>(n_kv));
    std::vector<uint64_t> kv_offsets;
    kv_offsets.reserve(static_cast<size_t>(n_kv));
    std::unordered_set<std::string> keys;
    for (int64_t i = 0; i < n_kv; ++i) {
        const uint64_t at = c.pos();
        c.set_item("key #" + std::to_string(i));
        KV kv;
        kv.key = c.str("key name");
        if (kv.key.empty()) c.fail(at, "empty key name");
        c.set_item("key '" + kv.key + "'");
        if (!keys.insert(kv.key).second) c.fail(at, "duplicate key");

        const uint64_t type_at = c.pos();
        const uint32_t t = c.u32("value type");
        if (t >= kValueTypeCount) c.fail(type_at, "invalid value type " + std::to_string(t));
        kv.type = static_cast<ValueType>(t);

        ValueType elem = kv.type;
        uint64_t count = 1;
        if (kv.type == ValueType::ARRAY) {
            const uint64_t et_at = c.pos();
            const uint32_t et = c.u32("array element type");
            if (et >= kValueTypeCount) c.fail(et_at, "invalid array element type " + std::to_string(et));
            if (et == static_cast<uint32_t>(ValueType::ARRAY)) c.fail(et_at, "nested arrays are not supported");
            elem = static_cast<ValueType>(et);
            const uint64_t count_at = c.pos();
            count = c.u64("array count");
            if (count > kMaxArrayCount)
                c.fail(count_at, "array count " + std::to_string(count) + " exceeds the limit of 2^30 elements");
            kv.arr_type = elem;
        }
        kv.count = count;

        if (elem == ValueType::STRING) {
            // Each string has at least its 8-byte length: bound the count by the bytes left.
            if (count > c.left() / 8)
                c.fail(c.pos(), "file is truncated: " + std::to_string(count) + " strings need at least " +
                                    std::to_string(count * 8) + " bytes, only " + std::to_string(c.left()) + " left");
            kv.strs.reserve(static_cast<size_t>(count));
            for (uint64_t j = 0; j < count; ++j) kv.strs.push_back(c.str("string value"));
        } else {
            const uint64_t esize = value_type_size(elem);
            const uint64_t bytes = esize * count;   // count <= 2^30, esize <= 8: no overflow
            const uint64_t data_at = c.pos();
            const uint8_t * p = c.take(bytes, "value");
            kv.data.assign(p, p + bytes);
            if (elem == ValueType::BOOL) {
                for (uint64_t j = 0; j < count; ++j)
                    if (p[j] > 1)
                        c.fail(data_at + j, "bool value " + std::to_string(p[j]) + " is out of range (0 or 1)");
            }
        }
        kvs_.push_back(std::move(kv));
        kv_offsets.push_back(at);
    }

    // ---- alignment ----
    alignment_ = 32;
    c.set_item("key 'general.alignment'");
    for (size_t i = 0; i < kvs_.size(); ++i) {
        if (kvs_[i].key != "general.alignment") continue;
        const KV & kv = kvs_[i];
        if (kv.type != ValueType::U32) c.fail(kv_offsets[i], "has type " + kv_type_name(kv) + ", expected u32");
        const uint32_t a = static_cast<uint32_t>(read_int(ValueType::U32, kv.data.data(), 0).magnitude);
        if (a == 0 || (a & (a - 1)) != 0) c.fail(kv_offsets[i], "alignment " + std::to_string(a) + " is not a power of two");
        alignment_ = a;
    }

    // ---- tensor infos ----
    c.set_item("tensor info");
    if (static_cast<uint64_t>(n_tensors) > c.left() / kMinTensorInfoBytes)
        c.fail(tensors_at, "tensor count " + std::to_string(n_tensors) + " is larger than the file can hold (" +
                               std::to_string(c.left()) + " bytes left): file is truncated or the count is corrupt");
    tensors_.clear();
    tensors_.reserve(static_cast<size_t>(n_tensors));
    std::vector<uint64_t> offset_fields;
    offset_fields.reserve(static_cast<size_t>(n_tensors));
    tensor_index_.clear();
    for (int64_t i = 0; i < n_tensors; ++i) {
        const uint64_t at = c.pos();
        c.set_item("tensor #" + std::to_string(i));
        TensorInfo ti;
        ti.name = c.str("tensor name");
        c.set_item("tensor '" + ti.name + "'");
        if (ti.name.size() >= kMaxTensorName)
            c.fail(at, "name is " + std::to_string(ti.name.size()) + " bytes, the limit is 63");
        if (tensor_index_.count(ti.name)) c.fail(at, "duplicate tensor name");

        const uint64_t dims_at = c.pos();
        ti.n_dims = c.u32("n_dims");
        if (ti.n_dims == 0 || ti.n_dims > kMaxDims)
            c.fail(dims_at, "n_dims " + std::to_string(ti.n_dims) + " is out of range (1..4)");
        for (uint32_t d = 0; d < ti.n_dims; ++d) {
            const uint64_t ne_at = c.pos();
            ti.ne[d] = c.i64("dimension");
            if (ti.ne[d] < 0) c.fail(ne_at, "ne[" + std::to_string(d) + "] = " + std::to_string(ti.ne[d]) + " is negative");
        }
        const uint64_t type_at = c.pos();
        const uint32_t type = c.u32("tensor type");
        const TypeTraits * tt = type_traits(type);
        if (!tt) c.fail(type_at, "unsupported tensor type " + std::to_string(type));
        ti.type = static_cast<TensorType>(type);
        if (ti.ne[0] % tt->block_size != 0)
            c.fail(dims_at, "ne[0] = " + std::to_string(ti.ne[0]) + " is not a multiple of the block size " +
                                std::to_string(tt->block_size) + " of type " + tt->name);
        int64_t n = 1;
        for (int d = 0; d < 4; ++d)
            if (__builtin_mul_overflow(n, ti.ne[d], &n)) c.fail(dims_at, "element count overflows int64");
        uint64_t nbytes = static_cast<uint64_t>(ti.ne[0] / tt->block_size);
        bool ovf = __builtin_mul_overflow(nbytes, static_cast<uint64_t>(tt->type_size), &nbytes);
        for (int d = 1; d < 4 && !ovf; ++d) ovf = __builtin_mul_overflow(nbytes, static_cast<uint64_t>(ti.ne[d]), &nbytes);
        if (ovf || nbytes > static_cast<uint64_t>(SIZE_MAX)) c.fail(dims_at, "byte size overflows");
        ti.nbytes = nbytes;
        offset_fields.push_back(c.pos());
        ti.offset = c.u64("tensor offset");
        tensor_index_.emplace(ti.name, tensors_.size());
        tensors_.push_back(std::move(ti));
    }

    // ---- data section: offsets must be the running padded sum in info order (llama.cpp's rule) ----
    c.set_item("data section");
    bool ovf = false;
    data_offset_ = tensors_.empty() ? c.pos() : pad_to(c.pos(), alignment_, ovf);
    if (ovf) c.fail(c.pos(), "data section offset overflows");
    uint64_t expected = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
        const TensorInfo & ti = tensors_[i];
        c.set_item("");   // the messages below name the tensor themselves
        if (ti.offset != expected)
            c.fail(offset_fields[i], "tensor '" + ti.name + "' has offset " + std::to_string(ti.offset) + ", expected " +
                                         std::to_string(expected));
        uint64_t end;
        if (__builtin_add_overflow(data_offset_, ti.offset, &end) || __builtin_add_overflow(end, ti.nbytes, &end) ||
            end > size_)
            c.fail(offset_fields[i], "tensor '" + ti.name + "' data [" + std::to_string(data_offset_ + ti.offset) + ", +" + std::to_string(ti.nbytes) +
                                         ") extends past the end of the file (" + std::to_string(size_) +
                                         " bytes): file is truncated or the offset is wrong");
        const uint64_t padded = pad_to(ti.nbytes, alignment_, ovf);
        if (ovf || __builtin_add_overflow(expected, padded, &expected)) c.fail(offset_fields[i], "tensor '" + ti.name + "' data size overflows");
    }
}

const KV * Reader::find(std::string_view key) const {
    for (const KV & kv : kvs_)
        if (kv.key == key) return &kv;
    return nullptr;
}

const TensorInfo * Reader::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

} // namespace gguf
