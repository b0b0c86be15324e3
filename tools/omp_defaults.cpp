// The OpenMP wait default of every tool: a thread that reaches a barrier spins 10,000 times before it
// sleeps (GOMP_SPINCOUNT=10000), unless the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT.
//
// Why: libgomp's own default spins 300,000 times, which on a machine whose cores are busy with other work
// starves the thread that holds the lock; OMP_WAIT_POLICY=passive sleeps at once, which costs a futex wake
// per parallel region. Measured on 2 cores, 2 threads (rp-generate llama-98M tok/s; rp-finetune --full
// stories260K and llama-20M tok/s, seq 256):
//                       idle machine            2 other busy processes
//   libgomp default     59.6 / 12,952 / 965     4.6 / 4,707 / 137
//   passive             45.0 /  7,070 / 825    17.3 / 3,074 / 305
//   GOMP_SPINCOUNT=1e4  56.3 / 13,303 / 963    27.1 / 5,809 / 433
//   GOMP_SPINCOUNT=1e3       -                 20.5 / 4,280 / 493
//
// libgomp reads its environment once, in its library constructor, before main and before any constructor of
// ours can put a default there (not even the executable's .preinit_array works: glibc sets up the process
// environment again after it). So when neither variable is set, the first constructor of the tool sets
// GOMP_SPINCOUNT and executes the same program again (same pid, same arguments; a few milliseconds), whose
// libgomp then reads it. If that exec fails, the tool goes on with libgomp's default.
//
// The same exec gives OpenBLAS (linked for the Blas GEMM backend and the benchmarks) OPENBLAS_NUM_THREADS=1
// unless the user set it: its library constructor otherwise starts a thread per core that spins and yields,
// fighting our OpenMP threads for the cores (bench/design-measurements.md). Nothing here uses its threads implicitly: the Blas backend runs it single-threaded,
// and the benchmarks' openblas_set_num_threads(n) still starts n.
#include "tools/cli.h"

#include <cstdlib>
#include <string>

#include <unistd.h>

namespace {

constexpr const char * kSpinCount = "10000";

__attribute__((constructor)) void apply_omp_wait_default(int, char ** argv, char **) {
    const bool spin = std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr;
#ifdef RP_HAVE_BLAS
    const bool blas = std::getenv("OPENBLAS_NUM_THREADS") == nullptr;
#else
    const bool blas = false;
#endif
    if ((!spin && !blas) || argv == nullptr) return;
    if (spin && setenv("GOMP_SPINCOUNT", kSpinCount, 1) != 0) return;
    if (blas && setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0) return;
    execv("/proc/self/exe", argv);
    // The exec failed: this process keeps the libraries' defaults, and says so.
    if (spin) unsetenv("GOMP_SPINCOUNT");
    if (blas) unsetenv("OPENBLAS_NUM_THREADS");
}

} // namespace

namespace rp::cli {

std::string omp_wait_setting() {
    const char * policy = std::getenv("OMP_WAIT_POLICY");
    const char * spin = std::getenv("GOMP_SPINCOUNT");
    std::string s;
    if (policy) s = std::string("OMP_WAIT_POLICY=") + policy;
    if (spin) s += (s.empty() ? "" : " ") + std::string("GOMP_SPINCOUNT=") + spin;
    if (s.empty()) return "libgomp's default wait";
    return s;
}

} // namespace rp::cli
