// The transfer engine's pure parts (roundpipe.md §8, §16): 256 MB chunking and LPT grouping behind pending
// activation uploads.
#include "ggml_rp/roundpipe/transfer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

namespace {

constexpr size_t MB = size_t(1) << 20;

} // namespace

TEST(Transfer, ChunksAreAtMost256MBAndTileEachTensor) {
    const std::vector<size_t> sizes = {0, 1, 256 * MB, 256 * MB + 1, 600 * MB, 3};
    const auto chunks = rp::split_chunks(sizes);
    std::map<int, size_t> covered;
    for (const rp::CopyChunk & c : chunks) {
        EXPECT_LE(c.bytes, rp::kMaxWeightChunk);
        EXPECT_GT(c.bytes, 0u);
        EXPECT_EQ(c.offset, covered[c.tensor]) << "chunks of a tensor are contiguous and in order";
        covered[c.tensor] += c.bytes;
    }
    for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(covered[static_cast<int>(i)], sizes[i]) << i;
    EXPECT_EQ(chunks.size(), 0u + 1 + 1 + 2 + 3 + 1);
    EXPECT_EQ(rp::split_chunks({10}, 4).size(), 3u);
}

TEST(Transfer, LptGroupsCoverEveryChunkOnceAndAreBalanced) {
    std::mt19937_64 rng(3);
    for (int trial = 0; trial < 200; ++trial) {
        std::vector<rp::CopyChunk> chunks;
        const int n_chunks = 1 + static_cast<int>(rng() % 40);
        for (int i = 0; i < n_chunks; ++i) chunks.push_back({i, 0, 1 + static_cast<size_t>(rng() % 1000)});
        const int n = static_cast<int>(rng() % 6);  // 0 pending marks: one group
        const auto groups = rp::lpt_groups(chunks, n);
        ASSERT_LE(groups.size(), static_cast<size_t>(std::max(n, 1)));
        std::vector<int> seen(static_cast<size_t>(n_chunks), 0);
        size_t total = 0, largest = 0, prev = 0, heaviest = 0;
        for (const auto & g : groups) {
            ASSERT_FALSE(g.empty());
            size_t load = 0;
            for (const rp::CopyChunk & c : g) {
                ++seen[static_cast<size_t>(c.tensor)];
                load += c.bytes;
            }
            EXPECT_GE(load, prev) << "issued lightest group first";
            prev = load;
            heaviest = std::max(heaviest, load);
        }
        for (const rp::CopyChunk & c : chunks) {
            total += c.bytes;
            largest = std::max(largest, c.bytes);
        }
        for (int s : seen) EXPECT_EQ(s, 1);
        // LPT: the heaviest group is at most the optimum plus the largest item (the optimum >= total / n).
        const size_t groups_n = static_cast<size_t>(std::max(n, 1));
        EXPECT_LE(heaviest, (total + groups_n - 1) / groups_n + largest);
        if (n <= 1) {
            EXPECT_EQ(groups.size(), 1u);
        }
    }
}

TEST(Transfer, LptIsExactOnAKnownCase) {
    // 7, 5, 4, 3, 1 into 2 groups: LPT gives {7, 3} = 10 and {5, 4, 1} = 10.
    std::vector<rp::CopyChunk> chunks;
    for (size_t b : {3, 7, 1, 5, 4}) chunks.push_back({static_cast<int>(chunks.size()), 0, b});
    const auto g = rp::lpt_groups(chunks, 2);
    ASSERT_EQ(g.size(), 2u);
    size_t a = 0, b = 0;
    for (const auto & c : g[0]) a += c.bytes;
    for (const auto & c : g[1]) b += c.bytes;
    EXPECT_EQ(a, 10u);
    EXPECT_EQ(b, 10u);
}
