// The pool of pinned host buffers (runtime/pinned_pool.h) on a CPU virtual device: a dropped buffer's block
// serves the next request of a size it fits (at least half its size), from any thread; a block too large for
// the request is not used for it; the cache never holds more than was in use at once; the pool outlives the
// handle that made it while buffers are out.
#include "ggml_rp/runtime/cpu_device.h"
#include "ggml_rp/runtime/pinned_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

TEST(PinnedPool, ADroppedBufferServesTheNextRequestThatFits) {
    rp::CpuDevice dev(0, rp::CpuDeviceOptions{});
    auto pool = rp::PinnedPool::make(dev);
    void * first = nullptr;
    {
        rp::PinnedBuffer a = pool->take(10000);
        ASSERT_NE(a.data(), nullptr);
        EXPECT_EQ(a.size(), 10000u);
        std::memset(a.data(), 7, a.size());
        first = a.data();
    }
    EXPECT_EQ(pool->stats().cached_bytes, 12288u);  // whole pages
    rp::PinnedBuffer b = pool->take(9000);           // fits the 12 KiB block
    EXPECT_EQ(b.data(), first);
    EXPECT_EQ(b.size(), 9000u);
    rp::PinnedBuffer c = pool->take(9000);           // the block is out: a new one
    EXPECT_NE(c.data(), first);
    rp::PinnedPool::Stats s = pool->stats();
    EXPECT_EQ(s.allocations, 2u);
    EXPECT_EQ(s.reuses, 1u);
    EXPECT_EQ(s.in_use_bytes, 2u * 12288u);
}

TEST(PinnedPool, ABlockServesNoRequestUnderHalfItsSize) {
    rp::CpuDevice dev(0, rp::CpuDeviceOptions{});
    auto pool = rp::PinnedPool::make(dev);
    { rp::PinnedBuffer big = pool->take(1 << 20); }
    rp::PinnedBuffer small = pool->take(4096);
    EXPECT_EQ(pool->stats().allocations, 2u);
    EXPECT_EQ(pool->stats().reuses, 0u);
    rp::PinnedBuffer half = pool->take((1 << 19) + 1);
    EXPECT_EQ(pool->stats().reuses, 1u);
}

TEST(PinnedPool, TheCacheHoldsNoMoreThanWasInUseAtOnce) {
    rp::CpuDevice dev(0, rp::CpuDeviceOptions{});
    auto pool = rp::PinnedPool::make(dev);
    // Sizes that keep growing: each request finds only smaller blocks, so each pins a new one; the cache keeps
    // at most the peak in use (one block here), freeing the rest.
    for (size_t kib : {4, 16, 64, 256, 1024}) {
        rp::PinnedBuffer b = pool->take(kib << 10);
        EXPECT_LE(pool->stats().cached_bytes, pool->stats().in_use_peak);
    }
    EXPECT_EQ(pool->stats().allocations, 5u);
    EXPECT_LE(pool->stats().cached_bytes, pool->stats().in_use_peak);
    EXPECT_EQ(pool->stats().in_use_bytes, 0u);
}

TEST(PinnedPool, BuffersReturnFromOtherThreadsAndOutliveTheHandle) {
    rp::CpuDevice dev(0, rp::CpuDeviceOptions{});
    std::vector<rp::PinnedBuffer> bufs;
    std::weak_ptr<rp::PinnedPool> weak;
    {
        auto pool = rp::PinnedPool::make(dev);
        weak = pool;
        for (int i = 0; i < 8; ++i) bufs.push_back(pool->take(size_t(1000 + i)));
    }
    EXPECT_FALSE(weak.expired());  // the buffers hold the pool
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
        ts.emplace_back([&bufs, t] {
            for (int i = t; i < 8; i += 4) bufs[size_t(i)].reset();
        });
    for (auto & t : ts) t.join();
    EXPECT_TRUE(weak.expired());  // the last buffer back: the pool freed its blocks and went
}
