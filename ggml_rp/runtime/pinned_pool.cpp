#include "ggml_rp/runtime/pinned_pool.h"

#include <vector>

namespace rp {

namespace {
// Blocks are whole pages, as cudaHostAlloc gives them, so nearby sizes share blocks.
size_t block_bytes(size_t bytes) { return (bytes + 4095) / 4096 * 4096; }
} // namespace

PinnedPool::~PinnedPool() {
    for (auto & [cap, p] : free_) {
        try { dev_.free_pinned(p); } catch (...) {}  // a destructor must not throw
    }
}

PinnedBuffer PinnedPool::take(size_t bytes) {
    const size_t want = block_bytes(bytes == 0 ? 1 : bytes);
    void * p = nullptr;
    size_t cap = 0;
    {
        std::lock_guard<std::mutex> lk(m_);
        auto it = free_.lower_bound(want);
        if (it != free_.end() && it->first / 2 <= want) {
            cap = it->first;
            p = it->second;
            free_.erase(it);
            stats_.cached_bytes -= cap;
            ++stats_.reuses;
        }
    }
    if (!p) {
        p = dev_.alloc_pinned(want);
        cap = want;
        std::lock_guard<std::mutex> lk(m_);
        ++stats_.allocations;
    }
    {
        std::lock_guard<std::mutex> lk(m_);
        stats_.in_use_bytes += cap;
        if (stats_.in_use_bytes > stats_.in_use_peak) stats_.in_use_peak = stats_.in_use_bytes;
    }
    PinnedBuffer b;
    b.dev_ = &dev_;
    b.ptr_ = p;
    b.bytes_ = bytes;
    b.capacity_ = cap;
    b.pool_ = shared_from_this();
    return b;
}

void PinnedPool::give_back(void * ptr, size_t capacity) noexcept {
    std::vector<void *> drop;  // freed outside the lock (cudaFreeHost may take a while)
    {
        std::lock_guard<std::mutex> lk(m_);
        stats_.in_use_bytes -= capacity;
        free_.emplace(capacity, ptr);
        stats_.cached_bytes += capacity;
        // Over the bound: the smallest blocks go first (growing shapes keep the large ones).
        while (stats_.cached_bytes > stats_.in_use_peak && !free_.empty()) {
            stats_.cached_bytes -= free_.begin()->first;
            drop.push_back(free_.begin()->second);
            free_.erase(free_.begin());
        }
    }
    for (void * p : drop) {
        try { dev_.free_pinned(p); } catch (...) {}  // called from destructors
    }
}

PinnedPool::Stats PinnedPool::stats() const {
    std::lock_guard<std::mutex> lk(m_);
    return stats_;
}

void PinnedBuffer::reset() {
    if (ptr_) {
        if (pool_) pool_->give_back(ptr_, capacity_);
        else dev_->free_pinned(ptr_);
    }
    pool_.reset();
    dev_ = nullptr; ptr_ = nullptr; bytes_ = 0; capacity_ = 0;
}

} // namespace rp
