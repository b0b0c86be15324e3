// rp-bench: one program, one sub-command ("family") per bench/bench_<family>.cpp.
//
// A family registers itself at static-initialization time, so adding one is adding a file:
//
//     static int run_ops(int argc, char ** argv) { ... return 0; }
//     RP_BENCH_FAMILY(ops, "matmul / attention kernels: GFLOP/s per shape", run_ops);
//
// run() receives argv[0] = the family name and the options after it. It returns the exit status; an rp::Error
// or std::exception escaping it is printed as "error: <message>" by main and gives exit status 1.
#pragma once

#include "tools/options.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace rp::bench {

struct BenchFamily {
    const char * name;
    const char * help;  // one line for `rp-bench --help`
    int (*run)(int argc, char ** argv);
};

// All registered families, sorted by name (registration order depends on link order).
std::vector<BenchFamily> families();
void register_family(const BenchFamily & f);

struct Registrar {
    explicit Registrar(const BenchFamily & f) { register_family(f); }
};

#define RP_BENCH_FAMILY(name, help, fn) \
    static const ::rp::bench::Registrar rp_bench_registrar_##name(::rp::bench::BenchFamily{#name, help, fn})

// ---- timing -------------------------------------------------------------------------------------------

inline double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Timing {
    double best_s = 0;    // fastest repetition
    double median_s = 0;  // median repetition
    int reps = 0;
};

// Runs f() `warmup` times untimed, then `reps` times timed (steady_clock); returns best and median.
template <class F>
Timing time_it(F && f, int reps = 5, int warmup = 1) {
    for (int i = 0; i < warmup; ++i) f();
    std::vector<double> t;
    for (int i = 0; i < std::max(reps, 1); ++i) {
        const double t0 = now_s();
        f();
        t.push_back(now_s() - t0);
    }
    std::sort(t.begin(), t.end());
    Timing r;
    r.best_s = t.front();
    r.median_s = t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
    r.reps = static_cast<int>(t.size());
    return r;
}

// The read-only stream, the limit of work that reads each byte once (generation): `bytes` bytes at p on `threads`
// threads, each 8-byte word loaded and XORed into a sum (integer: it vectorizes; nothing is stored), each line
// prefetched into L2 `prefetch_bytes` ahead (0: the hardware prefetchers alone). Returns the sum, for the caller to
// keep somewhere volatile so that the loads stay.
inline uint64_t read_stream(const uint8_t * p, size_t bytes, int threads, size_t prefetch_bytes = 0) {
    const int64_t chunks = 4L * threads;
    uint64_t x = 0;
#if defined(_OPENMP)
#pragma omp parallel for num_threads(threads) schedule(static) reduction(^ : x)
#endif
    for (int64_t c = 0; c < chunks; ++c) {
        const size_t lo = bytes * size_t(c) / size_t(chunks) / 64 * 64;
        const size_t hi = c + 1 == chunks ? bytes / 8 * 8 : bytes * size_t(c + 1) / size_t(chunks) / 64 * 64;
        uint64_t a = 0;
        size_t i = lo;
        for (; i + 64 <= hi; i += 64) {
            if (prefetch_bytes) __builtin_prefetch(p + i + prefetch_bytes, 0, 2);
            for (size_t j = 0; j < 64; j += 8) {
                uint64_t w;
                std::memcpy(&w, p + i + j, 8);
                a ^= w;
            }
        }
        for (; i < hi; i += 8) {
            uint64_t w;
            std::memcpy(&w, p + i, 8);
            a ^= w;
        }
        x ^= a;
    }
    return x;
}

// The read-only stream's best time (over `reps` runs each) with the hardware prefetchers alone and with software
// prefetches 2 and 16 KiB ahead (the row dots' kind, matvec_dot.cpp): what a reader of these bytes can reach on
// this machine, so a kernel's share of it is not flattered by a naive stream.
inline Timing time_read_stream(const uint8_t * p, size_t bytes, int threads, int reps, volatile uint64_t & sink) {
    Timing best;
    for (size_t ahead : {size_t(0), size_t(2048), size_t(16384)}) {
        const Timing t = time_it([&] { sink = sink + read_stream(p, bytes, threads, ahead); }, reps);
        if (best.reps == 0 || t.best_s < best.best_s) best = t;
    }
    return best;
}

} // namespace rp::bench
