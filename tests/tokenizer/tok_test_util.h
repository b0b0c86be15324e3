// Shared helpers of the tokenizer tests: paths into shared/models, file reading, the .inp/.out fixture
// format, and one loaded Tokenizer per vocabulary for the whole program (the big ones take a moment).
#pragma once

#include "tests/common/shared_paths.h"
#include "gguf/gguf.h"
#include "models/text/tokenizer.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace tok_test {

using rp_test::shared_dir;
using rp_test::models_dir;

// Whether this runs in CI (CI=true or 1), where a missing oracle or peer fails a test instead of skipping it.
inline bool in_ci() {
    const char * ci = std::getenv("CI");
    return ci && (std::string(ci) == "true" || std::string(ci) == "1");
}

// A test that needs an external reference (llama.cpp's oracle, tokenizers.js): skips without it, fails in CI.
#define TOK_NEED(available, what)                                                                   \
    do {                                                                                            \
        if (!(available)) {                                                                         \
            if (tok_test::in_ci()) FAIL() << what << " not available in CI (scripts/fetch-oracle.sh, then reconfigure)"; \
            GTEST_SKIP() << what << " not available (run scripts/fetch-oracle.sh, then reconfigure)"; \
        }                                                                                           \
    } while (0)

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

// Pieces of text random test strings are made of: letters, digits, every whitespace and punctuation class,
// contractions, non-Latin scripts, marks, emoji, malformed UTF-8, special-token texts.
inline const char * const kPieces[] = {
    "a", "b", "Hello", " world", "the", "I", "M", "s", "re", "ve", "ll", "d", "t", "x", "Z", "q", "ABC", "camelCase", "eS",
    "0", "1", "2", "3", "45", "678", "9999", " ", "  ", "   ", "\t", "\n", "\r", "\r\n", "\n\n", " \n", "\v", "\f",
    "'", "'s", "'S", "'re", "'RE", "'ll", "'Ll", "'d", "'t", "'m", "'ve", "'x", "''",
    "!", "?", ".", ",", ";", ":", "-", "_", "(", ")", "[", "]", "{", "}", "<", ">", "=", "+", "$", "^", "~", "|",
    "`", "@", "#", "%", "&", "*", "/", "\\", "\"",
    "\xc3\xa9", "\xc3\x84", "\xd0\x96", "\xd0\xb8", "\xe4\xb8\x80", "\xe6\x88\x91", "\xe1\x9e\x80", "\xe1\x9e\xb6",
    "\xcc\x81", "\xe2\x80\x8d", "\xc2\xbd", "\xc2\xb2", "\xd9\xa3", "\xe2\x85\xa0", "\xc2\xa0", "\xe3\x80\x80",
    "\xe2\x80\xa8", "\xc2\x85", "\xe3\x80\x81", "\xef\xbd\x9e", "\xf0\x9f\xa6\x99", "\xf0\x9f\x98\x81", "\xe2\x9c\x85",
    "\xef\xb8\x8f", "\xe2\x82\xac", "\xe2\x96\x81",
    "\x80", "\xc3", "\xff", "\xe4\xb8", "\x01", "\x7f",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "[PAD151700]", "<|eot_id|>",
    "<|begin_of_text|>", "<|start_header_id|>", "<|", "<|user|>", "<|end|>", "<|assistant|>",
};

// A copy of the vocabulary `src` with its keys edited by `edit` (in the test's temp dir, named after `name`).
inline std::string with_kvs(const std::string & src, const std::string & name, const std::function<void(gguf::Writer &)> & edit) {
    const auto r = gguf::Reader::open(src);
    gguf::Writer w;
    gguf::copy_kvs(*r, w);
    edit(w);
    const std::string path = ::testing::TempDir() + "/rp_tok_" + name + "." + std::to_string(getpid()) + ".gguf";
    w.write(path);
    return path;
}

// A copy of a vocabulary with another tokenizer.ggml.pre ("" removes the key).
inline std::string with_pre(const std::string & src, const std::string & pre, const std::string & name) {
    return with_kvs(src, name, [&](gguf::Writer & w) {
        if (pre.empty()) {
            w.remove("tokenizer.ggml.pre");
        } else {
            w.set_string("tokenizer.ggml.pre", pre);
        }
    });
}

// The SentencePiece fixture named like Phi-3 (general.name), whose last five tokens are Phi-3's chat markers as
// control tokens: llama.cpp absorbs the whitespace after them (but <unk>, <s> and <|endoftext|>) and after </s>.
inline std::string phi3_vocab(const std::string & name) {
    const std::string src = models_dir() + "/vocab/ggml-vocab-llama-spm.gguf";
    const auto r = gguf::Reader::open(src);
    std::vector<std::string> tokens = r->get_string_array("tokenizer.ggml.tokens");
    const std::vector<int64_t> types64 = r->get_int_array("tokenizer.ggml.token_type");
    std::vector<int32_t> types(types64.begin(), types64.end());
    const char * markers[] = {"<|endoftext|>", "<|user|>", "<|end|>", "<|assistant|>", "<|system|>"};
    for (size_t i = 0; i < 5; ++i) {
        tokens[tokens.size() - 5 + i] = markers[i];
        types[types.size() - 5 + i] = 3;  // CONTROL
    }
    return with_kvs(src, name, [&](gguf::Writer & w) {
        w.set_string("general.name", "Phi-3-mini-4k-instruct");
        w.set_string_array("tokenizer.ggml.tokens", tokens);
        w.set_i32_array("tokenizer.ggml.token_type", types);
    });
}

inline const rp::Tokenizer & vocab(const std::string & name) {
    return *load_cached(models_dir() + "/vocab/ggml-vocab-" + name + ".gguf").tok;
}

} // namespace tok_test
