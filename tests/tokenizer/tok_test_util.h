// Shared helpers of the tokenizer tests: paths into shared/models, file reading, the .inp/.out fixture
// format, and one loaded Tokenizer per vocabulary for the whole program (the big ones take a moment).
#pragma once

#include "tests/common/shared_paths.h"
#include "models/text/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace tok_test {

using rp_test::shared_dir;
using rp_test::models_dir;

inline std::string read_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in.good()) << "cannot open " << path;
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// .inp: every case is followed by "\n__ggml_vocab_test__\n".
inline std::vector<std::string> read_inp(const std::string & path) {
    const std::string all = read_file(path);
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> cases;
    size_t pos = 0;
    while (pos < all.size()) {
        const size_t e = all.find(sep, pos);
        if (e == std::string::npos) {
            break;
        }
        cases.push_back(all.substr(pos, e - pos));
        pos = e + sep.size();
    }
    return cases;
}

// .out: one line of space-separated ids per case (some files indent lines with a space).
inline std::vector<std::vector<int32_t>> read_out(const std::string & path) {
    std::istringstream in(read_file(path));
    std::vector<std::vector<int32_t>> rows;
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream ls(line);
        std::vector<int32_t> ids;
        long v;
        while (ls >> v) {
            ids.push_back(static_cast<int32_t>(v));
        }
        rows.push_back(ids);
    }
    return rows;
}

inline std::string ids_str(const std::vector<int32_t> & ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) {
            s += ' ';
        }
        s += std::to_string(ids[i]);
    }
    return s;
}

struct Loaded {
    std::unique_ptr<rp::Tokenizer> tok;
    double load_ms = 0;
};

// Loads each file once per test program; reports the load time (gguf parse + tokenizer tables).
inline const Loaded & load_cached(const std::string & path) {
    static std::map<std::string, Loaded> cache;
    auto it = cache.find(path);
    if (it == cache.end()) {
        Loaded l;
        const auto t0 = std::chrono::steady_clock::now();
        l.tok = rp::Tokenizer::load(path);
        l.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        std::printf("[ load    ] %s: %d tokens in %.1f ms\n", path.c_str(), l.tok->n_vocab(), l.load_ms);
        it = cache.emplace(path, std::move(l)).first;
    }
    return it->second;
}

inline const rp::Tokenizer & vocab(const std::string & name) {
    return *load_cached(models_dir() + "/vocab/ggml-vocab-" + name + ".gguf").tok;
}

} // namespace tok_test
