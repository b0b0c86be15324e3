// LR schedules at chosen steps against values computed by hand.
#include "ggml_rp/optim/lr_schedule.h"
#include "base/error.h"

#include <gtest/gtest.h>

namespace {

rp::LrSchedule make(rp::LrDecay d, int64_t warmup = 10, int64_t total = 110) {
    rp::LrSchedule s;
    s.lr_max = 1e-3;
    s.lr_min = 1e-4;
    s.warmup_steps = warmup;
    s.total_steps = total;
    s.decay = d;
    s.validate();
    return s;
}

TEST(LrSchedule, Cosine) {
    const rp::LrSchedule s = make(rp::LrDecay::Cosine);
    EXPECT_NEAR(s.lr(0), 1e-4, 1e-15);       // warmup: 1e-3 * 1/10
    EXPECT_NEAR(s.lr(4), 5e-4, 1e-15);       // 1e-3 * 5/10
    EXPECT_NEAR(s.lr(9), 1e-3, 1e-15);       // last warmup step reaches the peak
    EXPECT_NEAR(s.lr(10), 1e-3, 1e-15);      // decay progress 0
    EXPECT_NEAR(s.lr(35), 8.681980515339464e-4, 1e-15);  // progress 1/4: 1e-4 + 9e-4 * (1 + cos(pi/4)) / 2
    EXPECT_NEAR(s.lr(60), 5.5e-4, 1e-15);    // progress 1/2: midpoint
    EXPECT_NEAR(s.lr(85), 2.3180194846605358e-4, 1e-15);  // progress 3/4: 1e-4 + 9e-4 * (1 - cos(pi/4)) / 2
    EXPECT_NEAR(s.lr(110), 1e-4, 1e-15);     // end of the run
    EXPECT_NEAR(s.lr(1000), 1e-4, 1e-15);    // beyond
}

TEST(LrSchedule, Linear) {
    const rp::LrSchedule s = make(rp::LrDecay::Linear);
    EXPECT_NEAR(s.lr(2), 3e-4, 1e-15);
    EXPECT_NEAR(s.lr(10), 1e-3, 1e-15);
    EXPECT_NEAR(s.lr(60), 5.5e-4, 1e-15);    // 1e-3 - 9e-4 * 0.5
    EXPECT_NEAR(s.lr(85), 3.25e-4, 1e-15);   // 1e-3 - 9e-4 * 0.75
    EXPECT_NEAR(s.lr(109), 1.09e-4, 1e-15);  // 1e-3 - 9e-4 * 0.99
    EXPECT_NEAR(s.lr(110), 1e-4, 1e-15);
}

TEST(LrSchedule, ConstantAndNoWarmup) {
    const rp::LrSchedule c = make(rp::LrDecay::Constant);
    EXPECT_NEAR(c.lr(3), 4e-4, 1e-15);
    EXPECT_NEAR(c.lr(50), 1e-3, 1e-15);
    EXPECT_NEAR(c.lr(500), 1e-3, 1e-15);
    const rp::LrSchedule s = make(rp::LrDecay::Cosine, 0, 4);
    EXPECT_NEAR(s.lr(0), 1e-3, 1e-15);
    EXPECT_NEAR(s.lr(2), 5.5e-4, 1e-15);
    EXPECT_NEAR(s.lr(4), 1e-4, 1e-15);
    const rp::LrSchedule w = make(rp::LrDecay::Linear, 4, 4);  // all warmup
    EXPECT_NEAR(w.lr(3), 1e-3, 1e-15);
    EXPECT_NEAR(w.lr(4), 1e-4, 1e-15);
}

TEST(LrSchedule, NamesAndValidation) {
    EXPECT_EQ(rp::lr_decay_from_name("cosine"), rp::LrDecay::Cosine);
    EXPECT_EQ(rp::lr_decay_from_name("linear"), rp::LrDecay::Linear);
    EXPECT_EQ(rp::lr_decay_from_name("constant"), rp::LrDecay::Constant);
    EXPECT_THROW(rp::lr_decay_from_name("step"), rp::Error);
    EXPECT_THROW(make(rp::LrDecay::Cosine, 11, 10), rp::Error);
    EXPECT_THROW(make(rp::LrDecay::Cosine, -1, 10), rp::Error);
    EXPECT_THROW(make(rp::LrDecay::Cosine, 0, 0), rp::Error);
    rp::LrSchedule s;
    s.lr_min = 1.0;
    s.lr_max = 0.5;
    try {
        s.validate();
        FAIL();
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("lr_min"), std::string::npos) << e.what();
    }
}

} // namespace
