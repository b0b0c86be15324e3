#include "ggml_rp/runtime/work_queue.h"

#include <exception>
#include <utility>

namespace rp {

WorkQueue::WorkQueue(std::function<void(const std::string &)> on_error, std::function<void()> before_each)
    : on_error_(std::move(on_error)), before_each_(std::move(before_each)) {
    thread_ = std::thread([this] { loop(); });
}

WorkQueue::~WorkQueue() {
    {
        std::lock_guard<std::mutex> lk(m_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

void WorkQueue::enqueue(std::function<void()> fn) {
    {
        std::lock_guard<std::mutex> lk(m_);
        queue_.push_back(std::move(fn));
    }
    cv_.notify_all();
}

void WorkQueue::wait_idle() {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
}

void WorkQueue::loop() {
    for (;;) {
        std::function<void()> fn;
        {
            std::unique_lock<std::mutex> lk(m_);
            cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;
            fn = std::move(queue_.front());
            queue_.pop_front();
            busy_ = true;
        }
        if (before_each_) before_each_();
        try {
            fn();
        } catch (const std::exception & e) {
            if (on_error_) on_error_(e.what());
        }
        {
            std::lock_guard<std::mutex> lk(m_);
            busy_ = false;
        }
        cv_.notify_all();
    }
}

} // namespace rp
