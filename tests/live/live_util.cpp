#include "live_util.h"

#include "models/arch/inference.h"
#include "models/arch/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>

namespace rp::live {

namespace fs = std::filesystem;

std::string shared_dir() {
    const char * e = std::getenv("RP_SHARED_DIR");
    return e && *e ? e : RP_SHARED_DIR;
}

std::string model_path(const std::string & rel) { return shared_dir() + "/models/" + rel; }

TempDir::TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "rp-live-test-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) std::abort();  // no temp directory: nothing sensible to test
    path = tmpl;
}

TempDir::~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
}

std::vector<int32_t> random_tokens(uint64_t seed, int n, int n_vocab, int32_t first) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> t(n);
    for (int32_t & id : t) id = static_cast<int32_t>(rng() % static_cast<uint64_t>(n_vocab));  // bias < 1e-15
    if (first >= 0 && n > 0) t[0] = first;
    return t;
}

std::vector<float> oracle_logits(const std::string & model, const std::vector<int32_t> & tokens, int n_vocab) {
    TempDir dir;
    const std::string out = dir.file("logits.f32");
    const std::string ids = oracle::id_list(tokens);
    const oracle::Result r = oracle::run("logits " + oracle::quote(model) + " --tokens " + oracle::quote(ids) +
                                         " --out " + oracle::quote(out));
    EXPECT_EQ(r.status, 0) << "rp-oracle logits failed on " << model;
    if (r.status != 0) return {};
    // The oracle evaluated exactly our ids (no BOS added in front).
    const auto lines = oracle::lines_starting(r.out, "tokens(");
    EXPECT_EQ(lines.size(), 1u);
    if (lines.size() != 1) return {};
    EXPECT_EQ(lines[0], "tokens(" + std::to_string(tokens.size()) + "): " + ids);
    std::vector<float> z = oracle::read_f32(out);
    EXPECT_EQ(z.size(), tokens.size() * static_cast<size_t>(n_vocab)) << "size of " << out;
    if (z.size() != tokens.size() * static_cast<size_t>(n_vocab)) return {};
    return z;
}

std::vector<float> our_logits(const std::string & model, const std::vector<int32_t> & tokens) {
    auto m = Model::load(model);
    // One thread: on a busy 2-core machine OpenMP barriers cost more than the second core brings here.
    InferenceSession s(*m, static_cast<int64_t>(tokens.size()), 1);
    return s.eval(tokens, true);
}

Diff compare(const std::vector<float> & ours, const std::vector<float> & ref, int n_vocab) {
    Diff d;
    if (ours.size() != ref.size() || ref.empty()) {
        d.max_abs = INFINITY;
        return d;
    }
    auto [lo, hi] = std::minmax_element(ref.begin(), ref.end());
    d.range = *hi - *lo;
    for (size_t i = 0; i < ref.size(); ++i) d.max_abs = std::max(d.max_abs, std::fabs(ours[i] - ref[i]));
    d.n_pos = static_cast<int>(ref.size() / static_cast<size_t>(n_vocab));
    for (int p = 0; p < d.n_pos; ++p) {
        const float * a = ours.data() + static_cast<size_t>(p) * n_vocab;
        const float * b = ref.data() + static_cast<size_t>(p) * n_vocab;
        d.argmax_agree += (std::max_element(a, a + n_vocab) - a) == (std::max_element(b, b + n_vocab) - b);
    }
    return d;
}

void check_case(const std::string & label, const std::string & model, const std::vector<int32_t> & tokens,
                int n_vocab, float tol_abs, float tol_rel) {
    const std::vector<float> ref = oracle_logits(model, tokens, n_vocab);
    ASSERT_FALSE(ref.empty()) << label;
    const std::vector<float> ours = our_logits(model, tokens);
    ASSERT_EQ(ours.size(), ref.size()) << label;
    const Diff d = compare(ours, ref, n_vocab);
    const float tol = tol_abs + tol_rel * d.range;
    std::printf("live %-34s n=%3zu  max|dlogit| %.3e  (logit range %.2f, tolerance %.3e, %s)  argmax agrees %d/%d\n",
                label.c_str(), tokens.size(), d.max_abs, d.range, tol, d.max_abs <= tol ? "ok" : "FAIL",
                d.argmax_agree, d.n_pos);
    std::fflush(stdout);
    EXPECT_LE(d.max_abs, tol) << label << " on " << tokens.size() << " tokens";
}

} // namespace rp::live
