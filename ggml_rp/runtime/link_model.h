// A host<->device link as a bandwidth and a latency: a copy of n bytes takes latency + n / bandwidth.
// Written like "32GB/s,10us" (PCIe 4.0 x16 as the RoundPipe paper assumes). Units: B/s, KB/s, MB/s, GB/s
// (powers of 1000) and KiB/s, MiB/s, GiB/s (powers of 1024); s, ms, us, ns. Either part may be omitted
// ("32GB/s" has no latency, "5us" infinite bandwidth), in any order.
#pragma once

#include <cstddef>
#include <string>

namespace rp {

struct LinkModel {
    double bytes_per_s = 0;  // 0 = infinite
    double latency_s = 0;

    double seconds(size_t bytes) const {
        return latency_s + (bytes_per_s > 0 ? static_cast<double>(bytes) / bytes_per_s : 0.0);
    }
    bool is_free() const { return bytes_per_s <= 0 && latency_s <= 0; }

    // Throws rp::Error naming the text and the part it could not read.
    static LinkModel parse(const std::string & text);
    std::string to_string() const;  // e.g. "32 GB/s, 10 us"
};

} // namespace rp
