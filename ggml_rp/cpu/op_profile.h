// Wall time per op kind on the CPU backend: where a training step or a forward pass spends its time, without a
// profiler. Off by default (then compute_node reads one relaxed atomic per node); when on, every node
// CpuBackend::compute runs is timed and added to its op's row. The counters are process-wide (a mutex: RoundPipe's
// CPU devices compute at the same time, and their times add up); a kernel's own OpenMP threads are inside the
// timed call.
#pragma once

#include "ggml_rp/core/tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace rp::cpu {

struct OpTime {
    Op op;
    int64_t calls = 0;
    double seconds = 0;
};

void set_op_profiling(bool on);
bool op_profiling();
void reset_op_profile();
// The ops that ran since the last reset, longest total first.
std::vector<OpTime> op_profile();
// A table of op_profile(): op, calls, total ms, ms per call, share of the timed total; `outside_s` (> 0) adds a
// row for the caller's time not spent in any node (optimizer, data, I/O) and the shares include it.
std::string format_op_profile(const std::vector<OpTime> & rows, double outside_s = 0);

// (compute_node's hook) adds one call of `op` taking `seconds`.
void add_op_time(Op op, double seconds);

} // namespace rp::cpu
