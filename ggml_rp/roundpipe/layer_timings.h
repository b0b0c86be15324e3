// Per-layer time estimates for the planner (roundpipe.md §11.2).
//
// - Before any measurement: the cold-start byte proxy (planner.h cold_start_times).
// - Each training iteration reports, per layer, its measured forward time when recomputed (for the fused
//   tail's layers: their forward inside FB) and, per backward stage, the measured backward time (without
//   the recompute). A stage's backward time is apportioned to its layers in proportion to their forward
//   times of the same iteration (equally when those are all zero).
// - The first measured iteration is dropped (start-up noise). From the second on, an exponential moving
//   average with factor 0.9 that starts from 0 and is bias-corrected like Adam:
//       ema_n = 0.9 ema_(n-1) + 0.1 x_n,   estimate = ema_n / (1 - 0.9^n)    (n samples kept)
// - Estimates per micro-batch: tf = forward estimate, tb = forward estimate + backward estimate.
#pragma once

#include "ggml_rp/roundpipe/plan.h"

#include <cstddef>
#include <utility>
#include <vector>

namespace rp {

class LayerTimings {
public:
    static constexpr double kSmoothing = 0.9;

    explicit LayerTimings(const std::vector<size_t> & layer_bytes);

    // forward[l]: mean time of layer l's forward (recompute) per micro-batch; backward_stages: (layers,
    // mean backward time of that stage per micro-batch). The stages must cover every layer exactly once.
    // Throws rp::Error on a size mismatch, a gap, an overlap or a negative time.
    void add_iteration(const std::vector<double> & forward,
                       const std::vector<std::pair<LayerRange, double>> & backward_stages);

    size_t num_layers() const { return proxy_tf_.size(); }
    bool measured() const { return samples_ > 0; }
    int samples() const { return samples_; }          // iterations in the average (after the dropped one)
    int iterations_seen() const { return seen_; }     // including the dropped one
    std::vector<double> forward() const;              // tf
    std::vector<double> backward_stage() const;       // tb = recompute + backward

private:
    std::vector<double> proxy_tf_, proxy_tb_;
    std::vector<double> ema_fwd_, ema_bwd_;
    double decay_ = 1.0;  // 0.9^samples
    int samples_ = 0;
    int seen_ = 0;
};

} // namespace rp
