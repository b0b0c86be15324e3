// GGUF v2/v3 reader (mmap, validated with llama.cpp's rules) and writer (what llama.cpp's loader accepts).
// formats.md §1 is the specification. Every failure throws rp::Error naming the file, the key or tensor,
// and the byte offset at fault; nothing here aborts on bad input.
#pragma once

#include "base/error.h"
#include "gguf/types.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gguf {

enum class ValueType : uint32_t {
    U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
    STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
constexpr uint32_t kValueTypeCount = 13;
const char * value_type_name(ValueType t);

// One metadata key/value pair. Scalars and numeric arrays keep their packed little-endian bytes in `data`
// (so a round trip is byte-exact); strings and string arrays keep their text in `strs`.
struct KV {
    std::string key;
    ValueType type = ValueType::U8;
    ValueType arr_type = ValueType::U8;  // element type when type == ARRAY
    uint64_t count = 1;                  // number of elements (1 for a scalar or a string)
    std::vector<uint8_t> data;           // numeric payload
    std::vector<std::string> strs;       // STRING: one entry; ARRAY of STRING: count entries
};

struct TensorInfo {
    std::string name;
    uint32_t n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};        // ne[0] is the contiguous axis (GGUF / ggml order)
    TensorType type = TensorType::F32;
    uint64_t offset = 0;                 // relative to the data section
    uint64_t nbytes = 0;
    int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

class Reader {
public:
    // Maps and validates a file. Throws rp::Error.
    static std::unique_ptr<Reader> open(const std::string & path);
    // Parses a buffer the caller keeps alive (fuzzing, tests). `name` is used in messages.
    static std::unique_ptr<Reader> from_memory(const void * data, size_t size, const std::string & name = "<memory>");
    ~Reader();
    Reader(const Reader &) = delete;
    Reader & operator=(const Reader &) = delete;

    const std::string & path() const { return path_; }
    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }   // absolute offset of the data section
    uint64_t file_size() const { return size_; }
    const uint8_t * bytes() const { return base_; }          // the whole mapped file

    const std::vector<KV> & kvs() const { return kvs_; }
    const KV * find(std::string_view key) const;             // nullptr when absent
    bool has(std::string_view key) const { return find(key) != nullptr; }

    // Typed accessors. The plain forms throw when the key is missing; all throw on a type that cannot be
    // converted, naming the key and both types. Integer getters accept any integer type (u8..u64, i8..i64)
    // whose value fits (counts are u32 in llama.cpp's files and u64 by the spec).
    uint64_t get_u64(std::string_view key) const;
    uint32_t get_u32(std::string_view key) const;
    int64_t get_i64(std::string_view key) const;
    float get_f32(std::string_view key) const;              // F32 or F64
    bool get_bool(std::string_view key) const;
    const std::string & get_string(std::string_view key) const;
    uint32_t get_u32_or(std::string_view key, uint32_t dflt) const;
    float get_f32_or(std::string_view key, float dflt) const;
    bool get_bool_or(std::string_view key, bool dflt) const;
    std::string get_string_or(std::string_view key, const std::string & dflt) const;
    // Arrays: element type must be convertible (any integer type for the integer forms).
    const std::vector<std::string> & get_string_array(std::string_view key) const;
    std::vector<float> get_f32_array(std::string_view key) const;
    std::vector<int64_t> get_int_array(std::string_view key) const;

    const std::vector<TensorInfo> & tensors() const { return tensors_; }
    const TensorInfo * find_tensor(std::string_view name) const;   // nullptr when absent
    const uint8_t * tensor_data(const TensorInfo & t) const { return base_ + data_offset_ + t.offset; }
    // Drops the mapped pages that lie wholly inside [p, p + bytes) from this process's memory (a caller that
    // copied the data and reads it no more: a full finetune's fp32 masters). They stay valid: touching them
    // again reads them back from the file. A range outside the mapping, or a reader from memory: no-op.
    // Returns the bytes released.
    size_t release_pages(const void * p, size_t bytes) const;
    // The bytes of [p, p + bytes) whose pages are present in this process's mapping: what the process has read
    // (or had read around a read) since the file was mapped or the pages released, whatever the page cache
    // holds. Whole pages, clipped to the range. nullopt when the range is not in the mapping, the reader is
    // over memory, or /proc/self/pagemap cannot be read.
    std::optional<size_t> resident_bytes(const void * p, size_t bytes) const;

private:
    Reader() = default;
    void parse();
    bool in_mapping(const void * p, size_t bytes) const;  // [p, p + bytes) lies in this reader's mmap

    std::string path_;
    const uint8_t * base_ = nullptr;
    uint64_t size_ = 0;
    void * map_ = nullptr;   // non-null when mmap'd
    uint64_t map_size_ = 0;
    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<KV> kvs_;
    std::vector<TensorInfo> tensors_;
    // name -> index into tensors_ (heterogeneous lookup: find_tensor does not allocate)
    struct NameHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    std::unordered_map<std::string, size_t, NameHash, std::equal_to<>> tensor_index_;
};

// Builds a GGUF file. Tensors are written in the order added, each at the running padded offset, so the
// output satisfies llama.cpp's strict offset rule. Tensor bytes are produced by a callback at write time,
// one tensor at a time, so a model never has to be in memory twice.
class Writer {
public:
    // The data alignment (a power of two, else rp::Error). A general.alignment key set on the writer wins;
    // without one, an alignment other than 32 makes write() append that key so readers agree.
    explicit Writer(uint32_t alignment = 32);

    // Metadata, in insertion order; setting an existing key replaces its value in place.
    void set_kv(const KV & kv);
    void set_u32(const std::string & key, uint32_t v);
    void set_i32(const std::string & key, int32_t v);
    void set_u64(const std::string & key, uint64_t v);
    void set_i64(const std::string & key, int64_t v);
    void set_f32(const std::string & key, float v);
    void set_bool(const std::string & key, bool v);
    void set_string(const std::string & key, const std::string & v);
    void set_string_array(const std::string & key, const std::vector<std::string> & v);
    void set_f32_array(const std::string & key, const std::vector<float> & v);
    void set_i32_array(const std::string & key, const std::vector<int32_t> & v);
    void set_u32_array(const std::string & key, const std::vector<uint32_t> & v);
    void remove(const std::string & key);
    const KV * find(std::string_view key) const;

    // Fills exactly `nbytes` bytes at `dst` with the tensor's data. An empty Fill: zeros, written as a hole
    // (a file with every shape and no data: memory plans of models too large to write).
    using Fill = std::function<void(uint8_t * dst, size_t nbytes)>;
    // Adds a tensor of n_dims dims (1..4). Throws on a duplicate name, a name of 64+ bytes, or ne[0] not a
    // multiple of the type's block size.
    void add_tensor(const std::string & name, TensorType type, uint32_t n_dims, const int64_t * ne, Fill fill);
    // Convenience: copies from memory that stays valid until write().
    void add_tensor(const std::string & name, TensorType type, uint32_t n_dims, const int64_t * ne, const void * data);

    // The tensors added so far, in order.
    std::vector<TensorInfo> tensor_infos() const;
    // Gives a hole (a tensor added with an empty Fill) another type: its bytes follow. Throws for a tensor that
    // is not there or has data, or when ne[0] is not a multiple of the type's block size.
    void set_hole_type(const std::string & name, TensorType type);

    // Writes `path + ".tmp"`, then renames it to `path`. On any error the temporary file is removed and
    // nothing is left at `path`.
    void write(const std::string & path) const;

private:
    struct Tensor {
        TensorInfo info;
        Fill fill;
    };
    // A tensor's info, validated (name length, dims, block size, overflow), its byte size computed.
    static TensorInfo tensor_info(const std::string & name, TensorType type, uint32_t n_dims, const int64_t * ne);
    uint32_t alignment_;
    std::vector<KV> kvs_;
    std::vector<Tensor> tensors_;
};

// Copies every key of a reader into a writer, byte-exact and in order (general.alignment included); keys
// the writer already has are replaced in place.
void copy_kvs(const Reader & from, Writer & to);

} // namespace gguf
