// The loss curve rp-finetune writes (models/finetune_report.h write_loss_svg): y ticks at round values
// spanning every loss, the best validation point ringed and named, every evaluation point's value on hover,
// the learning rate on its own axis, gaps (never "nan") for non-finite losses; rendered to PNG by
// rsvg-convert (librsvg, which refuses malformed XML).
#include "models/train/finetune_report.h"
#include "tests/common/temp_dir.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

std::string slurp(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// 50 steps from 1.766 down to ~1.2 with some noise, a skipped (NaN) step, evaluations every 10 steps whose
// best is at step 30.
rp::TrainCurve sample_curve() {
    rp::TrainCurve c;
    for (int i = 1; i <= 50; ++i) c.train_loss.push_back(static_cast<float>(1.2 + 0.566 * std::exp(-i / 12.0) + 0.02 * std::sin(i * 1.7)));
    c.train_loss[21] = NAN;
    const float ev[] = {1.766f, 1.61f, 1.52f, 1.486f, 1.49f, 1.50f};
    for (int k = 0; k <= 5; ++k) {
        c.eval_step.push_back(10 * k);
        c.eval_loss.push_back(ev[k]);
    }
    return c;
}

// The texts that follow each occurrence of `key`: from the first `from` character after it (excluded) to the
// next `to` character. (Not std::regex: GCC 12 warns maybe-uninitialized inside its headers at -O2 with the sanitizers.)
std::vector<std::string> after(const std::string & s, const std::string & key, char from = '>', char to = '<') {
    std::vector<std::string> out;
    for (size_t p = s.find(key); p != std::string::npos; p = s.find(key, p + key.size())) {
        const size_t a = s.find(from, p + key.size() - 1);
        if (a == std::string::npos) break;
        const size_t b = s.find(to, a + 1);
        if (b == std::string::npos) break;
        out.push_back(s.substr(a + 1, b - a - 1));
    }
    return out;
}

size_t count(const std::string & s, const std::string & key) {
    size_t n = 0;
    for (size_t p = s.find(key); p != std::string::npos; p = s.find(key, p + 1)) ++n;
    return n;
}

} // namespace

TEST(LossSvg, RoundTicksBestPointHoverAndTheLearningRate) {
    rp_test::TempDir d;
    const rp::TrainCurve c = sample_curve();
    rp::LrSchedule lr;
    lr.lr_max = 1e-3;
    lr.warmup_steps = 5;
    lr.total_steps = 50;
    rp::write_loss_svg(d.file("loss.svg"), c, &lr);
    const std::string svg = slurp(d.file("loss.svg"));
    EXPECT_EQ(svg.find("nan"), std::string::npos) << svg;

    // y ticks: equal round steps (1, 2 or 5 x 10^k), labels printed exactly, spanning every finite loss.
    const std::vector<std::string> ticks = after(svg, "class=\"y-tick\"");
    ASSERT_GE(ticks.size(), 3u) << svg;
    std::vector<double> v;
    for (const std::string & t : ticks) v.push_back(std::stod(t));
    const double step = v[1] - v[0];
    const double mant = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    EXPECT_TRUE(std::fabs(mant - 1) < 1e-6 || std::fabs(mant - 2) < 1e-6 || std::fabs(mant - 5) < 1e-6) << "step " << step;
    for (size_t i = 0; i < v.size(); ++i) {
        EXPECT_NEAR(v[i], v[0] + step * static_cast<double>(i), step * 1e-6) << ticks[i];
        EXPECT_NEAR(std::round(v[i] / step) * step, v[i], step * 1e-6) << ticks[i] << " is not a multiple of " << step;
        EXPECT_LE(ticks[i].size(), 6u) << ticks[i];  // "1.200", not "1.207031"
    }
    EXPECT_LE(v.front(), 1.2) << ticks.front();
    EXPECT_GE(v.back(), 1.766) << ticks.back();

    // The best evaluation (step 30, what --save-best keeps), ringed and named; every evaluation's value on hover.
    EXPECT_EQ(count(svg, "class=\"best\""), 1u) << svg;
    EXPECT_NE(svg.find("best 1.4860 (step 30)"), std::string::npos) << svg;
    const std::vector<std::string> titles = after(svg, "<title>");
    ASSERT_EQ(titles.size(), c.eval_loss.size()) << svg;
    EXPECT_EQ(titles[3], "step 30: validation loss 1.4860, ppl 4.419");

    // The learning rate: its own axis, one point per step.
    const std::vector<std::string> lr_points = after(svg, "stroke-dasharray=\"4 3\" points=", '"', '"');
    ASSERT_EQ(lr_points.size(), 1u) << svg;
    EXPECT_EQ(count(lr_points[0], ","), 50u);
    EXPECT_FALSE(after(svg, "class=\"lr-tick\"").empty());

    // Without a schedule there is no lr axis.
    rp::write_loss_svg(d.file("plain.svg"), c);
    EXPECT_EQ(slurp(d.file("plain.svg")).find("class=\"lr\""), std::string::npos);

    // It renders (rsvg-convert parses the XML strictly and draws it).
    const std::string png = d.file("loss.png");
    const int rc = std::system(("rsvg-convert -o " + png + " " + d.file("loss.svg") + " 2>" + d.file("rsvg.log")).c_str());
    ASSERT_EQ(rc, 0) << "rsvg-convert (apt-get install librsvg2-bin: scripts/setup.sh) failed: " << slurp(d.file("rsvg.log"));
    const std::string bytes = slurp(png);
    ASSERT_GT(bytes.size(), 1000u);
    EXPECT_EQ(bytes.substr(1, 3), "PNG");
}

// A curve with one value (or all values equal) still gets round ticks around it, and one with no finite
// value at all gets a default axis: never a division by zero or a NaN coordinate.
TEST(LossSvg, FlatAndEmptyCurves) {
    rp_test::TempDir d;
    rp::TrainCurve flat;
    flat.train_loss = {2.5f, 2.5f, 2.5f};
    rp::write_loss_svg(d.file("flat.svg"), flat);
    const std::string s = slurp(d.file("flat.svg"));
    EXPECT_EQ(s.find("nan"), std::string::npos) << s;
    EXPECT_EQ(s.find("inf"), std::string::npos) << s;
    EXPECT_GE(after(s, "class=\"y-tick\"").size(), 2u) << s;
    rp::TrainCurve none;
    none.train_loss = {NAN};
    rp::write_loss_svg(d.file("none.svg"), none);
    EXPECT_EQ(slurp(d.file("none.svg")).find("nan"), std::string::npos);
    EXPECT_EQ(std::system(("rsvg-convert -o " + d.file("flat.png") + " " + d.file("flat.svg")).c_str()), 0);
}

// Preference training adds a panel of each step's rewards (chosen, rejected, their margin) on its own round
// ticks, and the evaluations' hover text drops the perplexity (a preference loss has none).
TEST(LossSvg, PreferenceRewardsPanel) {
    rp_test::TempDir d;
    rp::TrainCurve c = sample_curve();
    for (int i = 1; i <= 50; ++i) {
        c.reward_chosen.push_back(static_cast<float>(0.02 * i));
        c.reward_rejected.push_back(static_cast<float>(-0.05 * i));
    }
    c.reward_chosen[7] = NAN;  // a KTO batch without a desirable example: a gap
    rp::write_loss_svg(d.file("pref.svg"), c);
    const std::string svg = slurp(d.file("pref.svg"));
    EXPECT_EQ(svg.find("nan"), std::string::npos) << svg;
    for (const char * name : {"rewards/chosen", "rewards/rejected", "rewards/margins"}) EXPECT_NE(svg.find(name), std::string::npos) << name;
    const std::vector<std::string> ticks = after(svg, "class=\"reward-tick\"");
    ASSERT_GE(ticks.size(), 3u) << svg;
    EXPECT_LE(std::stod(ticks.front()), -2.5) << ticks.front();  // rejected's lowest
    EXPECT_GE(std::stod(ticks.back()), 3.5) << ticks.back();     // the margin's highest
    for (const std::string color : {"#2ca02c", "#d62728", "#9467bd"}) {  // one point per step (chosen and the margin: one gap)
        const std::vector<std::string> pts = after(svg, "stroke=\"" + color + "\" stroke-width=\"1.5\" points=", '"', '"');
        ASSERT_EQ(pts.size(), 1u) << color;
        EXPECT_EQ(count(pts[0], ","), color == "#d62728" ? 50u : 49u) << color;
    }
    EXPECT_EQ(svg.find("ppl"), std::string::npos) << "no perplexity on a preference run's evaluations";
    EXPECT_EQ(std::system(("rsvg-convert -o " + d.file("pref.png") + " " + d.file("pref.svg")).c_str()), 0);
}

// GRPO adds a panel of each step's mean reward on its own ticks.
TEST(LossSvg, GrpoRewardPanel) {
    rp_test::TempDir d;
    rp::TrainCurve c = sample_curve();
    for (int i = 1; i <= 50; ++i) c.reward.push_back(static_cast<float>(0.02 * i));
    rp::write_loss_svg(d.file("grpo.svg"), c);
    const std::string svg = slurp(d.file("grpo.svg"));
    EXPECT_NE(svg.find("reward (mean of the step's completions)"), std::string::npos) << svg;
    EXPECT_EQ(svg.find("rewards/chosen"), std::string::npos);
    const std::vector<std::string> ticks = after(svg, "class=\"reward-tick\"");
    ASSERT_GE(ticks.size(), 3u) << svg;
    EXPECT_GE(std::stod(ticks.back()), 1.0) << ticks.back();
    const std::vector<std::string> pts = after(svg, "stroke=\"#2ca02c\" stroke-width=\"1.5\" points=", '"', '"');
    ASSERT_EQ(pts.size(), 1u);
    EXPECT_EQ(count(pts[0], ","), 50u);
    EXPECT_EQ(std::system(("rsvg-convert -o " + d.file("grpo.png") + " " + d.file("grpo.svg")).c_str()), 0);
}

// Perplexity as every report prints it: three decimals, scientific past 10^6 (the huge value of an untrained
// model's first evaluation), inf past a double's range.
TEST(LossSvg, PerplexityFormatting) {
    EXPECT_EQ(rp::format_perplexity(std::log(4.872)), "4.872");
    EXPECT_EQ(rp::format_perplexity(std::log(300010938.883)), "3.000e+08");
    EXPECT_EQ(rp::format_perplexity(std::log(999999.0)), "999999.000");
    EXPECT_EQ(rp::format_perplexity(1e6), "inf");
    EXPECT_EQ(rp::format_perplexity(NAN), "nan");
    // The float a curve keeps and the double it came from print alike at this precision.
    const double loss = 19.5190;
    EXPECT_EQ(rp::format_perplexity(static_cast<float>(loss)), rp::format_perplexity(loss));
}
