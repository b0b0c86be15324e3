// Helpers for the model tests: paths of the shared models and llama.cpp reference outputs, reading the
// reference logits, comparing, temp dirs, writing variants of a GGUF file, and running the tools.
#pragma once

#include "tests/common/reference_prompts.h"
#include "tests/common/temp_dir.h"
#include "tests/common/shared_paths.h"
#include "gguf/gguf.h"
#include "models/arch/inference.h"
#include "models/arch/model.h"
#include "models/convert/synth_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace models_test {

namespace fs = std::filesystem;

using rp_test::shared_dir;
inline std::string model_path(const std::string & rel) { return shared_dir() + "/models/" + rel; }
inline std::string ref_path(const std::string & rel) { return shared_dir() + "/models/reference/" + rel; }
inline std::string stories() { return model_path("stories260K.gguf"); }

using rp_test::kPrompt1;  // tests/common/reference_prompts.h
using rp_test::kPrompt2;

// A little-endian f32 file of exactly n values.
inline std::vector<float> read_f32(const std::string & path, size_t n) {
    std::ifstream f(path, std::ios::binary);
    std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (b.size() != n * sizeof(float)) {
        std::fprintf(stderr, "%s: %zu bytes, expected %zu\n", path.c_str(), b.size(), n * sizeof(float));
        return {};
    }
    std::vector<float> v(n);
    std::memcpy(v.data(), b.data(), b.size());
    return v;
}

inline float max_abs_diff(const std::vector<float> & a, const std::vector<float> & b) {
    float m = a.size() == b.size() ? 0.0f : INFINITY;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

inline float value_range(const std::vector<float> & v) {
    if (v.empty()) return 0.0f;
    auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    return *hi - *lo;
}

// The ids of `tokens` and their positions 0..T-1 as allocated leaves of ctx (inputs of a graph built by hand).
struct TokenLeaves {
    rp::Tensor * ids;
    rp::Tensor * pos;
};
inline TokenLeaves token_leaves(rp::Context & ctx, const std::vector<int32_t> & tokens) {
    const int64_t T = static_cast<int64_t>(tokens.size());
    TokenLeaves l{ctx.new_tensor(rp::DType::I32, T), ctx.new_tensor(rp::DType::I32, T)};
    ctx.alloc_data(l.ids);
    ctx.alloc_data(l.pos);
    rp::tensor_set_i32(l.ids, tokens);
    for (int64_t i = 0; i < T; ++i) l.pos->data_as<int32_t>()[i] = static_cast<int32_t>(i);
    return l;
}

// All-position logits of one batch through an InferenceSession.
inline std::vector<float> forward_all(const rp::Model & m, const std::vector<int32_t> & tokens,
                                      const rp::LoraSet * lora = nullptr) {
    rp::InferenceSession s(m, static_cast<int64_t>(tokens.size()), 0, lora);
    return s.eval(tokens, true);
}

using rp_test::TempDir;

// Writes a copy of `src` to `dst`: every key (then `edit_kvs` may change them), and every tensor for which
// `keep` returns true, with the shape that `reshape` may change (data: the first bytes of the original,
// zero-padded). Extra tensors can be added by `extra`.
struct Variant {
    std::function<void(gguf::Writer &)> edit_kvs;
    std::function<bool(const gguf::TensorInfo &)> keep;
    std::function<void(gguf::TensorInfo &)> reshape;
    std::function<void(gguf::Writer &)> extra;
};

inline void write_variant(const std::string & src, const std::string & dst, const Variant & v) {
    auto r = gguf::Reader::open(src);
    gguf::Writer w;
    gguf::copy_kvs(*r, w);
    if (v.edit_kvs) v.edit_kvs(w);
    for (const gguf::TensorInfo & t : r->tensors()) {
        if (v.keep && !v.keep(t)) continue;
        gguf::TensorInfo info = t;
        if (v.reshape) v.reshape(info);
        const uint8_t * data = r->tensor_data(t);
        const size_t have = t.nbytes;
        w.add_tensor(info.name, info.type, info.n_dims, info.ne, [data, have](uint8_t * out, size_t n) {
            std::memset(out, 0, n);
            std::memcpy(out, data, std::min(n, have));
        });
    }
    if (v.extra) v.extra(w);
    w.write(dst);  // the reader's mapping is still alive here: the fill callbacks read from it
}

struct ToolResult {
    int exit_code;
    std::string out;   // stdout
    std::string err;   // stderr
};

inline std::string slurp(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Runs RP_BIN_DIR/<tool> with `args` (already shell-quoted where needed).
inline ToolResult run_tool(const std::string & tool, const std::string & args) {
    TempDir d;
    const std::string out = d.file("out"), err = d.file("err");
    const std::string cmd = std::string(RP_BIN_DIR) + "/" + tool + " " + args + " > " + out + " 2> " + err;
    const int st = std::system(cmd.c_str());
    ToolResult r;
    r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
}

// A small random qwen3moe model (4 experts, 2 per token, 2 layers, 96 token rows, no tokenizer) at path.
inline std::unique_ptr<rp::Model> write_tiny_moe(const std::string & path) {
    rp::SynthSpec s;
    s.arch = "qwen3moe";
    s.n_vocab = 96;
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 8, s.n_ff = 48, s.n_layer = 2;
    s.n_expert = 4, s.n_expert_used = 2, s.n_ff_exp = 16;
    rp::write_synth_model(s, path);
    return rp::Model::load(path);
}

} // namespace models_test
