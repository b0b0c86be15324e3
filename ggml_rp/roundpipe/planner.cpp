#include "ggml_rp/roundpipe/planner.h"

#include "ggml_rp/runtime/arena.h"
#include "base/error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

namespace rp {

namespace {

constexpr double kRelTol = 1e-9;
constexpr size_t kNoCap = std::numeric_limits<size_t>::max();

bool within(double sum, double bound) { return sum <= bound * (1 + kRelTol); }

bool fits_bytes(size_t used, size_t add, size_t cap) { return cap == kNoCap || (add <= cap && used <= cap - add); }

struct Costs {
    const std::vector<double> & tf;
    const std::vector<double> & tb;
    std::vector<size_t> mf, mb;  // zeros when there is no memory constraint
    size_t cap = kNoCap;
};

struct Partition {
    int e = 0;                       // first layer of FB
    std::vector<LayerRange> fwd;     // ascending
    std::vector<LayerRange> bwd;     // ascending over [0, e) (reversed into the plan later)
};

// Greedy walk over [lo, hi) in direction `down` (from hi-1 to lo) or up; a new stage opens whenever the
// next layer would exceed the bound or the cap. Returns ranges in ascending layer order.
std::vector<LayerRange> greedy(int lo, int hi, bool down, const std::vector<double> & t,
                               const std::vector<size_t> & m, double T, size_t cap) {
    std::vector<LayerRange> out;
    if (hi <= lo) return out;
    double ts = 0;
    size_t ms = 0;
    bool open = false;
    const int n = hi - lo;
    for (int k = 0; k < n; ++k) {
        const int l = down ? hi - 1 - k : lo + k;
        const size_t ul = static_cast<size_t>(l);
        if (!open || !within(ts + t[ul], T) || !fits_bytes(ms, m[ul], cap)) {
            out.push_back({l, l + 1});
            ts = 0;
            ms = 0;
            open = true;
        }
        LayerRange & r = out.back();
        if (down) r.begin = l;
        else r.end = l + 1;
        ts += t[ul];
        ms += m[ul];
    }
    if (down) std::reverse(out.begin(), out.end());
    return out;
}

Partition partition(const Costs & c, double T) {
    const int L = static_cast<int>(c.tf.size());
    Partition p;
    double ts = 0;
    size_t ms = 0;
    p.e = L;
    for (int l = L - 1; l >= 0; --l) {
        const size_t ul = static_cast<size_t>(l);
        if (!within(ts + c.tb[ul], T) || !fits_bytes(ms, c.mb[ul], c.cap)) break;
        ts += c.tb[ul];
        ms += c.mb[ul];
        p.e = l;
    }
    if (p.e == L) p.e = L - 1;  // cannot happen for T >= W and a raised limit; keep FB non-empty anyway
    p.fwd = greedy(0, p.e, /*down=*/true, c.tf, c.mf, T, c.cap);
    p.bwd = greedy(0, p.e, /*down=*/false, c.tb, c.mb, T, c.cap);
    return p;
}

// Even re-split of [0, n) into exactly `stages` ranges, walking up from layer 0: each stage takes layers
// while it stays within its fair share (rounded down) of the time left; the last takes the rest.
// Returns an empty vector when a stage would break the bound or the cap.
std::vector<LayerRange> balanced(int n, int stages, const std::vector<double> & t, const std::vector<size_t> & m,
                                 double T, size_t cap) {
    std::vector<LayerRange> out;
    if (stages <= 0 || n < stages) return out;
    double left = 0;
    for (int l = 0; l < n; ++l) left += t[static_cast<size_t>(l)];
    if (!(left > 0)) return out;
    const double slack = left * kRelTol;
    int at = 0;
    for (int s = 0; s < stages; ++s) {
        const int remaining = stages - s;
        int end = at;
        double sum = 0;
        size_t bytes = 0;
        if (remaining == 1) {
            for (; end < n; ++end) {
                sum += t[static_cast<size_t>(end)];
                bytes += m[static_cast<size_t>(end)];
            }
        } else {
            const double share = left / remaining;
            while (end < n - (remaining - 1)) {
                const double next = t[static_cast<size_t>(end)];
                if (end > at && sum + next > share + slack) break;
                sum += next;
                bytes += m[static_cast<size_t>(end)];
                ++end;
            }
        }
        if (!within(sum, T) || (cap != kNoCap && bytes > cap)) return {};
        out.push_back({at, end});
        left -= sum;
        at = end;
    }
    return out;
}

std::string layer_name(const PlannerInput & in, size_t l) {
    if (l < in.layer_names.size() && !in.layer_names[l].empty()) {
        return "layer " + std::to_string(l) + " ('" + in.layer_names[l] + "')";
    }
    return "layer " + std::to_string(l);
}

} // namespace

void cold_start_times(const std::vector<size_t> & layer_bytes, std::vector<double> & tf, std::vector<double> & tb) {
    tf.resize(layer_bytes.size());
    tb.resize(layer_bytes.size());
    for (size_t l = 0; l < layer_bytes.size(); ++l) {
        const double b = static_cast<double>(layer_bytes[l]);
        tf[l] = b;          // forward = recompute = bytes
        tb[l] = b + 2 * b;  // recompute + backward (2 x bytes)
    }
}

std::vector<double> candidate_bounds(const std::vector<double> & tf, const std::vector<double> & tb,
                                     double upper_threshold) {
    double W = 0;
    for (size_t l = 0; l < tf.size(); ++l) W = std::max({W, tf[l], tb[l]});
    std::vector<double> out;
    const double hi = W * upper_threshold;
    for (const std::vector<double> * times : {&tf, &tb}) {
        const size_t n = times->size();
        for (size_t s = 0; s < n; ++s) {
            double sum = 0;
            for (size_t e = s; e < n; ++e) {
                sum += (*times)[e];
                if (sum > hi) break;
                if (sum >= W) out.push_back(sum);
            }
        }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

Plan make_plan(const PlannerInput & in) {
    const size_t L = in.tf.size();
    if (L == 0) throw Error("planner: no layers");
    if (in.tb.size() != L) {
        throw Error("planner: " + std::to_string(L) + " forward times but " + std::to_string(in.tb.size()) +
                    " backward times");
    }
    const bool has_mem = !in.mf.empty() || !in.mb.empty();
    if (has_mem && (in.mf.size() != L || in.mb.size() != L)) {
        throw Error("planner: memory sizes for " + std::to_string(in.mf.size()) + " / " + std::to_string(in.mb.size()) +
                    " layers, expected " + std::to_string(L) + " (forward / backward)");
    }
    for (size_t l = 0; l < L; ++l) {
        if (!std::isfinite(in.tf[l]) || in.tf[l] < 0 || !std::isfinite(in.tb[l]) || in.tb[l] < 0) {
            throw Error("planner: " + layer_name(in, l) + " has a negative or non-finite time");
        }
    }
    if (in.min_stages < 1) throw Error("planner: min_stages must be at least 1");
    if (!(in.upper_threshold >= 1.0)) throw Error("planner: upper_threshold must be at least 1");

    Plan plan;
    plan.grain = in.grain;
    Costs c{in.tf, in.tb, {}, {}, kNoCap};
    if (has_mem) {
        c.mf = in.mf;
        c.mb = in.mb;
    } else {
        c.mf.assign(L, 0);
        c.mb.assign(L, 0);
    }

    // memory cap per stage
    size_t limit = in.memory_limit;
    if (limit == 0 && in.device_memory > 0) limit = static_cast<size_t>(0.6 * static_cast<double>(in.device_memory));
    if (has_mem && limit > 0) {
        size_t largest = 0, at = 0;
        for (size_t l = 0; l < L; ++l) {
            const size_t need = std::max(c.mf[l], c.mb[l]);
            if (need > largest) {
                largest = need;
                at = l;
            }
        }
        if (in.device_memory > 0 && (largest > in.device_memory / 2)) {
            throw Error("planner: " + layer_name(in, at) + " needs " + format_bytes(largest) +
                        " on a device (weights + trainable grads); with prefetch two stages are resident, so a "
                        "device needs " + format_bytes(2 * largest) + " but has " + format_bytes(in.device_memory));
        }
        if (largest > limit / 2) {
            plan.notes.push_back("memory limit raised from " + format_bytes(limit) + " to " +
                                 format_bytes(2 * largest) + " because " + layer_name(in, at) + " needs " +
                                 format_bytes(largest));
            limit = 2 * largest;
        }
        c.cap = limit / 2;
    }

    std::vector<double> cands = candidate_bounds(in.tf, in.tb, in.upper_threshold);
    if (cands.empty()) cands.push_back(0);  // every time is zero

    double best_cost = std::numeric_limits<double>::infinity();
    Partition best;
    double best_T = 0;
    for (double T : cands) {
        Partition p = partition(c, T);
        const int S = static_cast<int>(p.fwd.size() + p.bwd.size()) + 1;
        const double cost = std::max(S, in.min_stages) * T;
        if (cost < best_cost) {
            best_cost = cost;
            best = std::move(p);
            best_T = T;
        }
    }

    if (in.balance) {
        auto f = balanced(best.e, static_cast<int>(best.fwd.size()), c.tf, c.mf, best_T, c.cap);
        if (!f.empty()) best.fwd = std::move(f);
        auto b = balanced(best.e, static_cast<int>(best.bwd.size()), c.tb, c.mb, best_T, c.cap);
        if (!b.empty()) best.bwd = std::move(b);
    }

    plan.fwd = best.fwd;
    plan.bwd.push_back({best.e, static_cast<int>(L)});
    for (auto it = best.bwd.rbegin(); it != best.bwd.rend(); ++it) plan.bwd.push_back(*it);
    plan.stage_bound = best_T;
    plan.cost = best_cost;
    validate_plan(plan, static_cast<int>(L));
    return plan;
}

namespace {

// n stage sizes (>= 1 layer each) over `cost` (the pass's layers in its order) with times in proportion to
// `share`: cut k where the cumulative cost comes nearest to the cumulative share of stages 0..k.
std::vector<int> proportional_sizes(const std::vector<double> & cost, const std::vector<double> & share) {
    const int L = static_cast<int>(cost.size()), n = static_cast<int>(share.size());
    std::vector<double> prefix(static_cast<size_t>(L) + 1, 0.0);
    for (int l = 0; l < L; ++l) prefix[static_cast<size_t>(l) + 1] = prefix[static_cast<size_t>(l)] + cost[static_cast<size_t>(l)];
    const double total_share = std::accumulate(share.begin(), share.end(), 0.0);
    std::vector<int> sizes;
    double cum_share = 0;
    int at = 0;
    for (int k = 0; k + 1 < n; ++k) {
        cum_share += share[static_cast<size_t>(k)];
        const double target = prefix.back() * cum_share / total_share;
        const int lo = at + 1, hi = L - (n - k - 1);  // every later stage keeps a layer
        int cut = lo;
        for (int c = lo; c <= hi; ++c)
            if (std::abs(prefix[static_cast<size_t>(c)] - target) < std::abs(prefix[static_cast<size_t>(cut)] - target)) cut = c;
        sizes.push_back(cut - at);
        at = cut;
    }
    sizes.push_back(L - at);
    return sizes;
}

} // namespace

Plan split_by_speed(const Plan & plan, const std::vector<double> & tf, const std::vector<double> & tb,
                    const std::vector<double> & stage_speed) {
    const int L = plan.num_layers(), e = plan.fb_begin();
    if (static_cast<int>(tf.size()) != L || static_cast<int>(tb.size()) != L)
        throw Error("split_by_speed: per-layer times tf of " + std::to_string(tf.size()) + " and tb of " + std::to_string(tb.size()) +
                    " layers for a plan of " + std::to_string(L));
    if (static_cast<int>(stage_speed.size()) != plan.num_stages())
        throw Error("split_by_speed: " + std::to_string(stage_speed.size()) + " speeds for " + std::to_string(plan.num_stages()) + " stages");
    for (double s : stage_speed)
        if (!(s > 0) || !std::isfinite(s)) throw Error("split_by_speed: a stage's speed " + std::to_string(s) + " is not positive");
    const size_t f = plan.fwd.size();
    if (static_cast<int>(f) > e || static_cast<int>(plan.bwd.size()) - 1 > e)
        throw Error("split_by_speed: more stages than layers before the fused tail");
    std::vector<int> fwd_sizes, bwd_sizes{plan.bwd.front().size()};
    if (f > 0) {
        const std::vector<double> cost(tf.begin(), tf.begin() + e);
        fwd_sizes = proportional_sizes(cost, std::vector<double>(stage_speed.begin(), stage_speed.begin() + static_cast<long>(f)));
    }
    if (plan.bwd.size() > 1) {  // deep -> shallow
        const std::vector<double> cost(tb.rbegin() + (L - e), tb.rend());
        const std::vector<int> b = proportional_sizes(cost, std::vector<double>(stage_speed.begin() + static_cast<long>(f) + 1, stage_speed.end()));
        bwd_sizes.insert(bwd_sizes.end(), b.begin(), b.end());
    }
    Plan out = plan_from_sizes(fwd_sizes, bwd_sizes, plan.grain);
    out.stage_bound = plan.stage_bound;
    out.cost = plan.cost;
    out.notes = plan.notes;
    out.notes.push_back("stages sized by device speed");
    return out;
}

} // namespace rp
