// Random sleeps that the race fuzz injects into the runtime's threads (tests/roundpipe/test_pipeline_fuzz):
// a seeded generator per thread, so a failing seed replays the same schedule of delays. Disabled (no sleep)
// when the seed or the maximum delay is 0.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <thread>

namespace rp {

class FuzzDelay {
public:
    FuzzDelay() = default;
    FuzzDelay(uint64_t seed, double max_delay_us) : on_(seed != 0 && max_delay_us > 0), max_us_(max_delay_us), rng_(seed) {}
    void sleep() {
        if (!on_) return;
        const double us = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * max_us_;
        std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(us));
    }

private:
    bool on_ = false;
    double max_us_ = 0;
    std::mt19937_64 rng_;
};

} // namespace rp
