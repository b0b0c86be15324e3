// Counter-based random numbers: every value is a pure function of (key, counter), with no generator state.
//
// Why: RoundPipe recomputes each layer's forward inside the backward pass, possibly on another device and
// with another micro-batch split (roundpipe.md §4, invariant I3). A stateful RNG would have to be snapshotted
// and restored; a counter-based one regenerates the identical values from ids alone. The ids are mixed into
// one 64-bit key (rng_key: seed, step, layer, micro-batch, ...) and the element's position is the counter.
//
// The generator is Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the
// generator of cuRAND and JAX), checked against Random123's published known-answer vectors in
// tests/core/test_counter_rng.cpp. Its paper reports it passing TestU01's BigCrush over counters and keys in
// simple sequences, so keys that differ in a few bits (step k, step k + 1) still give unrelated streams. One Philox call yields four 32-bit words: value number
// `counter` of a stream is word counter % 4 of block counter / 4 (cuRAND's Philox layout), so a kernel
// walking consecutive counters needs one block per four values (philox_block + rng_word).
//
// Everything is integer arithmetic except the final u32 -> float conversion, which is exact (24 bits), so the
// CPU and the GPU produce the same bits. Header-only, RP_HD: the CUDA kernels include it too.
#pragma once

#include "ggml_rp/core/host_device.h"

#include <cstdint>

namespace rp {

struct Philox4x32 {
    uint32_t v[4];
};

// Philox-4x32's round multipliers and key schedule (Weyl constants: golden ratio, sqrt(3) - 1).
inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

// The high and low 32 bits of a * b. On the GPU as two 32-bit multiplies: nvcc otherwise emits a 64-bit
// multiply for most rounds (several instructions each). The same numbers either way.
RP_HD inline void philox_mulhilo(uint32_t a, uint32_t b, uint32_t & hi, uint32_t & lo) {
#if defined(__CUDA_ARCH__)
    hi = __umulhi(a, b);
    lo = a * b;
#else
    const uint64_t prod = static_cast<uint64_t>(a) * b;
    hi = static_cast<uint32_t>(prod >> 32);
    lo = static_cast<uint32_t>(prod);
#endif
}

// One Philox-4x32-10 block: ten rounds of the multiply-xor bijection over the 128-bit counter `ctr`, with
// the 64-bit key bumped by the Weyl constants between rounds (Random123's philox4x32_R with R = 10).
RP_HD inline Philox4x32 philox4x32_10(Philox4x32 ctr, uint32_t k0, uint32_t k1) {
    for (int round = 0; round < 10; ++round) {
        if (round > 0) { k0 += kPhiloxW0; k1 += kPhiloxW1; }
        uint32_t hi0, lo0, hi1, lo1;
        philox_mulhilo(kPhiloxM0, ctr.v[0], hi0, lo0);
        philox_mulhilo(kPhiloxM1, ctr.v[2], hi1, lo1);
        ctr = Philox4x32{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    }
    return ctr;
}

// The block that holds values 4*block .. 4*block + 3 of the stream `key`.
RP_HD inline Philox4x32 philox_block(uint64_t key, uint64_t block) {
    const Philox4x32 ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u}};
    return philox4x32_10(ctr, static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
}

// Value number `counter` taken from its block (counter / 4 == the block's index).
RP_HD inline uint32_t rng_word(const Philox4x32 & block, uint64_t counter) { return block.v[counter & 3u]; }

// splitmix64's finaliser (Stafford's Mix13): a bijection on 64 bits with full avalanche. Used only to derive
// keys, where it needs to be a good hash, not a random generator.
RP_HD inline uint64_t rng_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// One key from a seed and up to four ids, e.g. rng_key(seed, step, layer, micro_batch, module). Each id is
// absorbed by a non-linear bijection of the running state, so the key depends on the order of the ids:
// rng_key(s, 1, 2) != rng_key(s, 2, 1). Omitted ids are 0 (rng_key(s, a) == rng_key(s, a, 0)).
RP_HD inline uint64_t rng_key(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0, uint64_t d = 0) {
    constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
    uint64_t h = rng_mix64(seed + kGolden);
    h = rng_mix64(h ^ (a + 1 * kGolden));
    h = rng_mix64(h ^ (b + 2 * kGolden));
    h = rng_mix64(h ^ (c + 3 * kGolden));
    h = rng_mix64(h ^ (d + 4 * kGolden));
    return h;
}

// The 32-bit value number `counter` of the stream `key`.
RP_HD inline uint32_t rng_u32(uint64_t key, uint64_t counter) { return rng_word(philox_block(key, counter >> 2), counter); }

// A 32-bit value -> [0, 1): its top 24 bits times 2^-24, exact in float (a multiple of 2^-24 below 1).
RP_HD inline float rng_u32_to_uniform(uint32_t u) { return static_cast<float>(u >> 8) * (1.0f / 16777216.0f); }

// Uniform in [0, 1) on the grid k / 2^24.
RP_HD inline float rng_uniform(uint64_t key, uint64_t counter) { return rng_u32_to_uniform(rng_u32(key, counter)); }

} // namespace rp
