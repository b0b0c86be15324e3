// rp-bench mixed (issue #37's benchmark) runs end to end on a tiny model: every mix and dispatch row is printed,
// round-robin keeps its share of jobs on every device, and dispatch by readiness reports the straggler's speed it
// was given. Nothing here is timed: the step times it prints are not checked.
#include "tests/finetune/ft_test_util.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

TEST(BenchMixed, PrintsEveryMixAndDispatchOnATinyModel) {
    std::string out;
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-bench") + " mixed --model " + ft_test::stories() +
                               " --devices 2 --steps 1 --warmup 1 --seq-len 8 --seqs 1 --rank 2 --steps-mode sync",
                           &out),
              0)
        << out;
    for (const std::string mix : {"1:1", "1:0.5", "straggler 0.25"})
        for (const std::string dispatch : {"round-robin", "ready (given)", "ready (measured)"}) {
            const std::string row = "sync  2   " + mix;
            const size_t at = out.find(row + std::string(16 - mix.size(), ' ') + dispatch);
            EXPECT_NE(at, std::string::npos) << mix << " " << dispatch << "\n" << out;
        }
    // round-robin alternates the two devices: their job counts differ by at most one; the given straggler is 0.25
    const size_t rr = out.find("straggler 0.25  round-robin");
    ASSERT_NE(rr, std::string::npos) << out;
    const std::string line = out.substr(rr, out.find('\n', rr) - rr);
    int a = -1, b = -1;
    ASSERT_EQ(std::sscanf(line.substr(line.rfind("x  ") + 3).c_str(), "%d,%d", &a, &b), 2) << line;
    EXPECT_LE(std::abs(a - b), 1) << line;
    EXPECT_NE(out.find("1.00 0.25"), std::string::npos) << out;
}
