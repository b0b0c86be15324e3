// KL divergence between a model and a base model's saved predictions, as llama-perplexity computes it
// (--kl-divergence-base / --kl-divergence), in its file format, so that a file saved by either program can
// be compared by the other.
//
// The base file ("_logits_", u32 n_ctx, i32 n_vocab, i32 n_chunk, n_chunk * n_ctx i32 tokens, then per chunk
// the scored positions' log-probabilities) stores each scored position in 2 bytes per vocabulary entry
// instead of 4: a row of `log_prob_row_u16(n_vocab)` uint16 — f32 scale and f32 offset, then log p of every
// token mapped linearly onto [max log p - 16, max log p] in 65536 steps (entries below the window read as
// its bottom). So the base's log p is known to 16/65535/2 = 1.2e-4 nats. Scored positions are those of
// perplexity's chunks: [n_ctx/2, n_ctx - 1) of each n_ctx-token chunk whose first token is BOS.
//
// Per position, with p the base's distribution (from the row) and q the model's (from its logits):
//   KL  = sum over tokens with log p > -16 of p (log p - log q)
//   nll = -log q(next token), nll_base = -log p(next token), dp = q(next) - p(next), same top = argmax p == argmax q.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rp {

// uint16 per stored row: 4 for the two floats, the vocabulary rounded up to even.
inline int64_t log_prob_row_u16(int64_t n_vocab) { return 2 * ((n_vocab + 1) / 2) + 4; }

// Writes one row for `logits` (n_vocab floats) into `row`; returns -log softmax(logits)[next] (llama.cpp's
// float/double mix: max and min in f32, sum of expf in double).
double encode_log_probs(const float * logits, int64_t n_vocab, int32_t next, uint16_t * row);
// log p of token i from a row.
float row_log_prob(const uint16_t * row, int64_t i);

struct KlStats {
    int64_t count = 0;
    double ppl = 0, ppl_unc = 0;                // the model's perplexity on the scored positions
    double ppl_base = 0, ppl_base_unc = 0;
    double ln_ppl_ratio = 0, ln_ppl_ratio_unc = 0;  // mean ln(PPL(Q)/PPL(base)) with its correlated error
    double ppl_diff = 0, ppl_diff_unc = 0;      // PPL(Q) - PPL(base)
    double cor_ln_ppl = 0;                      // correlation of the two log-perplexities
    double kld = 0, kld_unc = 0;                // mean KL and its standard error
    double kld_median = 0, kld_max = 0, kld_min = 0, kld_p99 = 0, kld_p999 = 0, kld_p90 = 0;
    double dp_mean = 0, dp_mean_unc = 0, dp_rms = 0, dp_rms_unc = 0, dp_max = 0, dp_min = 0, dp_median = 0;
    double same_top = 0, same_top_unc = 0;      // fraction of positions whose most likely token agrees
};

// Accumulates positions; the statistics of llama-perplexity's KL report (same estimators, same errors).
class KlAccumulator {
public:
    // One position: the model's logits, the base's row, the next token. Returns this position's KL.
    double add(const float * logits, int64_t n_vocab, const uint16_t * base_row, int32_t next);
    KlStats stats() const;
    int64_t count() const { return count_; }

private:
    double sum_nll_ = 0, sum_nll2_ = 0, sum_nll_base_ = 0, sum_nll_base2_ = 0, sum_nll_nll_base_ = 0;
    double sum_kld_ = 0, sum_kld2_ = 0, sum_dp_ = 0, sum_dp2_ = 0, sum_dp4_ = 0;
    int64_t n_same_top_ = 0, count_ = 0;
    std::vector<float> kld_, dp_;
};

// The base file, read whole (its size is 8 + 12 + 4 * tokens + 2 * rows * row length bytes). Throws
// rp::Error naming the file for a bad magic, a truncated file or inconsistent sizes.
struct KlBaseFile {
    uint32_t n_ctx = 0;
    int32_t n_vocab = 0, n_chunk = 0;
    std::vector<int32_t> tokens;  // n_chunk * n_ctx, as saved (the first of each chunk not yet BOS)
    std::vector<uint16_t> rows;   // n_chunk * (n_ctx - 1 - n_ctx / 2) rows

    int64_t rows_per_chunk() const { return static_cast<int64_t>(n_ctx) - 1 - static_cast<int64_t>(n_ctx) / 2; }
    const uint16_t * row(int64_t chunk, int64_t j) const {
        return rows.data() + static_cast<size_t>((chunk * rows_per_chunk() + j) * log_prob_row_u16(n_vocab));
    }
    static KlBaseFile read(const std::string & path);
};

// Writes a base file: header and tokens at construction, rows as they come; commit() renames the temporary
// file into place (nothing at `path` before, and nothing if the object is destroyed without commit()).
class KlBaseWriter {
public:
    KlBaseWriter(const std::string & path, uint32_t n_ctx, int32_t n_vocab, const std::vector<int32_t> & tokens);
    ~KlBaseWriter();
    KlBaseWriter(const KlBaseWriter &) = delete;
    KlBaseWriter & operator=(const KlBaseWriter &) = delete;
    void write_rows(const uint16_t * rows, int64_t n_rows);  // n_rows rows of log_prob_row_u16(n_vocab)
    void commit();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace rp
