// The Device conformance checks of tests/runtime/test_cpu_device.cpp, re-run on the CUDA device: bounded memory
// and its errors, in-order streams, events within a device and across two logical devices (CUDA's semantics:
// unrecorded = no-op, a wait binds to the record made before it), host synchronisation, elapsed time, copy
// round trips on every stream, sticky job errors, the op hook, shutdown with queued work, pinned and
// registered host memory, and make_cuda_devices. Skipped without a CUDA device.
//
// "Work" on a GPU stream is enqueued, never run on the host: the tests make it slow or observable with
// cudaLaunchHostFunc callbacks (which hold their stream until they return) and cudaMemsetAsync, and never
// let one callback wait for another stream's callback (CUDA may run callbacks on one thread).
#include "cuda_test_util.h"

#if defined(RP_HAVE_CUDA)

#include "ggml_rp/cuda/cuda_device.h"
#include "ggml_rp/cuda/norm.cuh"
#include "ggml_rp/cuda/unary.cuh"
#include "ggml_rp/runtime/clock.h"
#include "base/error.h"

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
using rp::CudaDevice;
using rp::CudaDeviceOptions;
using rp::StreamKind;

namespace {

CudaDeviceOptions small(size_t bytes = 1 << 20, int logical = 0) {
    CudaDeviceOptions o;
    o.ordinal = logical % rp::cuda_device_count();
    o.memory_bytes = bytes;
    return o;
}

void sleep_ms(double ms) { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms)); }

cudaStream_t native(rp::Stream & s) { return static_cast<cudaStream_t>(s.native_handle()); }

// Enqueues a host callback on s that runs fn (a heap copy, freed by the callback).
void enqueue_host(rp::Stream & s, std::function<void()> fn) {
    auto * f = new std::function<void()>(std::move(fn));
    const cudaError_t e = cudaLaunchHostFunc(
        native(s),
        [](void * p) {
            auto * g = static_cast<std::function<void()> *>(p);
            (*g)();
            delete g;
        },
        f);
    if (e != cudaSuccess) {
        delete f;
        throw rp::Error(std::string("cudaLaunchHostFunc: ") + cudaGetErrorString(e));
    }
}

void host_sleep_on(rp::Stream & s, double ms) {
    enqueue_host(s, [ms] { sleep_ms(ms); });
}

} // namespace

TEST(CudaDevice, MemoryIsBoundedAndErrorsNameTheDevice) {
    RP_REQUIRE_GPU();
    CudaDevice dev(3, small(1 << 20, 3));
    EXPECT_EQ(dev.name(), "cuda:3");
    EXPECT_EQ(dev.capacity(), size_t(1) << 20);
    EXPECT_EQ(dev.num_streams(), rp::kNumStreamKinds);
    void * a = dev.allocate(600 << 10, "stage weights");
    EXPECT_TRUE(dev.contains(a, 600 << 10));
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, a), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
    EXPECT_EQ(attr.device, dev.ordinal());
    try {
        dev.allocate(600 << 10, "prefetched stage weights");
        FAIL() << "expected an out-of-memory error";
    } catch (const rp::Error & e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("cuda:3"), std::string::npos) << msg;
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
    dev.reset_high_water();
    EXPECT_EQ(dev.high_water(), 0u);
    int host = 0;
    EXPECT_THROW(dev.free(&host), rp::Error);
    EXPECT_THROW(dev.stream(4), rp::Error);
    EXPECT_THROW(CudaDevice(0, [] { auto o = small(); o.num_streams = 3; return o; }()), rp::Error);
    EXPECT_THROW(CudaDevice(0, [] { auto o = small(); o.ordinal = rp::cuda_device_count(); return o; }()), rp::Error);
}

TEST(CudaDevice, StreamsAreNonBlockingAndRunInOrder) {
    RP_REQUIRE_GPU();
    CudaDeviceOptions o = small();
    o.num_streams = 6;
    CudaDevice dev(0, o);
    EXPECT_EQ(dev.num_streams(), 6);
    std::mutex m;
    std::vector<int> seen[6];
    for (int s = 0; s < 6; ++s) {
        unsigned flags = 0;
        ASSERT_EQ(cudaStreamGetFlags(native(dev.stream(s)), &flags), cudaSuccess);
        EXPECT_EQ(flags & cudaStreamNonBlocking, unsigned(cudaStreamNonBlocking)) << s;
    }
    for (int i = 0; i < 200; ++i)
        for (int s = 0; s < 6; ++s)
            dev.stream(s).launch("append", [&, s, i] {
                enqueue_host(dev.stream(s), [&, s, i] {
                    std::lock_guard<std::mutex> lk(m);
                    seen[s].push_back(i);
                });
            });
    dev.synchronize();
    std::vector<int> want(200);
    std::iota(want.begin(), want.end(), 0);
    for (int s = 0; s < 6; ++s) EXPECT_EQ(seen[s], want) << "stream " << s;
}

TEST(CudaDevice, LaunchRunsOnTheCallingThreadWithTheGpuCurrent) {
    RP_REQUIRE_GPU();
    CudaDevice dev(1, small(1 << 20, 1));
    const std::thread::id me = std::this_thread::get_id();
    std::thread::id ran_on;
    int current = -1;
    dev.stream(StreamKind::Compute).launch("probe", [&] {
        ran_on = std::this_thread::get_id();
        cudaGetDevice(&current);
    });
    EXPECT_EQ(ran_on, me);
    EXPECT_EQ(current, dev.ordinal());
    EXPECT_NE(dev.stream(StreamKind::Compute).native_handle(), nullptr);
}

TEST(CudaDevice, EventOrdersTwoStreamsOfOneDevice) {
    RP_REQUIRE_GPU();
    CudaDevice dev(0, small());
    auto ev = dev.create_event();
    auto * d = static_cast<unsigned char *>(dev.allocate(256, "x"));
    rp::PinnedBuffer host(dev, 256);
    std::memset(host.data(), 0, 256);
    rp::Stream & producer = dev.stream(StreamKind::Compute);
    rp::Stream & consumer = dev.stream(StreamKind::Download);
    producer.launch("slow producer", [&] {
        cudaMemsetAsync(d, 0, 256, native(producer));
        host_sleep_on(producer, 30);
        cudaMemsetAsync(d, 42, 256, native(producer));
    });
    producer.record(*ev);
    consumer.wait(*ev);
    consumer.copy(host.data(), d, 256, CopyKind::DeviceToHost, "d2h");
    dev.synchronize();
    for (int i = 0; i < 256; ++i) ASSERT_EQ(host.as<unsigned char>()[i], 42) << i;
    dev.free(d);
}

TEST(CudaDevice, CrossDeviceWaitAndCopiesThroughPinnedHostMemory) {
    RP_REQUIRE_GPU();
    auto devs = rp::make_cuda_devices(2, 1 << 20);
    CudaDevice & a = *devs[0];
    CudaDevice & b = *devs[1];
    EXPECT_EQ(a.name(), "cuda:0");
    EXPECT_EQ(b.name(), "cuda:1");
    EXPECT_EQ(b.ordinal(), 1 % rp::cuda_device_count());
    const size_t n = 4096;
    std::vector<float> src(n);
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 0.5f;
    rp::PinnedBuffer host(a, n * sizeof(float)), staging(a, n * sizeof(float));
    std::memcpy(staging.data(), src.data(), n * sizeof(float));
    float * da0 = static_cast<float *>(a.allocate(n * sizeof(float), "source"));
    float * da = static_cast<float *>(a.allocate(n * sizeof(float), "out"));
    float * db = static_cast<float *>(b.allocate(n * sizeof(float), "in"));
    rp::PinnedBuffer result(b, n * sizeof(float));
    std::memset(result.data(), 0, n * sizeof(float));
    a.stream(StreamKind::WeightUpload).copy(da0, staging.data(), n * sizeof(float), CopyKind::HostToDevice, "h2d");
    a.stream(StreamKind::WeightUpload).synchronize();

    // a: compute (slow) -> D2H into pinned host -> record; b: wait -> H2D -> compute -> D2H
    rp::Stream & ac = a.stream(StreamKind::Compute);
    ac.launch("copy", [&] {
        host_sleep_on(ac, 20);
        rp::cuda::scale(da0, 1.0f, da, n, native(ac));
    });
    auto computed = a.create_event(), produced = a.create_event();
    ac.record(*computed);
    a.stream(StreamKind::Download).wait(*computed);
    a.stream(StreamKind::Download).copy(host.data(), da, n * sizeof(float), CopyKind::DeviceToHost, "d2h");
    a.stream(StreamKind::Download).record(*produced);

    b.stream(StreamKind::ActivationUpload).wait(*produced);
    b.stream(StreamKind::ActivationUpload).copy(db, host.data(), n * sizeof(float), CopyKind::HostToDevice, "h2d");
    auto uploaded = b.create_event();
    b.stream(StreamKind::ActivationUpload).record(*uploaded);
    rp::Stream & bc = b.stream(StreamKind::Compute);
    bc.wait(*uploaded);
    bc.launch("double", [&] { rp::cuda::scale(db, 2.0f, db, n, native(bc)); });
    auto doubled = b.create_event();
    bc.record(*doubled);
    b.stream(StreamKind::Download).wait(*doubled);
    b.stream(StreamKind::Download).copy(result.data(), db, n * sizeof(float), CopyKind::DeviceToHost, "d2h");
    b.synchronize();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(result.as<float>()[i], static_cast<float>(i)) << i;

    // a device pointer of the other device is refused
    EXPECT_THROW(b.stream(StreamKind::Download).copy(result.data(), da, 16, CopyKind::DeviceToHost), rp::Error);
    EXPECT_THROW(b.stream(StreamKind::ActivationUpload).copy(result.data(), host.data(), 16, CopyKind::HostToDevice),
                 rp::Error);
    a.synchronize();
    a.free(da0);
    a.free(da);
    b.free(db);
}

TEST(CudaDevice, CopyRoundTripsOnEveryStream) {
    RP_REQUIRE_GPU();
    CudaDeviceOptions o = small(4 << 20);
    o.num_streams = 5;
    CudaDevice dev(0, o);
    const size_t n = 100003;  // odd size
    std::mt19937 rng(11);
    for (int s = 0; s < dev.num_streams(); ++s) {
        SCOPED_TRACE("stream " + rp::stream_name(s));
        rp::Stream & st = dev.stream(s);
        std::vector<unsigned char> pageable(n);
        for (auto & c : pageable) c = static_cast<unsigned char>(rng());
        rp::PinnedBuffer in(dev, n), mid(dev, n), out(dev, n);
        std::memcpy(in.data(), pageable.data(), n);
        void * d1 = dev.allocate(n, "a");
        void * d2 = dev.allocate(n, "b");
        st.copy(d1, in.data(), n, CopyKind::HostToDevice, "h2d");
        st.copy(d2, d1, n, CopyKind::DeviceToDevice, "d2d");
        st.copy(mid.data(), d2, n, CopyKind::DeviceToHost, "d2h");
        st.copy(out.data(), mid.data(), n, CopyKind::HostToHost, "h2h");
        st.copy(out.data(), mid.data(), 0, CopyKind::HostToHost, "nothing");
        st.synchronize();
        EXPECT_EQ(std::memcmp(out.data(), pageable.data(), n), 0);
        // pageable host memory works too (synchronous-ish in CUDA, still correct)
        std::vector<unsigned char> back(n, 0);
        st.copy(back.data(), d2, n, CopyKind::DeviceToHost, "d2h pageable");
        st.synchronize();
        EXPECT_EQ(back, pageable);
        // a device range that overruns the allocation's arena is refused
        EXPECT_THROW(st.copy(static_cast<char *>(d1) + (4 << 20) - 16, in.data(), 64, CopyKind::HostToDevice), rp::Error);
        dev.free(d1);
        dev.free(d2);
    }
}

TEST(CudaDevice, UnrecordedEventsAreNoOpsLikeCuda) {
    RP_REQUIRE_GPU();
    CudaDevice dev(0, small());
    auto ev = dev.create_event();
    EXPECT_TRUE(ev->query());
    ev->synchronize();  // returns at once
    std::atomic<bool> ran{false};
    dev.stream(StreamKind::Compute).wait(*ev);
    dev.stream(StreamKind::Compute).launch("after", [&] { enqueue_host(dev.stream(StreamKind::Compute), [&] { ran = true; }); });
    dev.stream(StreamKind::Compute).synchronize();
    EXPECT_TRUE(ran);
}

// A wait binds to the record made before it: a later re-record of the same event must not be waited for.
// The second record sits behind a callback that holds the producer until the test thread has seen the
// consumer finish; waiting for the latest record instead would hold the consumer too (5 s, then fail).
TEST(CudaDevice, WaitBindsToTheMostRecentRecordAtCallTime) {
    RP_REQUIRE_GPU();
    CudaDevice dev(0, small());
    auto ev = dev.create_event(), consumer_done = dev.create_event();
    auto * flag = static_cast<int *>(dev.allocate(sizeof(int), "flag"));
    rp::PinnedBuffer seen(dev, sizeof(int));
    *seen.as<int>() = -1;
    std::promise<void> release;
    std::shared_future<void> gate = release.get_future().share();

    rp::Stream & producer = dev.stream(StreamKind::Compute);
    rp::Stream & consumer = dev.stream(StreamKind::Download);
    producer.launch("first", [&] {
        cudaMemsetAsync(flag, 0, sizeof(int), native(producer));
        host_sleep_on(producer, 10);
        cudaMemsetAsync(flag, 1, 1, native(producer));  // flag = 1
    });
    producer.record(*ev);
    consumer.wait(*ev);  // binds to the first record
    producer.launch("second", [&] { enqueue_host(producer, [gate] { gate.wait_for(std::chrono::seconds(5)); }); });
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
    dev.synchronize();
    EXPECT_TRUE(finished_first) << "the consumer waited for the later record";
    EXPECT_EQ(*seen.as<int>(), 1) << "the consumer did not wait for the first record";
    dev.free(flag);
}

TEST(CudaDevice, QueryAndHostSynchronize) {
    RP_REQUIRE_GPU();
    CudaDevice dev(0, small());
    auto ev = dev.create_event();
    std::promise<void> go;
    std::shared_future<void> gate = go.get_future().share();
    std::atomic<bool> done{false};
    rp::Stream & s = dev.stream(StreamKind::Compute);
    s.launch("blocked", [&] {
        enqueue_host(s, [gate, &done] {
            gate.wait();
            sleep_ms(20);
            done = true;
        });
    });
    s.record(*ev);
    sleep_ms(5);
    EXPECT_FALSE(ev->query());
    const double t0 = rp::clock_us();
    go.set_value();
    ev->synchronize();
    EXPECT_TRUE(done);
    EXPECT_TRUE(ev->query());
    EXPECT_GE(rp::clock_us() - t0, 19000.0);
}

TEST(CudaDevice, ElapsedTimeBetweenEvents) {
    RP_REQUIRE_GPU();
    CudaDevice dev(0, small());
    auto start = dev.create_event(), stop = dev.create_event();
    EXPECT_THROW(stop->elapsed_ms(*start), rp::Error);  // never recorded
    rp::Stream & s = dev.stream(StreamKind::Compute);
    s.record(*start);
    s.launch("20 ms", [&] { host_sleep_on(s, 20); });
    s.record(*stop);
    s.synchronize();
    const double ms = stop->elapsed_ms(*start);
    EXPECT_GE(ms, 19.5);
    EXPECT_LE(ms, 20 + 100);
}

TEST(CudaDevice, AFailingJobPoisonsItsStreamButNotTheOthers) {
    RP_REQUIRE_GPU();
    CudaDevice dev(0, small());
    auto ev = dev.create_event();
    std::atomic<int> after{0};
    rp::Stream & s = dev.stream(StreamKind::Compute);
    rp::Stream & other = dev.stream(StreamKind::Download);
    s.launch("bad kernel", [] { throw rp::Error("kernel 'bad' failed"); });
    s.launch("skipped", [&] { ++after; });
    s.record(*ev);  // still happens so nobody dead-locks on it
    other.wait(*ev);
    other.launch("other stream", [&] { after += 10; });
    other.synchronize();
    EXPECT_EQ(after, 10);
    EXPECT_TRUE(ev->query());
    try {
        s.synchronize();
        FAIL() << "the job error was lost";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("kernel 'bad' failed"), std::string::npos);
    }
    EXPECT_THROW(dev.synchronize(), rp::Error);  // sticky
    // A launcher's own argument check inside work poisons the same way, with its message.
    rp::Stream & up = dev.stream(StreamKind::WeightUpload);
    up.launch("bad launch", [&] { rp::cuda::rms_norm_fwd(nullptr, nullptr, nullptr, -1, 1, 0.0f, native(up)); });
    EXPECT_THROW(up.synchronize(), rp::Error);
}

TEST(CudaDevice, HookSeesEveryLaunchAndCopyInStreamOrder) {
    RP_REQUIRE_GPU();
    std::mutex m;
    std::vector<rp::OpRecord> recs;
    CudaDeviceOptions o = small();
    o.hook = [&](const rp::OpRecord & r) {
        std::lock_guard<std::mutex> lk(m);
        recs.push_back(r);
    };
    const double t0 = rp::clock_us();
    {
        CudaDevice dev(5, o);
        char * d = static_cast<char *>(dev.allocate(64, "x"));
        rp::PinnedBuffer host(dev, 64);
        rp::Stream & c = dev.stream(StreamKind::Compute);
        dev.stream(StreamKind::ActivationUpload).copy(d, host.data(), 64, CopyKind::HostToDevice, {"up mb0", "fwd/F1"});
        c.launch({"F1 mb0", "fwd/F1"}, [&] { host_sleep_on(c, 2); });
        c.launch({"F1 mb1", "fwd/F1"}, [] {});
        dev.synchronize();
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

TEST(CudaDevice, ShutdownFinishesQueuedWork) {
    RP_REQUIRE_GPU();
    std::atomic<int> count{0};
    {
        CudaDevice dev(0, small());
        for (int i = 0; i < 100; ++i) {
            rp::Stream & s = dev.stream(i % 4);
            s.launch("job", [&] {
                enqueue_host(s, [&] {
                    sleep_ms(0.05);
                    ++count;
                });
            });
        }
    }  // no synchronize: the destructor waits for every stream
    EXPECT_EQ(count, 100);
}

TEST(CudaDevice, PinnedAndRegisteredHostMemory) {
    RP_REQUIRE_GPU();
    auto devs = rp::make_cuda_devices(2, 1 << 20);
    CudaDevice & dev = *devs[0];
    {
        rp::PinnedBuffer a(dev, 1000);
        ASSERT_NE(a.data(), nullptr);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 4096, 0u);
        cudaPointerAttributes attr{};
        ASSERT_EQ(cudaPointerGetAttributes(&attr, a.data()), cudaSuccess);
        EXPECT_EQ(attr.type, cudaMemoryTypeHost);
        std::memset(a.data(), 1, 1000);
        rp::PinnedBuffer b = std::move(a);
        EXPECT_EQ(a.data(), nullptr);
        EXPECT_EQ(b.size(), 1000u);
    }
    int not_pinned = 0;
    EXPECT_THROW(dev.free_pinned(&not_pinned), rp::Error);

    std::vector<char> range(1 << 16);
    auto kind = [&] {
        cudaPointerAttributes attr{};
        EXPECT_EQ(cudaPointerGetAttributes(&attr, range.data()), cudaSuccess);
        return attr.type;
    };
    dev.register_host(range.data(), range.size());
    EXPECT_EQ(kind(), cudaMemoryTypeHost);
    EXPECT_THROW(dev.register_host(range.data(), range.size()), rp::Error);
    devs[1]->register_host(range.data(), range.size());  // the second logical device shares the pinning
    dev.unregister_host(range.data());
    EXPECT_EQ(kind(), cudaMemoryTypeHost);  // still held by cuda:1
    EXPECT_THROW(dev.unregister_host(range.data()), rp::Error);
    devs[1]->unregister_host(range.data());
    EXPECT_EQ(kind(), cudaMemoryTypeUnregistered);
}

TEST(CudaDevice, FactorySpreadsLogicalDevicesAndChecksMemory) {
    RP_REQUIRE_GPU();
    const int gpus = rp::cuda_device_count();
    auto devs = rp::make_cuda_devices(3, 2 << 20);
    ASSERT_EQ(devs.size(), 3u);
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(devs[static_cast<size_t>(i)]->index(), i);
        EXPECT_EQ(devs[static_cast<size_t>(i)]->ordinal(), i % gpus);
        EXPECT_EQ(devs[static_cast<size_t>(i)]->capacity(), size_t(2) << 20);
    }
    try {
        rp::make_cuda_devices(2, size_t(1) << 50);
        FAIL() << "1 PiB per logical device was accepted";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("GPU 0"), std::string::npos) << e.what();
    }
    EXPECT_THROW(rp::make_cuda_devices(0, 1 << 20), rp::Error);
}

#else

TEST(CudaDevice, NeedsACudaBuild) { GTEST_SKIP() << "skipped: built without CUDA (RP_CUDA=OFF or no nvcc)"; }

#endif
