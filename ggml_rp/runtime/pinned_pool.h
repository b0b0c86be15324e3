// Page-locked host buffers reused across calls. cudaHostAlloc is slow and cudaFreeHost synchronises the whole
// device, so a run that pins its per-call buffers (the RoundPipe call's tokens, boundary activations and
// losses, roundpipe/call_state.h) each call stalls every device each time a call ends. A pool allocates a
// block the first time a size is asked for and hands it out again once its buffer is dropped: a run of calls
// of one shape pins its memory in the first call and never again.
//
// take() returns a PinnedBuffer whose reset() gives the block back (from any thread). A cached block serves a
// request of at least half its size (best fit, smallest first); the cache is bounded by the high water of what
// was in use at once (the smallest blocks freed first), so shapes that keep changing free their old blocks
// instead of growing the pool. The pool
// lives as long as its longest-lived buffer (each holds a share of it); the device must outlive both.
#pragma once

#include "ggml_rp/runtime/device.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace rp {

class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
public:
    static std::shared_ptr<PinnedPool> make(Device & dev) { return std::shared_ptr<PinnedPool>(new PinnedPool(dev)); }
    ~PinnedPool();
    PinnedPool(const PinnedPool &) = delete;
    PinnedPool & operator=(const PinnedPool &) = delete;

    // A buffer of `bytes` bytes (its size()), from the cache when a block fits. Throws what alloc_pinned throws.
    PinnedBuffer take(size_t bytes);

    struct Stats {
        uint64_t allocations = 0;  // blocks pinned (alloc_pinned calls)
        uint64_t reuses = 0;       // takes served from the cache
        size_t cached_bytes = 0;   // blocks waiting in the cache
        size_t in_use_bytes = 0;   // blocks handed out and not yet back
        size_t in_use_peak = 0;
    };
    Stats stats() const;

private:
    explicit PinnedPool(Device & dev) : dev_(dev) {}
    friend class PinnedBuffer;
    void give_back(void * ptr, size_t capacity) noexcept;

    Device & dev_;
    mutable std::mutex m_;
    std::multimap<size_t, void *> free_;  // capacity -> block
    Stats stats_;
};

} // namespace rp
