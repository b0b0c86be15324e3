// Shared helpers of the optimizer tests: a deterministic value generator (so every run sees the same data).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace optim_test {

// splitmix64: a tiny portable generator, independent of the code under test.
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    // Uniform in [-1, 1).
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-52 - 1.0; }
};

inline std::vector<float> random_vector(size_t n, uint64_t seed, double scale = 1.0) {
    Rng r(seed);
    std::vector<float> v(n);
    for (auto & x : v) x = static_cast<float>(r.uniform() * scale);
    return v;
}

// The same floats bit for bit (sizes too).
inline bool same_bits(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

} // namespace optim_test
