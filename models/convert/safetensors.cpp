#include "models/convert/safetensors.h"

#include "base/atomic_file.h"
#include "base/error.h"
#include "ggml_rp/core/fp16.h"
#include "ggml_rp/core/json.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

namespace rp {

size_t safetensors_dtype_size(const std::string & dtype) {
    if (dtype == "F32") return 4;
    if (dtype == "F16" || dtype == "BF16") return 2;
    return 0;
}

std::string safetensors_dtype_from_name(const std::string & name) {
    for (const char * d : {"F32", "F16", "BF16"}) {
        std::string lower = d;
        for (char & c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (name == d || name == lower) return d;
    }
    return "";
}

int64_t SafetensorsTensor::elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

namespace {

// A JSON number that is an exact integer in [0, max].
uint64_t whole(const json::Value & v, uint64_t max, const std::string & where) {
    if (!v.is_number() || !(v.number >= 0) || v.number != std::floor(v.number) || v.number > static_cast<double>(max))
        throw Error(where + ": expected an integer in [0, " + std::to_string(max) + "]");
    return static_cast<uint64_t>(v.number);
}

} // namespace

std::unique_ptr<SafetensorsReader> SafetensorsReader::parse(const uint8_t * bytes, size_t size, const std::string & name) {
    auto r = std::unique_ptr<SafetensorsReader>(new SafetensorsReader());
    r->path_ = name;
    if (size < 8) throw Error(name + ": " + std::to_string(size) + " bytes: too short for a safetensors file (an 8-byte header length)");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | bytes[i];
    if (n > size - 8) throw Error(name + ": the header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(size) + " bytes)");
    if (n > (size_t(100) << 20)) throw Error(name + ": a header of " + std::to_string(n) + " bytes (more than 100 MiB) is refused");
    const std::string header(reinterpret_cast<const char *>(bytes) + 8, static_cast<size_t>(n));
    const json::Value h = json::parse(header, name + " (header)");
    if (!h.is_object()) throw Error(name + ": the header is not a JSON object");
    r->data_ = bytes + 8 + n;
    const size_t data_size = size - 8 - static_cast<size_t>(n);
    for (const json::Member & m : h.object) {
        const std::string where = name + ": tensor '" + m.first + "'";
        if (m.first == "__metadata__") {
            if (!m.second.is_object()) throw Error(name + ": __metadata__ is not an object");
            for (const json::Member & kv : m.second.object) {
                if (!kv.second.is_string()) throw Error(name + ": __metadata__ '" + kv.first + "' is not a string");
                r->metadata_[kv.first] = kv.second.string;
            }
            continue;
        }
        if (!m.second.is_object()) throw Error(where + ": not an object");
        SafetensorsTensor t;
        t.name = m.first;
        const json::Value * dtype = m.second.find("dtype");
        const json::Value * shape = m.second.find("shape");
        const json::Value * offsets = m.second.find("data_offsets");
        if (!dtype || !dtype->is_string()) throw Error(where + ": no \"dtype\" string");
        if (!shape || !shape->is_array()) throw Error(where + ": no \"shape\" array");
        if (!offsets || !offsets->is_array() || offsets->array.size() != 2) throw Error(where + ": no \"data_offsets\" [begin, end]");
        t.dtype = dtype->string;
        const size_t esize = safetensors_dtype_size(t.dtype);
        if (!esize) throw Error(where + ": dtype " + t.dtype + " is not one of F32, F16, BF16");
        uint64_t count = 1;
        for (const json::Value & d : shape->array) {
            const uint64_t v = whole(d, uint64_t(1) << 40, where + " shape");
            if (v && count > std::numeric_limits<uint64_t>::max() / 8 / v) throw Error(where + ": the shape's element count overflows");
            count *= v;
            t.shape.push_back(static_cast<int64_t>(v));
        }
        t.begin = static_cast<size_t>(whole(offsets->array[0], data_size, where + " data_offsets[0]"));
        t.end = static_cast<size_t>(whole(offsets->array[1], data_size, where + " data_offsets[1]"));
        if (t.end < t.begin) throw Error(where + ": data_offsets end before they begin");
        if (t.end - t.begin != count * esize)
            throw Error(where + ": " + std::to_string(t.end - t.begin) + " bytes for " + std::to_string(count) + " " + t.dtype + " values (" +
                        std::to_string(count * esize) + " bytes)");
        for (const SafetensorsTensor & o : r->tensors_)
            if (o.name == t.name) throw Error(where + ": named twice");
        r->tensors_.push_back(std::move(t));
    }
    std::sort(r->tensors_.begin(), r->tensors_.end(), [](const SafetensorsTensor & a, const SafetensorsTensor & b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    size_t at = 0;
    for (const SafetensorsTensor & t : r->tensors_) {
        if (t.begin < at) throw Error(name + ": tensor '" + t.name + "' overlaps the tensor before it (bytes " + std::to_string(t.begin) + ".." +
                                      std::to_string(t.end) + ")");
        if (t.begin > at) throw Error(name + ": " + std::to_string(t.begin - at) + " bytes before tensor '" + t.name + "' belong to no tensor");
        at = t.end;
    }
    if (at != data_size) throw Error(name + ": " + std::to_string(data_size - at) + " bytes after the last tensor belong to no tensor");
    return r;
}

std::unique_ptr<SafetensorsReader> SafetensorsReader::open(const std::string & path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw Error(path + ": not a regular file");
    }
    const size_t size = static_cast<size_t>(st.st_size);
    void * map = size ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
    const int e = errno;
    ::close(fd);
    if (map == MAP_FAILED) throw Error(path + ": cannot mmap " + std::to_string(size) + " bytes: " + std::strerror(e));
    try {
        auto r = parse(static_cast<const uint8_t *>(map), size, path);
        r->map_ = map;
        r->map_size_ = size;
        return r;
    } catch (...) {
        if (map) ::munmap(map, size);
        throw;
    }
}

SafetensorsReader::~SafetensorsReader() {
    if (map_) ::munmap(map_, map_size_);
}

const SafetensorsTensor * SafetensorsReader::find(const std::string & name) const {
    for (const SafetensorsTensor & t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

std::vector<float> SafetensorsReader::to_f32(const SafetensorsTensor & t) const {
    const size_t n = static_cast<size_t>(t.elements());
    std::vector<float> out(n);
    const uint8_t * p = data(t);
    if (n == 0) return out;  // a shape with a 0: no bytes, and memcpy must not see the empty vector's null data()
    if (t.dtype == "F32") {
        std::memcpy(out.data(), p, n * 4);
        return out;
    }
    for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = t.dtype == "F16" ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
    return out;
}

SafetensorsWriter::Entry & SafetensorsWriter::new_entry(const std::string & name, const std::string & dtype, const std::vector<int64_t> & shape) {
    const size_t esize = safetensors_dtype_size(dtype);
    if (!esize) throw Error("safetensors: tensor '" + name + "': dtype " + dtype + " is not one of F32, F16, BF16");
    if (name == "__metadata__") throw Error("safetensors: '__metadata__' is not a tensor name");
    for (const Entry & e : entries_)
        if (e.name == name) throw Error("safetensors: tensor '" + name + "' added twice");
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    Entry & e = entries_.emplace_back();
    e.name = name, e.dtype = dtype, e.shape = shape, e.bytes = n * esize;
    return e;
}

void SafetensorsWriter::add(const std::string & name, const std::string & dtype, const std::vector<int64_t> & shape, const void * bytes) {
    Entry & e = new_entry(name, dtype, shape);
    e.data.assign(static_cast<const char *>(bytes), e.bytes);
}

void SafetensorsWriter::add_deferred(const std::string & name, const std::string & dtype, const std::vector<int64_t> & shape,
                                     std::function<std::string()> make) {
    new_entry(name, dtype, shape).make = std::move(make);
}

void SafetensorsWriter::add_f32(const std::string & name, const std::string & dtype, const std::vector<int64_t> & shape, const float * values) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    if (dtype == "F32") return add(name, dtype, shape, values);
    std::vector<uint16_t> half(n);
    for (size_t i = 0; i < n; ++i) half[i] = dtype == "F16" ? fp32_to_fp16(values[i]) : fp32_to_bf16(values[i]);
    add(name, dtype, shape, half.data());
}

std::string SafetensorsWriter::header() const {
    std::string header = "{";
    if (!metadata_.empty()) {
        header += "\"__metadata__\":{";
        bool first = true;
        for (const auto & [k, v] : metadata_) {
            if (!first) header += ',';
            header += json::quoted(k);
            header += ':';
            header += json::quoted(v);
            first = false;
        }
        header += "}";
    }
    size_t at = 0;
    for (const Entry & e : entries_) {
        if (header.size() > 1) header += ",";
        header += json::quoted(e.name) + ":{\"dtype\":\"" + e.dtype + "\",\"shape\":[";
        for (size_t i = 0; i < e.shape.size(); ++i) {
            if (i) header += ',';
            header += std::to_string(e.shape[i]);
        }
        header += "],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + e.bytes) + "]}";
        at += e.bytes;
    }
    header += "}";
    header.append((8 - header.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xFF);
    return out + header;
}

std::string SafetensorsWriter::bytes() const {
    std::string out = header();
    for (const Entry & e : entries_) {
        const std::string made = e.make ? e.make() : std::string();
        const std::string & d = e.make ? made : e.data;
        if (d.size() != e.bytes) throw Error("safetensors: tensor '" + e.name + "': " + std::to_string(d.size()) + " bytes made, " + std::to_string(e.bytes) + " declared");
        out += d;
    }
    return out;
}

void SafetensorsWriter::write_to(AtomicFile & f) const {
    f.write(header());
    for (const Entry & e : entries_) {
        if (!e.make) {
            f.write(e.data);
            continue;
        }
        const std::string d = e.make();
        if (d.size() != e.bytes)
            throw Error("safetensors: tensor '" + e.name + "': " + std::to_string(d.size()) + " bytes made, " + std::to_string(e.bytes) + " declared");
        f.write(d);
    }
}

void SafetensorsWriter::write(const std::string & path) const {
    AtomicFile f(path);
    write_to(f);
    f.commit();
}

} // namespace rp
