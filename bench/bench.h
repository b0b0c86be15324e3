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

} // namespace rp::bench
