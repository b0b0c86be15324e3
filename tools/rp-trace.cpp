// rp-trace: look at a stream-operation trace (Chrome trace JSON, as written by roundpipe/trace.h from CPU
// virtual devices, the CUDA device or rp-simulate --trace).
//
//   rp-trace trace.json                    print the schedule's numbers
//   rp-trace trace.json -o timeline.svg    also draw devices x streams, coloured by stage and pass
//   rp-trace trace.json --assignment       also each call's jobs and the device each ran on
//
// Printed: devices, operations, the compute span (first compute operation's start to the last one's end),
// the bubble ratio (idle fraction of the compute streams over that span) and the exposed-communication
// fraction (time a device's compute stream is idle while one of its copy streams is busy, over the span),
// each summed over devices; then the same per device, with the jobs it ran.
#include "tools/options.h"

#include "base/atomic_file.h"
#include "ggml_rp/roundpipe/timeline_svg.h"
#include "ggml_rp/roundpipe/trace.h"
#include "base/error.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <set>
#include <string>


namespace {

const char * const kUsage =
    "usage: rp-trace TRACE.json [MORE.json ...] [-o TIMELINE.svg] [--title TEXT] [--width PIXELS] [--assignment]\n"
    "\n"
    "Prints the bubble ratio (idle fraction of the compute streams between the first and the last compute\n"
    "operation) and the exposed-communication fraction (compute idle while a copy stream of the same device\n"
    "is busy), over all devices and per device, with the jobs each device ran. With -o, draws the timeline as\n"
    "SVG: one row per device and stream, boxes coloured by pass (hue) and stage (shade), copies lighter. With\n"
    "--assignment, prints each call's jobs in dispatch order as STAGE:DEVICE (where dispatch by readiness\n"
    "moved jobs off a slow device, rp-finetune --dispatch).\n"
    "\n"
    "Several files: the traces of the ranks of one data-parallel run (rp-finetune --trace T.json under mpirun\n"
    "writes T.rank0.json, T.rank1.json, ...), in rank order, merged on their common clock. Printed also: each\n"
    "rank's all-reduce time and the part of it exposed (none of the rank's devices computing meanwhile).\n";

} // namespace

int main(int argc, char ** argv) {
    try {
        std::vector<std::string> inputs;
        std::string out;
        rp::TimelineOptions opt;
        rp::cli::Options opts("rp-trace", kUsage);
        opts.positionals("TRACE.json ...", inputs, 1, -1, "the trace, or the traces of the ranks of one run in rank order");
        opts.text("-o,--output", out, "draw the timeline as SVG into FILE", "TIMELINE.svg");
        opts.text("--title", opt.title, "the timeline's title", "TEXT");
        opts.integer("--width", opt.width, 100, 100000, "the timeline's width", "PIXELS");
        bool assignment = false;
        opts.flag("--assignment", assignment, "print each call's jobs and their devices");
        if (!opts.parse(argc, argv)) return 0;

        rp::Trace trace;
        if (inputs.size() == 1) {
            trace = rp::read_chrome_trace(inputs[0]);
        } else {
            std::vector<rp::Trace> ranks;
            for (const std::string & f : inputs) ranks.push_back(rp::read_chrome_trace(f));
            trace = rp::merge_rank_traces(ranks);
        }
        trace.name_defaults();
        const std::string in = inputs.size() == 1 ? inputs[0] : std::to_string(inputs.size()) + " rank traces";
        const rp::TraceStats st = rp::analyse_trace(trace);
        const std::vector<rp::TraceJob> jobs = rp::trace_jobs(trace);
        std::printf("%s: %zu operations on %d devices\n", in.c_str(), trace.events.size(), st.devices);
        if (st.compute_ops == 0) {
            std::printf("no compute operations: no bubble ratio\n");
        } else {
            std::printf("compute span       %.3f ms (%.3f .. %.3f ms)\n", st.span_us() / 1e3, st.span_start_us / 1e3,
                        st.span_end_us / 1e3);
            std::printf("bubble ratio       %.2f%%\n", 100 * st.bubble_ratio);
            std::printf("exposed comm       %.2f%%\n", 100 * st.exposed_comm_fraction);
            std::set<int> devices, allreduce_rows;
            for (const rp::TraceEvent & e : trace.events)
                if (e.tid == rp::kAllReduceStream) allreduce_rows.insert(e.pid);
            for (const auto & [pid, name] : trace.process_names)
                if (!allreduce_rows.count(pid)) devices.insert(pid);
            for (int d : devices) {
                rp::Trace one;
                for (const rp::TraceEvent & e : trace.events) {
                    if (e.pid == d) one.events.push_back(e);
                }
                // the same span for every device: clip to the whole trace's compute span
                one.events.push_back({d, static_cast<int>(rp::StreamKind::Compute), "", "", st.span_start_us, 0});
                one.events.push_back({d, static_cast<int>(rp::StreamKind::Compute), "", "", st.span_end_us, 0});
                const rp::TraceStats ds = rp::analyse_trace(one);
                const long n_jobs = std::count_if(jobs.begin(), jobs.end(), [d](const rp::TraceJob & j) { return j.device == d; });
                std::printf("  %-20s busy %6.2f%%  exposed comm %6.2f%%  jobs %ld\n", trace.process_names[d].c_str(),
                            100 * (1 - ds.bubble_ratio), 100 * ds.exposed_comm_fraction, n_jobs);
            }
            if (assignment && !jobs.empty()) {  // a call starts where its first stage comes round again
                std::printf("assignment (STAGE:DEVICE in start order, one call per line)\n");
                int call = 0;
                for (size_t k = 0; k < jobs.size(); ++k) {
                    if (k == 0 || jobs[k].stage == jobs[0].stage) std::printf("%s  call %d:", k ? "\n" : "", call++);
                    std::printf(" %s:%d", jobs[k].stage.c_str(), jobs[k].device);
                }
                std::printf("\n");
            }
            if (st.ranks > 0) {
                std::printf("all-reduce         %zu exchanges on %d ranks, busy %.3f ms, exposed %.3f ms (%.2f%% of the span per rank)\n",
                            st.allreduce_ops, st.ranks, st.allreduce_busy_us / 1e3, st.exposed_allreduce_us / 1e3,
                            100 * st.exposed_allreduce_us / (st.span_us() * st.ranks));
                std::set<int> ranks;
                for (int row : allreduce_rows) ranks.insert(row / rp::kTraceRankStride);
                for (int r : ranks) {
                    rp::Trace one;
                    for (const rp::TraceEvent & e : trace.events)
                        if (e.pid / rp::kTraceRankStride == r) one.events.push_back(e);
                    const rp::TraceStats rs = rp::analyse_trace(one);
                    std::printf("  rank %-15d all-reduce busy %.3f ms, exposed %.3f ms\n", r, rs.allreduce_busy_us / 1e3,
                                rs.exposed_allreduce_us / 1e3);
                }
            }
        }
        if (!out.empty()) {
            rp::write_file_atomically(out, rp::timeline_svg(trace, opt));
            std::printf("timeline: %s\n", out.c_str());
        }
        return 0;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
