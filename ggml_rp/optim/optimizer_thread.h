// The optimizer thread of the RoundPipe runtime (roundpipe.md §3.1): one host thread that runs closures in
// FIFO order — copy-back, gradient hand-off, the update, the done flag — so the controller can return from a
// step while the update runs (async mode) and the devices keep computing. A closure that throws is reported
// through on_error and the queue goes on. before_each runs before every closure (the race fuzz's delays).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace rp {

class OptimizerThread {
public:
    OptimizerThread(std::function<void(const std::string &)> on_error, std::function<void()> before_each = {});
    ~OptimizerThread();  // runs what is queued, then joins
    OptimizerThread(const OptimizerThread &) = delete;
    OptimizerThread & operator=(const OptimizerThread &) = delete;

    void enqueue(std::function<void()> fn);
    // Blocks until the queue is empty and nothing is running.
    void wait_idle();

private:
    void loop();

    std::function<void(const std::string &)> on_error_;
    std::function<void()> before_each_;
    std::mutex m_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    bool stop_ = false;
    bool busy_ = false;
    std::thread thread_;  // last
};

} // namespace rp
