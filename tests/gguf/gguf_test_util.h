// Helpers for the GGUF tests: paths, temp dirs, whole-file I/O, a hand encoder for GGUF bytes (written
// from formats.md §1, independent of gguf::Writer) and a runner for the rp-gguf tool.
#pragma once

#include "tests/common/temp_dir.h"
#include "tests/common/shared_paths.h"
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace gguf_test {

namespace fs = std::filesystem;

using rp_test::shared_dir;
using rp_test::models_dir;
inline std::string stories() { return models_dir() + "/stories260K.gguf"; }

// Every .gguf under models/ except invalid/, sorted.
inline std::vector<std::string> valid_model_files() {
    std::vector<std::string> out;
    for (const auto & e : fs::recursive_directory_iterator(models_dir())) {
        if (!e.is_regular_file() || e.path().extension() != ".gguf") continue;
        if (e.path().string().find("/invalid/") != std::string::npos) continue;
        out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
}

inline std::vector<uint8_t> read_bytes(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string & path, const std::vector<uint8_t> & b) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char *>(b.data()), static_cast<std::streamsize>(b.size()));
}

using rp_test::TempDir;

// Little-endian GGUF encoder with named marks, so tests can patch a field at a known offset.
struct Bytes {
    std::vector<uint8_t> b;
    std::map<std::string, size_t> marks;

    void mark(const std::string & name) { marks[name] = b.size(); }
    size_t at(const std::string & name) const { return marks.at(name); }
    void raw(const void * p, size_t n) {
        const uint8_t * q = static_cast<const uint8_t *>(p);
        b.insert(b.end(), q, q + n);
    }
    void u8(uint8_t v) { raw(&v, 1); }
    void u32(uint32_t v) { raw(&v, 4); }
    void u64(uint64_t v) { raw(&v, 8); }
    void i32(int32_t v) { raw(&v, 4); }
    void i64(int64_t v) { raw(&v, 8); }
    void f32(float v) { raw(&v, 4); }
    void str(const std::string & s) {
        u64(s.size());
        raw(s.data(), s.size());
    }
    void pad(size_t align) {
        while (b.size() % align) b.push_back(0);
    }
    template <typename T> void put(size_t off, T v) { std::memcpy(b.data() + off, &v, sizeof v); }
};

struct RunResult {
    int code = -1;
    std::string out, err;
};

// Runs `RP_BIN_DIR/rp-gguf ARGS` with stdout/stderr captured through files in `dir`.
inline RunResult run_tool(const std::string & args, const TempDir & dir) {
    const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
    const std::string cmd = std::string(RP_BIN_DIR) + "/rp-gguf " + args + " >" + out + " 2>" + err;
    const int st = std::system(cmd.c_str());
    RunResult r;
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    const auto o = read_bytes(out), e = read_bytes(err);
    r.out.assign(o.begin(), o.end());
    r.err.assign(e.begin(), e.end());
    return r;
}

} // namespace gguf_test
