// The Device contract (ggml_rp/runtime/device.h), as one typed GoogleTest suite that every Device
// implementation runs: tests/runtime instantiates it for the CPU virtual device, tests/cuda for the CUDA
// device. A Kind describes how to make a device and how to put observable host work on a stream in stream
// order (the CPU device runs a launch's work on the stream's thread; on a GPU the work only enqueues, so the
// CUDA kind enqueues a host callback). Device-specific behaviour (delay injection, the link model, CUDA's
// non-blocking streams, cudaHostRegister sharing) stays in each device's own test file.
//
//   struct Kind {
//       static const char * prefix();                       // device names are "<prefix>:<index>"
//       static bool available();                           // false: every test skips, saying why
//       static std::unique_ptr<rp::Device> make(int index, size_t bytes, int streams = 4, rp::OpHook hook = {});
//       static void host_work(rp::Stream & s, rp::OpLabel label, std::function<void()> fn);
//   };
//   INSTANTIATE_TYPED_TEST_SUITE_P(Cpu, DeviceContract, ::testing::Types<CpuKind>);
#pragma once

#include "base/error.h"
#include "ggml_rp/ggml_rp.h"
#include "ggml_rp/runtime/arena_device.h"
#include "ggml_rp/runtime/clock.h"
#include "ggml_rp/runtime/device.h"
#include "ggml_rp/runtime/graph_runner.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace rp_device_contract {

using rp::CopyKind;
using rp::StreamKind;

inline void sleep_ms(double ms) { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms)); }

template <class Kind> class DeviceContract : public ::testing::Test {
protected:
    void SetUp() override {
        if (!Kind::available()) GTEST_SKIP() << "skipped: no " << Kind::prefix() << " device";
    }
    static std::string name(int i) { return std::string(Kind::prefix()) + ":" + std::to_string(i); }
};

TYPED_TEST_SUITE_P(DeviceContract);

TYPED_TEST_P(DeviceContract, MemoryIsBoundedAndErrorsNameTheDevice) {
    auto dev = TypeParam::make(3, 1 << 20);
    EXPECT_EQ(dev->name(), this->name(3));
    EXPECT_EQ(dev->index(), 3);
    EXPECT_EQ(dev->capacity(), size_t(1) << 20);
    EXPECT_GE(dev->num_streams(), rp::kNumStreamKinds);
    void * a = dev->allocate(600 << 10, "stage weights");
    auto * arena = dynamic_cast<rp::ArenaDevice *>(dev.get());
    ASSERT_NE(arena, nullptr);
    EXPECT_TRUE(arena->contains(a, 600 << 10));
    try {
        dev->allocate(600 << 10, "prefetched stage weights");
        FAIL() << "expected an out-of-memory error";
    } catch (const rp::Error & e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(this->name(3)), std::string::npos) << msg;
        EXPECT_NE(msg.find("prefetched stage weights"), std::string::npos) << msg;
        EXPECT_NE(msg.find("614400 bytes"), std::string::npos) << msg;
    }
    void * b = dev->allocate(300 << 10, "activations");
    EXPECT_EQ(dev->used(), size_t(900) << 10);
    EXPECT_EQ(dev->high_water(), size_t(900) << 10);
    dev->free(a);
    dev->free(b);
    EXPECT_EQ(dev->used(), 0u);
    EXPECT_EQ(dev->high_water(), size_t(900) << 10);
    dev->reset_high_water();
    EXPECT_EQ(dev->high_water(), 0u);
    int host = 0;
    EXPECT_THROW(dev->free(&host), rp::Error);
    EXPECT_THROW(dev->stream(dev->num_streams()), rp::Error);
    EXPECT_THROW(TypeParam::make(0, 1 << 20, 3), rp::Error);  // fewer than the four roles
}

TYPED_TEST_P(DeviceContract, StreamsRunInOrder) {
    auto dev = TypeParam::make(0, 1 << 20, 6);
    EXPECT_EQ(dev->num_streams(), 6);
    std::mutex m;
    std::vector<int> seen[6];
    for (int i = 0; i < 200; ++i)
        for (int s = 0; s < 6; ++s)
            TypeParam::host_work(dev->stream(s), "append", [&, s, i] {
                std::lock_guard<std::mutex> lk(m);
                seen[s].push_back(i);
            });
    dev->synchronize();
    std::vector<int> want(200);
    std::iota(want.begin(), want.end(), 0);
    for (int s = 0; s < 6; ++s) EXPECT_EQ(seen[s], want) << "stream " << s;
}

TYPED_TEST_P(DeviceContract, EventOrdersTwoStreamsOfOneDevice) {
    auto dev = TypeParam::make(0, 1 << 20);
    auto ev = dev->create_event();
    std::atomic<int> x{0}, seen{-1};
    TypeParam::host_work(dev->stream(StreamKind::Compute), "slow producer", [&] {
        sleep_ms(30);
        x = 42;
    });
    dev->stream(StreamKind::Compute).record(*ev);
    dev->stream(StreamKind::Download).wait(*ev);
    TypeParam::host_work(dev->stream(StreamKind::Download), "consumer", [&] { seen = x.load(); });
    dev->synchronize();
    EXPECT_EQ(seen, 42);
}

// Device a: slow compute, then D2H into pinned host memory, record; device b: wait, H2D, D2H. Without the
// cross-device wait b would copy the pinned buffer before a has filled it.
TYPED_TEST_P(DeviceContract, CrossDeviceWaitAndCopiesThroughPinnedHostMemory) {
    auto a = TypeParam::make(0, 1 << 20), b = TypeParam::make(1, 1 << 20);
    const size_t n = 4096, bytes = n * sizeof(float);
    std::vector<float> src(n);
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 0.5f;
    rp::PinnedBuffer staging(*a, bytes), host(*a, bytes), result(*b, bytes);
    std::memcpy(staging.data(), src.data(), bytes);
    std::memset(host.data(), 0, bytes);
    std::memset(result.data(), 0, bytes);
    void * da = a->allocate(bytes, "out");
    void * db = b->allocate(bytes, "in");
    a->stream(StreamKind::WeightUpload).copy(da, staging.data(), bytes, CopyKind::HostToDevice, "h2d");
    a->stream(StreamKind::WeightUpload).synchronize();
    TypeParam::host_work(a->stream(StreamKind::Compute), "slow", [] { sleep_ms(20); });
    auto computed = a->create_event(), produced = a->create_event();
    a->stream(StreamKind::Compute).record(*computed);
    a->stream(StreamKind::Download).wait(*computed);
    a->stream(StreamKind::Download).copy(host.data(), da, bytes, CopyKind::DeviceToHost, "d2h");
    a->stream(StreamKind::Download).record(*produced);
    b->stream(StreamKind::ActivationUpload).wait(*produced);
    b->stream(StreamKind::ActivationUpload).copy(db, host.data(), bytes, CopyKind::HostToDevice, "h2d");
    auto arrived = b->create_event();
    b->stream(StreamKind::ActivationUpload).record(*arrived);
    b->stream(StreamKind::Download).wait(*arrived);
    b->stream(StreamKind::Download).copy(result.data(), db, bytes, CopyKind::DeviceToHost, "d2h");
    b->synchronize();
    a->synchronize();
    EXPECT_EQ(std::memcmp(result.data(), src.data(), bytes), 0);
    a->free(da);
    b->free(db);
}

TYPED_TEST_P(DeviceContract, CopyRoundTripsOnEveryStream) {
    auto dev = TypeParam::make(0, 4 << 20, 5);
    const size_t n = 100003;  // odd size
    std::mt19937 rng(11);
    for (int s = 0; s < dev->num_streams(); ++s) {
        SCOPED_TRACE("stream " + rp::stream_name(s));
        rp::Stream & st = dev->stream(s);
        std::vector<unsigned char> pageable(n);
        for (auto & c : pageable) c = static_cast<unsigned char>(rng());
        rp::PinnedBuffer in(*dev, n), mid(*dev, n), out(*dev, n);
        std::memcpy(in.data(), pageable.data(), n);
        void * d1 = dev->allocate(n, "a");
        void * d2 = dev->allocate(n, "b");
        st.copy(d1, in.data(), n, CopyKind::HostToDevice, "h2d");
        st.copy(d2, d1, n, CopyKind::DeviceToDevice, "d2d");
        st.copy(mid.data(), d2, n, CopyKind::DeviceToHost, "d2h");
        st.copy(out.data(), mid.data(), n, CopyKind::HostToHost, "h2h");
        st.copy(out.data(), mid.data(), 0, CopyKind::HostToHost, "nothing");
        st.synchronize();
        EXPECT_EQ(std::memcmp(out.data(), pageable.data(), n), 0);
        std::vector<unsigned char> back(n, 0);  // pageable host memory works too
        st.copy(back.data(), d2, n, CopyKind::DeviceToHost, "d2h pageable");
        st.synchronize();
        EXPECT_EQ(back, pageable);
        // a device range that overruns the arena is refused
        EXPECT_THROW(st.copy(static_cast<char *>(d1) + (4 << 20) - 16, in.data(), 64, CopyKind::HostToDevice), rp::Error);
        dev->free(d1);
        dev->free(d2);
    }
}

TYPED_TEST_P(DeviceContract, UnrecordedEventsAreNoOps) {
    auto dev = TypeParam::make(0, 1 << 20);
    auto ev = dev->create_event();
    EXPECT_TRUE(ev->query());
    ev->synchronize();  // returns at once
    std::atomic<bool> ran{false};
    dev->stream(StreamKind::Compute).wait(*ev);
    TypeParam::host_work(dev->stream(StreamKind::Compute), "after", [&] { ran = true; });
    dev->stream(StreamKind::Compute).synchronize();
    EXPECT_TRUE(ran);
}

// A wait binds to the record made before it: a later re-record of the same event must not be waited for.
// The second record sits behind host work that holds the producer until the test thread has seen the
// consumer finish; waiting for the latest record instead would hold the consumer too (4 s, then fail).
TYPED_TEST_P(DeviceContract, WaitBindsToTheMostRecentRecordAtCallTime) {
    auto dev = TypeParam::make(0, 1 << 20);
    auto ev = dev->create_event(), consumer_done = dev->create_event();
    void * flag = dev->allocate(sizeof(int), "flag");
    rp::PinnedBuffer zero(*dev, sizeof(int)), one(*dev, sizeof(int)), seen(*dev, sizeof(int));
    *zero.as<int>() = 0;
    *one.as<int>() = 1;
    *seen.as<int>() = -1;
    std::promise<void> release;
    std::shared_future<void> gate = release.get_future().share();

    rp::Stream & producer = dev->stream(StreamKind::Compute);
    rp::Stream & consumer = dev->stream(StreamKind::Download);
    producer.copy(flag, zero.data(), sizeof(int), CopyKind::HostToDevice, "flag = 0");
    TypeParam::host_work(producer, "first", [] { sleep_ms(10); });
    producer.copy(flag, one.data(), sizeof(int), CopyKind::HostToDevice, "flag = 1");
    producer.record(*ev);
    consumer.wait(*ev);  // binds to the first record
    TypeParam::host_work(producer, "second", [gate] { gate.wait_for(std::chrono::seconds(5)); });
    producer.record(*ev);  // re-record after "second"
    consumer.copy(seen.data(), flag, sizeof(int), CopyKind::DeviceToHost, "read flag");
    consumer.record(*consumer_done);

    const double t0 = rp::clock_us();
    bool finished_first = false;
    while (rp::clock_us() - t0 < 4e6) {
        if (consumer_done->query()) {
            finished_first = true;
            break;
        }
        sleep_ms(0.5);
    }
    release.set_value();
    dev->synchronize();
    EXPECT_TRUE(finished_first) << "the consumer waited for the later record";
    EXPECT_EQ(*seen.as<int>(), 1) << "the consumer did not wait for the first record";
    dev->free(flag);
}

TYPED_TEST_P(DeviceContract, QueryAndHostSynchronize) {
    auto dev = TypeParam::make(0, 1 << 20);
    auto ev = dev->create_event();
    std::promise<void> go;
    std::shared_future<void> gate = go.get_future().share();
    std::atomic<bool> done{false};
    TypeParam::host_work(dev->stream(StreamKind::Compute), "blocked", [gate, &done] {
        gate.wait();
        sleep_ms(20);
        done = true;
    });
    dev->stream(StreamKind::Compute).record(*ev);
    sleep_ms(5);
    EXPECT_FALSE(ev->query());
    const double t0 = rp::clock_us();
    go.set_value();
    ev->synchronize();
    EXPECT_TRUE(done);
    EXPECT_TRUE(ev->query());
    EXPECT_GE(rp::clock_us() - t0, 19000.0);
}

TYPED_TEST_P(DeviceContract, ElapsedTimeBetweenEvents) {
    auto dev = TypeParam::make(0, 1 << 20);
    auto start = dev->create_event(), stop = dev->create_event();
    EXPECT_THROW(stop->elapsed_ms(*start), rp::Error);  // never recorded
    rp::Stream & s = dev->stream(StreamKind::Compute);
    s.record(*start);
    TypeParam::host_work(s, "20 ms", [] { sleep_ms(20); });
    s.record(*stop);
    s.synchronize();
    const double ms = stop->elapsed_ms(*start);
    EXPECT_GE(ms, 19.5);
    EXPECT_LE(ms, 20 + 100);
}

TYPED_TEST_P(DeviceContract, AFailingJobPoisonsItsStreamButNotTheOthers) {
    auto dev = TypeParam::make(0, 1 << 20);
    auto ev = dev->create_event();
    std::atomic<int> after{0};
    rp::Stream & s = dev->stream(StreamKind::Compute);
    rp::Stream & other = dev->stream(StreamKind::Download);
    s.launch("bad kernel", [] { throw rp::Error("kernel 'bad' failed"); });
    s.launch("skipped", [&] { ++after; });
    s.record(*ev);  // still completes so nobody dead-locks on it
    other.wait(*ev);
    TypeParam::host_work(other, "other stream", [&] { after += 10; });
    other.synchronize();
    EXPECT_EQ(after, 10);
    EXPECT_TRUE(ev->query());
    try {
        s.synchronize();
        FAIL() << "the job error was lost";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("kernel 'bad' failed"), std::string::npos);
    }
    EXPECT_THROW(dev->synchronize(), rp::Error);  // sticky
}

TYPED_TEST_P(DeviceContract, HookSeesEveryLaunchAndCopyInStreamOrder) {
    std::mutex m;
    std::vector<rp::OpRecord> recs;
    const double t0 = rp::clock_us();
    {
        auto dev = TypeParam::make(5, 1 << 20, 4, [&](const rp::OpRecord & r) {
            std::lock_guard<std::mutex> lk(m);
            recs.push_back(r);
        });
        void * d = dev->allocate(64, "x");
        rp::PinnedBuffer host(*dev, 64);
        rp::Stream & c = dev->stream(StreamKind::Compute);
        dev->stream(StreamKind::ActivationUpload).copy(d, host.data(), 64, CopyKind::HostToDevice, {"up mb0", "fwd/F1"});
        TypeParam::host_work(c, {"F1 mb0", "fwd/F1"}, [] { sleep_ms(2); });
        c.launch({"F1 mb1", "fwd/F1"}, [] {});
        dev->synchronize();
    }
    const double t1 = rp::clock_us();
    ASSERT_EQ(recs.size(), 3u);
    int compute_seen = 0;
    for (const rp::OpRecord & r : recs) {
        EXPECT_EQ(r.device, 5);
        EXPECT_EQ(r.cat, "fwd/F1");
        EXPECT_LE(r.start_us, r.end_us);
        EXPECT_GE(r.start_us, t0);  // the same clock as the host
        EXPECT_LE(r.end_us, t1);
        if (r.stream == static_cast<int>(StreamKind::ActivationUpload)) {
            EXPECT_EQ(r.name, "up mb0");
            EXPECT_EQ(r.bytes, 64u);
        } else {
            EXPECT_EQ(r.stream, static_cast<int>(StreamKind::Compute));
            EXPECT_EQ(r.name, compute_seen == 0 ? "F1 mb0" : "F1 mb1");
            if (compute_seen == 0) {
                EXPECT_GE(r.end_us - r.start_us, 1900.0);
            }
            EXPECT_EQ(r.bytes, 0u);
            ++compute_seen;
        }
    }
    EXPECT_EQ(compute_seen, 2);
}

TYPED_TEST_P(DeviceContract, ShutdownFinishesQueuedWork) {
    std::atomic<int> count{0};
    {
        auto dev = TypeParam::make(0, 1 << 20);
        for (int i = 0; i < 100; ++i)
            TypeParam::host_work(dev->stream(i % 4), "job", [&] {
                sleep_ms(0.05);
                ++count;
            });
    }  // no synchronize: the destructor drains every stream
    EXPECT_EQ(count, 100);
}

TYPED_TEST_P(DeviceContract, PinnedAndRegisteredHostMemory) {
    auto dev = TypeParam::make(0, 1 << 20);
    {
        rp::PinnedBuffer a(*dev, 1000);
        ASSERT_NE(a.data(), nullptr);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 4096, 0u);
        std::memset(a.data(), 1, 1000);
        rp::PinnedBuffer b = std::move(a);
        EXPECT_EQ(a.data(), nullptr);
        EXPECT_EQ(b.size(), 1000u);
    }
    int not_pinned = 0;
    EXPECT_THROW(dev->free_pinned(&not_pinned), rp::Error);
    std::vector<char> range(1 << 16);
    dev->register_host(range.data(), range.size());
    EXPECT_THROW(dev->register_host(range.data(), range.size()), rp::Error);
    dev->unregister_host(range.data());
    EXPECT_THROW(dev->unregister_host(range.data()), rp::Error);
}

// The device's own runner runs a graph over its memory, inside a compute-stream launch (what the per-layer
// training programs do), and zeroes device memory in stream order.
TYPED_TEST_P(DeviceContract, OwnsAGraphRunner) {
    auto dev = TypeParam::make(0, 1 << 20);
    const int64_t n = 1000;
    const size_t bytes = n * sizeof(float);
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i % 17) - 8.0f;
    rp::PinnedBuffer in(*dev, bytes), out(*dev, bytes), zeros(*dev, bytes);
    std::memcpy(in.data(), x.data(), bytes);
    void * dx = dev->allocate(bytes, "x");
    void * dy = dev->allocate(bytes, "y");
    rp::Stream & cs = dev->stream(StreamKind::Compute);
    cs.copy(dx, in.data(), bytes, CopyKind::HostToDevice, "x");
    rp::Context ctx;
    rp::Tensor * tx = ctx.new_tensor(rp::DType::F32, n);
    tx->data = dx;
    tx->flags |= rp::kFlagInput;
    rp::Tensor * ty = rp::scale(ctx, rp::silu(ctx, tx), 2.0f);
    ty->flags |= rp::kFlagOutput;
    rp::Graph g;
    rp::build_forward(g, ty);
    size_t graph_bytes = 0;
    cs.launch("graph", [&] {
        rp::GraphRunner & r = dev->runner();
        graph_bytes = r.run(g, 1, [&] { r.copy_out(dy, ty); });
    });
    cs.copy(out.data(), dy, bytes, CopyKind::DeviceToHost, "y");
    cs.launch("zero", [&] { dev->runner().zero(dy, bytes); });
    cs.copy(zeros.data(), dy, bytes, CopyKind::DeviceToHost, "zeros");
    cs.synchronize();
    EXPECT_GT(graph_bytes, 0u);
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[static_cast<size_t>(i)];
        EXPECT_NEAR(out.as<float>()[i], 2.0f * v / (1.0f + std::exp(-v)), 1e-5f) << i;
        EXPECT_EQ(zeros.as<float>()[i], 0.0f) << i;
    }
    dev->free(dx);
    dev->free(dy);
}

REGISTER_TYPED_TEST_SUITE_P(DeviceContract, MemoryIsBoundedAndErrorsNameTheDevice, StreamsRunInOrder,
                            EventOrdersTwoStreamsOfOneDevice, CrossDeviceWaitAndCopiesThroughPinnedHostMemory,
                            CopyRoundTripsOnEveryStream, UnrecordedEventsAreNoOps, WaitBindsToTheMostRecentRecordAtCallTime,
                            QueryAndHostSynchronize, ElapsedTimeBetweenEvents, AFailingJobPoisonsItsStreamButNotTheOthers,
                            HookSeesEveryLaunchAndCopyInStreamOrder, ShutdownFinishesQueuedWork,
                            PinnedAndRegisteredHostMemory, OwnsAGraphRunner);

} // namespace rp_device_contract
