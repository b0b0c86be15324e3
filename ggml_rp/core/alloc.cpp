#include "ggml_rp/core/alloc.h"

#include "base/error.h"
#include "ggml_rp/core/counter_rng.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>

namespace rp {

namespace {

// Best-fit free list over a virtual address range [0, top). Free blocks never touch top: a block freed at
// the end shrinks the range instead, so growing always starts at top.
class BlockAllocator {
public:
    size_t alloc(size_t size) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < free_.size(); ++i)
            if (free_[i].size >= size && (best == SIZE_MAX || free_[i].size < free_[best].size)) best = i;
        if (best != SIZE_MAX) {
            const size_t off = free_[best].off;
            free_[best].off += size;
            free_[best].size -= size;
            if (free_[best].size == 0) free_.erase(free_.begin() + static_cast<ptrdiff_t>(best));
            return off;
        }
        // No block fits: grow at the end.
        const size_t off = top_;
        top_ = off + size;
        peak_ = std::max(peak_, top_);
        return off;
    }

    void release(size_t off, size_t size) {
        auto it = std::lower_bound(free_.begin(), free_.end(), off, [](const Block & b, size_t o) { return b.off < o; });
        it = free_.insert(it, Block{off, size});
        // Merge with the next, then with the previous block.
        if (it + 1 != free_.end() && it->off + it->size == (it + 1)->off) {
            it->size += (it + 1)->size;
            free_.erase(it + 1);
        }
        if (it != free_.begin() && (it - 1)->off + (it - 1)->size == it->off) {
            (it - 1)->size += it->size;
            it = free_.erase(it) - 1;
        }
        // A free block at the end shrinks the used range.
        if (it->off + it->size == top_) {
            top_ = it->off;
            free_.erase(it);
        }
    }

    size_t peak() const { return peak_; }

private:
    struct Block { size_t off, size; };
    std::vector<Block> free_;  // sorted by offset, never adjacent
    size_t top_ = 0;
    size_t peak_ = 0;
};

const Tensor * root_of(const Tensor * t) { return t->view_src ? t->view_src : t; }

// Offline placement (every lifetime is known before anything runs): the blocks one after the other in an order, each
// at the lowest offset that is free over its whole lifetime [i, freed[i]] (both inclusive: block i is taken before
// node i runs and freed after its last reader ran) among the blocks placed before it.
struct OrderPlacement {
    const std::vector<size_t> & sizes;
    const std::vector<size_t> & freed;
    std::vector<size_t> order;    // the blocks (sizes[i] > 0) in placement order
    std::vector<size_t> offsets;  // per node (only the blocks' entries are set)
    std::vector<size_t> tops;     // tops[k]: the buffer's size once order[0..k] are placed

    // Places order[from..] beside order[..from) as they are. Stops once the buffer would exceed `limit` (returns
    // SIZE_MAX then, the rest unplaced); otherwise returns the buffer's size.
    size_t place_from(size_t from, size_t limit = SIZE_MAX) {
        struct Span { size_t off, end; };
        std::vector<Span> busy;
        tops.resize(order.size());
        size_t top = from > 0 ? tops[from - 1] : 0;
        for (size_t k = from; k < order.size(); ++k) {
            const size_t i = order[k];
            busy.clear();
            for (size_t m = 0; m < k; ++m) {
                const size_t j = order[m];
                if (j <= freed[i] && i <= freed[j]) busy.push_back({offsets[j], offsets[j] + sizes[j]});
            }
            std::sort(busy.begin(), busy.end(), [](const Span & a, const Span & b) { return a.off < b.off; });
            size_t off = 0;
            for (const Span & b : busy) {
                if (off + sizes[i] <= b.off) break;
                off = std::max(off, b.end);
            }
            offsets[i] = off;
            top = std::max(top, off + sizes[i]);
            if (top > limit) return SIZE_MAX;
            tops[k] = top;
        }
        return top;
    }
};

// Graphs up to this many nodes also try the offline placement (its cost grows with the square of the count).
constexpr size_t kPlaceOfflineNodes = 4096;
// The local search's budget: about this many block pairs examined (each placement of m blocks examines up to m^2 / 2),
// at most kSearchPlacements placements; none below kSearchMinPlacements (large graphs keep the greedy orders).
constexpr double kSearchPairs = 4e7;
constexpr size_t kSearchPlacements = 6000, kSearchMinPlacements = 64;
constexpr uint64_t kSearchKey = 0x5EA2C4;

// The searched placements of the last few lifetime sets. A planner sizes the same layer's graph many times over (each
// candidate plan, each sequence length of rp-simulate's search), and the search is the costly part of a plan.
class SearchMemo {
public:
    bool find(const std::vector<size_t> & sizes, const std::vector<size_t> & freed, std::vector<size_t> & offsets, size_t & size) {
        std::lock_guard<std::mutex> lock(mu_);
        for (const Entry & e : entries_)
            if (e.sizes == sizes && e.freed == freed) {
                for (size_t i = 0; i < sizes.size(); ++i)
                    if (sizes[i] > 0) offsets[i] = e.offsets[i];
                size = e.size;
                return true;
            }
        return false;
    }
    void add(const std::vector<size_t> & sizes, const std::vector<size_t> & freed, const std::vector<size_t> & offsets, size_t size) {
        std::lock_guard<std::mutex> lock(mu_);
        if (entries_.size() == kEntries) entries_.pop_front();
        entries_.push_back({sizes, freed, offsets, size});
    }

private:
    static constexpr size_t kEntries = 32;
    struct Entry { std::vector<size_t> sizes, freed, offsets; size_t size; };
    std::mutex mu_;
    std::deque<Entry> entries_;  // oldest first
};

SearchMemo & search_memo() {
    static SearchMemo memo;
    return memo;
}

} // namespace

// Three greedy orders, then a local search from them while the buffer is above the live bound (the most bytes live at
// once: no placement takes less). The orders: the largest blocks first (best fit, online, leaves holes that a later,
// larger block cannot use; placing the large blocks first packs them); the blocks of the most crowded moments first
// (by the most bytes live at once during a block's lifetime), then by size; the most crowded first, then the
// longest-lived. Each packs some graphs to the bound and leaves others up to a fifth above it (Qwen3.5's layers).
// The search moves one block to another place in the order, re-places the blocks from there on, and keeps the move
// when the buffer does not grow (moves across plateaus let it walk); three chains, one from each order, share the
// budget, and it stops at the bound. A pure function of the lifetimes (a fixed pseudo-random stream), so a plan is
// the same on every run. Returns the buffer size; offsets[i] for every i with sizes[i] > 0.
size_t place_lifetimes(const std::vector<size_t> & sizes, const std::vector<size_t> & freed, std::vector<size_t> & offsets) {
    const size_t n = sizes.size();
    if (freed.size() != n || offsets.size() != n) {
        throw Error("place_lifetimes: " + std::to_string(n) + " block sizes, " + std::to_string(freed.size()) + " lifetimes and " +
                    std::to_string(offsets.size()) + " offsets (one of each per node)");
    }
    for (size_t i = 0; i < n; ++i)
        if (sizes[i] > 0 && freed[i] < i) {
            throw Error("place_lifetimes: block " + std::to_string(i) + " is freed after node " + std::to_string(freed[i]) +
                        ", before it is taken");
        }
    std::vector<size_t> by_size;
    for (size_t i = 0; i < n; ++i)
        if (sizes[i] > 0) by_size.push_back(i);
    // The bytes live while node t runs (the difference array of the lifetimes, summed), and per block the most over
    // its lifetime.
    std::vector<int64_t> delta(n + 1, 0);
    for (size_t i : by_size) {
        delta[i] += static_cast<int64_t>(sizes[i]);
        delta[std::min(freed[i], n - 1) + 1] -= static_cast<int64_t>(sizes[i]);
    }
    std::vector<size_t> live(n);
    int64_t sum = 0;
    for (size_t t = 0; t < n; ++t) live[t] = static_cast<size_t>(sum += delta[t]);
    const size_t bound = n > 0 ? *std::max_element(live.begin(), live.end()) : 0;
    std::vector<size_t> crowd(n, 0);
    for (size_t i : by_size) {
        const auto from = live.begin() + static_cast<ptrdiff_t>(i), to = live.begin() + static_cast<ptrdiff_t>(std::min(freed[i], n - 1));
        crowd[i] = *std::max_element(from, to + 1);
    }
    std::vector<size_t> by_crowd = by_size;
    std::sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) { return sizes[a] != sizes[b] ? sizes[a] > sizes[b] : a < b; });
    std::sort(by_crowd.begin(), by_crowd.end(), [&](size_t a, size_t b) {
        return crowd[a] != crowd[b] ? crowd[a] > crowd[b] : sizes[a] != sizes[b] ? sizes[a] > sizes[b] : a < b;
    });
    auto lifetime = [&](size_t i) { return std::min(freed[i], n - 1) - i; };
    std::vector<size_t> by_crowd_life = by_crowd;
    std::sort(by_crowd_life.begin(), by_crowd_life.end(), [&](size_t a, size_t b) {
        return crowd[a] != crowd[b] ? crowd[a] > crowd[b] : lifetime(a) != lifetime(b) ? lifetime(a) > lifetime(b) : a < b;
    });

    const size_t m = by_size.size();
    std::vector<OrderPlacement> chains;
    size_t best = SIZE_MAX, best_chain = 0;
    for (std::vector<size_t> * order : {&by_size, &by_crowd, &by_crowd_life}) {
        chains.push_back(OrderPlacement{sizes, freed, std::move(*order), offsets, {}});
        const size_t size = chains.back().place_from(0);
        if (size < best) {
            best = size;
            best_chain = chains.size() - 1;
        }
    }
    std::vector<size_t> best_offsets = chains[best_chain].offsets;
    const double pairs = static_cast<double>(m) * static_cast<double>(m) / 2.0;
    const size_t placements = m < 2 ? 0 : std::min(kSearchPlacements, static_cast<size_t>(kSearchPairs / pairs));
    const bool search = best > bound && placements >= kSearchMinPlacements;
    if (search && search_memo().find(sizes, freed, offsets, best)) return best;
    if (search) {
        uint64_t draws = 0;  // the search's fixed stream of choices: rng_u32(kSearchKey, 0), (.., 1), ...
        auto below = [&](size_t k) { return static_cast<size_t>(rng_u32(kSearchKey, draws++) % k); };
        std::vector<size_t> cur_top(chains.size());
        for (size_t c = 0; c < chains.size(); ++c) cur_top[c] = chains[c].tops.back();
        OrderPlacement trial{sizes, freed, {}, {}, {}};
        for (size_t step = 0; step < placements && best > bound; ++step) {
            const size_t c = step % chains.size();
            OrderPlacement & chain = chains[c];
            const size_t a = below(m), b = below(m);
            if (a == b) continue;
            trial.order = chain.order;
            const size_t moved = trial.order[a];
            trial.order.erase(trial.order.begin() + static_cast<ptrdiff_t>(a));
            trial.order.insert(trial.order.begin() + static_cast<ptrdiff_t>(b), moved);
            trial.offsets = chain.offsets;
            trial.tops = chain.tops;
            const size_t size = trial.place_from(std::min(a, b), cur_top[c]);
            if (size == SIZE_MAX) continue;
            std::swap(chain.order, trial.order);
            std::swap(chain.offsets, trial.offsets);
            std::swap(chain.tops, trial.tops);
            cur_top[c] = size;
            if (size < best) {
                best = size;
                best_offsets = chain.offsets;
            }
        }
        search_memo().add(sizes, freed, best_offsets, best);
    }
    offsets = std::move(best_offsets);
    return best;
}

AllocPlan plan_graph(const Graph & g, size_t alignment, const std::unordered_set<const Tensor *> * placed) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) throw Error("plan_graph: alignment must be a power of two");
    AllocPlan plan;
    plan.alignment = alignment;
    plan.offsets.assign(g.nodes.size(), SIZE_MAX);

    // Index of each compute node, and the last node index that uses each one.
    std::unordered_map<const Tensor *, size_t> index;
    std::vector<size_t> last_use(g.nodes.size());
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        if (!g.nodes[i]->is_view()) index[g.nodes[i]] = i;
        last_use[i] = i;
    }
    auto touch = [&](const Tensor * t, size_t at) {
        auto it = index.find(root_of(t));
        if (it != index.end()) last_use[it->second] = std::max(last_use[it->second], at);
    };
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Tensor * n = g.nodes[i];
        if (n->is_view()) touch(n, i);
        for (const Tensor * s : n->src)
            if (s) touch(s, i);
    }
    // Outputs keep their memory; an output that is a view keeps its root's.
    std::unordered_set<const Tensor *> kept;
    for (const Tensor * n : g.nodes)
        if (n->has_flag(kFlagOutput)) kept.insert(root_of(n));
    // Nodes whose memory is released right after node i.
    std::vector<std::vector<size_t>> release_after(g.nodes.size());
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Tensor * n = g.nodes[i];
        if (n->is_view() || kept.count(n) || (placed && placed->count(n))) continue;
        release_after[last_use[i]].push_back(i);
    }

    BlockAllocator blocks;
    std::vector<size_t> sizes(g.nodes.size(), 0);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Tensor * n = g.nodes[i];
        if (!n->is_view() && !(placed && placed->count(n))) {
            const size_t bytes = n->nbytes() + n->aux_bytes;
            sizes[i] = std::max<size_t>(alignment, (bytes + alignment - 1) & ~(alignment - 1));
            plan.offsets[i] = blocks.alloc(sizes[i]);
        }
        for (size_t j : release_after[i]) blocks.release(plan.offsets[j], sizes[j]);
    }
    plan.size = blocks.peak();
    // The offline placement where it takes less (deterministic either way: a pure function of the graph).
    if (g.nodes.size() <= kPlaceOfflineNodes) {
        std::vector<size_t> freed(g.nodes.size(), g.nodes.size());  // kept blocks: never freed
        for (size_t i = 0; i < g.nodes.size(); ++i)
            for (size_t j : release_after[i]) freed[j] = i;
        std::vector<size_t> offsets = plan.offsets;
        const size_t offline = place_lifetimes(sizes, freed, offsets);
        if (offline < plan.size) {
            plan.offsets = std::move(offsets);
            plan.size = offline;
        }
    }
    return plan;
}

void resolve_views(const Graph & g) {
    for (Tensor * n : g.nodes) {
        if (!n->is_view()) continue;
        if (!n->view_src->data) throw Error("view " + describe(n) + ": its root " + describe(n->view_src) + " has no data");
        n->data = static_cast<char *>(n->view_src->data) + n->view_offs;
    }
}

void apply_plan(const Graph & g, const AllocPlan & plan, void * base) {
    if (plan.offsets.size() != g.nodes.size()) throw Error("apply_plan: the plan was made for another graph");
    if (plan.size > 0 && !base) throw Error("apply_plan: no buffer for " + std::to_string(plan.size) + " bytes");
    for (size_t i = 0; i < g.nodes.size(); ++i)
        if (!g.nodes[i]->is_view() && plan.offsets[i] != SIZE_MAX) g.nodes[i]->data = static_cast<char *>(base) + plan.offsets[i];
    resolve_views(g);
}

} // namespace rp
