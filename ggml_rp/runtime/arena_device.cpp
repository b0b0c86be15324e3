#include "ggml_rp/runtime/arena_device.h"

#include "base/error.h"

#include <exception>

namespace rp {

ArenaDevice::~ArenaDevice() = default;

void ArenaDevice::release() {
    runner_.reset();   // its destructor waits for the work it enqueued
    streams_.clear();  // each stream finishes its queue
}

Stream & ArenaDevice::stream(int i) {
    if (i < 0 || i >= num_streams())
        throw Error(name_ + ": no stream " + std::to_string(i) + " (the device has " + std::to_string(num_streams()) + ")");
    return *streams_[static_cast<size_t>(i)];
}

void ArenaDevice::remember_pinned(const void * p) {
    std::lock_guard<std::mutex> lk(pinned_m_);
    pinned_.insert(p);
}

void ArenaDevice::forget_pinned(const void * p) {
    std::lock_guard<std::mutex> lk(pinned_m_);
    if (pinned_.erase(p) == 0) throw Error(name_ + ": free_pinned of a pointer this device did not allocate");
}

void ArenaDevice::synchronize() {
    std::exception_ptr first;
    for (auto & s : streams_) {
        try {
            s->synchronize();
        } catch (...) {
            if (!first) first = std::current_exception();
        }
    }
    if (first) std::rethrow_exception(first);
}

} // namespace rp
