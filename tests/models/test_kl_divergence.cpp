// KL divergence (models/kl_divergence.h, rp-perplexity --kl-divergence-base / --kl-divergence):
//   - the compact rows hold every log p within the window to half a step (16/65535/2 nats);
//   - the accumulator equals the definition computed here in double from the same rows;
//   - a model against its own saved base: KL 0 up to the rows' rounding, PPL ratio 1, the same top token;
//   - a model with an adapter against the base: our KL equals the KL computed in double from llama.cpp's
//     logits (rp-oracle) of the two models on the same chunks;
//   - bad input (a truncated or foreign file, another vocabulary, a missing base) fails naming it, and a
//     failed save leaves no file.
#include "models_test_util.h"

#include "models/check/kl_divergence.h"
#include "models/text/tokenizer.h"
#include "tests/oracle/oracle_run.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

using namespace models_test;

namespace {

const std::string kTrain = ref_path("train.txt");
const std::string kAdapter = ref_path("lora/stories260K-lora-r4-a8.gguf");
constexpr double kHalfStep = 16.0 / 65535.0 / 2.0;  // the rows' rounding of log p

double value_after(const std::string & out, const std::string & key) {
    const size_t p = out.find(key);
    if (p == std::string::npos) return NAN;
    return std::stod(out.substr(p + key.size()));
}

// log softmax in double.
std::vector<double> log_softmax(const float * l, int64_t n) {
    double mx = l[0];
    for (int64_t i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(l[i]));
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += std::exp(l[i] - mx);
    std::vector<double> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = l[i] - mx - std::log(s);
    return out;
}

} // namespace

TEST(KlDivergence, RowsHoldLogProbsToHalfAStep) {
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.0f, 4.0f);
    for (int64_t n : {2, 7, 512, 1001}) {
        std::vector<float> logits(static_cast<size_t>(n));
        for (float & x : logits) x = g(rng);
        std::vector<uint16_t> row(static_cast<size_t>(rp::log_prob_row_u16(n)), 0xAAAA);
        const double nll = rp::encode_log_probs(logits.data(), n, 1, row.data());
        const std::vector<double> lp = log_softmax(logits.data(), n);
        EXPECT_NEAR(nll, -lp[1], 1e-5);
        const double top = *std::max_element(lp.begin(), lp.end());
        for (int64_t i = 0; i < n; ++i) {
            const double want = std::max(lp[static_cast<size_t>(i)], top - 16.0);  // below the window: its bottom
            ASSERT_NEAR(rp::row_log_prob(row.data(), i), want, kHalfStep + 1e-5 * std::fabs(want)) << "n " << n << " token " << i;
        }
    }
    // All logits equal: scale 0, every token log(1/n).
    std::vector<float> flat(10, 2.5f);
    std::vector<uint16_t> row(static_cast<size_t>(rp::log_prob_row_u16(10)));
    rp::encode_log_probs(flat.data(), 10, 0, row.data());
    for (int i = 0; i < 10; ++i) EXPECT_NEAR(rp::row_log_prob(row.data(), i), std::log(0.1), 1e-6);
}

TEST(KlDivergence, AccumulatorEqualsTheDefinitionInDouble) {
    std::mt19937 rng(11);
    std::normal_distribution<float> g(0.0f, 3.0f);
    const int64_t n = 300, positions = 200;
    rp::KlAccumulator acc;
    double sum_kl = 0, sum_nll = 0, sum_nll_base = 0;
    int same = 0;
    std::vector<double> kls;
    for (int64_t p = 0; p < positions; ++p) {
        std::vector<float> base(static_cast<size_t>(n)), model(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
            base[static_cast<size_t>(i)] = g(rng);
            model[static_cast<size_t>(i)] = base[static_cast<size_t>(i)] + 0.3f * g(rng);
        }
        const int32_t next = static_cast<int32_t>(p % n);
        std::vector<uint16_t> row(static_cast<size_t>(rp::log_prob_row_u16(n)));
        rp::encode_log_probs(base.data(), n, next, row.data());
        const double kl = acc.add(model.data(), n, row.data(), next);
        // The definition, in double, from the same row.
        const std::vector<double> lq = log_softmax(model.data(), n);
        double ref = 0;
        int64_t top_p = 0, top_q = 0;
        for (int64_t i = 0; i < n; ++i) {
            const double lpb = rp::row_log_prob(row.data(), i);
            if (lpb > -16) ref += std::exp(lpb) * (lpb - lq[static_cast<size_t>(i)]);
            if (lpb > rp::row_log_prob(row.data(), top_p)) top_p = i;
            if (lq[static_cast<size_t>(i)] > lq[static_cast<size_t>(top_q)]) top_q = i;
        }
        ASSERT_NEAR(kl, ref, 1e-6 * std::max(1.0, ref)) << "position " << p;
        sum_kl += ref;
        sum_nll += -lq[static_cast<size_t>(next)];
        sum_nll_base += -rp::row_log_prob(row.data(), next);
        same += top_p == top_q;
        kls.push_back(ref);
    }
    const rp::KlStats s = acc.stats();
    EXPECT_EQ(s.count, positions);
    EXPECT_NEAR(s.kld, sum_kl / positions, 1e-7);
    EXPECT_NEAR(std::log(s.ppl), sum_nll / positions, 1e-6);
    EXPECT_NEAR(s.ln_ppl_ratio, (sum_nll - sum_nll_base) / positions, 1e-6);
    EXPECT_NEAR(s.same_top, static_cast<double>(same) / positions, 1e-12);
    std::sort(kls.begin(), kls.end());
    EXPECT_NEAR(s.kld_max, kls.back(), 1e-6);
    EXPECT_NEAR(s.kld_median, 0.5 * (kls[99] + kls[100]), 1e-6);
    EXPECT_GT(s.kld_unc, 0);
}

TEST(KlDivergence, AModelAgainstItselfIsZero) {
    TempDir d;
    const std::string base = d.file("base.kld");
    const ToolResult save = run_tool("rp-perplexity", "-m " + stories() + " -f " + kTrain + " -c 128 -t 1 --kl-divergence-base " + base);
    ASSERT_EQ(save.exit_code, 0) << save.err;
    const ToolResult r = run_tool("rp-perplexity", "-m " + stories() + " -t 1 --kl-divergence-base " + base + " --kl-divergence");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // The only difference is the rows' rounding of log p (|e| <= half a step): |KL| <= half a step per
    // position, and its mean far below (the roundings have both signs).
    EXPECT_LE(std::fabs(value_after(r.out, "Mean    KLD:")), 2e-6) << r.out;
    EXPECT_LE(value_after(r.out, "Maximum KLD:"), kHalfStep) << r.out;
    EXPECT_GE(value_after(r.out, "Minimum KLD:"), -kHalfStep) << r.out;
    EXPECT_NEAR(value_after(r.out, "Mean PPL(Q)/PPL(base)         :"), 1.0, 1e-5) << r.out;
    EXPECT_EQ(value_after(r.out, "Same top p:"), 100.0) << r.out;
    EXPECT_NE(r.out.find("(378 positions)"), std::string::npos) << "6 chunks x 63 positions: " << r.out;
    // 2 bytes per vocabulary entry: 512 + 4 per position, the tokens and a 20-byte header.
    EXPECT_EQ(std::filesystem::file_size(base), 20u + 4u * 6u * 128u + 2u * 378u * 516u);
}

// Ours (our engine's logits) against the definition in double on llama.cpp's logits of both models.
TEST(KlDivergence, EqualsTheKlOfLlamaCppsLogits) {
    RP_REQUIRE_ORACLE();
    TempDir d;
    const std::string base = d.file("base.kld");
    ASSERT_EQ(run_tool("rp-perplexity", "-m " + stories() + " -f " + kTrain + " -c 128 -t 1 --kl-divergence-base " + base).exit_code, 0);
    const ToolResult r = run_tool("rp-perplexity", "-m " + stories() + " --lora " + kAdapter +
                                                       " --lora-scale 0.3 -t 1 --kl-divergence-base " + base + " --kl-divergence");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const double ours = value_after(r.out, "Mean    KLD:"), ours_top = value_after(r.out, "Same top p:");

    const rp::KlBaseFile f = rp::KlBaseFile::read(base);
    const int64_t n_ctx = f.n_ctx, n_vocab = f.n_vocab, first = n_ctx / 2;
    double sum_kl = 0;
    int64_t count = 0, same = 0;
    for (int32_t c = 0; c < f.n_chunk; ++c) {
        std::vector<int32_t> window(f.tokens.begin() + c * n_ctx, f.tokens.begin() + (c + 1) * n_ctx);
        window[0] = 1;  // BOS, as both programs substitute it
        const std::string ids = rp::oracle::id_list(window);
        auto logits = [&](const std::string & extra, const std::string & out) {
            const auto res = rp::oracle::run("logits " + rp::oracle::quote(stories()) + " --tokens " + rp::oracle::quote(ids) +
                                             extra + " --out " + rp::oracle::quote(out));
            EXPECT_EQ(res.status, 0);
            return rp::oracle::read_f32(out);
        };
        const std::vector<float> lb = logits("", d.file("b.f32"));
        const std::vector<float> lm = logits(" --lora " + rp::oracle::quote(kAdapter) + " --lora-scale 0.3", d.file("m.f32"));
        ASSERT_EQ(lb.size(), static_cast<size_t>(n_ctx * n_vocab));
        for (int64_t j = first; j < n_ctx - 1; ++j) {
            const std::vector<double> lp = log_softmax(lb.data() + j * n_vocab, n_vocab);
            const std::vector<double> lq = log_softmax(lm.data() + j * n_vocab, n_vocab);
            double kl = 0;
            for (int64_t i = 0; i < n_vocab; ++i)
                if (lp[static_cast<size_t>(i)] > -16) kl += std::exp(lp[static_cast<size_t>(i)]) * (lp[static_cast<size_t>(i)] - lq[static_cast<size_t>(i)]);
            sum_kl += kl;
            same += std::max_element(lp.begin(), lp.end()) - lp.begin() == std::max_element(lq.begin(), lq.end()) - lq.begin();
            ++count;
        }
    }
    const double ref = sum_kl / static_cast<double>(count);
    std::printf("mean KL (adapter at 0.3 vs base): ours %.7f, llama.cpp's logits in double %.7f; same top ours %.3f%%, llama.cpp %.3f%%\n",
                ours, ref, ours_top, 100.0 * static_cast<double>(same) / static_cast<double>(count));
    EXPECT_GT(ref, 1e-3) << "the adapter must move the distribution";
    // Within 1e-6: the printed value has 6 decimals (5e-7), the rows round log p by half a step (both signs).
    EXPECT_NEAR(ours, ref, 1e-6);
    EXPECT_NEAR(ours_top, 100.0 * static_cast<double>(same) / static_cast<double>(count), 1e-3);
}

TEST(KlDivergence, BadInputFailsNamingItAndLeavesNoFile) {
    TempDir d;
    const std::string base = d.file("base.kld");
    ASSERT_EQ(run_tool("rp-perplexity", "-m " + stories() + " -f " + kTrain + " -c 128 -t 1 --kl-divergence-base " + base).exit_code, 0);
    // Truncated.
    const std::string bytes = slurp(base);
    const std::string cut = d.file("cut.kld");
    {
        std::ofstream o(cut, std::ios::binary);
        o.write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 100));
    }
    ToolResult r = run_tool("rp-perplexity", "-m " + stories() + " --kl-divergence-base " + cut + " --kl-divergence");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find(cut), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    // Not a log-prob file.
    r = run_tool("rp-perplexity", "-m " + stories() + " --kl-divergence-base " + stories() + " --kl-divergence");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("_logits_"), std::string::npos) << r.err;
    // Another vocabulary.
    r = run_tool("rp-perplexity", "-m " + model_path("synthetic/tiny-random-qwen2.gguf") + " --kl-divergence-base " + base + " --kl-divergence");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("vocabulary"), std::string::npos) << r.err;
    // Another context.
    r = run_tool("rp-perplexity", "-m " + stories() + " -c 64 --kl-divergence-base " + base + " --kl-divergence");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("128"), std::string::npos) << r.err;
    // No base.
    r = run_tool("rp-perplexity", "-m " + stories() + " --kl-divergence");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("--kl-divergence-base"), std::string::npos) << r.err;
    // A save that fails (the text is too short for the context) leaves no file, not even a temporary one.
    const std::string none = d.file("none.kld");
    r = run_tool("rp-perplexity", "-m " + stories() + " -f " + kTrain + " -c 4096 --kl-divergence-base " + none);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_FALSE(std::filesystem::exists(none));
    EXPECT_FALSE(std::filesystem::exists(none + ".tmp"));
}
