// The automatic partitioner of roundpipe.md §11: from per-layer costs and device memory to a fused
// training plan (plan.h).
//
// Algorithm (§11.3):
//   W = the slowest single layer, max over l of max(tf[l], tb[l]);
//   candidate bounds T = every sum of tf, and every sum of tb, over a contiguous layer range that lies in
//   [W, upper_threshold * W], ascending;
//   for each T:  FB = layers from L-1 downwards while sum tb <= T and sum mb <= cap;
//                forward stages: layers e-1 down to 0, a new stage whenever the next layer would exceed T or
//                the forward memory cap (so the first stage holds the remainder);
//                backward stages: layers 0 up to e-1 likewise with tb and mb, ordered deep -> shallow;
//                cost = max(S, min_stages) * T with S = all stages including FB;
//   keep the cheapest (the first on ties).
// Memory: cap = memory_limit / 2 per stage (two stages are resident with prefetch depth 1, §8). When one
// layer alone exceeds the cap the limit is raised to twice that layer, with a note in Plan::notes; when even
// that exceeds the device memory, rp::Error names the layer and the bytes.
//
// Balancing (our addition, `balance`): the greedy walk packs every stage to the bound and leaves one small
// remainder stage. Keeping the chosen T and the stage counts (so the cost is unchanged), balancing
// re-spreads each pass's layers evenly, walking from layer 0: every stage takes its fair share (rounded
// down) of the time still to place, so the remainder goes to the pass's first stages — the first forward
// stages and the last backward stages, which shortens fill and drain. If a balanced stage would break the
// time bound or a memory cap, that pass keeps the greedy split. With the per-layer times of roundpipe.md
// §13.8 this reproduces three of the five partitions published in §11.4 (tests/roundpipe/test_planner.cpp).
// Comparisons allow a relative 1e-9 so that one range summed in two orders gives one answer.
#pragma once

#include "ggml_rp/roundpipe/plan.h"

#include <cstddef>
#include <string>
#include <vector>

namespace rp {

struct PlannerInput {
    std::vector<double> tf;  // per layer forward time; in training the measured recompute time
    std::vector<double> tb;  // per layer backward-stage time = recompute + backward
    std::vector<size_t> mf;  // forward memory: weight + buffer bytes (empty = no memory constraint)
    std::vector<size_t> mb;  // backward memory: mf + bytes of trainable parameters (their grads)
    size_t device_memory = 0;  // the smallest device's memory; 0 = unknown (no device check)
    size_t memory_limit = 0;   // 0 = 0.6 * device_memory (no cap when both are 0)
    int min_stages = 1;        // G
    double upper_threshold = 1.1;
    bool balance = true;
    RecomputeGrain grain = RecomputeGrain::Stage;
    std::vector<std::string> layer_names;  // for messages; default "layer <i>"
};

Plan make_plan(const PlannerInput & in);

// Stage boundaries by device speed (issue #37): the stage counts and the fused tail of `plan`, each other
// stage's layers chosen so that its time (tf forward, tb backward) is in proportion to stage_speed[k], the speed
// of the device that will run stage k (dispatch order: F0 .. F(f-1), FB, B1 .. B(b-1)); a job then takes about
// the same time on whichever device it lands, and a slow device never holds up the chain. Each pass's cut
// points are where its cumulative time comes nearest to the cumulative share, every stage keeping at least one
// layer. Throws rp::Error on a size mismatch or a speed that is not positive.
Plan split_by_speed(const Plan & plan, const std::vector<double> & tf, const std::vector<double> & tb,
                    const std::vector<double> & stage_speed);

// Cold-start costs (§11.2, before any measurement): bytes as the time proxy, forward = recompute = bytes,
// backward = 2 * bytes, so tb = recompute + backward = 3 * bytes.
void cold_start_times(const std::vector<size_t> & layer_bytes, std::vector<double> & tf, std::vector<double> & tb);

// The candidate bounds of §11.3 step 2 (sorted, duplicates removed).
std::vector<double> candidate_bounds(const std::vector<double> & tf, const std::vector<double> & tb,
                                     double upper_threshold);

} // namespace rp
