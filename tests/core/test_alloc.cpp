// The graph allocator: peak equals the hand-computed live-set maximum, views live in their sources, outputs
// are never reused, freed blocks are reused best fit.
#include "ggml_rp/ggml_rp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <unordered_set>

using rp::Context;
using rp::DType;
using rp::Tensor;

namespace {

struct Small {
    Context ctx;
    Tensor *x, *a, *b, *c, *d, *f, *e;
    rp::Graph g;

    // x [64] leaf (256 B)
    // a = scale(x)          256 B
    // b = silu(a)           256 B
    // c = add(a, b)         256 B    a, b die after c
    // d = repeat(c, [64,2]) 512 B    c dies after d (unless it is an output)
    // f = reshape(d, 128)   view of d
    // e = sum(f)            4 B -> 64 B block; d dies after e
    explicit Small(bool c_is_output) {
        x = ctx.new_tensor(DType::F32, 64);
        ctx.alloc_data(x);
        a = rp::scale(ctx, x, 0.5f);
        b = rp::silu(ctx, a);
        c = rp::add(ctx, a, b);
        if (c_is_output) c->flags |= rp::kFlagOutput;
        Tensor * like = ctx.new_tensor(DType::F32, 64, 2);
        d = rp::repeat(ctx, c, like);
        f = rp::reshape(ctx, d, 128);
        e = rp::sum(ctx, f);
        e->flags |= rp::kFlagOutput;
        rp::build_forward(g, e);
    }
};

// The most bytes live at once: no placement of these lifetimes takes less.
size_t live_bound(const std::vector<size_t> & sizes, const std::vector<size_t> & freed) {
    size_t most = 0;
    for (size_t t = 0; t < sizes.size(); ++t) {
        size_t live = 0;
        for (size_t i = 0; i <= t; ++i)
            if (freed[i] >= t) live += sizes[i];
        most = std::max(most, live);
    }
    return most;
}

// Every pair of blocks live at once apart, and the buffer's size as the placement uses it.
size_t checked_extent(const std::vector<size_t> & sizes, const std::vector<size_t> & freed, const std::vector<size_t> & offsets) {
    size_t extent = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
        if (sizes[i] == 0) continue;
        extent = std::max(extent, offsets[i] + sizes[i]);
        for (size_t j = i + 1; j < sizes.size(); ++j)
            if (sizes[j] > 0 && j <= freed[i]) {
                EXPECT_TRUE(offsets[i] + sizes[i] <= offsets[j] || offsets[j] + sizes[j] <= offsets[i]) << i << " " << j;
            }
    }
    return extent;
}

// The plain greedy reference: the largest blocks first, each at the lowest offset free over its lifetime.
size_t largest_first(const std::vector<size_t> & sizes, const std::vector<size_t> & freed) {
    std::vector<size_t> order;
    for (size_t i = 0; i < sizes.size(); ++i)
        if (sizes[i] > 0) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
    std::vector<size_t> offsets(sizes.size(), 0);
    size_t top = 0;
    for (size_t k = 0; k < order.size(); ++k) {
        const size_t i = order[k];
        size_t off = 0;
        for (bool moved = true; moved;) {
            moved = false;
            for (size_t m = 0; m < k; ++m) {
                const size_t j = order[m];
                if (j <= freed[i] && i <= freed[j] && off < offsets[j] + sizes[j] && offsets[j] < off + sizes[i]) {
                    off = offsets[j] + sizes[j];
                    moved = true;
                }
            }
        }
        offsets[i] = off;
        top = std::max(top, off + sizes[i]);
    }
    return top;
}

} // namespace

TEST(CoreAlloc, PeakEqualsHandComputedLiveSet) {
    Small s(false);
    // Live sets (bytes) just after each node's block is taken:
    //   a: 256   b: 512   c: 768 (a, b, c)   then a, b freed -> 256
    //   d: 256 + 512 = 768, then c freed -> 512   e: 512 + 64 = 576
    // max = 768, and best fit puts d into the 512-byte hole left by a and b, so the buffer is exactly that.
    const rp::AllocPlan plan = rp::plan_graph(s.g, 64);
    EXPECT_EQ(plan.size, 768u);
    rp::CpuBackend be;
    EXPECT_EQ(be.allocate(s.g), 768u);
    EXPECT_EQ(s.d->data, s.a->data);              // reused a's block (best fit, lowest offset)
    EXPECT_EQ(s.f->data, s.d->data);              // a view lives in its source
    EXPECT_EQ(static_cast<char *>(s.e->data), static_cast<char *>(s.a->data) + 512);  // c's block, freed at the top
    std::vector<float> xv(64);
    for (int i = 0; i < 64; ++i) xv[static_cast<size_t>(i)] = 0.01f * static_cast<float>(i - 32);
    rp::tensor_set_f32(s.x, xv);
    be.compute(s.g, 2);
    double want = 0.0;
    for (float v : xv) {
        const double a = 0.5 * v;
        want += 2.0 * (a + a / (1.0 + std::exp(-a)));
    }
    EXPECT_NEAR(rp::tensor_get_f32(s.e)[0], want, 1e-5);
}

TEST(CoreAlloc, OutputsAreNeverReused) {
    Small s(true);
    // c stays live: at e the live set is c (256) + d (512) + e (64) = 832.
    const rp::AllocPlan plan = rp::plan_graph(s.g, 64);
    EXPECT_EQ(plan.size, 832u);
    rp::CpuBackend be;
    be.allocate(s.g);
    for (Tensor * t : {s.a, s.b, s.d, s.e}) EXPECT_NE(t->data, s.c->data);
}

// An output that is a view keeps its root's memory: the root is not released after its last use, so nothing
// computed later lands on the view's values (segment_sum's output is a reshape of its scatter-add).
TEST(CoreAlloc, AnOutputViewKeepsItsRoot) {
    Context ctx;
    Tensor * x = ctx.new_tensor(DType::F32, 64);
    ctx.alloc_data(x);
    Tensor * a = rp::scale(ctx, x, 2.0f);
    Tensor * v = rp::reshape(ctx, a, 8, 8);
    v->flags |= rp::kFlagOutput;
    Tensor * b = rp::silu(ctx, rp::scale(ctx, x, 3.0f));  // would take a's block were it released
    Tensor * e = rp::add(ctx, rp::sum(ctx, v), rp::sum(ctx, b));
    e->flags |= rp::kFlagOutput;
    rp::Graph g;
    rp::build_forward(g, e);
    rp::build_forward(g, v);
    rp::CpuBackend be;
    be.allocate(g);
    std::vector<float> xv(64);
    for (int i = 0; i < 64; ++i) xv[size_t(i)] = 0.25f * float(i);
    rp::tensor_set_f32(x, xv);
    be.compute(g, 1);
    for (Tensor * t : {b, b->src[0]}) EXPECT_NE(t->data, a->data);
    const std::vector<float> got = rp::tensor_get_f32(v);
    for (int i = 0; i < 64; ++i) EXPECT_EQ(got[size_t(i)], 2.0f * xv[size_t(i)]) << i;
}

// A placed node (memory its caller provides: host training's kept activations) takes no buffer space, keeps
// the data it was given, and what it reads still lives until it runs: here c (placed) reads a and b, so
// neither is freed before c; d then reuses their blocks.
TEST(CoreAlloc, PlacedNodesTakeNoSpaceAndTheirSourcesLiveUntilThey) {
    Small s(false);
    const std::unordered_set<const Tensor *> placed = {s.c};
    const rp::AllocPlan plan = rp::plan_graph(s.g, 64, &placed);
    size_t ci = 0;
    while (s.g.nodes[ci] != s.c) ++ci;
    EXPECT_EQ(plan.offsets[ci], SIZE_MAX);
    // a (256) and b (256) live until c; then d (512) takes their 512 bytes and e (64) the next block.
    EXPECT_EQ(plan.size, 576u);
    alignas(64) static float c_memory[64];
    s.c->data = c_memory;
    rp::CpuBackend be;
    be.allocate(s.g, plan);
    EXPECT_EQ(s.c->data, static_cast<void *>(c_memory));
    EXPECT_NE(s.a->data, s.b->data);
    std::vector<float> xv(64, 0.25f);
    rp::tensor_set_f32(s.x, xv);
    be.compute(s.g, 2);
    const double a = 0.125;
    EXPECT_NEAR(rp::tensor_get_f32(s.e)[0], 128.0 * (a + a / (1.0 + std::exp(-a))), 1e-4);
}

TEST(CoreAlloc, LeafsAndViewsOfLeafsTakeNoBufferSpace) {
    Context ctx;
    Tensor * x = ctx.new_tensor(DType::F32, 16, 4);
    ctx.alloc_data(x);
    Tensor * t = rp::transpose(ctx, x);
    Tensor * y = rp::cont(ctx, t);
    y->flags |= rp::kFlagOutput;
    rp::Graph g;
    rp::build_forward(g, y);
    rp::CpuBackend be;
    EXPECT_EQ(be.allocate(g), 256u);
    EXPECT_EQ(t->data, x->data);
}

TEST(CoreAlloc, AlignmentAndSmallBlocks) {
    Context ctx;
    Tensor * x = ctx.new_tensor(DType::F32, 3);
    ctx.alloc_data(x);
    Tensor * y = rp::silu(ctx, x);  // 12 bytes -> one 256-byte block at alignment 256
    y->flags |= rp::kFlagOutput;
    rp::Graph g;
    rp::build_forward(g, y);
    EXPECT_EQ(rp::plan_graph(g, 256).size, 256u);
    EXPECT_EQ(rp::plan_graph(g, 64).size, 64u);
    EXPECT_THROW(rp::plan_graph(g, 48), rp::Error);
}

TEST(CoreAlloc, ComputeWithoutAllocateIsAnError) {
    Context ctx;
    Tensor * x = ctx.new_tensor(DType::F32, 3);
    Tensor * y = rp::silu(ctx, x);
    rp::Graph g;
    rp::build_forward(g, y);
    rp::CpuBackend be;
    EXPECT_THROW(be.compute(g, 1), rp::Error);  // leaf x has no data
    ctx.alloc_data(x);
    EXPECT_THROW(be.compute(g, 1), rp::Error);  // y has no memory
    be.allocate(g);
    EXPECT_NO_THROW(be.compute(g, 1));
}

// Best fit leaves a hole a later, larger block cannot use: a (256) and b (256) side by side, a freed after b, then
// c (512) does not fit a's 256 and would grow the buffer to 1024. The lifetimes are known before anything runs, so
// the larger block is placed first: c at 0 (a, which dies before c is taken, shares it), b above it, e (64) beside
// c: 768 bytes, the most that is ever live (b and c).
TEST(CoreAlloc, TheLargestBlocksPlacedFirstFillTheHolesBestFitLeaves) {
    Context ctx;
    Tensor * x = ctx.new_tensor(DType::F32, 64);
    ctx.alloc_data(x);
    Tensor * a = rp::scale(ctx, x, 0.5f);                                   // 256 B, read by b only
    Tensor * b = rp::silu(ctx, a);                                          // 256 B, read by c only
    Tensor * c = rp::repeat(ctx, b, ctx.new_tensor(DType::F32, 64, 2));      // 512 B
    Tensor * e = rp::sum(ctx, c);
    e->flags |= rp::kFlagOutput;
    rp::Graph g;
    rp::build_forward(g, e);
    EXPECT_EQ(rp::plan_graph(g, 64).size, 768u);
    rp::CpuBackend be;
    EXPECT_EQ(be.allocate(g), 768u);
    EXPECT_EQ(c->data, a->data);
    std::vector<float> xv(64);
    for (int i = 0; i < 64; ++i) xv[size_t(i)] = 0.05f * float(i - 20);
    rp::tensor_set_f32(x, xv);
    be.compute(g, 2);
    double want = 0.0;
    for (float v : xv) {
        const double av = 0.5 * v;
        want += 2.0 * av / (1.0 + std::exp(-av));
    }
    EXPECT_NEAR(rp::tensor_get_f32(e)[0], want, 1e-5);
}

// The largest blocks first is not always best either: here it takes 1792 bytes (7 units of 256) and best fit online
// 2304, while at most 1536 are ever live (n4 and the output n5). Placing the blocks of the most crowded moments first
// (n4, n5, then n2 and n3 of the next most crowded) reaches that.
//   n0 = repeat(x, 128)  512 B   read by n1          n3 = repeat(x, 128)  512 B   read by n4
//   n1 = scale(n0)       512 B   read by n2          n4 = add(n3, n2)     512 B   read by n5
//   n2 = sum_to(n1, 64)  256 B   read by n4          n5 = repeat(n4, 256) 1024 B  the output
TEST(CoreAlloc, TheBlocksOfTheMostCrowdedMomentsPlacedFirstReachTheLiveBound) {
    Context ctx;
    Tensor * x = ctx.new_tensor(DType::F32, 64);
    ctx.alloc_data(x);
    Tensor * n0 = rp::repeat(ctx, x, ctx.new_tensor(DType::F32, 128));
    Tensor * n1 = rp::scale(ctx, n0, 0.5f);
    Tensor * n2 = rp::sum_to(ctx, n1, x);
    Tensor * n3 = rp::repeat(ctx, x, ctx.new_tensor(DType::F32, 128));
    Tensor * n4 = rp::add(ctx, n3, n2);
    Tensor * n5 = rp::repeat(ctx, n4, ctx.new_tensor(DType::F32, 256));
    n5->flags |= rp::kFlagOutput;
    rp::Graph g;
    rp::build_forward(g, n2);   // n0, n1, n2 first: the order of the lifetimes above
    rp::build_forward(g, n5);
    ASSERT_EQ(g.nodes.size(), 6u);
    EXPECT_EQ(g.nodes[3], n3);
    EXPECT_EQ(rp::plan_graph(g, 64).size, 1536u);
    rp::CpuBackend be;
    EXPECT_EQ(be.allocate(g), 1536u);
    std::vector<float> xv(64);
    for (int i = 0; i < 64; ++i) xv[size_t(i)] = 0.25f * float(i - 30);
    rp::tensor_set_f32(x, xv);
    be.compute(g, 2);
    const std::vector<float> got = rp::tensor_get_f32(n5);
    for (int i = 0; i < 256; ++i) EXPECT_FLOAT_EQ(got[size_t(i)], xv[size_t(i % 64)] + 2.0f * 0.5f * xv[size_t(i % 64)]) << i;
}

// Four blocks (units of 64 B) whose lifetimes only the third offline order packs to the live bound: 0 of 4 units in
// [0, 1], 1 of 2 in [1, 3], 2 of 3 in [2, 3], 3 of 2 in [3, 3]; live 4, 6, 5, 7. Every block is in the crowded moment
// (node 3 or node 1 with 6 of its 7), so the crowded-first order falls back on size like the largest-first one: 0 at
// 0, 2 (3 units) at 0 (after 0 is freed), 1 beside 0 at 4, and 3 above 2 and 1 at 6: 8 units. Online best fit also
// takes 8. The longest-lived of them first (0, 1, then 2 and 3) gives 0 at 0, 1 at 4, 2 at 0 and 3 at 3: 7.
TEST(CoreAlloc, TheLongestLivedBlocksOfTheCrowdedMomentsPlacedFirstReachTheLiveBound) {
    const size_t u = 64;
    const std::vector<size_t> sizes = {4 * u, 2 * u, 3 * u, 2 * u}, freed = {1, 3, 3, 3};
    std::vector<size_t> offsets(4, SIZE_MAX);
    EXPECT_EQ(rp::place_lifetimes(sizes, freed, offsets), 7 * u);
    EXPECT_EQ(checked_extent(sizes, freed, offsets), 7 * u);  // no two blocks live at once share a byte
    // a block of size 0 is no block: its offset stays as given
    std::vector<size_t> with_none(5, 12345);
    const std::vector<size_t> sizes5 = {4 * u, 0, 2 * u, 3 * u, 2 * u}, freed5 = {2, 1, 4, 4, 4};
    EXPECT_EQ(rp::place_lifetimes(sizes5, freed5, with_none), 7 * u);
    EXPECT_EQ(with_none[1], 12345u);
}


// The lifetimes of one of the graphs the planner sizes for a Qwen3.5-4B DeltaNet layer near 120k tokens (45 nodes, 30
// blocks; bytes, from rp-simulate --max-seq). Each of the three greedy orders takes 10.7-12.6 GB, a fifth above the
// 8.8 GB live at the busiest moment; the local search over the order packs them into exactly that.
TEST(CoreAlloc, TheSearchOverOrdersPacksAQwen35LayerToTheLiveBound) {
    const std::vector<size_t> sizes = {
        1187205120, 14840064, 14840064, 3799056384, 0, 3799154688, 3799056384, 0, 949764096, 0, 957184256, 0, 949764096, 0,
        957184256, 0, 1899528192, 0, 14840064, 14840064, 14840064, 0, 14840064, 14840064, 14840064, 0, 14840064, 14840064,
        14840064, 0, 14840064, 0, 2140700672, 14840064, 14840064, 1899528192, 0, 0, 1899528192, 0, 14840064, 14840064,
        1187205120, 0, 1187205120};
    const std::vector<size_t> freed = {35, 2, 4, 5, 45, 6, 16, 45, 10, 45, 32, 45, 14, 45, 32, 45, 32, 45, 19, 21, 22, 45, 23,
                                       24, 32, 45, 27, 29, 30, 45, 32, 45, 38, 34, 36, 38, 45, 45, 42, 45, 41, 43, 44, 45, 45};
    const size_t bound = live_bound(sizes, freed);
    EXPECT_EQ(bound, 8800158208u);
    EXPECT_GT(largest_first(sizes, freed), bound + bound / 5);
    std::vector<size_t> offsets(sizes.size(), SIZE_MAX);
    EXPECT_EQ(rp::place_lifetimes(sizes, freed, offsets), bound);
    EXPECT_EQ(checked_extent(sizes, freed, offsets), bound);
}

// Lifetimes that are not lifetimes are refused, naming the block, and leave the offsets as they were.
TEST(CoreAlloc, PlaceLifetimesRefusesBadLifetimes) {
    std::vector<size_t> offsets(3, 7);
    try {
        rp::place_lifetimes({64, 64, 64}, {2, 2, 1}, offsets);
        ADD_FAILURE() << "a block freed before it is taken was placed";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("block 2 is freed after node 1"), std::string::npos) << e.what();
    }
    EXPECT_THROW(rp::place_lifetimes({64, 64}, {1, 1, 2}, offsets), rp::Error);
    EXPECT_EQ(offsets, std::vector<size_t>(3, 7));
}

// Random lifetime sets (4 to 60 blocks of 1 to 40 units, some never freed): live blocks never share a byte, the
// buffer is at least the live bound and at most the plain greedy's, and the placement is a function of the lifetimes
// alone: the same sizes times 3 (whose every comparison is the same) are placed at 3 times the offsets.
TEST(CoreAlloc, ThePlacementIsAFunctionOfTheLifetimesAlone) {
    std::mt19937 rng(23);
    for (int trial = 0; trial < 40; ++trial) {
        const size_t n = 4 + rng() % 57;
        std::vector<size_t> sizes(n), freed(n);
        for (size_t i = 0; i < n; ++i) {
            sizes[i] = rng() % 6 == 0 ? 0 : 64 * (1 + rng() % 40);
            freed[i] = rng() % 10 == 0 ? n : std::min(n - 1, i + rng() % (1 + n / 3));
        }
        std::vector<size_t> offsets(n, SIZE_MAX);
        const size_t size = rp::place_lifetimes(sizes, freed, offsets);
        EXPECT_EQ(checked_extent(sizes, freed, offsets), size) << trial;
        EXPECT_GE(size, live_bound(sizes, freed)) << trial;
        EXPECT_LE(size, largest_first(sizes, freed)) << trial;
        std::vector<size_t> sizes3 = sizes, offsets3(n, SIZE_MAX);
        for (size_t & s : sizes3) s *= 3;
        EXPECT_EQ(rp::place_lifetimes(sizes3, freed, offsets3), 3 * size) << trial;
        for (size_t i = 0; i < n; ++i)
            if (sizes[i] > 0) {
                EXPECT_EQ(offsets3[i], 3 * offsets[i]) << trial << " block " << i;
            }
    }
}

// On random graphs (chains and fan-outs of elementwise ops, broadcasts and sums of sizes 1 to 64 KiB, some outputs):
// no two blocks that are live at once share a byte, and the buffer holds the largest live set.
TEST(CoreAlloc, RandomGraphsNeverOverlapLiveBlocks) {
    std::mt19937 rng(19);
    for (int trial = 0; trial < 60; ++trial) {
        Context ctx;
        Tensor * x = ctx.new_tensor(DType::F32, 16);
        ctx.alloc_data(x);
        std::vector<Tensor *> pool{x};
        const int n = 10 + static_cast<int>(rng() % 50);
        for (int i = 0; i < n; ++i) {
            Tensor * s = pool[rng() % pool.size()];
            Tensor * t = nullptr;
            switch (rng() % 4) {
            case 0: t = rp::silu(ctx, s); break;
            case 1: t = rp::scale(ctx, s, 0.5f); break;
            case 2: t = rp::repeat(ctx, s, ctx.new_tensor(DType::F32, s->ne[0], s->ne[1] * int64_t(1 + rng() % 4))); break;
            default: {
                Tensor * o = pool[rng() % pool.size()];
                t = rp::same_shape(o, s) ? rp::add(ctx, s, o) : rp::sum(ctx, s);
            }
            }
            if (t->nelements() > 16384) t = rp::sum(ctx, t);
            if (rng() % 9 == 0) t->flags |= rp::kFlagOutput;
            pool.push_back(t);
        }
        Tensor * last = pool.back();
        last->flags |= rp::kFlagOutput;
        rp::Graph g;
        for (Tensor * t : pool)
            if (t->has_flag(rp::kFlagOutput)) rp::build_forward(g, t);
        const rp::AllocPlan plan = rp::plan_graph(g, 64);
        // Lifetimes, computed here: taken at the node's index, freed after its last reader (outputs: never).
        const size_t N = g.nodes.size();
        std::vector<size_t> freed(N), bytes(N, 0);
        for (size_t i = 0; i < N; ++i) {
            freed[i] = g.nodes[i]->has_flag(rp::kFlagOutput) ? N : i;
            if (!g.nodes[i]->is_view()) bytes[i] = (g.nodes[i]->nbytes() + 63) / 64 * 64;
        }
        for (size_t i = 0; i < N; ++i)
            for (const Tensor * s : g.nodes[i]->src)
                for (size_t j = 0; s && j < i; ++j)
                    if (g.nodes[j] == s && freed[j] != N) freed[j] = std::max(freed[j], i);
        SCOPED_TRACE("trial " + std::to_string(trial));
        EXPECT_GE(plan.size, live_bound(bytes, freed));
        EXPECT_LE(checked_extent(bytes, freed, plan.offsets), plan.size);
    }
}
