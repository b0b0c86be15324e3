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
    // A program's own error (a kernel that refused its data) may be a consequence of a fault upstream: a failed
    // upload leaves the buffer the program reads unwritten, and the stream that waited on it still runs (a
    // job's error poisons its own stream only, runtime/device.h). Such errors are reported only when nothing
    // else failed; the controller syncs the devices before it rethrows, so a stream's fault is seen first.
    enum class Origin { Actor, Program };
    void record(const std::string & what, Origin origin = Origin::Actor) {
        std::lock_guard<std::mutex> lk(m_);
        std::string & first = origin == Origin::Program ? first_program_ : first_;
        if (first.empty()) first = what;
        failed_.store(true);
    }
    bool failed() const { return failed_.load(); }
    // Throws rp::Error "pipeline: <first error>" once anything failed.
    void rethrow() const {
        if (!failed()) return;
        std::lock_guard<std::mutex> lk(m_);
        throw Error("pipeline: " + (first_.empty() ? first_program_ : first_));
    }

private:
    mutable std::mutex m_;
    std::string first_, first_program_;
    std::atomic<bool> failed_{false};
};

} // namespace rp
