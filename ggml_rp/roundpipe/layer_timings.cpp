#include "ggml_rp/roundpipe/layer_timings.h"

#include "ggml_rp/roundpipe/planner.h"
#include "base/error.h"

#include <cmath>
#include <string>

namespace rp {

LayerTimings::LayerTimings(const std::vector<size_t> & layer_bytes) {
    cold_start_times(layer_bytes, proxy_tf_, proxy_tb_);
    ema_fwd_.assign(layer_bytes.size(), 0.0);
    ema_bwd_.assign(layer_bytes.size(), 0.0);
}

void LayerTimings::add_iteration(const std::vector<double> & forward,
                                 const std::vector<std::pair<LayerRange, double>> & backward_stages) {
    const size_t L = proxy_tf_.size();
    if (forward.size() != L) {
        throw Error("layer timings: " + std::to_string(forward.size()) + " forward times for " + std::to_string(L) +
                    " layers");
    }
    for (size_t l = 0; l < L; ++l) {
        if (!std::isfinite(forward[l]) || forward[l] < 0) {
            throw Error("layer timings: layer " + std::to_string(l) + " has a negative or non-finite forward time");
        }
    }
    std::vector<double> backward(L, 0.0);
    std::vector<int> covered(L, 0);
    for (const auto & [range, time] : backward_stages) {
        if (range.begin < 0 || range.end > static_cast<int>(L) || range.size() <= 0) {
            throw Error("layer timings: backward stage [" + std::to_string(range.begin) + "," +
                        std::to_string(range.end) + ") is not a non-empty range of the " + std::to_string(L) + " layers");
        }
        if (!std::isfinite(time) || time < 0) throw Error("layer timings: negative or non-finite backward time");
        double fsum = 0;
        for (int l = range.begin; l < range.end; ++l) fsum += forward[static_cast<size_t>(l)];
        for (int l = range.begin; l < range.end; ++l) {
            const size_t ul = static_cast<size_t>(l);
            ++covered[ul];
            backward[ul] = fsum > 0 ? time * forward[ul] / fsum : time / range.size();
        }
    }
    for (size_t l = 0; l < L; ++l) {
        if (covered[l] != 1) {
            throw Error("layer timings: layer " + std::to_string(l) + " is covered by " + std::to_string(covered[l]) +
                        " backward stages (expected exactly one)");
        }
    }

    ++seen_;
    if (seen_ == 1) return;  // the first measured iteration is dropped
    ++samples_;
    decay_ *= kSmoothing;
    for (size_t l = 0; l < L; ++l) {
        ema_fwd_[l] = kSmoothing * ema_fwd_[l] + (1 - kSmoothing) * forward[l];
        ema_bwd_[l] = kSmoothing * ema_bwd_[l] + (1 - kSmoothing) * backward[l];
    }
}

std::vector<double> LayerTimings::forward() const {
    if (!measured()) return proxy_tf_;
    std::vector<double> out(ema_fwd_.size());
    for (size_t l = 0; l < out.size(); ++l) out[l] = ema_fwd_[l] / (1 - decay_);
    return out;
}

std::vector<double> LayerTimings::backward_stage() const {
    if (!measured()) return proxy_tb_;
    std::vector<double> out(ema_fwd_.size());
    for (size_t l = 0; l < out.size(); ++l) out[l] = (ema_fwd_[l] + ema_bwd_[l]) / (1 - decay_);
    return out;
}

} // namespace rp
