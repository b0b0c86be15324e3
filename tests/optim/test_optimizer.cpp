// The Optimizer's bookkeeping: state save / load round trip continues bit for bit, checkpoint errors,
// once-per-step enforcement, and agreement with the span kernels.
#include "optim_test_util.h"

#include "ggml_rp/optim/optimizer.h"
#include "base/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

using optim_test::random_vector;
using optim_test::same_bits;

namespace {

struct TrainRun {
    rp::Optimizer opt;
    std::vector<std::vector<float>> params;
    explicit TrainRun(const rp::OptimizerConfig & cfg) : opt(cfg) {
        const size_t sizes[] = {17, 4096, 3};
        for (size_t i = 0; i < 3; ++i) {
            opt.add_param("blk." + std::to_string(i) + ".w", sizes[i]);
            params.push_back(random_vector(sizes[i], 10 + i));
        }
    }
    // The gradients of step t depend only on t, so two runs see the same data.
    void step(int64_t t) {
        for (size_t i = 0; i < params.size(); ++i) {
            const std::vector<float> g = random_vector(params[i].size(), 1000 * t + i);
            opt.update(i, params[i], g, 1e-2 / static_cast<double>(t));
        }
        opt.end_step();
    }
};

// The checkpoint as a writer would store it: names and copies of the arrays.
struct Saved {
    int64_t step;
    std::vector<std::string> names;
    std::vector<std::vector<float>> data;
    std::vector<rp::StateArray> views() const {
        std::vector<rp::StateArray> v;
        for (size_t i = 0; i < names.size(); ++i) v.push_back({names[i], data[i], {}});
        return v;
    }
};

Saved save(const rp::Optimizer & opt) {
    Saved s{opt.step(), {}, {}};
    for (const rp::StateArray & a : opt.state_arrays()) {
        s.names.push_back(a.name);
        s.data.emplace_back(a.data.begin(), a.data.end());
    }
    return s;
}

void round_trip(const rp::OptimizerConfig & cfg, size_t n_arrays) {
    TrainRun a(cfg);
    for (int64_t t = 1; t <= 4; ++t) a.step(t);
    const Saved ck = save(a.opt);
    ASSERT_EQ(ck.step, 4);
    ASSERT_EQ(ck.names.size(), n_arrays);
    const std::vector<std::vector<float>> params_at_ck = a.params;

    TrainRun b(cfg);
    b.params = params_at_ck;
    const std::vector<rp::StateArray> views = ck.views();
    b.opt.load_state(ck.step, views);
    EXPECT_EQ(b.opt.step(), 4);
    for (int64_t t = 5; t <= 8; ++t) {
        a.step(t);
        b.step(t);
    }
    for (size_t i = 0; i < a.params.size(); ++i) EXPECT_TRUE(same_bits(a.params[i], b.params[i])) << i;
    const Saved sa = save(a.opt), sb = save(b.opt);
    EXPECT_EQ(sa.names, sb.names);
    for (size_t i = 0; i < sa.data.size(); ++i) EXPECT_TRUE(same_bits(sa.data[i], sb.data[i])) << sa.names[i];

    // Without the state (fresh m and v, step 0) the continuation differs: the round trip is not vacuous.
    if (n_arrays > 0) {
        TrainRun c(cfg);
        c.params = params_at_ck;
        for (int64_t t = 5; t <= 8; ++t) c.step(t - 4);
        EXPECT_FALSE(same_bits(a.params[1], c.params[1]));
    }
}

TEST(Optimizer, AdamWStateRoundTripContinuesIdentically) {
    rp::OptimizerConfig cfg;
    cfg.adamw.weight_decay = 0.1;
    round_trip(cfg, 6);
}

TEST(Optimizer, SgdMomentumStateRoundTrip) {
    rp::OptimizerConfig cfg;
    cfg.kind = rp::OptimizerKind::Sgd;
    cfg.sgd.momentum = 0.9;
    round_trip(cfg, 3);
    cfg.sgd.momentum = 0.0;
    round_trip(cfg, 0);  // plain SGD has no state, only the step count
}

TEST(Optimizer, StateNames) {
    TrainRun a(rp::OptimizerConfig{});
    const std::vector<rp::StateArray> s = a.opt.state_arrays();
    ASSERT_EQ(s.size(), 6u);
    EXPECT_EQ(s[0].name, "blk.0.w.adam_m");
    EXPECT_EQ(s[1].name, "blk.0.w.adam_v");
    EXPECT_EQ(s[5].name, "blk.2.w.adam_v");
    EXPECT_EQ(s[2].data.size(), 4096u);
}

TEST(Optimizer, MatchesSpanKernel) {
    rp::OptimizerConfig cfg;
    TrainRun a(cfg);
    std::vector<float> p = a.params[0], m(p.size(), 0.0f), v(p.size(), 0.0f);
    for (int64_t t = 1; t <= 3; ++t) {
        a.step(t);
        const std::vector<float> g = random_vector(p.size(), 1000 * t);
        rp::adamw_update(cfg.adamw, t, 1e-2 / static_cast<double>(t), p, g, m, v);
    }
    EXPECT_TRUE(same_bits(p, a.params[0]));
}

TEST(Optimizer, LoadStateErrors) {
    TrainRun a(rp::OptimizerConfig{});
    a.step(1);
    const Saved ck = save(a.opt);
    auto expect_error = [&](const std::vector<rp::StateArray> & arrays, const char * needle) {
        TrainRun b(rp::OptimizerConfig{});
        try {
            b.opt.load_state(1, arrays);
            ADD_FAILURE() << "no error for " << needle;
        } catch (const rp::Error & e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
        EXPECT_EQ(b.opt.step(), 0);  // unchanged
    };
    std::vector<rp::StateArray> v = ck.views();
    v.pop_back();
    expect_error(v, "'blk.2.w.adam_v' is missing");
    v = ck.views();
    v[2].data = v[2].data.subspan(1);
    expect_error(v, "'blk.1.w.adam_m' has 4095 elements, expected 4096");
    v = ck.views();
    v.push_back({"blk.9.w.adam_m", v[0].data, {}});
    expect_error(v, "unexpected array 'blk.9.w.adam_m'");
    v = ck.views();
    v.push_back(v[0]);
    expect_error(v, "appears twice");

    // An AdamW checkpoint does not load into SGD with momentum.
    rp::OptimizerConfig sgd;
    sgd.kind = rp::OptimizerKind::Sgd;
    sgd.sgd.momentum = 0.5;
    TrainRun c(sgd);
    EXPECT_THROW(c.opt.load_state(1, ck.views()), rp::Error);
}

TEST(Optimizer, EveryParameterOncePerStep) {
    TrainRun a(rp::OptimizerConfig{});
    std::vector<float> g(17, 0.5f);
    a.opt.update(0, a.params[0], g, 1e-3);
    EXPECT_THROW(a.opt.update(0, a.params[0], g, 1e-3), rp::Error);  // twice
    EXPECT_THROW(a.opt.end_step(), rp::Error);                         // params 1 and 2 missing
    std::vector<float> wrong(5, 0.0f);
    EXPECT_THROW(a.opt.update(1, wrong, wrong, 1e-3), rp::Error);     // size
    EXPECT_THROW(a.opt.add_param("blk.0.w", 3), rp::Error);            // repeated name
    rp::OptimizerConfig bad;
    bad.adamw.beta2 = 1.0;
    EXPECT_THROW(rp::Optimizer{bad}, rp::Error);
    EXPECT_EQ(rp::optimizer_kind_from_name("sgd"), rp::OptimizerKind::Sgd);
    EXPECT_THROW(rp::optimizer_kind_from_name("lion"), rp::Error);
}

} // namespace

// bf16 state (OptimizerConfig::bf16_state): an independent element-by-element reference (the span kernel on one
// element with its state held as bf16 between steps, decoded and rounded by hand) gives the same bits; the
// state arrays are bf16 and half the bytes; the first step's masters equal the fp32 state's (both start from
// zeros); over 30 steps the masters stay close to the fp32 state's run and two runs give the same bits.
static uint16_t to_bf16(float f) {  // round to nearest even (the values here are finite)
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

TEST(Optimizer, Bf16StateIsTheFp32UpdateWithTheStateRoundedEachStep) {
    for (const rp::OptimizerKind kind : {rp::OptimizerKind::AdamW, rp::OptimizerKind::Sgd}) {
        rp::OptimizerConfig cfg;
        cfg.kind = kind;
        cfg.adamw.weight_decay = 0.1;
        cfg.sgd.momentum = 0.9;
        cfg.bf16_state = true;
        TrainRun a(cfg), again(cfg);
        const TrainRun start(cfg);
        rp::OptimizerConfig f32 = cfg;
        f32.bf16_state = false;
        TrainRun full(f32);
        // The reference: parameter 1 (4096 elements, several of the update's blocks), one element at a time.
        std::vector<float> p = a.params[1];
        std::vector<uint16_t> m(p.size(), 0), v(p.size(), 0);
        for (int64_t t = 1; t <= 30; ++t) {
            a.step(t);
            again.step(t);
            full.step(t);
            const std::vector<float> g = random_vector(p.size(), 1000 * t + 1);
            const double lr = 1e-2 / static_cast<double>(t);
            for (size_t e = 0; e < p.size(); ++e) {
                float me = from_bf16(m[e]), ve = from_bf16(v[e]);
                if (kind == rp::OptimizerKind::AdamW)
                    rp::adamw_update(cfg.adamw, t, lr, std::span<float>(&p[e], 1), std::span<const float>(&g[e], 1), std::span<float>(&me, 1),
                                     std::span<float>(&ve, 1));
                else
                    rp::sgd_update(cfg.sgd, t, lr, std::span<float>(&p[e], 1), std::span<const float>(&g[e], 1), std::span<float>(&me, 1));
                m[e] = to_bf16(me);
                v[e] = to_bf16(ve);
            }
            if (t == 1) {
                for (size_t i = 0; i < a.params.size(); ++i) EXPECT_TRUE(same_bits(a.params[i], full.params[i])) << i;
            }
        }
        EXPECT_TRUE(same_bits(p, a.params[1]));
        const std::vector<rp::StateArray> s = a.opt.state_arrays();
        ASSERT_EQ(s.size(), kind == rp::OptimizerKind::AdamW ? 6u : 3u);
        EXPECT_TRUE(s[0].data.empty());
        EXPECT_EQ(s[0].size(), 17u);
        EXPECT_EQ(s[0].size_bytes(), 17u * 2);
        const rp::StateArray & m1 = s[kind == rp::OptimizerKind::AdamW ? 2 : 1];
        ASSERT_EQ(m1.bf16.size(), m.size());
        EXPECT_EQ(std::memcmp(m1.bf16.data(), m.data(), m.size() * 2), 0);
        for (size_t i = 0; i < a.params.size(); ++i) {
            EXPECT_TRUE(same_bits(a.params[i], again.params[i])) << "deterministic " << i;
            EXPECT_FALSE(same_bits(a.params[i], full.params[i])) << "the rounding is not vacuous " << i;
            // Close to the fp32 state's run: within 2% of how far the masters travelled.
            double moved = 0, diff = 0;
            for (size_t e = 0; e < a.params[i].size(); ++e) {
                moved = std::max(moved, std::fabs(double(full.params[i][e]) - start.params[i][e]));
                diff = std::max(diff, std::fabs(double(a.params[i][e]) - full.params[i][e]));
            }
            EXPECT_GT(moved, 0.0) << i;
            EXPECT_LT(diff, 0.02 * moved) << i;
        }
    }
}

// A bf16 state round-trips through state_arrays/load_state bit for bit, and an fp32 state is refused by a bf16
// optimizer (and the reverse), naming the array.
TEST(Optimizer, Bf16StateRoundTripAndTypeMismatch) {
    rp::OptimizerConfig cfg;
    cfg.bf16_state = true;
    TrainRun a(cfg);
    for (int64_t t = 1; t <= 4; ++t) a.step(t);
    std::vector<std::vector<uint16_t>> copies;
    std::vector<std::string> names;
    for (const rp::StateArray & s : a.opt.state_arrays()) {
        copies.emplace_back(s.bf16.begin(), s.bf16.end());
        names.push_back(s.name);
    }
    std::vector<rp::StateArray> views;
    for (size_t i = 0; i < copies.size(); ++i) views.push_back({names[i], {}, copies[i]});
    TrainRun b(cfg);
    b.params = a.params;
    b.opt.load_state(4, views);
    for (int64_t t = 5; t <= 8; ++t) {
        a.step(t);
        b.step(t);
    }
    for (size_t i = 0; i < a.params.size(); ++i) EXPECT_TRUE(same_bits(a.params[i], b.params[i])) << i;

    TrainRun f(rp::OptimizerConfig{});
    for (int64_t t = 1; t <= 2; ++t) f.step(t);
    const Saved fs = save(f.opt);
    const std::vector<rp::StateArray> fv = fs.views();
    try {
        TrainRun c(cfg);
        c.opt.load_state(2, fv);
        ADD_FAILURE() << "an fp32 state loaded into a bf16 optimizer";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("'blk.0.w.adam_m' is fp32, this run keeps it in bf16"), std::string::npos) << e.what();
    }
    try {
        TrainRun c(rp::OptimizerConfig{});
        c.opt.load_state(4, views);
        ADD_FAILURE() << "a bf16 state loaded into an fp32 optimizer";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("'blk.0.w.adam_m' is bf16"), std::string::npos) << e.what();
    }
}
