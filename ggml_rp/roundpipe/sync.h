// Host-side synchronisation objects of the RoundPipe protocol (roundpipe.md §9).
//
// HostFlag: a per-layer boolean with wait / wait-and-clear / set, paired with device events by the protocol
// ("a flag is always checked before its event is waited on": a flag is set only after its event was
// recorded). set() on a flag that is already set means a consumer missed its clear — the "data consistency
// issue" the reference implementation guards against — and is counted in violations() (tests assert zero).
//
// Semaphore: a counting semaphore for stage-to-stage enqueue order (§9.2) and the devices' idle slots.
// std::counting_semaphore would do, but this one is visible to ThreadSanitizer on every standard library.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace rp {

class HostFlag {
public:
    explicit HostFlag(bool initially_set = true) : set_(initially_set) {}

    void set() {
        {
            std::lock_guard<std::mutex> lk(m_);
            if (set_) violations_.fetch_add(1);
            set_ = true;
        }
        cv_.notify_all();
    }
    void wait() {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return set_; });
    }
    void wait_and_clear() {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return set_; });
        set_ = false;
    }
    bool is_set() const {
        std::lock_guard<std::mutex> lk(m_);
        return set_;
    }
    static int64_t violations() { return violations_.load(); }

private:
    mutable std::mutex m_;
    std::condition_variable cv_;
    bool set_;
    static inline std::atomic<int64_t> violations_{0};
};

class Semaphore {
public:
    explicit Semaphore(int64_t initial = 0) : count_(initial) {}
    void release(int64_t n = 1) {
        {
            std::lock_guard<std::mutex> lk(m_);
            count_ += n;
        }
        cv_.notify_all();
    }
    void acquire() {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return count_ > 0; });
        --count_;
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    int64_t count_;
};

} // namespace rp
