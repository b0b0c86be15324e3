// The safetensors file format (Hugging Face's, what PEFT adapters and HF models are stored in): an 8-byte
// little-endian header length N, N bytes of JSON, then the tensors' bytes. The header maps each tensor name to
// {"dtype", "shape" (row-major, outermost first), "data_offsets": [begin, end)} relative to the byte after the
// header, and may hold "__metadata__" (string -> string). The reader checks what the specification requires
// of an untrusted file: a header inside the file, every tensor's bytes = product(shape) x its dtype's size,
// offsets inside the data and covering it without overlap or gap. Errors throw rp::Error naming the file and
// the tensor or key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rp {

class AtomicFile;

// The dtypes read and written: F32, F16, BF16 (the others of the specification are refused by name).
size_t safetensors_dtype_size(const std::string & dtype);  // 0 when not one of them
// The dtype a user names in lower case (f32, f16, bf16) or as the format does; "" when not one of them.
std::string safetensors_dtype_from_name(const std::string & name);

struct SafetensorsTensor {
    std::string name;
    std::string dtype;           // "F32" | "F16" | "BF16"
    std::vector<int64_t> shape;  // PyTorch order: shape.back() is contiguous
    size_t begin = 0, end = 0;   // byte range in the data section
    int64_t elements() const;
};

class SafetensorsReader {
public:
    // Maps and validates `path`; the source name in errors is the path.
    static std::unique_ptr<SafetensorsReader> open(const std::string & path);
    // Validates bytes already in memory (the fuzzer); `name` is used in errors. The bytes must outlive the reader.
    static std::unique_ptr<SafetensorsReader> parse(const uint8_t * bytes, size_t size, const std::string & name);
    ~SafetensorsReader();
    SafetensorsReader(const SafetensorsReader &) = delete;
    SafetensorsReader & operator=(const SafetensorsReader &) = delete;

    const std::string & path() const { return path_; }
    // In data-offset order.
    const std::vector<SafetensorsTensor> & tensors() const { return tensors_; }
    const SafetensorsTensor * find(const std::string & name) const;
    const std::map<std::string, std::string> & metadata() const { return metadata_; }
    const uint8_t * data(const SafetensorsTensor & t) const { return data_ + t.begin; }
    // The tensor's values as f32 (F16 and BF16 widened exactly).
    std::vector<float> to_f32(const SafetensorsTensor & t) const;

private:
    SafetensorsReader() = default;
    std::string path_;
    void * map_ = nullptr;
    size_t map_size_ = 0;
    const uint8_t * data_ = nullptr;
    std::vector<SafetensorsTensor> tensors_;
    std::map<std::string, std::string> metadata_;
};

// Collects tensors and writes the file (temp file + rename), tensors in the order added, the header padded
// with spaces to a multiple of 8 bytes (as the reference implementation writes it).
class SafetensorsWriter {
public:
    // `bytes` must hold product(shape) x the dtype's size bytes; copied.
    void add(const std::string & name, const std::string & dtype, const std::vector<int64_t> & shape, const void * bytes);
    // f32 values converted to dtype (F16 and BF16 rounded to nearest even).
    void add_f32(const std::string & name, const std::string & dtype, const std::vector<int64_t> & shape, const float * values);
    // A tensor whose bytes `make` returns when the file is written (one at a time: a model never sits whole in
    // memory); they must be product(shape) x the dtype's size.
    void add_deferred(const std::string & name, const std::string & dtype, const std::vector<int64_t> & shape,
                      std::function<std::string()> make);
    void set_metadata(const std::string & key, const std::string & value) { metadata_[key] = value; }
    // The file's bytes (header + data).
    std::string bytes() const;
    void write(const std::string & path) const;
    // The file's bytes into f (not committed: a caller writing several files renames them together).
    void write_to(AtomicFile & f) const;

private:
    struct Entry {
        std::string name, dtype;
        std::vector<int64_t> shape;
        size_t bytes = 0;
        std::string data;                   // or, when empty:
        std::function<std::string()> make;
    };
    Entry & new_entry(const std::string & name, const std::string & dtype, const std::vector<int64_t> & shape);
    std::string header() const;
    std::vector<Entry> entries_;
    std::map<std::string, std::string> metadata_;
};

} // namespace rp
