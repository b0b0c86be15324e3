// kl_divergence.h: llama-perplexity's compact log-prob rows and KL statistics, written from its definitions
// (tools/perplexity/perplexity.cpp in the llama.cpp bundle). The float/double mix follows it where the
// stored bytes or the reported numbers depend on it.
#include "models/check/kl_divergence.h"

#include "base/atomic_file.h"
#include "base/error.h"
#include "ggml_rp/core/quant_block.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

namespace rp {

namespace {

struct MeanUnc {
    double mean = 0, unc = 0;
};

// Mean and standard error of the mean, the error 0 for 10 samples or fewer (llama-perplexity's rule).
MeanUnc mean_and_uncertainty(double sum, double sum2, int64_t count) {
    if (count < 1) return {};
    const double f = sum / static_cast<double>(count);
    double df = sum2 / static_cast<double>(count) - f * f;
    df = df > 0 && count > 10 ? std::sqrt(df / static_cast<double>(count - 1)) : 0.;
    return {f, df};
}

double covariance(double suma, double sumb, double sumab, int64_t count) {
    if (count < 10) return 0.0;
    const double n = static_cast<double>(count);
    return (sumab / n - (suma / n) * (sumb / n)) / (n - 1);
}

// Linear interpolation between the sorted values around fraction * (n - 1).
double percentile(const std::vector<float> & sorted, double fraction) {
    if (sorted.empty()) return 0;
    if (fraction <= 0) return sorted.front();
    if (fraction >= 1) return sorted.back();
    double p = fraction * static_cast<double>(sorted.size() - 1);
    const size_t ip = static_cast<size_t>(p);
    p -= static_cast<double>(ip);
    return (1 - p) * sorted[ip] + p * sorted[std::min(ip + 1, sorted.size() - 1)];
}

double median(const std::vector<float> & sorted) {
    if (sorted.empty()) return 0;
    const size_t n = sorted.size();
    return n % 2 == 0 ? 0.5f * (sorted[n / 2] + sorted[n / 2 - 1]) : sorted[n / 2];
}

} // namespace

double encode_log_probs(const float * logits, int64_t n_vocab, int32_t next, uint16_t * row) {
    float max_logit = logits[0], min_logit = logits[0];
    for (int64_t i = 1; i < n_vocab; ++i) {
        max_logit = std::max(max_logit, logits[i]);
        min_logit = std::min(min_logit, logits[i]);
    }
    min_logit = std::max(min_logit, max_logit - 16);
    double sum_exp = 0.0;
    for (int64_t i = 0; i < n_vocab; ++i) sum_exp += std::exp(logits[i] - max_logit);
    const float log_sum_exp = static_cast<float>(std::log(sum_exp));
    const float min_log_prob = min_logit - max_logit - log_sum_exp;
    const float scale = (max_logit - min_logit) / 65535.f;
    std::memcpy(row, &scale, sizeof scale);
    std::memcpy(row + 2, &min_log_prob, sizeof min_log_prob);
    uint16_t * q = row + 4;
    if (scale != 0) {
        const float inv_scale = 1 / scale;
        for (int64_t i = 0; i < n_vocab; ++i)
            q[i] = logits[i] > min_logit ? static_cast<uint16_t>(nearest_int(inv_scale * (logits[i] - min_logit))) : 0;
    } else {
        std::memset(q, 0, static_cast<size_t>(n_vocab) * sizeof(uint16_t));
    }
    if (n_vocab % 2) q[n_vocab] = 0;  // the padding entry (llama.cpp leaves it unwritten)
    return max_logit + log_sum_exp - logits[next];
}

float row_log_prob(const uint16_t * row, int64_t i) {
    float scale, min_log_prob;
    std::memcpy(&scale, row, sizeof scale);
    std::memcpy(&min_log_prob, row + 2, sizeof min_log_prob);
    return scale * row[4 + i] + min_log_prob;
}

double KlAccumulator::add(const float * logits, int64_t n_vocab, const uint16_t * base_row, int32_t next) {
    float max_logit = logits[0];
    int64_t imax = 0;
    for (int64_t i = 1; i < n_vocab; ++i) {
        if (logits[i] > max_logit) {
            max_logit = logits[i];
            imax = i;
        }
    }
    double sum_exp = 0.0;
    for (int64_t i = 0; i < n_vocab; ++i) sum_exp += std::exp(logits[i] - max_logit);
    const float log_sum_exp = static_cast<float>(std::log(sum_exp));
    float scale, min_log_prob;
    std::memcpy(&scale, base_row, sizeof scale);
    std::memcpy(&min_log_prob, base_row + 2, sizeof min_log_prob);
    const uint16_t * q = base_row + 4;

    const float nll = max_logit + log_sum_exp - logits[next];
    const float nll_base = -(scale * q[next] + min_log_prob);
    // Products in float, sums in double, as llama-perplexity: the same reported errors.
    sum_nll_ += nll;
    sum_nll2_ += nll * nll;
    sum_nll_base_ += nll_base;
    sum_nll_base2_ += nll_base * nll_base;
    sum_nll_nll_base_ += nll * nll_base;

    const float log_norm = max_logit + log_sum_exp;  // log q_i = logits[i] - log_norm
    double kl = 0;
    int64_t imax_base = -1;
    float p_log_base_max = 0;
    for (int64_t i = 0; i < n_vocab; ++i) {
        const float p_log_base = scale * q[i] + min_log_prob;
        if (i == 0 || p_log_base > p_log_base_max) {
            p_log_base_max = p_log_base;
            imax_base = i;
        }
        if (p_log_base > -16.f) kl += std::exp(p_log_base) * (p_log_base - logits[i] + log_norm);
    }
    sum_kld_ += kl;
    sum_kld2_ += kl * kl;
    ++count_;
    if (imax == imax_base) ++n_same_top_;

    const float dp = std::exp(-nll) - std::exp(-nll_base);
    sum_dp_ += dp;
    const double dp2 = dp * dp;
    sum_dp2_ += dp2;
    sum_dp4_ += dp2 * dp2;
    kld_.push_back(static_cast<float>(kl));
    dp_.push_back(dp);
    return kl;
}

KlStats KlAccumulator::stats() const {
    KlStats s;
    s.count = count_;
    if (count_ == 0) return s;
    const MeanUnc lp = mean_and_uncertainty(sum_nll_, sum_nll2_, count_);
    const MeanUnc lpb = mean_and_uncertainty(sum_nll_base_, sum_nll_base2_, count_);
    s.ppl = std::exp(lp.mean), s.ppl_unc = s.ppl * lp.unc;
    s.ppl_base = std::exp(lpb.mean), s.ppl_base_unc = s.ppl_base * lpb.unc;
    const double cov = covariance(sum_nll_, sum_nll_base_, sum_nll_nll_base_, count_);
    s.cor_ln_ppl = lp.unc > 0 && lpb.unc > 0 ? cov / (lp.unc * lpb.unc) : 0;
    s.ln_ppl_ratio = lp.mean - lpb.mean;
    s.ln_ppl_ratio_unc = std::sqrt(std::max(0.0, lp.unc * lp.unc + lpb.unc * lpb.unc - 2.0 * cov));
    s.ppl_diff = s.ppl - s.ppl_base;
    s.ppl_diff_unc = std::sqrt(std::max(0.0, s.ppl_unc * s.ppl_unc + s.ppl_base_unc * s.ppl_base_unc - 2.0 * s.ppl * s.ppl_base * cov));
    const MeanUnc kl = mean_and_uncertainty(sum_kld_, sum_kld2_, count_);
    s.kld = kl.mean, s.kld_unc = kl.unc;
    std::vector<float> k = kld_, d = dp_;
    std::sort(k.begin(), k.end());
    std::sort(d.begin(), d.end());
    s.kld_median = median(k), s.kld_max = k.back(), s.kld_min = k.front();
    s.kld_p90 = percentile(k, 0.90), s.kld_p99 = percentile(k, 0.99), s.kld_p999 = percentile(k, 0.999);
    const MeanUnc dpm = mean_and_uncertainty(sum_dp_, sum_dp2_, count_);
    s.dp_mean = dpm.mean, s.dp_mean_unc = dpm.unc;
    const MeanUnc mse = mean_and_uncertainty(sum_dp2_, sum_dp4_, count_);
    s.dp_rms = std::sqrt(mse.mean);
    s.dp_rms_unc = s.dp_rms > 0 ? 0.5 / s.dp_rms * mse.unc : 0;
    s.dp_max = d.back(), s.dp_min = d.front(), s.dp_median = median(d);
    s.same_top = static_cast<double>(n_same_top_) / static_cast<double>(count_);
    s.same_top_unc = count_ > 1 ? std::sqrt(s.same_top * (1.0 - s.same_top) / static_cast<double>(count_ - 1)) : 0;
    return s;
}

KlBaseFile KlBaseFile::read(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open");
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});
    KlBaseFile f;
    const size_t header = 8 + 4 + 4 + 4;
    if (bytes.size() < header || bytes.compare(0, 8, "_logits_") != 0)
        throw Error(path + ": not a log-probability file (no \"_logits_\" magic; write one with --kl-divergence-base)");
    std::memcpy(&f.n_ctx, bytes.data() + 8, 4);
    std::memcpy(&f.n_vocab, bytes.data() + 12, 4);
    std::memcpy(&f.n_chunk, bytes.data() + 16, 4);
    if (f.n_ctx < 4 || f.n_vocab < 1 || f.n_chunk < 1)
        throw Error(path + ": bad header (n_ctx " + std::to_string(f.n_ctx) + ", n_vocab " + std::to_string(f.n_vocab) +
                    ", n_chunk " + std::to_string(f.n_chunk) + ")");
    const uint64_t n_tokens = static_cast<uint64_t>(f.n_ctx) * static_cast<uint64_t>(f.n_chunk);
    const uint64_t n_rows = static_cast<uint64_t>(f.rows_per_chunk()) * static_cast<uint64_t>(f.n_chunk);
    const uint64_t want = header + 4 * n_tokens + 2 * n_rows * static_cast<uint64_t>(log_prob_row_u16(f.n_vocab));
    if (bytes.size() != want)
        throw Error(path + ": " + std::to_string(bytes.size()) + " bytes, but its header (n_ctx " + std::to_string(f.n_ctx) +
                    ", n_vocab " + std::to_string(f.n_vocab) + ", " + std::to_string(f.n_chunk) + " chunks) needs " +
                    std::to_string(want) + (bytes.size() < want ? " (truncated)" : ""));
    f.tokens.resize(static_cast<size_t>(n_tokens));
    std::memcpy(f.tokens.data(), bytes.data() + header, 4 * f.tokens.size());
    for (int32_t t : f.tokens)
        if (t < 0 || t >= f.n_vocab) throw Error(path + ": token id " + std::to_string(t) + " outside the vocabulary of " + std::to_string(f.n_vocab));
    f.rows.resize(static_cast<size_t>(n_rows * static_cast<uint64_t>(log_prob_row_u16(f.n_vocab))));
    std::memcpy(f.rows.data(), bytes.data() + header + 4 * n_tokens, 2 * f.rows.size());
    return f;
}

struct KlBaseWriter::Impl {
    AtomicFile file;
    int64_t row_u16;
    Impl(const std::string & p, int32_t n_vocab) : file(p), row_u16(log_prob_row_u16(n_vocab)) {}
};

KlBaseWriter::KlBaseWriter(const std::string & path, uint32_t n_ctx, int32_t n_vocab, const std::vector<int32_t> & tokens)
    : impl_(std::make_unique<Impl>(path, n_vocab)) {
    const int32_t n_chunk = static_cast<int32_t>(tokens.size() / n_ctx);
    impl_->file.write("_logits_", 8);
    impl_->file.write(&n_ctx, 4);
    impl_->file.write(&n_vocab, 4);
    impl_->file.write(&n_chunk, 4);
    impl_->file.write(tokens.data(), static_cast<size_t>(n_chunk) * n_ctx * sizeof(int32_t));
}

KlBaseWriter::~KlBaseWriter() = default;

void KlBaseWriter::write_rows(const uint16_t * rows, int64_t n_rows) {
    impl_->file.write(rows, static_cast<size_t>(n_rows * impl_->row_u16) * sizeof(uint16_t));
}

void KlBaseWriter::commit() { impl_->file.commit(); }

} // namespace rp
