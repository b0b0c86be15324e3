// The bounded device arena: hand-computed offsets for best fit and merging, exact high-water marks, the
// error messages (device, purpose, bytes, full vs fragmented), and a randomised comparison with a unit
// bitmap that checks no overlap, exact accounting and "fails only when no free run is long enough".
#include "ggml_rp/runtime/arena.h"
#include "base/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

using rp::Arena;

namespace {

std::string error_of(const std::function<void()> & f) {
    try {
        f();
    } catch (const rp::Error & e) {
        return e.what();
    }
    return "";
}

} // namespace

TEST(Arena, BestFitAndMerging) {
    Arena a("cpu:0", 1024, 64);
    EXPECT_EQ(a.allocate(64, "a"), 0u);
    EXPECT_EQ(a.allocate(100, "b"), 64u);   // rounded to 128
    EXPECT_EQ(a.allocate(64, "c"), 192u);
    EXPECT_EQ(a.allocate(256, "d"), 256u);
    EXPECT_EQ(a.allocate(64, "e"), 512u);
    EXPECT_EQ(a.used(), 64u + 128 + 64 + 256 + 64);
    // free b (128 at 64) and d (256 at 256): free runs 128@64, 256@256, 448@576
    a.free(64);
    a.free(256);
    EXPECT_EQ(a.largest_free(), 448u);
    // 100 bytes -> 128: best fit is the 128 run at 64, not the first big one
    EXPECT_EQ(a.allocate(100, "f"), 64u);
    // 200 -> 256: the 256 run at 256 fits exactly
    EXPECT_EQ(a.allocate(200, "g"), 256u);
    // free c between f and g: its neighbours are live, so no merge
    a.free(192);
    EXPECT_EQ(a.largest_free(), 448u);
    // free f and g: 64..512 becomes one 448-byte run (f 128 + c 64 + g 256)
    a.free(64);
    a.free(256);
    EXPECT_EQ(a.largest_free(), 448u);
    EXPECT_EQ(a.allocate(448, "h"), 64u);  // ties with the run at 576: lowest offset wins
    EXPECT_EQ(a.num_live(), 3u);
}

TEST(Arena, HighWaterIsThePeakOfLiveBytes) {
    Arena a("cpu:1", 4096, 256);
    EXPECT_EQ(a.high_water(), 0u);
    size_t x = a.allocate(1000, "x");  // 1024
    size_t y = a.allocate(10, "y");    // 256
    EXPECT_EQ(a.high_water(), 1280u);
    a.free(x);
    EXPECT_EQ(a.used(), 256u);
    EXPECT_EQ(a.high_water(), 1280u);
    size_t z = a.allocate(0, "z");  // a zero-byte request still takes one unit
    EXPECT_EQ(a.block_size(z), 256u);
    EXPECT_NE(z, y);
    EXPECT_EQ(a.high_water(), 1280u);
    a.reset_high_water();
    EXPECT_EQ(a.high_water(), 512u);
    a.free(y);
    a.free(z);
    EXPECT_EQ(a.used(), 0u);
    EXPECT_EQ(a.largest_free(), 4096u);
}

TEST(Arena, ErrorsNameTheDeviceThePurposeAndTheBytes) {
    Arena a("cpu:3", 1 << 20, 256);
    std::string msg = error_of([&] { a.allocate(2 << 20, "weights of stage F2"); });
    EXPECT_NE(msg.find("cpu:3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("weights of stage F2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("2097152 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("larger than the device capacity"), std::string::npos) << msg;

    // fill with 4 x 256 KiB, free the 1st and 3rd: 512 KiB free but no 300 KiB run
    std::vector<size_t> offs;
    for (int i = 0; i < 4; ++i) offs.push_back(a.allocate(256 << 10, "block"));
    a.free(offs[0]);
    a.free(offs[2]);
    msg = error_of([&] { a.allocate(300 << 10, "activations mb3"); });
    EXPECT_NE(msg.find("activations mb3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("307200 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fragmented"), std::string::npos) << msg;
    EXPECT_NE(msg.find("largest free block is 256.00 KiB"), std::string::npos) << msg;

    // genuinely full
    a.allocate(256 << 10, "again");
    a.allocate(256 << 10, "again");
    msg = error_of([&] { a.allocate(1, "one byte"); });
    EXPECT_NE(msg.find("only 0 bytes free"), std::string::npos) << msg;

    msg = error_of([&] { a.free(12345); });
    EXPECT_NE(msg.find("not a live allocation"), std::string::npos) << msg;
    EXPECT_THROW(Arena("cpu:9", 1024, 100), rp::Error);  // alignment must be a power of two
}

// Random allocate/free against a bitmap of 64-byte units.
TEST(Arena, RandomisedAgainstABitmap) {
    const size_t unit = 64, units = 512;
    for (uint32_t seed = 1; seed <= 20; ++seed) {
        std::mt19937 rng(seed);
        Arena a("cpu:0", unit * units, unit);
        std::vector<int> owner(units, -1);
        std::vector<std::pair<size_t, size_t>> live;  // offset, units
        size_t peak = 0;
        for (int step = 0; step < 600; ++step) {
            const bool do_alloc = live.empty() || rng() % 100 < 55;
            if (do_alloc) {
                const size_t req = 1 + rng() % (unit * 40);
                const size_t need = (req + unit - 1) / unit;
                // longest free run and the best-fit run in the bitmap
                size_t best_len = 0, best_at = SIZE_MAX;
                for (size_t i = 0; i < units;) {
                    if (owner[i] != -1) { ++i; continue; }
                    size_t j = i;
                    while (j < units && owner[j] == -1) ++j;
                    const size_t len = j - i;
                    if (len >= need && (best_at == SIZE_MAX || len < best_len)) {
                        best_len = len;
                        best_at = i;
                    }
                    i = j;
                }
                if (best_at == SIZE_MAX) {
                    EXPECT_THROW(a.allocate(req, "r"), rp::Error);
                    continue;
                }
                const size_t off = a.allocate(req, "r");
                ASSERT_EQ(off % unit, 0u);
                EXPECT_EQ(off / unit, best_at) << "seed " << seed << " step " << step;
                for (size_t k = off / unit; k < off / unit + need; ++k) {
                    ASSERT_EQ(owner[k], -1) << "overlap";
                    owner[k] = step;
                }
                live.emplace_back(off, need);
            } else {
                const size_t pick = rng() % live.size();
                const auto [off, n] = live[pick];
                a.free(off);
                for (size_t k = off / unit; k < off / unit + n; ++k) owner[k] = -1;
                live.erase(live.begin() + static_cast<long>(pick));
            }
            size_t used = 0;
            for (const auto & [o, n] : live) used += n * unit;
            peak = std::max(peak, used);
            ASSERT_EQ(a.used(), used);
            ASSERT_EQ(a.high_water(), peak);
        }
    }
}
