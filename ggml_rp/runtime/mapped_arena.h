// A device's memory as the host manages it: one bounded Arena (arena.h) mapped onto one base pointer — a host
// allocation for the CPU virtual device, one cudaMalloc for a CUDA logical device — with the checks and the
// lock every Device implementation needs (Device::allocate/free/used/high_water are thread-safe).
#pragma once

#include "ggml_rp/runtime/arena.h"
#include "ggml_rp/runtime/device.h"
#include "base/error.h"

#include <cstddef>
#include <mutex>
#include <string>

namespace rp {

class MappedArena {
public:
    MappedArena(std::string owner, size_t capacity) : owner_(owner), arena_(std::move(owner), capacity) {}

    void set_base(std::byte * base) { base_ = base; }  // the memory the offsets map onto (capacity bytes)
    std::byte * base() const { return base_; }

    void * allocate(size_t bytes, const std::string & what) {
        std::lock_guard<std::mutex> lk(m_);
        return base_ + arena_.allocate(bytes, what);
    }
    void free(void * ptr) {
        if (!ptr) return;
        std::lock_guard<std::mutex> lk(m_);
        const auto * p = static_cast<const std::byte *>(ptr);
        if (!base_ || p < base_ || p >= base_ + arena_.capacity())
            throw Error(owner_ + ": free of a pointer that is not in this device's memory");
        arena_.free(static_cast<size_t>(p - base_));
    }
    // True when [ptr, ptr + bytes) lies inside the memory.
    bool contains(const void * ptr, size_t bytes) const {
        const auto * b = static_cast<const std::byte *>(ptr);
        return base_ && b >= base_ && bytes <= arena_.capacity() && b - base_ <= std::ptrdiff_t(arena_.capacity() - bytes);
    }
    // A stream copy's device side(s) must lie inside this memory: throws rp::Error naming the copy otherwise.
    void check_copy(const void * dst, const void * src, size_t bytes, CopyKind kind, const std::string & label) const {
        if (bytes == 0) return;
        const bool dst_dev = kind == CopyKind::HostToDevice || kind == CopyKind::DeviceToDevice;
        const bool src_dev = kind == CopyKind::DeviceToHost || kind == CopyKind::DeviceToDevice;
        if (dst_dev && !contains(dst, bytes))
            throw Error(owner_ + ": copy '" + label + "': destination [" + std::to_string(bytes) + " bytes] is not inside this device's memory");
        if (src_dev && !contains(src, bytes))
            throw Error(owner_ + ": copy '" + label + "': source [" + std::to_string(bytes) + " bytes] is not inside this device's memory");
    }
    size_t capacity() const { return arena_.capacity(); }
    size_t used() const { return locked([&] { return arena_.used(); }); }
    size_t high_water() const { return locked([&] { return arena_.high_water(); }); }
    size_t largest_free() const { return locked([&] { return arena_.largest_free(); }); }
    void reset_high_water() {
        std::lock_guard<std::mutex> lk(m_);
        arena_.reset_high_water();
    }

private:
    template <class F> size_t locked(F && f) const {
        std::lock_guard<std::mutex> lk(m_);
        return f();
    }
    std::string owner_;
    mutable std::mutex m_;
    Arena arena_;
    std::byte * base_ = nullptr;
};

} // namespace rp
