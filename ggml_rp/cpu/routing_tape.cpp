#include "ggml_rp/cpu/routing_tape.h"

#include "base/error.h"

#include <atomic>
#include <string>

namespace rp::cpu {

namespace {
std::atomic<RoutingTape *> g_active{nullptr};
} // namespace

RoutingTape::RoutingTape() {
    RoutingTape * none = nullptr;
    if (!g_active.compare_exchange_strong(none, this)) throw Error("routing tape: another tape is installed");
}

RoutingTape::~RoutingTape() { g_active.store(nullptr); }

RoutingTape * RoutingTape::active() { return g_active.load(); }

void RoutingTape::replay() {
    std::lock_guard<std::mutex> lk(m_);
    replaying_ = true;
    next_ = 0;
}

size_t RoutingTape::nodes() const {
    std::lock_guard<std::mutex> lk(m_);
    return nodes_.size();
}

void RoutingTape::on_topk(int32_t * ids, size_t n, const char * node_name) {
    std::lock_guard<std::mutex> lk(m_);
    if (!replaying_) {
        nodes_.emplace_back(ids, ids + n);
        return;
    }
    if (next_ >= nodes_.size() || nodes_[next_].size() != n)
        throw Error(std::string("routing tape: ") + node_name + " (" + std::to_string(n) + " ids) is not the node recorded at position " +
                    std::to_string(next_) + " of " + std::to_string(nodes_.size()) + ": the replay runs other graphs than the recording");
    const std::vector<int32_t> & rec = nodes_[next_++];
    std::copy(rec.begin(), rec.end(), ids);
}

} // namespace rp::cpu
