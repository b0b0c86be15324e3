// One monotonic clock for every device and trace of the process, in microseconds since its first use, so
// records from different devices and threads line up on one timeline.
#pragma once

#include <chrono>

namespace rp {

inline std::chrono::steady_clock::time_point clock_epoch() {
    static const std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();
    return epoch;
}

inline double clock_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - clock_epoch()).count();
}

inline std::chrono::steady_clock::time_point clock_time_point(double us) {
    return clock_epoch() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double, std::micro>(us));
}

} // namespace rp
