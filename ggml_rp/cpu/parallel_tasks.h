// for_tasks: a CPU kernel's tasks on the OpenMP threads, an exception carried out of the region.
#pragma once

#include "base/error.h"

#include <atomic>
#include <cstdint>
#include <exception>
#include <string>

namespace rp::cpu {

// body(task) for task in [0, n): on the OpenMP threads when `parallel`, else on the calling thread without
// entering an OpenMP region at all (serial calls come from inside other kernels' parallel loops). An exception
// is carried out of the region and rethrown (exceptions must not cross an OpenMP region).
template <class F>
void for_tasks(int64_t n, bool parallel, F && body) {
    if (!parallel || n <= 1) {
        for (int64_t task = 0; task < n; ++task) body(task);
        return;
    }
    std::atomic<bool> failed{false};
    std::string err;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int64_t task = 0; task < n; ++task) {
        if (failed.load(std::memory_order_relaxed)) continue;
        try {
            body(task);
        } catch (const std::exception & e) {
            if (!failed.exchange(true)) err = e.what();
        }
    }
    if (failed) throw Error(err);
}

} // namespace rp::cpu
