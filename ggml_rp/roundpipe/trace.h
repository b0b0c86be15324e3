// Stream-operation traces: collect them from devices (or the schedule simulator), write and read Chrome
// trace JSON (chrome://tracing, Perfetto), and measure a schedule from them.
//
// File format (what write_chrome_trace produces and read_chrome_trace reads back exactly):
//   {"displayTimeUnit":"ms","traceEvents":[
//     {"name":"process_name","ph":"M","pid":0,"args":{"name":"cpu:0"}},
//     {"name":"thread_name","ph":"M","pid":0,"tid":2,"args":{"name":"compute"}},
//     {"name":"F0 mb1","cat":"fwd/F0","ph":"X","pid":0,"tid":2,"ts":12.5,"dur":3.25}, ...]}
// One complete ("X") event per stream operation: pid = device, tid = stream (StreamKind), ts/dur in us,
// cat = "<pass>/<stage>". The reader also accepts a bare array of events and ignores other phases/fields.
#pragma once

#include "ggml_rp/runtime/device.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace rp {

struct TraceEvent {
    int pid = 0;  // device
    int tid = 0;  // stream
    std::string name;
    std::string cat;
    double ts_us = 0;
    double dur_us = 0;

    double end_us() const { return ts_us + dur_us; }
    bool operator==(const TraceEvent &) const = default;
};

struct Trace {
    std::vector<TraceEvent> events;
    std::map<int, std::string> process_names;                // device -> "cpu:0"
    std::map<std::pair<int, int>, std::string> thread_names;  // (device, stream) -> "compute"

    bool operator==(const Trace &) const = default;
    // Names every device and stream that appears in the events (keeps names already set).
    void name_defaults();
};

// Thread-safe collector; hook() plugs into CpuDeviceOptions::hook (the recorder must outlive the devices
// that call it). Snapshot times are relative to the earliest record's start unless keep_absolute_time.
class TraceRecorder {
public:
    explicit TraceRecorder(bool keep_absolute_time = false) : absolute_(keep_absolute_time) {}
    OpHook hook();
    void add(const OpRecord & rec);
    void name_device(int device, const std::string & name);
    Trace snapshot() const;  // events sorted by (ts, pid, tid)
    void clear();

private:
    bool absolute_;
    mutable std::mutex m_;
    std::vector<OpRecord> records_;
    std::map<int, std::string> names_;
};

std::string to_chrome_json(const Trace & trace);
// Written through a temporary file and a rename; throws rp::Error naming the path.
void write_chrome_trace(const std::string & path, const Trace & trace);
Trace parse_chrome_trace(const std::string & text, const std::string & source_name);
Trace read_chrome_trace(const std::string & path);

// What a timeline says about the schedule. Compute streams are tid == compute_stream; copy streams are the
// other three roles (weight upload, activation upload, download). The span runs from the first compute
// operation's start to the last one's end over all devices; devices are every pid in the trace.
//   bubble_ratio          = sum over devices of (span - compute busy) / (span * devices)
//   exposed_comm_fraction = sum over devices of |copy busy minus compute busy| / (span * devices)
// Busy times are unions of intervals (overlapping operations are not double counted), clipped to the span.
// Merged traces of several data-parallel ranks (rp-trace r0.json r1.json ...): rank k's devices are pids
// k * kTraceRankStride + device.
constexpr int kTraceRankStride = 1000;
// Merges rank traces (each rank's timestamps relative to a moment every rank agreed on): rank k's pids are
// shifted by k * kTraceRankStride and its processes named "rank k <name>".
Trace merge_rank_traces(const std::vector<Trace> & ranks);

struct TraceStats {
    int devices = 0;
    size_t compute_ops = 0;
    double span_start_us = 0;
    double span_end_us = 0;
    double compute_busy_us = 0;  // summed over devices
    double idle_us = 0;          // summed over devices
    double exposed_comm_us = 0;  // summed over devices
    double bubble_ratio = 0;
    double exposed_comm_fraction = 0;
    // Data parallel (rows on stream kAllReduceStream; rank = pid / kTraceRankStride in a merged trace): the
    // all-reduce busy time and the part of it while none of the rank's devices computed, summed over ranks.
    int ranks = 0;
    size_t allreduce_ops = 0;
    double allreduce_busy_us = 0;
    double exposed_allreduce_us = 0;
    double span_us() const { return span_end_us - span_start_us; }
};
TraceStats analyse_trace(const Trace & trace, int compute_stream = static_cast<int>(StreamKind::Compute));

// The jobs a trace shows and where they ran (the dispatch, issue #37): a job begins where a device's compute
// stream starts micro-batch 0 of a stage (an operation named "<stage> ... mb0 ..."; the runtime's "F2 mb0", the
// simulator's "B1 recompute mb0 it3"), unless the operation before it on that stream was of that stage's
// micro-batch 0 too. In start order.
struct TraceJob {
    std::string stage;
    int device = 0;
    double start_us = 0;
};
std::vector<TraceJob> trace_jobs(const Trace & trace, int compute_stream = static_cast<int>(StreamKind::Compute));

} // namespace rp
