#include "ggml_rp/cpu/op_profile.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>

namespace rp::cpu {

namespace {
std::atomic<bool> g_on{false};
std::mutex g_mutex;   // RoundPipe devices compute on several threads at once
std::array<OpTime, size_t(Op::COUNT)> g_rows{};
} // namespace

void set_op_profiling(bool on) { g_on.store(on, std::memory_order_relaxed); }
bool op_profiling() { return g_on.load(std::memory_order_relaxed); }

void reset_op_profile() {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_rows = {};
}

void add_op_time(Op op, double seconds) {
    std::lock_guard<std::mutex> lock(g_mutex);
    OpTime & r = g_rows[size_t(op)];
    r.op = op;
    ++r.calls;
    r.seconds += seconds;
}

std::vector<OpTime> op_profile() {
    std::vector<OpTime> rows;
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const OpTime & r : g_rows)
        if (r.calls > 0) rows.push_back(r);
    std::stable_sort(rows.begin(), rows.end(), [](const OpTime & a, const OpTime & b) { return a.seconds > b.seconds; });
    return rows;
}

std::string format_op_profile(const std::vector<OpTime> & rows, double outside_s) {
    double total = outside_s > 0 ? outside_s : 0;
    for (const OpTime & r : rows) total += r.seconds;
    std::string out;
    char line[160];
    std::snprintf(line, sizeof line, "  %-18s %9s %11s %11s %7s\n", "op", "calls", "total ms", "ms/call", "share");
    out += line;
    auto row = [&](const char * name, int64_t calls, double s) {
        if (calls > 0)
            std::snprintf(line, sizeof line, "  %-18s %9lld %11.1f %11.3f %6.1f%%\n", name, (long long)calls, s * 1e3,
                          s * 1e3 / double(calls), total > 0 ? 100 * s / total : 0.0);
        else
            std::snprintf(line, sizeof line, "  %-18s %9s %11.1f %11s %6.1f%%\n", name, "", s * 1e3, "",
                          total > 0 ? 100 * s / total : 0.0);
        out += line;
    };
    for (const OpTime & r : rows) row(op_name(r.op), r.calls, r.seconds);
    if (outside_s > 0) row("(outside graphs)", 0, outside_s);
    return out;
}

} // namespace rp::cpu
