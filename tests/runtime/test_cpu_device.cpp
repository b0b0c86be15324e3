// The CPU virtual device: memory limits and errors, in-order streams, events within and across devices with
// CUDA's semantics (unrecorded = no-op, a wait binds to the record made before it), host synchronisation,
// copies and the link model (coarse timing: the machine is shared), sticky job errors, the op hook, clean
// shutdown with queued work.
#include "ggml_rp/runtime/clock.h"
#include "ggml_rp/runtime/cpu_device.h"
#include "ggml_rp/runtime/link_model.h"
#include "base/error.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

using rp::CopyKind;
using rp::CpuDevice;
using rp::CpuDeviceOptions;
using rp::StreamKind;

namespace {

CpuDeviceOptions small(size_t bytes = 1 << 20) {
    CpuDeviceOptions o;
    o.memory_bytes = bytes;
    return o;
}

void sleep_ms(double ms) { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms)); }

} // namespace

TEST(CpuDevice, MemoryIsBoundedAndErrorsNameTheDevice) {
    CpuDevice dev(3, small(1 << 20));
    EXPECT_EQ(dev.name(), "cpu:3");
    EXPECT_EQ(dev.capacity(), size_t(1) << 20);
    void * a = dev.allocate(600 << 10, "stage weights");
    EXPECT_TRUE(dev.contains(a, 600 << 10));
    try {
        dev.allocate(600 << 10, "prefetched stage weights");
        FAIL() << "expected an out-of-memory error";
    } catch (const rp::Error & e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("cpu:3"), std::string::npos) << msg;
        EXPECT_NE(msg.find("prefetched stage weights"), std::string::npos) << msg;
        EXPECT_NE(msg.find("614400 bytes"), std::string::npos) << msg;
    }
    void * b = dev.allocate(300 << 10, "activations");
    EXPECT_EQ(dev.used(), size_t(900) << 10);
    EXPECT_EQ(dev.high_water(), size_t(900) << 10);
    dev.free(a);
    dev.free(b);
    EXPECT_EQ(dev.used(), 0u);
    EXPECT_EQ(dev.high_water(), size_t(900) << 10);
    int host = 0;
    EXPECT_THROW(dev.free(&host), rp::Error);
    EXPECT_THROW(dev.stream(4), rp::Error);
    EXPECT_THROW(CpuDevice(0, [] { auto o = small(); o.num_streams = 3; return o; }()), rp::Error);
}

TEST(CpuDevice, StreamsRunInOrderEvenWithInjectedDelays) {
    CpuDeviceOptions o = small();
    o.delay_seed = 7;
    o.max_delay_us = 20;
    o.num_streams = 6;
    CpuDevice dev(0, o);
    EXPECT_EQ(dev.num_streams(), 6);
    std::vector<int> seen[6];
    for (int i = 0; i < 200; ++i) {
        for (int s = 0; s < 6; ++s) dev.stream(s).launch("append", [&, s, i] { seen[s].push_back(i); });
    }
    dev.synchronize();
    std::vector<int> want(200);
    std::iota(want.begin(), want.end(), 0);
    for (int s = 0; s < 6; ++s) EXPECT_EQ(seen[s], want) << "stream " << s;
}

TEST(CpuDevice, EventOrdersTwoStreamsOfOneDevice) {
    CpuDevice dev(0, small());
    auto ev = dev.create_event();
    int x = 0, seen = -1;
    dev.stream(StreamKind::Compute).launch("slow producer", [&] {
        sleep_ms(30);
        x = 42;
    });
    dev.stream(StreamKind::Compute).record(*ev);
    dev.stream(StreamKind::Download).wait(*ev);
    dev.stream(StreamKind::Download).launch("consumer", [&] { seen = x; });
    dev.synchronize();
    EXPECT_EQ(seen, 42);
}

TEST(CpuDevice, CrossDeviceWaitAndCopiesThroughPinnedHostMemory) {
    CpuDevice a(0, small()), b(1, small());
    const size_t n = 4096;
    rp::PinnedBuffer host(a, n * sizeof(float));
    float * da = static_cast<float *>(a.allocate(n * sizeof(float), "out"));
    float * db = static_cast<float *>(b.allocate(n * sizeof(float), "in"));
    std::vector<float> result(n, 0.0f);
    auto produced = a.create_event();

    // a: compute (slow) -> D2H into pinned host -> record; b: wait -> H2D -> compute -> D2H
    a.stream(StreamKind::Compute).launch("fill", [&] {
        sleep_ms(20);
        for (size_t i = 0; i < n; ++i) da[i] = static_cast<float>(i) * 0.5f;
    });
    auto computed = a.create_event();
    a.stream(StreamKind::Compute).record(*computed);
    a.stream(StreamKind::Download).wait(*computed);
    a.stream(StreamKind::Download).copy(host.data(), da, n * sizeof(float), CopyKind::DeviceToHost, "d2h");
    a.stream(StreamKind::Download).record(*produced);

    b.stream(StreamKind::ActivationUpload).wait(*produced);
    b.stream(StreamKind::ActivationUpload).copy(db, host.data(), n * sizeof(float), CopyKind::HostToDevice, "h2d");
    auto uploaded = b.create_event();
    b.stream(StreamKind::ActivationUpload).record(*uploaded);
    b.stream(StreamKind::Compute).wait(*uploaded);
    b.stream(StreamKind::Compute).launch("double", [&] {
        for (size_t i = 0; i < n; ++i) db[i] *= 2;
    });
    auto doubled = b.create_event();
    b.stream(StreamKind::Compute).record(*doubled);
    b.stream(StreamKind::Download).wait(*doubled);
    b.stream(StreamKind::Download).copy(result.data(), db, n * sizeof(float), CopyKind::DeviceToHost, "d2h");
    b.synchronize();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(result[i], static_cast<float>(i)) << i;

    // a device pointer of the other device is refused
    EXPECT_THROW(b.stream(StreamKind::Download).copy(result.data(), da, 16, CopyKind::DeviceToHost), rp::Error);
    EXPECT_THROW(b.stream(StreamKind::ActivationUpload).copy(result.data(), host.data(), 16, CopyKind::HostToDevice),
                 rp::Error);
    a.synchronize();
    a.free(da);
    b.free(db);
}

TEST(CpuDevice, UnrecordedEventsAreNoOpsLikeCuda) {
    CpuDevice dev(0, small());
    auto ev = dev.create_event();
    EXPECT_TRUE(ev->query());
    ev->synchronize();  // returns at once
    std::atomic<bool> ran{false};
    dev.stream(StreamKind::Compute).wait(*ev);
    dev.stream(StreamKind::Compute).launch("after", [&] { ran = true; });
    dev.stream(StreamKind::Compute).synchronize();
    EXPECT_TRUE(ran);
}

// A wait binds to the record made before it: a later re-record of the same event must not be waited for.
// Here the second record sits behind a job that itself waits for the consumer: waiting for the latest
// record instead would dead-lock (bounded by the 5 s timeout, then the test fails).
TEST(CpuDevice, WaitBindsToTheMostRecentRecordAtCallTime) {
    CpuDevice dev(0, small());
    auto ev = dev.create_event();
    std::promise<void> consumer_ran;
    std::future<void> consumer_done = consumer_ran.get_future();
    std::atomic<bool> first_done{false}, consumer_saw_first{false}, second_released{false};

    rp::Stream & producer = dev.stream(StreamKind::Compute);
    rp::Stream & consumer = dev.stream(StreamKind::Download);
    producer.launch("first", [&] {
        sleep_ms(10);
        first_done = true;
    });
    producer.record(*ev);
    consumer.wait(*ev);  // binds to the first record
    producer.launch("second", [&] {
        second_released = consumer_done.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    });
    producer.record(*ev);  // re-record after "second"
    consumer.launch("consumer", [&] {
        consumer_saw_first = first_done.load();
        consumer_ran.set_value();
    });
    dev.synchronize();
    EXPECT_TRUE(consumer_saw_first);
    EXPECT_TRUE(second_released);
}

TEST(CpuDevice, QueryAndHostSynchronize) {
    CpuDevice dev(0, small());
    auto ev = dev.create_event();
    std::promise<void> go;
    std::shared_future<void> gate = go.get_future().share();
    std::atomic<bool> done{false};
    dev.stream(StreamKind::Compute).launch("blocked", [gate, &done] {
        gate.wait();
        sleep_ms(20);
        done = true;
    });
    dev.stream(StreamKind::Compute).record(*ev);
    sleep_ms(5);
    EXPECT_FALSE(ev->query());
    const double t0 = rp::clock_us();
    go.set_value();
    ev->synchronize();
    EXPECT_TRUE(done);
    EXPECT_TRUE(ev->query());
    EXPECT_GE(rp::clock_us() - t0, 19000.0);
}

TEST(CpuDevice, ElapsedTimeBetweenEvents) {
    CpuDevice dev(0, small());
    auto start = dev.create_event(), stop = dev.create_event();
    EXPECT_THROW(stop->elapsed_ms(*start), rp::Error);  // never recorded
    rp::Stream & s = dev.stream(StreamKind::Compute);
    s.record(*start);
    s.launch("20 ms", [] { sleep_ms(20); });
    s.record(*stop);
    s.synchronize();
    const double ms = stop->elapsed_ms(*start);
    EXPECT_GE(ms, 19.9);
    EXPECT_LE(ms, 20 + 100);
    EXPECT_NEAR(start->elapsed_ms(*stop), -ms, 1e-9);
}

TEST(LinkModel, Parse) {
    rp::LinkModel m = rp::LinkModel::parse("32GB/s,10us");
    EXPECT_DOUBLE_EQ(m.bytes_per_s, 32e9);
    EXPECT_DOUBLE_EQ(m.latency_s, 10e-6);
    EXPECT_DOUBLE_EQ(m.seconds(32000), 10e-6 + 1e-6);
    m = rp::LinkModel::parse(" 5 ms , 2 GiB/s ");
    EXPECT_DOUBLE_EQ(m.bytes_per_s, 2.0 * 1024 * 1024 * 1024);
    EXPECT_DOUBLE_EQ(m.latency_s, 5e-3);
    m = rp::LinkModel::parse("100MB/s");
    EXPECT_DOUBLE_EQ(m.latency_s, 0);
    EXPECT_DOUBLE_EQ(m.seconds(1000000), 0.01);
    m = rp::LinkModel::parse("3us");
    EXPECT_DOUBLE_EQ(m.bytes_per_s, 0);
    EXPECT_DOUBLE_EQ(m.seconds(1 << 30), 3e-6);
    for (const char * bad : {"", "fast", "32GB", "32GB/s,", "-1GB/s", "0GB/s", "1GB/s,2GB/s", "1us,2ms", "10 parsecs"}) {
        try {
            rp::LinkModel::parse(bad);
            ADD_FAILURE() << "accepted '" << bad << "'";
        } catch (const rp::Error & e) {
            EXPECT_NE(std::string(e.what()).find("link model"), std::string::npos);
        }
    }
}

// latency + bytes / bandwidth, simulated by sleeping: lower bounds are exact, upper bounds generous.
TEST(CpuDevice, CopiesFollowTheLinkModel) {
    CpuDeviceOptions o = small(16 << 20);
    o.link = rp::LinkModel::parse("10MB/s,2ms");
    CpuDevice dev(0, o);
    // 64 KiB: 6.55 ms at 10 MB/s, long next to the memcpy itself even under a sanitizer
    const size_t n = 64 << 10;
    const double expect_ms = 2.0 + static_cast<double>(n) / 1e4;
    std::vector<char> host(n, 'x'), back(n, 0);
    void * d = dev.allocate(n, "buffer");
    void * d2 = dev.allocate(n, "buffer 2");

    double t0 = rp::clock_us();
    dev.stream(StreamKind::WeightUpload).copy(d, host.data(), n, CopyKind::HostToDevice, "h2d");
    dev.stream(StreamKind::WeightUpload).synchronize();
    double ms = (rp::clock_us() - t0) / 1e3;
    EXPECT_GE(ms, expect_ms - 0.05);
    EXPECT_LE(ms, expect_ms + 60);

    // two uploads on two streams share the H2D link: about twice as long
    t0 = rp::clock_us();
    dev.stream(StreamKind::WeightUpload).copy(d, host.data(), n, CopyKind::HostToDevice, "h2d a");
    dev.stream(StreamKind::ActivationUpload).copy(d2, host.data(), n, CopyKind::HostToDevice, "h2d b");
    dev.synchronize();
    ms = (rp::clock_us() - t0) / 1e3;
    EXPECT_GE(ms, 2 * expect_ms - 0.05);
    EXPECT_LE(ms, 2 * expect_ms + 60);

    // an upload and a download use two links (full duplex): about one copy time
    t0 = rp::clock_us();
    dev.stream(StreamKind::WeightUpload).copy(d2, host.data(), n, CopyKind::HostToDevice, "h2d");
    dev.stream(StreamKind::Download).copy(back.data(), d, n, CopyKind::DeviceToHost, "d2h");
    dev.synchronize();
    ms = (rp::clock_us() - t0) / 1e3;
    EXPECT_GE(ms, expect_ms - 0.05);
    EXPECT_LE(ms, expect_ms + 60);
    EXPECT_EQ(std::memcmp(back.data(), host.data(), n), 0);
    dev.free(d);
    dev.free(d2);
}

TEST(CpuDevice, AFailingJobPoisonsItsStreamButNotTheOthers) {
    CpuDevice dev(0, small());
    auto ev = dev.create_event();
    std::atomic<int> after{0};
    rp::Stream & s = dev.stream(StreamKind::Compute);
    s.launch("bad kernel", [] { throw rp::Error("kernel 'bad' failed"); });
    s.launch("skipped", [&] { ++after; });
    s.record(*ev);  // still completes so nobody dead-locks on it
    dev.stream(StreamKind::Download).wait(*ev);
    dev.stream(StreamKind::Download).launch("other stream", [&] { after += 10; });
    dev.stream(StreamKind::Download).synchronize();
    EXPECT_EQ(after, 10);
    EXPECT_TRUE(ev->query());
    try {
        s.synchronize();
        FAIL() << "the job error was lost";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("kernel 'bad' failed"), std::string::npos);
    }
    EXPECT_THROW(dev.synchronize(), rp::Error);  // sticky
}

TEST(CpuDevice, HookSeesEveryLaunchAndCopyInStreamOrder) {
    std::mutex m;
    std::vector<rp::OpRecord> recs;
    CpuDeviceOptions o = small();
    o.hook = [&](const rp::OpRecord & r) {
        std::lock_guard<std::mutex> lk(m);
        recs.push_back(r);
    };
    {
        CpuDevice dev(5, o);
        char * d = static_cast<char *>(dev.allocate(64, "x"));
        char host[64] = {};
        dev.stream(StreamKind::ActivationUpload).copy(d, host, 64, CopyKind::HostToDevice, {"up mb0", "fwd/F1"});
        dev.stream(StreamKind::Compute).launch({"F1 mb0", "fwd/F1"}, [] { sleep_ms(2); });
        dev.stream(StreamKind::Compute).launch({"F1 mb1", "fwd/F1"}, [] {});
        dev.synchronize();
    }
    ASSERT_EQ(recs.size(), 3u);
    int compute_seen = 0;
    for (const rp::OpRecord & r : recs) {
        EXPECT_EQ(r.device, 5);
        EXPECT_EQ(r.cat, "fwd/F1");
        EXPECT_LE(r.start_us, r.end_us);
        if (r.stream == static_cast<int>(StreamKind::ActivationUpload)) {
            EXPECT_EQ(r.name, "up mb0");
            EXPECT_EQ(r.bytes, 64u);
        } else {
            EXPECT_EQ(r.stream, static_cast<int>(StreamKind::Compute));
            EXPECT_EQ(r.name, compute_seen == 0 ? "F1 mb0" : "F1 mb1");
            EXPECT_EQ(r.bytes, 0u);
            ++compute_seen;
        }
    }
    EXPECT_EQ(compute_seen, 2);
}

TEST(CpuDevice, ShutdownFinishesQueuedWork) {
    std::atomic<int> count{0};
    {
        CpuDevice dev(0, small());
        for (int i = 0; i < 100; ++i) {
            dev.stream(i % 4).launch("job", [&] {
                sleep_ms(0.05);
                ++count;
            });
        }
    }  // no synchronize: the destructor drains every queue
    EXPECT_EQ(count, 100);
}

TEST(CpuDevice, PinnedAndRegisteredHostMemory) {
    CpuDevice dev(0, small());
    {
        rp::PinnedBuffer a(dev, 1000);
        ASSERT_NE(a.data(), nullptr);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 4096, 0u);
        std::memset(a.data(), 1, 1000);
        rp::PinnedBuffer b = std::move(a);
        EXPECT_EQ(a.data(), nullptr);
        EXPECT_EQ(b.size(), 1000u);
    }
    std::vector<char> range(4096);
    dev.register_host(range.data(), range.size());
    EXPECT_THROW(dev.register_host(range.data(), range.size()), rp::Error);
    dev.unregister_host(range.data());
    EXPECT_THROW(dev.unregister_host(range.data()), rp::Error);
}
