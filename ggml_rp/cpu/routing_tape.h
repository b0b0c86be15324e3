// Fixed expert routing for finite-difference checks of mixture-of-experts models (models/check/gradient_check).
//
// A loss with top-k routing is piecewise smooth: where a perturbation changes some token's choice of experts,
// a central difference measures the jump, not the derivative (the analytic gradient holds the choice fixed,
// as backpropagation through a discrete selection does). While a RoutingTape is installed, the CPU backend's
// MOE_TOPK nodes either record the experts they choose, in the order they run, or replay those choices in the
// same order instead of choosing: the loss of the perturbed weights is then evaluated with the base routing,
// a smooth function whose derivative the analytic gradient is.
//
// One tape at a time, process-wide (the check runs one host evaluation at a time); recording and replaying
// must run the same graphs in the same order, and a replay that meets another node shape is an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace rp::cpu {

class RoutingTape {
public:
    // Installs the tape in Record mode. rp::Error if another tape is installed.
    RoutingTape();
    ~RoutingTape();  // uninstalls it
    RoutingTape(const RoutingTape &) = delete;
    RoutingTape & operator=(const RoutingTape &) = delete;

    // From the next MOE_TOPK node on, replay what was recorded, from the first recorded node.
    void replay();
    // How many nodes were recorded.
    size_t nodes() const;

    // The CPU kernel's side: nullptr when no tape is installed.
    static RoutingTape * active();
    // Record: stores the node's choices (k x T ids). Replay: overwrites them with the next recorded node's;
    // rp::Error when that node had another shape.
    void on_topk(int32_t * ids, size_t n, const char * node_name);

private:
    mutable std::mutex m_;
    bool replaying_ = false;
    size_t next_ = 0;
    std::vector<std::vector<int32_t>> nodes_;
};

} // namespace rp::cpu
