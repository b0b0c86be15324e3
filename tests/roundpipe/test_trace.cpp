// Traces: the JSON reader (escapes, numbers, errors with byte offsets, depth limit), the Chrome trace round
// trip through text and a file, the bubble ratio and exposed-communication fraction of a hand-made trace
// with a known answer, records collected from CPU virtual devices, and the SVG timeline.
#include <unistd.h>
#include "ggml_rp/core/json.h"
#include "ggml_rp/roundpipe/timeline_svg.h"
#include "ggml_rp/roundpipe/trace.h"
#include "ggml_rp/runtime/cpu_device.h"
#include "base/error.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

namespace {

std::string error_of(const std::function<void()> & f) {
    try {
        f();
    } catch (const rp::Error & e) {
        return e.what();
    }
    return "";
}

} // namespace

TEST(Json, ParsesValuesAndEscapes) {
    const rp::json::Value v = rp::json::parse(
        R"( {"a": [1, -2.5e3, 0.125, true, false, null], "s": "q\"b\\s\/n\n\u00e9\ud83d\ude00", "o": {}} )", "t");
    ASSERT_TRUE(v.is_object());
    const rp::json::Value * a = v.find("a");
    ASSERT_TRUE(a && a->is_array());
    ASSERT_EQ(a->array.size(), 6u);
    EXPECT_EQ(a->array[0].number, 1);
    EXPECT_EQ(a->array[1].number, -2500);
    EXPECT_EQ(a->array[2].number, 0.125);
    EXPECT_TRUE(a->array[3].boolean);
    EXPECT_EQ(a->array[4].type, rp::json::Value::Type::Bool);
    EXPECT_FALSE(a->array[4].boolean);
    EXPECT_EQ(a->array[5].type, rp::json::Value::Type::Null);
    EXPECT_EQ(v.find("s")->string, "q\"b\\s/n\n\xc3\xa9\xf0\x9f\x98\x80");
    EXPECT_TRUE(v.find("o")->is_object());
    EXPECT_EQ(v.find("missing"), nullptr);

    std::string out;
    rp::json::append_string(out, "a\"b\\c\nd\x01");
    EXPECT_EQ(out, "\"a\\\"b\\\\c\\nd\\u0001\"");
    EXPECT_EQ(rp::json::parse(out, "t").string, "a\"b\\c\nd\x01");
}

TEST(Json, ErrorsGiveTheSourceAndByteOffset) {
    EXPECT_NE(error_of([] { rp::json::parse(R"({"a":})", "x.json"); }).find("x.json: invalid JSON at byte offset 5"),
              std::string::npos);
    EXPECT_NE(error_of([] { rp::json::parse("[1,2", "x.json"); }).find("byte offset 4"), std::string::npos);
    EXPECT_NE(error_of([] { rp::json::parse("[01]", "x.json"); }).find("byte offset 2"), std::string::npos);
    EXPECT_NE(error_of([] { rp::json::parse(R"(["\x"])", "x.json"); }).find("invalid escape"), std::string::npos);
    EXPECT_NE(error_of([] { rp::json::parse("[\"a\nb\"]", "x.json"); }).find("control character"), std::string::npos);
    EXPECT_NE(error_of([] { rp::json::parse(R"(["\ud83d"])", "x.json"); }).find("surrogate"), std::string::npos);
    EXPECT_NE(error_of([] { rp::json::parse("1e999", "x.json"); }).find("out of range"), std::string::npos);
    EXPECT_NE(error_of([] { rp::json::parse("[] x", "x.json"); }).find("after the JSON value"), std::string::npos);
    EXPECT_NE(error_of([] { rp::json::parse(std::string(65, '[') + std::string(65, ']'), "x.json"); }).find("nesting"),
              std::string::npos);
    EXPECT_NO_THROW(rp::json::parse(std::string(64, '[') + std::string(64, ']'), "x.json"));
}

namespace {

rp::Trace sample_trace() {
    rp::Trace t;
    t.process_names[0] = "cpu:0";
    t.process_names[1] = "gpu \"1\"";
    t.thread_names[{0, 2}] = "compute";
    t.events.push_back({0, 2, "F0 mb0", "fwd/F0", 0.0, 10.0});
    t.events.push_back({0, 3, "out \\ \"x\"\n", "fwd/F0", 10.0, 1.0 / 3.0});
    t.events.push_back({1, 1, "in \xc3\xa9", "bwd/B12", 123456.78901234567, 1e-3});
    t.events.push_back({1, 2, "", "", 7.25, 0.0});
    return t;
}

} // namespace

TEST(Trace, ChromeJsonRoundTripsExactly) {
    const rp::Trace t = sample_trace();
    const std::string text = rp::to_chrome_json(t);
    EXPECT_EQ(rp::parse_chrome_trace(text, "mem"), t);

    const std::string path = ::testing::TempDir() + "rp_trace_roundtrip." + std::to_string(getpid()) + ".json";
    rp::write_chrome_trace(path, t);
    EXPECT_EQ(rp::read_chrome_trace(path), t);
    std::remove(path.c_str());
    EXPECT_NE(error_of([] { rp::read_chrome_trace("/nonexistent/dir/t.json"); }).find("/nonexistent/dir/t.json"),
              std::string::npos);
    EXPECT_NE(error_of([] { rp::write_chrome_trace("/nonexistent/dir/t.json", rp::Trace{}); }).find("/nonexistent/dir"),
              std::string::npos);

    // a bare array of events, other phases ignored, a broken event reported with its index
    const rp::Trace bare = rp::parse_chrome_trace(
        R"([{"ph":"i","name":"mark","pid":0,"tid":0,"ts":1},{"ph":"X","pid":2,"tid":3,"ts":1,"dur":2,"extra":[1]}])", "b");
    ASSERT_EQ(bare.events.size(), 1u);
    EXPECT_EQ(bare.events[0].pid, 2);
    EXPECT_NE(error_of([] { rp::parse_chrome_trace(R"({"traceEvents":[{"ph":"X","pid":0,"tid":0,"ts":1}]})", "b"); })
                  .find("traceEvents[0]"),
              std::string::npos);
    EXPECT_NE(error_of([] { rp::parse_chrome_trace(R"({"events":[]})", "b"); }).find("traceEvents"), std::string::npos);
    EXPECT_NE(error_of([] { rp::parse_chrome_trace(R"([{"ph":"X","pid":0.5,"tid":0,"ts":1,"dur":1}])", "b"); })
                  .find("not an integer"),
              std::string::npos);
}

// Two devices over the span [0, 40] of their compute operations:
//   cpu:0 compute [0,10] [20,30]            busy 20, idle 20
//   cpu:1 compute [5,25] [6,12] [35,40]     busy 25 (the overlap counts once), idle 15
//   bubble = 35 / (40 * 2) = 0.4375
//   cpu:0 download [8,15] + weight upload [12,18]: union [8,18] minus compute [8,10] -> 8 exposed
//   cpu:1 activation upload [30,45] clipped to [30,40] minus compute [35,40] -> 5 exposed
//   cpu:1 stream 7 [25,35] is neither compute nor a copy stream: ignored
//   exposed = 13 / 80 = 0.1625
TEST(Trace, BubbleRatioAndExposedCommunicationOfAHandMadeTrace) {
    rp::Trace t;
    t.events = {
        {0, 2, "a", "", 0, 10},  {0, 2, "b", "", 20, 10},  {1, 2, "c", "", 5, 20},  {1, 2, "d", "", 6, 6},
        {1, 2, "e", "", 35, 5},  {0, 3, "x", "", 8, 7},    {0, 0, "w", "", 12, 6},  {1, 1, "u", "", 30, 15},
        {1, 7, "z", "", 25, 10},
    };
    rp::TraceStats st = rp::analyse_trace(t);
    EXPECT_EQ(st.devices, 2);
    EXPECT_EQ(st.compute_ops, 5u);
    EXPECT_DOUBLE_EQ(st.span_start_us, 0);
    EXPECT_DOUBLE_EQ(st.span_end_us, 40);
    EXPECT_DOUBLE_EQ(st.compute_busy_us, 45);
    EXPECT_DOUBLE_EQ(st.bubble_ratio, 0.4375);
    EXPECT_DOUBLE_EQ(st.exposed_comm_fraction, 0.1625);

    // a third device that is named but never computes is idle for the whole span
    t.process_names[2] = "cpu:2";
    st = rp::analyse_trace(t);
    EXPECT_EQ(st.devices, 3);
    EXPECT_DOUBLE_EQ(st.bubble_ratio, (20.0 + 15 + 40) / 120);
    EXPECT_DOUBLE_EQ(st.exposed_comm_fraction, 13.0 / 120);

    // no compute at all: nothing to measure
    rp::Trace copies;
    copies.events = {{0, 1, "u", "", 0, 5}};
    st = rp::analyse_trace(copies);
    EXPECT_EQ(st.compute_ops, 0u);
    EXPECT_EQ(st.bubble_ratio, 0);
}

TEST(Trace, RecorderCollectsFromVirtualDevices) {
    rp::TraceRecorder rec;
    {
        rp::CpuDeviceOptions o;
        o.memory_bytes = 1 << 16;
        o.hook = rec.hook();
        rp::CpuDevice a(0, o), b(1, o);
        rec.name_device(0, a.name());
        rec.name_device(1, b.name());
        auto ev = a.create_event();
        a.stream(rp::StreamKind::Compute).launch({"F0 mb0", "fwd/F0"}, [] {
            std::this_thread::sleep_for(std::chrono::milliseconds(3));
        });
        a.stream(rp::StreamKind::Compute).record(*ev);
        b.stream(rp::StreamKind::Compute).wait(*ev);
        b.stream(rp::StreamKind::Compute).launch({"F1 mb0", "fwd/F1"}, [] {
            std::this_thread::sleep_for(std::chrono::milliseconds(3));
        });
        b.synchronize();
    }
    const rp::Trace t = rec.snapshot();
    ASSERT_EQ(t.events.size(), 2u);
    EXPECT_EQ(t.events[0].name, "F0 mb0");
    EXPECT_EQ(t.events[0].ts_us, 0);  // relative to the first record
    EXPECT_EQ(t.events[1].pid, 1);
    EXPECT_GE(t.events[1].ts_us, t.events[0].end_us());  // the event ordered them
    EXPECT_EQ(t.process_names.at(1), "cpu:1");
    EXPECT_EQ(t.thread_names.at({1, 2}), "compute");
    const rp::TraceStats st = rp::analyse_trace(t);
    // each device computes at most half of the span (b starts after a ends): a bubble of at least one half
    EXPECT_GE(st.bubble_ratio, 0.49);
    EXPECT_LT(st.bubble_ratio, 0.95);
}

// The jobs of a trace: a job starts at a stage's micro-batch 0 on a device's compute stream (the runtime's names
// and the simulator's), and the launches of one task, or a backward job's recompute, do not start another.
TEST(Trace, JobsAreFoundWhereAStageStartsItsFirstMicroBatch) {
    rp::Trace t;
    const int C = static_cast<int>(rp::StreamKind::Compute);
    auto op = [&](int dev, double ts, const std::string & name, int tid = -1) {
        t.events.push_back({dev, tid < 0 ? C : tid, name, "", ts, 1});
    };
    op(0, 0, "F0 mb0"), op(0, 1, "F0 mb0"), op(0, 2, "F0 mb1");            // one job: two launches of mb0, then mb1
    op(1, 3, "F1 mb0"), op(1, 4, "F1 mb1");
    op(0, 5, "FB mb0"), op(0, 6, "FB mb1");
    op(1, 7, "B1 recompute mb0 it0"), op(1, 8, "B1 mb0 it0"), op(1, 9, "B1 mb1 it0");  // the simulator's names
    op(1, 10, "F0 mb0");                                                    // the next call
    op(0, 10, "W F1", static_cast<int>(rp::StreamKind::WeightUpload));     // not compute
    op(2, 11, "F1 mb1");                                                    // no micro-batch 0: no job start
    const std::vector<rp::TraceJob> jobs = rp::trace_jobs(t);
    ASSERT_EQ(jobs.size(), 5u);
    const std::vector<std::pair<std::string, int>> want = {{"F0", 0}, {"F1", 1}, {"FB", 0}, {"B1", 1}, {"F0", 1}};
    for (size_t i = 0; i < jobs.size(); ++i) {
        EXPECT_EQ(jobs[i].stage, want[i].first) << i;
        EXPECT_EQ(jobs[i].device, want[i].second) << i;
    }
}

TEST(Trace, SvgTimelineHasOneBoxPerOperation) {
    rp::Trace t = sample_trace();
    t.events.push_back({0, 2, "a<b&c", "fused/FB", 12, 3});
    rp::TimelineOptions o;
    o.title = "test <timeline>";
    const std::string svg = rp::timeline_svg(t, o);
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
    EXPECT_NE(svg.find("test &lt;timeline&gt;"), std::string::npos);
    EXPECT_NE(svg.find("a&lt;b&amp;c"), std::string::npos);
    EXPECT_EQ(svg.find("a<b"), std::string::npos);
    size_t titles = 0;
    for (size_t p = svg.find("<title>"); p != std::string::npos; p = svg.find("<title>", p + 1)) ++titles;
    EXPECT_EQ(titles, t.events.size());
    EXPECT_NE(svg.find("gpu &quot;1&quot; activation_upload"), std::string::npos);
}

// Data-parallel rank traces: merged with their pids shifted per rank; the all-reduce rows are not devices,
// and the exposed all-reduce time is the part during which none of that rank's devices computed.
TEST(Trace, MergedRankTracesMeasureTheExposedAllReduce) {
    const int C = static_cast<int>(rp::StreamKind::Compute), A = rp::kAllReduceStream;
    rp::Trace r0, r1;
    r0.events = {{0, C, "B1", "", 0, 10}, {1, C, "B2", "", 5, 10}, {2, A, "bucket 0", "allreduce", 8, 12}};  // exposed 15..20
    r0.process_names = {{0, "cpu:0"}, {1, "cpu:1"}, {2, "all-reduce"}};
    r1.events = {{0, C, "B1", "", 0, 20}, {1, A, "bucket 0", "allreduce", 10, 5}};  // hidden
    const rp::Trace m = rp::merge_rank_traces({r0, r1});
    EXPECT_EQ(m.events.size(), 5u);
    EXPECT_EQ(m.process_names.at(rp::kTraceRankStride + 1), "rank 1 device 1");
    EXPECT_EQ(m.process_names.at(1), "rank 0 cpu:1");
    const rp::TraceStats st = rp::analyse_trace(m);
    EXPECT_EQ(st.devices, 3);  // two of rank 0, one of rank 1
    EXPECT_EQ(st.ranks, 2);
    EXPECT_EQ(st.allreduce_ops, 2u);
    EXPECT_DOUBLE_EQ(st.allreduce_busy_us, 17);
    EXPECT_DOUBLE_EQ(st.exposed_allreduce_us, 5);
    // the bubble counts only the devices
    EXPECT_DOUBLE_EQ(st.span_end_us, 20);
    EXPECT_DOUBLE_EQ(st.compute_busy_us, 10 + 10 + 20);
}
