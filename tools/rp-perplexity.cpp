// rp-perplexity: perplexity of a GGUF model on a text file, computed the way llama-perplexity does it so
// the numbers can be compared (llama.cpp tools/perplexity/perplexity.cpp).
//
//   rp-perplexity -m MODEL.gguf -f FILE [-c CTX] [--stride S] [-b BATCH] [-t THREADS] [--lora A [--lora-scale S]]
//                 [--kl-divergence-base FILE [--kl-divergence]]
//
// The whole file is tokenized with BOS (when the vocabulary adds one). Default mode: chunk i is tokens
// [i*CTX, (i+1)*CTX) with its first token replaced by BOS, evaluated from an empty cache; the predictions of
// positions [CTX/2, CTX-1) (the second half, each with at least CTX/2 tokens of context) are scored.
// Prints the running perplexity after each chunk, "[1]x.xxxx,[2]...", and "Final estimate: PPL = X +/- Y".
// With --stride S (llama-perplexity --ppl-stride): windows of CTX tokens start at multiples of S, and the last
// S predictions of each window are scored. As in llama.cpp, those windows are evaluated as they are (its
// BOS substitution in that mode happens only after the evaluation, so it has no effect).
// --kl-divergence-base FILE saves the scored positions' log-probabilities (llama-perplexity's file format,
// models/kl_divergence.h); adding --kl-divergence reads FILE instead (its tokens and context; no -f) and
// reports the model's KL divergence from the saved one, the perplexity ratio and the top-token agreement.
#include "tools/perplexity_options.h"

#include "base/error.h"
#include "models/arch/hparams.h"
#include "models/arch/inference.h"
#include "models/check/kl_divergence.h"
#include "models/arch/model.h"
#include "models/text/tokenizer.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

// log p(tok) from one row of logits, as llama.cpp's log_softmax: max in f32, sum of expf in double.
double log_prob(const float * logits, int64_t n_vocab, int32_t tok) {
    float mx = logits[0];
    for (int64_t i = 1; i < n_vocab; ++i) mx = std::max(mx, logits[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(logits[i] - mx);
    return logits[tok] - mx - std::log(sum);
}

// All-position logits of `window`, evaluated from an empty cache in batches of at most n_batch tokens.
std::vector<float> eval_window(rp::InferenceSession & s, const std::vector<int32_t> & window, int64_t n_batch) {
    s.reset();
    std::vector<float> all;
    all.reserve(window.size() * static_cast<size_t>(s.n_vocab()));
    for (size_t b = 0; b < window.size(); b += static_cast<size_t>(n_batch)) {
        const size_t e = std::min(window.size(), b + static_cast<size_t>(n_batch));
        const std::vector<float> l = s.eval(std::vector<int32_t>(window.begin() + b, window.begin() + e), true);
        all.insert(all.end(), l.begin(), l.end());
    }
    return all;
}

using rp::cli::LoraArg;

// The model (with its adapters) that scores, and the chunk's first token (BOS when the vocabulary adds one).
struct Scorer {
    std::unique_ptr<rp::Model> model;
    std::unique_ptr<rp::Tokenizer> tok;
    std::unique_ptr<rp::cli::LoadedLoras> lora;
    std::unique_ptr<rp::InferenceSession> session;
    bool add_bos = false;

    Scorer(const std::string & path, const std::vector<LoraArg> & loras, int64_t n_ctx, long long threads)
        : model(rp::Model::load(path)), tok(std::make_unique<rp::Tokenizer>(model->file())), lora(rp::cli::load_loras(loras, *model)),
          session(std::make_unique<rp::InferenceSession>(*model, n_ctx, static_cast<int>(threads), lora->set())),
          add_bos(tok->add_bos() && tok->bos() != rp::kTokenNull) {}
    int64_t n_vocab() const { return session->n_vocab(); }
    // All-position logits of a chunk, its first token replaced by BOS.
    std::vector<float> chunk_logits(std::vector<int32_t> window, int64_t n_batch) {
        if (add_bos) window[0] = tok->bos();
        return eval_window(*session, window, n_batch);
    }
};

// --kl-divergence: the model against a saved base, chunk by chunk, printing llama-perplexity's table and
// its summary statistics.
int kl_divergence(const std::string & model_path, const std::string & base_path, const std::vector<LoraArg> & loras,
                  long long n_ctx_given, long long n_batch, long long threads) {
    const rp::KlBaseFile base = rp::KlBaseFile::read(base_path);
    const int64_t n_ctx = base.n_ctx;
    if (n_ctx_given && n_ctx_given != n_ctx)
        throw rp::Error(base_path + " was saved with a context of " + std::to_string(n_ctx) + " tokens, not -c " + std::to_string(n_ctx_given));
    Scorer scorer(model_path, loras, n_ctx, threads);
    const int64_t n_vocab = scorer.n_vocab();
    if (n_vocab != base.n_vocab)
        throw rp::Error(base_path + " holds a vocabulary of " + std::to_string(base.n_vocab) + " tokens, " + model_path + " has " +
                        std::to_string(n_vocab));
    if (n_batch == 0 || n_batch > n_ctx) n_batch = n_ctx;
    const int64_t first = n_ctx / 2;
    std::fprintf(stderr, "%d chunks of %lld tokens from %s, scoring positions [%lld, %lld) of each\n", base.n_chunk,
                 static_cast<long long>(n_ctx), base_path.c_str(), static_cast<long long>(first), static_cast<long long>(n_ctx - 1));
    std::printf("chunk        PPL          ln(PPL(Q)/PPL(base))      KL divergence           dp RMS            same top\n");
    rp::KlAccumulator acc;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t c = 0; c < base.n_chunk; ++c) {
        const std::vector<int32_t> window(base.tokens.begin() + c * n_ctx, base.tokens.begin() + (c + 1) * n_ctx);
        const std::vector<float> logits = scorer.chunk_logits(window, n_batch);
        for (int64_t j = first; j < n_ctx - 1; ++j)
            acc.add(logits.data() + j * n_vocab, n_vocab, base.row(c, j - first), window[j + 1]);
        const rp::KlStats s = acc.stats();
        std::printf("%4lld  %9.4f +/- %8.4f  %10.5f +/- %9.5f  %10.5f +/- %9.5f  %6.3f +/- %5.3f %%  %6.3f +/- %5.3f %%\n",
                    static_cast<long long>(c + 1), s.ppl, s.ppl_unc, s.ln_ppl_ratio, s.ln_ppl_ratio_unc, s.kld, s.kld_unc,
                    100 * s.dp_rms, 100 * s.dp_rms_unc, 100 * s.same_top, 100 * s.same_top_unc);
        std::fflush(stdout);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "\rchunk %lld/%d, %.1f s, ETA %.1f s ", static_cast<long long>(c + 1), base.n_chunk, secs,
                     secs / static_cast<double>(c + 1) * static_cast<double>(base.n_chunk - c - 1));
    }
    std::fprintf(stderr, "\n");
    const rp::KlStats s = acc.stats();
    std::printf("\n====== Perplexity statistics (%lld positions) ======\n", static_cast<long long>(s.count));
    std::printf("Mean PPL(Q)                   : %10.6f +/- %10.6f\n", s.ppl, s.ppl_unc);
    std::printf("Mean PPL(base)                : %10.6f +/- %10.6f\n", s.ppl_base, s.ppl_base_unc);
    std::printf("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n", 100 * s.cor_ln_ppl);
    std::printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f +/- %10.6f\n", s.ln_ppl_ratio, s.ln_ppl_ratio_unc);
    std::printf("Mean PPL(Q)/PPL(base)         : %10.6f +/- %10.6f\n", std::exp(s.ln_ppl_ratio), std::exp(s.ln_ppl_ratio) * s.ln_ppl_ratio_unc);
    std::printf("Mean PPL(Q)-PPL(base)         : %10.6f +/- %10.6f\n", s.ppl_diff, s.ppl_diff_unc);
    std::printf("\n====== KL divergence statistics ======\n");
    std::printf("Mean    KLD: %10.6f +/- %10.6f\n", s.kld, s.kld_unc);
    std::printf("Maximum KLD: %10.6f\n99.9%%   KLD: %10.6f\n99.0%%   KLD: %10.6f\n90.0%%   KLD: %10.6f\n", s.kld_max, s.kld_p999,
                s.kld_p99, s.kld_p90);
    std::printf("Median  KLD: %10.6f\nMinimum KLD: %10.6f\n", s.kld_median, s.kld_min);
    std::printf("\n====== Token probability statistics ======\n");
    std::printf("Mean    dp: %6.3f +/- %5.3f %%\n", 100 * s.dp_mean, 100 * s.dp_mean_unc);
    std::printf("Maximum dp: %6.3f%%\nMedian  dp: %6.3f%%\nMinimum dp: %6.3f%%\n", 100 * s.dp_max, 100 * s.dp_median, 100 * s.dp_min);
    std::printf("RMS dp    : %6.3f +/- %5.3f %%\n", 100 * s.dp_rms, 100 * s.dp_rms_unc);
    std::printf("Same top p: %6.3f +/- %5.3f %%\n", 100 * s.same_top, 100 * s.same_top_unc);
    if (std::fflush(stdout) != 0) throw rp::Error("cannot write to standard output");
    return 0;
}

} // namespace

int main(int argc, char ** argv) {
    try {
        rp::cli::PerplexitySettings s;
        rp::cli::Options opts("rp-perplexity", "usage: rp-perplexity -m MODEL.gguf -f FILE [options]");
        rp::cli::declare_perplexity_options(opts, s);
        if (!opts.parse(argc, argv)) return 0;
        s.validate();
        const std::string & model_path = s.model_path, & file = s.text_file, & kl_base = s.kl_base;
        const std::vector<LoraArg> & loras = s.loras;
        const long long n_ctx = s.context(), stride = s.stride, threads = s.threads;
        if (s.kl_divergence) return kl_divergence(model_path, kl_base, loras, s.n_ctx.value_or(0), s.n_batch, threads);
        const long long n_batch = s.n_batch == 0 || s.n_batch > n_ctx ? n_ctx : s.n_batch;

        const std::string text = rp::cli::read_file(file);
        Scorer scorer(model_path, loras, n_ctx, threads);
        const int64_t n_vocab = scorer.n_vocab();

        const std::vector<int32_t> tokens = scorer.tok->encode(text, true, false);
        const int64_t N = static_cast<int64_t>(tokens.size());
        if (N < 2 * n_ctx)
            throw rp::Error(file + " tokenizes to " + std::to_string(N) + " tokens; a context of " + std::to_string(n_ctx) +
                            " (-c) needs at least " + std::to_string(2 * n_ctx));

        const auto t0 = std::chrono::steady_clock::now();
        double nll = 0.0, nll2 = 0.0;
        int64_t count = 0;
        if (stride == 0) {
            const int64_t n_chunk = N / n_ctx, first = n_ctx / 2;
            std::fprintf(stderr, "%lld tokens, %lld chunks of %lld, scoring positions [%lld, %lld) of each\n",
                         static_cast<long long>(N), static_cast<long long>(n_chunk), n_ctx,
                         static_cast<long long>(first), n_ctx - 1);
            std::unique_ptr<rp::KlBaseWriter> base_out;
            std::vector<uint16_t> rows;
            if (!kl_base.empty()) {
                base_out = std::make_unique<rp::KlBaseWriter>(kl_base, static_cast<uint32_t>(n_ctx), static_cast<int32_t>(n_vocab),
                                                              std::vector<int32_t>(tokens.begin(), tokens.begin() + n_chunk * n_ctx));
                rows.resize(static_cast<size_t>((n_ctx - 1 - first) * rp::log_prob_row_u16(n_vocab)));
            }
            for (int64_t i = 0; i < n_chunk; ++i) {
                std::vector<int32_t> window(tokens.begin() + i * n_ctx, tokens.begin() + (i + 1) * n_ctx);
                const std::vector<float> logits = scorer.chunk_logits(window, n_batch);
                for (int64_t j = first; j < n_ctx - 1; ++j) {
                    const float * row_logits = logits.data() + j * n_vocab;
                    const double v = base_out ? rp::encode_log_probs(row_logits, n_vocab, window[j + 1],
                                                                     rows.data() + (j - first) * rp::log_prob_row_u16(n_vocab))
                                              : -log_prob(row_logits, n_vocab, window[j + 1]);
                    nll += v;
                    nll2 += v * v;
                    ++count;
                }
                if (base_out) base_out->write_rows(rows.data(), n_ctx - 1 - first);
                std::printf("[%lld]%.4lf,", static_cast<long long>(i + 1), std::exp(nll / static_cast<double>(count)));
                std::fflush(stdout);
            }
            std::printf("\n");
            if (base_out) {
                base_out->commit();
                std::fprintf(stderr, "saved the log-probabilities of %lld positions to %s\n", static_cast<long long>(count), kl_base.c_str());
            }
            const double mean = nll / static_cast<double>(count);
            const double ppl = std::exp(mean);
            double var = nll2 / static_cast<double>(count) - mean * mean;
            if (var > 0 && count > 1) {
                const double err = std::sqrt(var / static_cast<double>(count - 1));
                std::printf("Final estimate: PPL = %.4lf +/- %.5lf\n", ppl, err * ppl);
            } else {
                std::printf("Final estimate: PPL = %.4lf\n", ppl);
            }
        } else {
            const int64_t n_chunk = (N - n_ctx + stride - 1) / stride;
            std::fprintf(stderr, "%lld tokens, %lld windows of %lld every %lld tokens, scoring the last %lld predictions of each\n",
                         static_cast<long long>(N), static_cast<long long>(n_chunk), n_ctx, stride, stride);
            for (int64_t i = 0; i < n_chunk; ++i) {
                const int64_t start = i * stride;
                const std::vector<int32_t> window(tokens.begin() + start, tokens.begin() + start + n_ctx);
                const std::vector<float> logits = eval_window(*scorer.session, window, n_batch);
                for (int64_t j = n_ctx - stride - 1; j < n_ctx - 1; ++j) {
                    nll += -log_prob(logits.data() + j * n_vocab, n_vocab, window[j + 1]);
                    ++count;
                }
                std::printf("[%lld]%.4lf,", static_cast<long long>(i + 1), std::exp(nll / static_cast<double>(count)));
                std::fflush(stdout);
            }
            std::printf("\nFinal estimate: PPL = %.4lf\n", std::exp(nll / static_cast<double>(count)));
        }
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "%lld predictions scored in %.2f s\n", static_cast<long long>(count), secs);
        if (std::fflush(stdout) != 0) throw rp::Error("cannot write to standard output");
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
