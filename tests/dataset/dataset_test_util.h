// Shared helpers of the dataset tests: paths into shared/models and one loaded tokenizer per vocabulary.
#pragma once

#include "tests/common/reference_prompts.h"
#include "tests/common/shared_paths.h"
#include "base/error.h"
#include "models/data/dataset.h"
#include "models/text/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace ds_test {

using rp_test::shared_dir;
using rp_test::models_dir;

inline std::string read_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in.good()) << "cannot open " << path;
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// stories260K: SentencePiece, 512 tokens, BOS 1 added, EOS 2, no pad token.
inline const rp::Tokenizer & stories() {
    static std::unique_ptr<rp::Tokenizer> t = rp::Tokenizer::load(models_dir() + "/stories260K.gguf");
    return *t;
}

// The synthetic Qwen2 vocabulary: byte-level BPE, 269 tokens, <|im_start|> 267, <|im_end|> 268.
inline const rp::Tokenizer & qwen() {
    static std::unique_ptr<rp::Tokenizer> t = rp::Tokenizer::load(models_dir() + "/synthetic/tiny-random-qwen2.gguf");
    return *t;
}

inline std::vector<int32_t> row(std::span<const int32_t> s) { return {s.begin(), s.end()}; }

// The message of the rp::Error that f throws ("" and a test failure when it throws none).
template <class F>
std::string error_of(F && f) {
    try {
        f();
    } catch (const rp::Error & e) {
        return e.what();
    }
    ADD_FAILURE() << "no rp::Error thrown";
    return "";
}

using rp_test::kPrompt1;  // tests/common/reference_prompts.h
constexpr int32_t kBos = 1, kEos = 2;
constexpr int32_t X = rp::kIgnoreLabel;

} // namespace ds_test
