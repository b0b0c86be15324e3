// A bounded arena: hands out byte ranges of one fixed region (a device's memory) and tracks the peak.
//
// - every block is rounded up to `alignment` bytes (a zero-byte request still gets one unit, so every live
//   allocation has a distinct offset);
// - best fit: the smallest free range that holds the request, lowest offset on ties; freed ranges merge with
//   free neighbours, so a free() never leaves two adjacent free ranges;
// - a request that does not fit throws rp::Error naming the owner (e.g. "cpu:1"), what it was for and the
//   bytes, and says whether the arena is full or only fragmented (enough free bytes in total, none
//   contiguous).
//
// Offsets, not pointers: the CPU device maps them onto one host allocation, the CUDA device onto one
// cudaMalloc. Not thread-safe by itself; the device serialises calls.
#pragma once

#include <cstddef>
#include <map>
#include <string>

namespace rp {

class Arena {
public:
    Arena(std::string owner, size_t capacity, size_t alignment = 256);

    size_t allocate(size_t bytes, const std::string & what);  // returns the offset
    void free(size_t offset);                                   // throws rp::Error for an unknown offset

    size_t capacity() const { return capacity_; }
    size_t alignment() const { return alignment_; }
    size_t used() const { return used_; }           // bytes in live blocks (after rounding)
    size_t high_water() const { return high_water_; }
    void reset_high_water() { high_water_ = used_; }
    size_t largest_free() const;
    size_t num_live() const { return live_.size(); }
    bool owns(size_t offset) const { return live_.count(offset) != 0; }
    size_t block_size(size_t offset) const;  // 0 when not live

private:
    std::string owner_;
    size_t capacity_;
    size_t alignment_;
    size_t used_ = 0;
    size_t high_water_ = 0;
    std::map<size_t, size_t> free_;  // offset -> size, no two adjacent
    std::map<size_t, size_t> live_;  // offset -> size
};

// "1.50 MiB (1572864 bytes)": for error messages.
std::string format_bytes(size_t bytes);

} // namespace rp
