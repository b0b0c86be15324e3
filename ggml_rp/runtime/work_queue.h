// One host thread that runs closures in FIFO order. The RoundPipe runtime's actors are such threads: the
// optimizer thread (roundpipe.md §3.1: copy-back, gradient hand-off, the update, the done flag, so the
// controller can return from a step while the update runs) and each device's worker (roundpipe/
// device_worker.h). A closure that throws is reported through on_error and the queue goes on. before_each
// runs before every closure (the race fuzz's delays).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace rp {

class WorkQueue {
public:
    explicit WorkQueue(std::function<void(const std::string &)> on_error, std::function<void()> before_each = {});
    ~WorkQueue();  // runs what is queued, then joins
    WorkQueue(const WorkQueue &) = delete;
    WorkQueue & operator=(const WorkQueue &) = delete;

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
