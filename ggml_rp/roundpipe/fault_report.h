// The first error any actor of the runtime met (a device thread, the optimizer thread, a program launch),
// kept so that the controller rethrows it from its next call, and a flag every actor can poll.
#pragma once

#include "base/error.h"

#include <atomic>
#include <mutex>
#include <string>

namespace rp {

class FaultReport {
public:
    void record(const std::string & what) {
        std::lock_guard<std::mutex> lk(m_);
        if (first_.empty()) first_ = what;
        failed_.store(true);
    }
    bool failed() const { return failed_.load(); }
    // Throws rp::Error "pipeline: <first error>" once anything failed.
    void rethrow() const {
        if (!failed()) return;
        std::lock_guard<std::mutex> lk(m_);
        throw Error("pipeline: " + first_);
    }

private:
    mutable std::mutex m_;
    std::string first_;
    std::atomic<bool> failed_{false};
};

} // namespace rp
