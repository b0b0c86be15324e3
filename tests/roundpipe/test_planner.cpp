// The partitioner (roundpipe.md §11): the published partitions of §11.4 from the per-layer times of §13.8,
// a hand-traced greedy run, random property tests against an independent reference (brute-force candidate
// bounds and a dynamic program for the fewest stages under each bound), memory caps and errors, plan
// validation, and the EMA of measured times with bias correction.
#include "ggml_rp/roundpipe/layer_timings.h"
#include "ggml_rp/roundpipe/planner.h"
#include "base/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

using rp::LayerRange;
using rp::Plan;
using rp::PlannerInput;

namespace {

// roundpipe.md §13.8: prefix (time 0) + n decoder layers + postfix (LM head + loss). tf = forward (= the
// recompute), tb = recompute + backward; for the postfix, which sits in the fused tail: forward + backward.
PlannerInput paper_model(int n, double fwd, double bwd, double head_fwd, double head_bwd, int gpus) {
    PlannerInput in;
    in.tf.assign(static_cast<size_t>(n + 2), fwd);
    in.tb.assign(static_cast<size_t>(n + 2), fwd + bwd);
    in.tf.front() = in.tb.front() = 0;
    in.tf.back() = head_fwd;
    in.tb.back() = head_fwd + head_bwd;
    in.min_stages = gpus;
    return in;
}

// §11.4 lists decoder layers per stage; the prefix rides in F0 and in the last backward stage, the postfix
// in FB.
Plan published(std::vector<int> fwd, std::vector<int> bwd) {
    fwd.front() += 1;
    bwd.front() += 1;
    bwd.back() += 1;
    return rp::plan_from_sizes(fwd, bwd);
}

std::vector<int> repeat(int value, int times) { return std::vector<int>(static_cast<size_t>(times), value); }

std::vector<int> concat(std::vector<int> a, const std::vector<int> & b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

std::string error_of(const std::function<void()> & f) {
    try {
        f();
    } catch (const rp::Error & e) {
        return e.what();
    }
    return "";
}

} // namespace

TEST(Planner, ReproducesThePublishedPartitions) {
    // Qwen3-1.7B: 7,7,7,7 | 0,3,3,3,3,3,3,3,3,2,2
    Plan p = rp::make_plan(paper_model(28, 7.43, 15.83, 22.07, 43.71, 8));
    EXPECT_EQ(p, published({7, 7, 7, 7}, {0, 3, 3, 3, 3, 3, 3, 3, 3, 2, 2})) << p.describe();
    EXPECT_NEAR(p.stage_bound, 3 * (7.43 + 15.83), 1e-9);
    EXPECT_NEAR(p.cost, 15 * 3 * (7.43 + 15.83), 1e-6);

    // Llama-3.1-8B: 5,5,5,5,6,6 | 0, then 16 stages of 2
    p = rp::make_plan(paper_model(32, 18.50, 41.21, 37.23, 74.50, 8));
    EXPECT_EQ(p, published({5, 5, 5, 5, 6, 6}, concat({0}, repeat(2, 16)))) << p.describe();
    EXPECT_NEAR(p.stage_bound, 2 * (18.50 + 41.21), 1e-9);

    // Qwen3-235B-A22B: 47 stages of 2 | 0, then 94 stages of 1
    p = rp::make_plan(paper_model(94, 43.02, 58.38, 42.44, 43.29, 8));
    EXPECT_EQ(p, published(repeat(2, 47), concat({0}, repeat(1, 94)))) << p.describe();
}

// The greedy walk of §11.3 alone, traced by hand for Qwen3-1.7B: T = 3 x 23.26 = 69.78 (three decoder
// layers of recompute + backward); forward from layer 28 down in runs of 9 (9 x 7.43 = 66.87 <= T), the
// remainder (prefix + layer 1) first; FB = the postfix alone (65.78 + 23.26 > T); backward from layer 0 up
// in runs of 3 decoder layers (the prefix costs 0), the remainder (layer 28) deepest.
TEST(Planner, GreedyWalkWithoutBalancing) {
    PlannerInput in = paper_model(28, 7.43, 15.83, 22.07, 43.71, 8);
    in.balance = false;
    const Plan p = rp::make_plan(in);
    Plan want;
    want.fwd = {{0, 2}, {2, 11}, {11, 20}, {20, 29}};
    want.bwd = {{29, 30}, {28, 29}, {25, 28}, {22, 25}, {19, 22}, {16, 19}, {13, 16}, {10, 13}, {7, 10}, {4, 7}, {0, 4}};
    EXPECT_EQ(p, want) << p.describe();
    EXPECT_NEAR(p.stage_bound, 69.78, 1e-9);
    EXPECT_NEAR(p.cost, 15 * 69.78, 1e-6);
}

// Cold start: bytes as time, backward = 2 x bytes, so a backward stage holds a third of a forward stage.
TEST(Planner, ColdStartByteProxy) {
    std::vector<size_t> bytes(32, 1000);
    std::vector<double> tf, tb;
    rp::cold_start_times(bytes, tf, tb);
    ASSERT_EQ(tf.size(), 32u);
    for (size_t l = 0; l < 32; ++l) {
        EXPECT_EQ(tf[l], 1000.0);
        EXPECT_EQ(tb[l], 3000.0);
    }
    PlannerInput in;
    in.tf = tf;
    in.tb = tb;
    in.min_stages = 1;
    const Plan p = rp::make_plan(in);
    // W = 3000: T = 3000 (three forward layers or one backward layer) is the only candidate <= 3300
    EXPECT_EQ(p.stage_bound, 3000.0);
    EXPECT_EQ(p.bwd.front(), (LayerRange{31, 32}));
    for (const LayerRange & r : p.fwd) EXPECT_LE(r.size(), 3);
    EXPECT_EQ(p.fwd.size(), 11u);      // 31 layers in stages of at most 3
    EXPECT_EQ(p.bwd.size(), 1u + 31);  // one layer per backward stage
}

TEST(Planner, MemoryCapsRaisedLimitAndTooLargeLayer) {
    PlannerInput in;
    in.tf.assign(8, 1.0);
    in.tb.assign(8, 1.0);
    in.mf.assign(8, 100);
    in.mb.assign(8, 150);
    in.device_memory = 1000;  // limit 600, cap 300 per stage
    in.upper_threshold = 10;  // time would allow stages of 10 layers: memory must split them
    in.min_stages = 1;
    in.layer_names = {"token_embd", "blk.0", "blk.1", "blk.2", "blk.3", "blk.4", "blk.5", "output"};
    Plan p = rp::make_plan(in);
    for (const LayerRange & r : p.fwd) EXPECT_LE(r.size() * 100, 300) << p.describe();
    for (const LayerRange & r : p.bwd) EXPECT_LE(r.size() * 150, 300) << p.describe();
    EXPECT_TRUE(p.notes.empty());

    in.mb[3] = 400;  // one layer above the cap: the limit becomes 800 (cap 400), with a note
    p = rp::make_plan(in);
    ASSERT_EQ(p.notes.size(), 1u);
    EXPECT_NE(p.notes[0].find("layer 3 ('blk.2')"), std::string::npos) << p.notes[0];
    EXPECT_NE(p.notes[0].find("400 bytes"), std::string::npos) << p.notes[0];
    for (const LayerRange & r : p.bwd) {
        size_t sum = 0;
        for (int l = r.begin; l < r.end; ++l) sum += in.mb[static_cast<size_t>(l)];
        EXPECT_LE(sum, 400u) << p.describe();
    }

    in.mb[5] = 600;  // two of it (prefetch) exceed the 1000-byte device
    const std::string msg = error_of([&] { rp::make_plan(in); });
    EXPECT_NE(msg.find("layer 5 ('blk.4')"), std::string::npos) << msg;
    EXPECT_NE(msg.find("600 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1200 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1000 bytes"), std::string::npos) << msg;
}

TEST(Planner, RejectsBadInput) {
    PlannerInput in;
    EXPECT_THROW(rp::make_plan(in), rp::Error);  // no layers
    in.tf = {1, 2};
    in.tb = {1};
    EXPECT_THROW(rp::make_plan(in), rp::Error);
    in.tb = {1, -2};
    EXPECT_THROW(rp::make_plan(in), rp::Error);
    in.tb = {1, NAN};
    EXPECT_THROW(rp::make_plan(in), rp::Error);
    in.tb = {1, 2};
    in.mf = {1};
    EXPECT_THROW(rp::make_plan(in), rp::Error);
}

// ---- random properties against an independent reference -------------------------------------------------

namespace {

struct Reference {
    std::vector<double> candidates;
    double best_cost = std::numeric_limits<double>::infinity();
};

// Fewest contiguous segments of [0, n) with every segment's time <= T and bytes <= cap (a DP, not greedy).
int min_segments(int n, const std::vector<double> & t, const std::vector<size_t> & m, double T, size_t cap) {
    std::vector<int> best(static_cast<size_t>(n + 1), std::numeric_limits<int>::max());
    best[0] = 0;
    for (int j = 1; j <= n; ++j) {
        double ts = 0;
        size_t ms = 0;
        for (int i = j - 1; i >= 0; --i) {
            ts += t[static_cast<size_t>(i)];
            ms += m[static_cast<size_t>(i)];
            if (ts > T * (1 + 1e-9) || ms > cap) break;
            if (best[static_cast<size_t>(i)] != std::numeric_limits<int>::max()) {
                best[static_cast<size_t>(j)] = std::min(best[static_cast<size_t>(j)], best[static_cast<size_t>(i)] + 1);
            }
        }
    }
    return best[static_cast<size_t>(n)];
}

Reference reference(const PlannerInput & in, size_t cap) {
    Reference r;
    const size_t L = in.tf.size();
    double W = 0;
    for (size_t l = 0; l < L; ++l) W = std::max({W, in.tf[l], in.tb[l]});
    for (const auto * v : {&in.tf, &in.tb}) {
        for (size_t i = 0; i < L; ++i) {
            for (size_t j = i + 1; j <= L; ++j) {
                double s = 0;
                for (size_t k = i; k < j; ++k) s += (*v)[k];
                if (s >= W && s <= in.upper_threshold * W) r.candidates.push_back(s);
            }
        }
    }
    for (double T : r.candidates) {
        // FB: from the last layer down while it fits (the rule of §11.3, not an optimisation)
        int e = static_cast<int>(L);
        double ts = 0;
        size_t ms = 0;
        for (int l = static_cast<int>(L) - 1; l >= 0; --l) {
            if (ts + in.tb[static_cast<size_t>(l)] > T * (1 + 1e-9) || ms + in.mb[static_cast<size_t>(l)] > cap) break;
            ts += in.tb[static_cast<size_t>(l)];
            ms += in.mb[static_cast<size_t>(l)];
            e = l;
        }
        const int S = 1 + min_segments(e, in.tf, in.mf, T, cap) + min_segments(e, in.tb, in.mb, T, cap);
        r.best_cost = std::min(r.best_cost, std::max(S, in.min_stages) * T);
    }
    return r;
}

} // namespace

TEST(Planner, RandomPropertiesAndOptimalityOverCandidates) {
    for (uint32_t seed = 1; seed <= 300; ++seed) {
        std::mt19937 rng(seed);
        std::uniform_real_distribution<double> u(0, 1);
        PlannerInput in;
        const int L = 3 + static_cast<int>(rng() % 30);
        for (int l = 0; l < L; ++l) {
            const double f = rng() % 10 == 0 ? 0.0 : 0.2 + 10 * u(rng);
            in.tf.push_back(f);
            in.tb.push_back(f * (1.5 + 2.5 * u(rng)) + (rng() % 7 == 0 ? 5 * u(rng) : 0));
            const size_t w = 100 + rng() % 900;
            in.mf.push_back(w);
            in.mb.push_back(w + rng() % 300);
        }
        in.min_stages = 1 + static_cast<int>(rng() % 8);
        in.upper_threshold = rng() % 3 == 0 ? 1.5 : 1.1;
        in.balance = rng() % 2 == 0;
        const bool memory = rng() % 4 != 0;
        size_t largest = 0;
        for (int l = 0; l < L; ++l) largest = std::max(largest, in.mb[static_cast<size_t>(l)]);
        if (memory) in.device_memory = 2 * largest + rng() % 6000;
        else in.mf.clear(), in.mb.clear();

        const Plan p = rp::make_plan(in);
        SCOPED_TRACE("seed " + std::to_string(seed) + ": " + p.describe());
        ASSERT_NO_THROW(rp::validate_plan(p, L));  // contiguous, covering, FB ends last, fwd end == FB start
        EXPECT_EQ(p.bwd.front().end, L);
        EXPECT_EQ(p.fwd.empty() ? 0 : p.fwd.back().end, p.bwd.front().begin);

        // the cap the rules of §11.1 give
        size_t cap = std::numeric_limits<size_t>::max();
        std::vector<size_t> mf = in.mf, mb = in.mb;
        if (memory) {
            size_t limit = static_cast<size_t>(0.6 * static_cast<double>(in.device_memory));
            if (largest > limit / 2) limit = 2 * largest;
            cap = limit / 2;
        } else {
            mf.assign(static_cast<size_t>(L), 0);
            mb.assign(static_cast<size_t>(L), 0);
        }
        const double T = p.stage_bound;
        auto check = [&](const LayerRange & r, const std::vector<double> & t, const std::vector<size_t> & m) {
            double ts = 0;
            size_t ms = 0;
            for (int l = r.begin; l < r.end; ++l) {
                ts += t[static_cast<size_t>(l)];
                ms += m[static_cast<size_t>(l)];
            }
            EXPECT_LE(ts, T * (1 + 1e-9));
            EXPECT_LE(ms, cap);
        };
        for (const LayerRange & r : p.fwd) check(r, in.tf, mf);
        for (const LayerRange & r : p.bwd) check(r, in.tb, mb);

        PlannerInput ref_in = in;
        ref_in.mf = mf;
        ref_in.mb = mb;
        const Reference ref = reference(ref_in, cap);
        double W = 0;
        for (int l = 0; l < L; ++l) W = std::max({W, in.tf[static_cast<size_t>(l)], in.tb[static_cast<size_t>(l)]});
        EXPECT_GE(T, W * (1 - 1e-12));
        EXPECT_LE(T, in.upper_threshold * W * (1 + 1e-12));
        EXPECT_TRUE(std::any_of(ref.candidates.begin(), ref.candidates.end(),
                                [&](double c) { return std::fabs(c - T) <= 1e-9 * std::max(1.0, T); }))
            << "T = " << T << " is not a candidate bound";
        EXPECT_NEAR(p.cost, std::max(p.num_stages(), in.min_stages) * T, 1e-9 * p.cost);
        EXPECT_NEAR(p.cost, ref.best_cost, 1e-9 * ref.best_cost) << "not the cheapest candidate";
    }
}

TEST(Plan, ValidationNamesTheBrokenStage) {
    Plan ok = rp::plan_from_sizes({2, 3}, {1, 2, 3});
    EXPECT_EQ(ok.describe(), "F [0,2) [2,5) | FB [5,6) | B [3,5) [0,3)");
    EXPECT_NO_THROW(rp::validate_plan(ok, 6));
    EXPECT_NE(error_of([&] { rp::validate_plan(ok, 7); }).find("must end at the last layer"), std::string::npos);

    Plan gap = ok;
    gap.fwd[1] = {3, 5};
    EXPECT_NE(error_of([&] { rp::validate_plan(gap, 6); }).find("forward stage F1 [3,5) should start at layer 2"),
              std::string::npos);
    Plan short_fwd = ok;
    short_fwd.fwd.pop_back();
    EXPECT_NE(error_of([&] { rp::validate_plan(short_fwd, 6); }).find("last forward layer + 1"), std::string::npos);
    Plan hole = ok;
    hole.bwd[2] = {1, 3};
    EXPECT_NE(error_of([&] { rp::validate_plan(hole, 6); }).find("instead of covering down to 0"), std::string::npos);
    Plan empty = ok;
    empty.bwd[1] = {5, 5};
    EXPECT_NE(error_of([&] { rp::validate_plan(empty, 6); }).find("B1 [5,5) is empty"), std::string::npos);
    Plan none;
    EXPECT_NE(error_of([&] { rp::validate_plan(none, 6); }).find("no fused tail"), std::string::npos);
    // a plan whose fused tail is the whole model is valid (no forward stage, no backward stage)
    EXPECT_NO_THROW(rp::validate_plan(rp::plan_from_sizes({}, {4}), 4));
}

// The §11.4 notation in decoder layers: the prefix rides in F0 and the last backward stage, the postfix in FB.
TEST(Plan, DecoderCountsReadAndWriteThePublishedNotation) {
    const Plan p = rp::plan_from_decoder_counts("5,5,5,5,6,6|0,2x16");  // Llama-3.1-8B's
    EXPECT_EQ(p.num_layers(), 34);                                      // 32 decoder layers + prefix + postfix
    EXPECT_EQ(p.fwd.front(), (LayerRange{0, 6}));
    EXPECT_EQ(p.bwd.front(), (LayerRange{33, 34}));
    EXPECT_EQ(p.bwd.back(), (LayerRange{0, 3}));
    EXPECT_EQ(p.num_stages(), 6 + 17);
    EXPECT_EQ(rp::decoder_counts(p), "5,5,5,5,6,6|0,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2");
    EXPECT_EQ(rp::plan_from_decoder_counts(rp::decoder_counts(p)), p);
    EXPECT_EQ(error_of([] { rp::plan_from_decoder_counts("7,7"); }), "partition '7,7': expected \"forward|backward\"");
    EXPECT_EQ(error_of([] { rp::plan_from_decoder_counts("7,x|0,7"); }), "partition (forward): bad item 'x'");
    EXPECT_EQ(error_of([] { rp::plan_from_decoder_counts("7|0,3x0"); }), "partition (backward): bad item '3x0'");
    EXPECT_EQ(error_of([] { rp::plan_from_decoder_counts("7|0"); }), "partition '7|0': need forward stages and FB plus backward stages");
    EXPECT_NE(error_of([] { rp::plan_from_decoder_counts("7,7|0,3"); }).find("partition '7,7|0,3': plan: backward stages stop at layer"),
              std::string::npos);
}

// ---- measured times --------------------------------------------------------------------------------------

TEST(LayerTimings, ColdStartThenBiasCorrectedEmaWithTheFirstSampleDropped) {
    rp::LayerTimings t({100, 200, 300});
    EXPECT_FALSE(t.measured());
    EXPECT_EQ(t.forward(), (std::vector<double>{100, 200, 300}));
    EXPECT_EQ(t.backward_stage(), (std::vector<double>{300, 600, 900}));

    const std::vector<std::pair<LayerRange, double>> one_stage = {{{0, 3}, 6.0}};
    t.add_iteration({1, 2, 3}, one_stage);  // dropped (start-up noise)
    EXPECT_FALSE(t.measured());
    EXPECT_EQ(t.iterations_seen(), 1);

    // x_n for layer 0: 10, 20, 40; estimate_n = sum_i 0.1 * 0.9^(n-i) x_i / (1 - 0.9^n)
    const double xs[3] = {10, 20, 40};
    double num = 0, decay = 1;
    for (int n = 1; n <= 3; ++n) {
        const double x = xs[n - 1];
        // backward stage time 3x apportioned by forward time 1:2:3 -> x/2, x, 3x/2
        t.add_iteration({x, 2 * x, 3 * x}, {{{0, 3}, 3 * x}});
        num = 0.9 * num + 0.1 * x;
        decay *= 0.9;
        const double est = num / (1 - decay);
        EXPECT_EQ(t.samples(), n);
        EXPECT_NEAR(t.forward()[0], est, 1e-12 * est);
        EXPECT_NEAR(t.forward()[2], 3 * est, 1e-12 * est);
        EXPECT_NEAR(t.backward_stage()[0], est + est / 2, 1e-12 * est);
        EXPECT_NEAR(t.backward_stage()[1], 2 * est + est, 1e-12 * est);
        EXPECT_NEAR(t.backward_stage()[2], 3 * est + 1.5 * est, 1e-12 * est);
    }
    // a constant signal is recovered exactly after any number of samples (the bias correction)
    rp::LayerTimings c({1, 1});
    c.add_iteration({99, 99}, {{{0, 1}, 0}, {{1, 2}, 0}});
    for (int n = 0; n < 5; ++n) {
        c.add_iteration({5, 7}, {{{0, 1}, 2}, {{1, 2}, 4}});
        EXPECT_NEAR(c.forward()[0], 5, 1e-12);
        EXPECT_NEAR(c.backward_stage()[1], 11, 1e-12);
    }
    // zero forward times: the stage time is split equally
    rp::LayerTimings z({1, 1});
    z.add_iteration({0, 0}, {{{0, 2}, 8}});
    z.add_iteration({0, 0}, {{{0, 2}, 8}});
    EXPECT_NEAR(z.backward_stage()[0], 4, 1e-12);
}

TEST(LayerTimings, RejectsStagesThatDoNotCoverEveryLayerOnce) {
    rp::LayerTimings t({1, 1, 1});
    EXPECT_THROW(t.add_iteration({1, 1}, {{{0, 3}, 1}}), rp::Error);
    EXPECT_THROW(t.add_iteration({1, 1, 1}, {{{0, 2}, 1}}), rp::Error);                // layer 2 missing
    EXPECT_THROW(t.add_iteration({1, 1, 1}, {{{0, 2}, 1}, {{1, 3}, 1}}), rp::Error);   // layer 1 twice
    EXPECT_THROW(t.add_iteration({1, 1, 1}, {{{0, 4}, 1}}), rp::Error);
    EXPECT_THROW(t.add_iteration({1, -1, 1}, {{{0, 3}, 1}}), rp::Error);
    EXPECT_EQ(t.iterations_seen(), 0);
}

// Stage boundaries by device speed (issue #37): the stage counts and the fused tail stay; each pass's stages take
// time in proportion to their devices' speeds (each cut where the cumulative time is nearest the cumulative share,
// worked by hand below); equal speeds give stages within a layer's time of each other; bad input is refused.
TEST(Planner, StagesSizedByDeviceSpeed) {
    // 1 + 12 + 1 layers: tf 1 per block (the prefix 0), tb 3; FB = the last block and the head.
    std::vector<double> tf(14, 1.0), tb(14, 3.0);
    tf[0] = tb[0] = 0;
    const Plan plan = rp::plan_from_sizes({4, 4, 4}, {2, 3, 3, 3, 3});  // F: [0,4) [4,8) [8,12); FB [12,14); B: 4 of 12
    // Devices by the pointer: F0 F1 F2 FB B1 B2 B3 B4 on speeds 1, 0.5, 1, 0.5, 1, 0.5, 1, 0.5
    const std::vector<double> speed = {1, 0.5, 1, 0.5, 1, 0.5, 1, 0.5};
    const Plan s = rp::split_by_speed(plan, tf, tb, speed);
    EXPECT_EQ(s.bwd.front(), plan.bwd.front());
    ASSERT_EQ(s.fwd.size(), 3u);
    ASSERT_EQ(s.bwd.size(), 5u);
    // forward: layer 0 costs nothing, 11 blocks of 1 over shares 1 : 0.5 : 1 -> cuts nearest 4.4 and 6.6 blocks
    EXPECT_EQ(s.fwd[0], (LayerRange{0, 5}));   // layer 0 + 4 blocks (4 of 4.4)
    EXPECT_EQ(s.fwd[1], (LayerRange{5, 8}));   // cumulative 7 (of 6.6; 6 is further)
    EXPECT_EQ(s.fwd[2], (LayerRange{8, 12}));
    // backward, deep -> shallow over 11 blocks of 3 and the prefix (0), shares 1 : 0.5 : 1 : 0.5 -> cuts nearest
    // 11, 16.5 and 27.5 of 33: 12 (4 blocks), 15 (16.5 is as near 15 as 18: the first is kept), 27
    EXPECT_EQ(s.bwd[1], (LayerRange{8, 12}));
    EXPECT_EQ(s.bwd[2], (LayerRange{7, 8}));
    EXPECT_EQ(s.bwd[3], (LayerRange{3, 7}));
    EXPECT_EQ(s.bwd[4], (LayerRange{0, 3}));
    EXPECT_NO_THROW(rp::validate_plan(s, 14));
    bool noted = false;
    for (const std::string & n : s.notes) noted = noted || n == "stages sized by device speed";
    EXPECT_TRUE(noted);

    // Equal speeds: every stage within one layer's time of its pass's mean.
    const Plan eq = rp::split_by_speed(rp::plan_from_sizes({1, 1, 10}, {2, 1, 11}), tf, tb, std::vector<double>(6, 1.0));
    auto time = [](const LayerRange & r, const std::vector<double> & t) {
        double x = 0;
        for (int l = r.begin; l < r.end; ++l) x += t[static_cast<size_t>(l)];
        return x;
    };
    for (const LayerRange & r : eq.fwd) EXPECT_LE(std::abs(time(r, tf) - 11.0 / 3), 1.0) << eq.describe();
    for (size_t k = 1; k < eq.bwd.size(); ++k) EXPECT_LE(std::abs(time(eq.bwd[k], tb) - 33.0 / 2), 3.0) << eq.describe();
    EXPECT_NE(error_of([&] { rp::split_by_speed(plan, tf, tb, {1, 1}); }).find("speeds for 8 stages"), std::string::npos);
    EXPECT_NE(error_of([&] { rp::split_by_speed(plan, tf, std::vector<double>(3, 1.0), speed); }).find("tb of 3 layers for a plan of 14"), std::string::npos);
    std::vector<double> zero = speed;
    zero[2] = 0;
    EXPECT_NE(error_of([&] { rp::split_by_speed(plan, tf, tb, zero); }).find("not positive"), std::string::npos);
}
