#include "ggml_rp/runtime/arena.h"

#include "base/error.h"

#include <cstdio>
#include <iterator>

namespace rp {

std::string format_bytes(size_t bytes) {
    char buf[96];
    const double b = static_cast<double>(bytes);
    if (bytes >= (size_t(1) << 30)) {
        std::snprintf(buf, sizeof buf, "%.2f GiB (%zu bytes)", b / double(size_t(1) << 30), bytes);
    } else if (bytes >= (size_t(1) << 20)) {
        std::snprintf(buf, sizeof buf, "%.2f MiB (%zu bytes)", b / double(size_t(1) << 20), bytes);
    } else if (bytes >= 1024) {
        std::snprintf(buf, sizeof buf, "%.2f KiB (%zu bytes)", b / 1024.0, bytes);
    } else {
        std::snprintf(buf, sizeof buf, "%zu bytes", bytes);
    }
    return buf;
}

Arena::Arena(std::string owner, size_t capacity, size_t alignment)
    : owner_(std::move(owner)), capacity_(capacity), alignment_(alignment) {
    if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0) {
        throw Error(owner_ + ": arena alignment " + std::to_string(alignment_) + " is not a power of two");
    }
    capacity_ -= capacity_ % alignment_;  // only whole units are usable
    if (capacity_ > 0) free_[0] = capacity_;
}

size_t Arena::largest_free() const {
    size_t best = 0;
    for (const auto & [off, size] : free_) best = size > best ? size : best;
    return best;
}

size_t Arena::block_size(size_t offset) const {
    auto it = live_.find(offset);
    return it == live_.end() ? 0 : it->second;
}

size_t Arena::allocate(size_t bytes, const std::string & what) {
    size_t need = bytes == 0 ? alignment_ : bytes;
    if (need > capacity_ || need + (alignment_ - 1) < need) {
        throw Error(owner_ + ": out of memory: cannot allocate " + format_bytes(bytes) + " for '" + what +
                    "': larger than the device capacity " + format_bytes(capacity_));
    }
    need = (need + alignment_ - 1) & ~(alignment_ - 1);

    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second >= need && (best == free_.end() || it->second < best->second)) best = it;
    }
    if (best == free_.end()) {
        const size_t free_total = capacity_ - used_;
        std::string why = free_total >= need
                              ? "fragmented: " + format_bytes(free_total) + " free in total but the largest free block is " +
                                    format_bytes(largest_free())
                              : "only " + format_bytes(free_total) + " free";
        throw Error(owner_ + ": out of memory: cannot allocate " + format_bytes(bytes) + " for '" + what +
                    "' (capacity " + format_bytes(capacity_) + ", in use " + format_bytes(used_) + " in " +
                    std::to_string(live_.size()) + " blocks; " + why + ")");
    }
    const size_t off = best->first;
    const size_t rest = best->second - need;
    free_.erase(best);
    if (rest > 0) free_[off + need] = rest;
    live_[off] = need;
    used_ += need;
    if (used_ > high_water_) high_water_ = used_;
    return off;
}

void Arena::free(size_t offset) {
    auto it = live_.find(offset);
    if (it == live_.end()) {
        throw Error(owner_ + ": free of offset " + std::to_string(offset) + " that is not a live allocation");
    }
    size_t off = it->first;
    size_t size = it->second;
    live_.erase(it);
    used_ -= size;

    // merge with the free neighbours
    auto next = free_.lower_bound(off);
    if (next != free_.end() && next->first == off + size) {
        size += next->second;
        next = free_.erase(next);
    }
    if (next != free_.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == off) {
            prev->second += size;
            return;
        }
    }
    free_[off] = size;
}

} // namespace rp
