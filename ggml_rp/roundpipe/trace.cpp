#include "ggml_rp/roundpipe/trace.h"

#include "ggml_rp/core/json.h"
#include "base/atomic_file.h"
#include "base/error.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <unistd.h>

namespace rp {

void Trace::name_defaults() {
    for (const TraceEvent & e : events) {
        if (!process_names.count(e.pid)) process_names[e.pid] = "device " + std::to_string(e.pid);
        if (!thread_names.count({e.pid, e.tid})) thread_names[{e.pid, e.tid}] = e.tid == kAllReduceStream ? "all-reduce" : stream_name(e.tid);
    }
}

// ---- recorder ----------------------------------------------------------------------------------------

OpHook TraceRecorder::hook() {
    return [this](const OpRecord & rec) { add(rec); };
}

void TraceRecorder::add(const OpRecord & rec) {
    std::lock_guard<std::mutex> lk(m_);
    records_.push_back(rec);
}

void TraceRecorder::name_device(int device, const std::string & name) {
    std::lock_guard<std::mutex> lk(m_);
    names_[device] = name;
}

void TraceRecorder::clear() {
    std::lock_guard<std::mutex> lk(m_);
    records_.clear();
}

Trace TraceRecorder::snapshot() const {
    std::lock_guard<std::mutex> lk(m_);
    Trace t;
    double t0 = 0;
    if (!absolute_ && !records_.empty()) {
        t0 = records_.front().start_us;
        for (const OpRecord & r : records_) t0 = std::min(t0, r.start_us);
    }
    for (const OpRecord & r : records_) {
        TraceEvent e;
        e.pid = r.device;
        e.tid = r.stream;
        e.name = r.name;
        e.cat = r.cat;
        e.ts_us = r.start_us - t0;
        e.dur_us = std::max(0.0, r.end_us - r.start_us);
        t.events.push_back(std::move(e));
    }
    std::stable_sort(t.events.begin(), t.events.end(), [](const TraceEvent & a, const TraceEvent & b) {
        if (a.ts_us != b.ts_us) return a.ts_us < b.ts_us;
        if (a.pid != b.pid) return a.pid < b.pid;
        return a.tid < b.tid;
    });
    t.process_names = names_;
    t.name_defaults();
    return t;
}

// ---- JSON --------------------------------------------------------------------------------------------

namespace {

void append_number(std::string & out, double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);  // round-trips exactly
    out += buf;
}

int as_int(const json::Value & v, const char * field, const std::string & source, size_t index) {
    if (!v.is_number() || v.number != std::floor(v.number) || std::fabs(v.number) > 1e9) {
        throw Error(source + ": traceEvents[" + std::to_string(index) + "]: '" + field + "' is not an integer");
    }
    return static_cast<int>(v.number);
}

double as_double(const json::Value & v, const char * field, const std::string & source, size_t index) {
    if (!v.is_number()) {
        throw Error(source + ": traceEvents[" + std::to_string(index) + "]: '" + field + "' is not a number");
    }
    return v.number;
}

} // namespace

std::string to_chrome_json(const Trace & trace) {
    std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    bool first = true;
    auto sep = [&] {
        if (!first) out += ",\n";
        first = false;
    };
    for (const auto & [pid, name] : trace.process_names) {
        sep();
        out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"args\":{\"name\":";
        json::append_string(out, name);
        out += "}}";
    }
    for (const auto & [key, name] : trace.thread_names) {
        sep();
        out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(key.first) +
               ",\"tid\":" + std::to_string(key.second) + ",\"args\":{\"name\":";
        json::append_string(out, name);
        out += "}}";
    }
    for (const TraceEvent & e : trace.events) {
        sep();
        out += "{\"name\":";
        json::append_string(out, e.name);
        out += ",\"cat\":";
        json::append_string(out, e.cat);
        out += ",\"ph\":\"X\",\"pid\":" + std::to_string(e.pid) + ",\"tid\":" + std::to_string(e.tid) + ",\"ts\":";
        append_number(out, e.ts_us);
        out += ",\"dur\":";
        append_number(out, e.dur_us);
        out += "}";
    }
    out += "\n]}\n";
    return out;
}

void write_chrome_trace(const std::string & path, const Trace & trace) {
    const std::string text = to_chrome_json(trace);
    write_file_atomically(path, text);
}

Trace parse_chrome_trace(const std::string & text, const std::string & source_name) {
    const json::Value root = json::parse(text, source_name);
    const json::Value * events = nullptr;
    if (root.is_array()) {
        events = &root;
    } else if (root.is_object()) {
        events = root.find("traceEvents");
        if (!events || !events->is_array()) throw Error(source_name + ": no \"traceEvents\" array");
    } else {
        throw Error(source_name + ": a trace is a JSON object with \"traceEvents\" or an array of events");
    }

    Trace t;
    for (size_t i = 0; i < events->array.size(); ++i) {
        const json::Value & ev = events->array[i];
        if (!ev.is_object()) throw Error(source_name + ": traceEvents[" + std::to_string(i) + "] is not an object");
        const json::Value * ph = ev.find("ph");
        if (!ph || !ph->is_string()) {
            throw Error(source_name + ": traceEvents[" + std::to_string(i) + "]: missing \"ph\"");
        }
        const json::Value * name = ev.find("name");
        const json::Value * pid = ev.find("pid");
        const json::Value * tid = ev.find("tid");
        if (ph->string == "M") {
            const json::Value * args = ev.find("args");
            const json::Value * label = args ? args->find("name") : nullptr;
            if (!name || !name->is_string() || !pid || !label || !label->is_string()) continue;
            if (name->string == "process_name") {
                t.process_names[as_int(*pid, "pid", source_name, i)] = label->string;
            } else if (name->string == "thread_name" && tid) {
                t.thread_names[{as_int(*pid, "pid", source_name, i), as_int(*tid, "tid", source_name, i)}] =
                    label->string;
            }
            continue;
        }
        if (ph->string != "X") continue;  // instant, counter, flow ... events carry no duration
        const json::Value * ts = ev.find("ts");
        const json::Value * dur = ev.find("dur");
        if (!pid || !tid || !ts || !dur) {
            throw Error(source_name + ": traceEvents[" + std::to_string(i) +
                        "]: a complete event needs pid, tid, ts and dur");
        }
        TraceEvent e;
        e.pid = as_int(*pid, "pid", source_name, i);
        e.tid = as_int(*tid, "tid", source_name, i);
        e.ts_us = as_double(*ts, "ts", source_name, i);
        e.dur_us = as_double(*dur, "dur", source_name, i);
        if (e.dur_us < 0) throw Error(source_name + ": traceEvents[" + std::to_string(i) + "]: negative dur");
        if (name && name->is_string()) e.name = name->string;
        if (const json::Value * cat = ev.find("cat"); cat && cat->is_string()) e.cat = cat->string;
        t.events.push_back(std::move(e));
    }
    return t;
}

Trace read_chrome_trace(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(path + ": cannot open: " + std::strerror(errno));
    std::ostringstream ss;
    ss << f.rdbuf();
    if (f.bad()) throw Error(path + ": read failed");
    return parse_chrome_trace(ss.str(), path);
}

// ---- analysis ----------------------------------------------------------------------------------------

namespace {

using Intervals = std::vector<std::pair<double, double>>;

// Sorted, disjoint union of the intervals clipped to [lo, hi].
Intervals merged(Intervals v, double lo, double hi) {
    Intervals out;
    for (auto & iv : v) {
        iv.first = std::max(iv.first, lo);
        iv.second = std::min(iv.second, hi);
    }
    std::sort(v.begin(), v.end());
    for (const auto & iv : v) {
        if (iv.second <= iv.first) continue;
        if (!out.empty() && iv.first <= out.back().second) {
            out.back().second = std::max(out.back().second, iv.second);
        } else {
            out.push_back(iv);
        }
    }
    return out;
}

double measure(const Intervals & v) {
    double s = 0;
    for (const auto & iv : v) s += iv.second - iv.first;
    return s;
}

double intersection(const Intervals & a, const Intervals & b) {
    double s = 0;
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
        const double lo = std::max(a[i].first, b[j].first);
        const double hi = std::min(a[i].second, b[j].second);
        if (hi > lo) s += hi - lo;
        if (a[i].second < b[j].second) ++i;
        else ++j;
    }
    return s;
}

} // namespace

Trace merge_rank_traces(const std::vector<Trace> & ranks) {
    Trace out;
    for (size_t k = 0; k < ranks.size(); ++k) {
        const int off = static_cast<int>(k) * kTraceRankStride;
        const std::string prefix = "rank " + std::to_string(k) + " ";
        Trace t = ranks[k];
        t.name_defaults();
        for (TraceEvent e : t.events) {
            e.pid += off;
            out.events.push_back(std::move(e));
        }
        for (const auto & [pid, name] : t.process_names) out.process_names[pid + off] = prefix + name;
        for (const auto & [key, name] : t.thread_names) out.thread_names[{key.first + off, key.second}] = name;
    }
    std::stable_sort(out.events.begin(), out.events.end(), [](const TraceEvent & a, const TraceEvent & b) {
        return a.ts_us != b.ts_us ? a.ts_us < b.ts_us : a.pid != b.pid ? a.pid < b.pid : a.tid < b.tid;
    });
    return out;
}

TraceStats analyse_trace(const Trace & trace, int compute_stream) {
    TraceStats st;
    std::set<int> devices, allreduce_rows;
    for (const TraceEvent & e : trace.events) (e.tid == kAllReduceStream ? allreduce_rows : devices).insert(e.pid);
    for (const auto & [pid, name] : trace.process_names)
        if (!allreduce_rows.count(pid)) devices.insert(pid);
    bool any = false;
    for (const TraceEvent & e : trace.events) {
        if (e.tid != compute_stream) continue;
        if (!any) {
            st.span_start_us = e.ts_us;
            st.span_end_us = e.end_us();
            any = true;
        }
        st.span_start_us = std::min(st.span_start_us, e.ts_us);
        st.span_end_us = std::max(st.span_end_us, e.end_us());
        ++st.compute_ops;
    }
    st.devices = static_cast<int>(devices.size());
    if (!any || st.span_us() <= 0) return st;

    const double lo = st.span_start_us, hi = st.span_end_us;
    for (int dev : devices) {
        Intervals compute, copies;
        for (const TraceEvent & e : trace.events) {
            if (e.pid != dev) continue;
            if (e.tid == compute_stream) {
                compute.emplace_back(e.ts_us, e.end_us());
            } else if (e.tid == static_cast<int>(StreamKind::WeightUpload) ||
                       e.tid == static_cast<int>(StreamKind::ActivationUpload) ||
                       e.tid == static_cast<int>(StreamKind::Download)) {
                copies.emplace_back(e.ts_us, e.end_us());
            }
        }
        const Intervals c = merged(std::move(compute), lo, hi);
        const Intervals x = merged(std::move(copies), lo, hi);
        const double busy = measure(c);
        st.compute_busy_us += busy;
        st.idle_us += (hi - lo) - busy;
        st.exposed_comm_us += measure(x) - intersection(x, c);
    }
    const double denom = (hi - lo) * st.devices;
    st.bubble_ratio = st.idle_us / denom;
    st.exposed_comm_fraction = st.exposed_comm_us / denom;
    // Data parallel: per rank, the all-reduce time during which none of the rank's devices computed.
    std::set<int> ranks;
    for (int row : allreduce_rows) ranks.insert(row / kTraceRankStride);
    for (int rank : ranks) {
        Intervals ar, compute;
        for (const TraceEvent & e : trace.events) {
            if (e.pid / kTraceRankStride != rank) continue;
            if (e.tid == kAllReduceStream) ar.emplace_back(e.ts_us, e.end_us()), ++st.allreduce_ops;
            else if (e.tid == compute_stream) compute.emplace_back(e.ts_us, e.end_us());
        }
        const double inf = std::numeric_limits<double>::infinity();
        const Intervals a = merged(std::move(ar), -inf, inf), c = merged(std::move(compute), -inf, inf);
        st.allreduce_busy_us += measure(a);
        st.exposed_allreduce_us += measure(a) - intersection(a, c);
        ++st.ranks;
    }
    return st;
}

std::vector<TraceJob> trace_jobs(const Trace & trace, int compute_stream) {
    // (stage, whether it is micro-batch 0) of an operation's name
    auto parse = [](const std::string & name) {
        std::istringstream in(name);
        std::string stage, w;
        in >> stage;
        bool mb0 = false;
        while (in >> w)
            if (w.rfind("mb", 0) == 0) mb0 = w == "mb0";
        return std::pair{stage, mb0};
    };
    std::map<int, std::vector<const TraceEvent *>> by_device;
    for (const TraceEvent & e : trace.events)
        if (e.tid == compute_stream && e.dur_us > 0) by_device[e.pid].push_back(&e);
    std::vector<TraceJob> jobs;
    for (auto & [device, ops] : by_device) {
        std::stable_sort(ops.begin(), ops.end(), [](const TraceEvent * a, const TraceEvent * b) { return a->ts_us < b->ts_us; });
        std::pair<std::string, bool> prev{"", false};
        for (const TraceEvent * e : ops) {
            const auto cur = parse(e->name);
            if (cur.second && !(prev.second && prev.first == cur.first)) jobs.push_back({cur.first, device, e->ts_us});
            prev = cur;
        }
    }
    std::stable_sort(jobs.begin(), jobs.end(), [](const TraceJob & a, const TraceJob & b) { return a.start_us < b.start_us; });
    return jobs;
}

} // namespace rp
