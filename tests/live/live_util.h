// Helpers for the live llama.cpp comparisons: model paths, seeded token sequences, running rp-oracle on a
// token list and reading back its logits, and the per-case comparison that prints the measured maxima.
#pragma once

#include "tests/oracle/oracle_run.h"

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace rp::live {

std::string shared_dir();
std::string model_path(const std::string & rel);  // shared/models/<rel>

// A fresh directory removed with its contents at scope exit.
struct TempDir {
    std::filesystem::path path;
    TempDir();
    ~TempDir();
    TempDir(const TempDir &) = delete;
    TempDir & operator=(const TempDir &) = delete;
    std::string file(const std::string & name) const { return (path / name).string(); }
};

// n ids drawn uniformly from [0, n_vocab) by mt19937_64(seed) (our own mapping, the same on every platform);
// first >= 0 replaces the first id (BOS for SentencePiece models).
std::vector<int32_t> random_tokens(uint64_t seed, int n, int n_vocab, int32_t first = -1);

// llama.cpp's logits for every position of `tokens`, row-major [position][n_vocab]. rp-oracle's --tokens mode
// evaluates exactly the ids given (no BOS is added); the "tokens(N):" line it prints is checked against them
// with gtest assertions, so callers check HasFatalFailure() / an empty result.
std::vector<float> oracle_logits(const std::string & model, const std::vector<int32_t> & tokens, int n_vocab);

// Our engine's logits for every position, one batch through a fresh single-threaded InferenceSession.
std::vector<float> our_logits(const std::string & model, const std::vector<int32_t> & tokens);

struct Diff {
    float max_abs = 0;   // max |ours - oracle|
    float range = 0;     // max - min of the oracle's logits
    int argmax_agree = 0;
    int n_pos = 0;
};
Diff compare(const std::vector<float> & ours, const std::vector<float> & ref, int n_vocab);

// Runs both on `tokens`, prints one line with the measured maximum, and expects max |Δ| <= tol_abs +
// tol_rel * range (F32 files: tol_rel = 1e-4, tol_abs = 0; other files: an absolute bound).
void check_case(const std::string & label, const std::string & model, const std::vector<int32_t> & tokens,
                int n_vocab, float tol_abs, float tol_rel);

} // namespace rp::live
