// The CUDA device: the Device contract (tests/common/device_contract.h, the same suite the CPU virtual device
// runs), and what only the CUDA device has: one cudaMalloc per logical device on its GPU, non-blocking
// streams, launches on the calling thread with the GPU current, launcher errors poisoning a stream, CUDA host
// memory and registrations shared across logical devices, make_cuda_devices. Skipped without a CUDA device.
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
#include "tests/common/device_contract.h"

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

struct CudaKind {
    static const char * prefix() { return "cuda"; }
    static bool available() { return cutest::have_gpu(); }
    static std::unique_ptr<rp::Device> make(int index, size_t bytes, int streams = 4, rp::OpHook hook = {}) {
        CudaDeviceOptions o = small(bytes, index);
        o.num_streams = streams;
        o.hook = std::move(hook);
        return std::make_unique<CudaDevice>(index, o);
    }
    // A launch only enqueues on a GPU: the host work is a callback the stream reaches in order.
    static void host_work(rp::Stream & s, rp::OpLabel label, std::function<void()> fn) {
        s.launch(std::move(label), [&s, fn = std::move(fn)]() mutable { enqueue_host(s, std::move(fn)); });
    }
};

} // namespace

namespace rp_device_contract {
INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, DeviceContract, ::testing::Types<CudaKind>);
} // namespace rp_device_contract

TEST(CudaDevice, MemoryIsOneCudaMallocOnTheRightGpu) {
    RP_REQUIRE_GPU();
    CudaDevice dev(3, small(1 << 20, 3));
    void * a = dev.allocate(600 << 10, "stage weights");
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, a), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
    EXPECT_EQ(attr.device, dev.ordinal());
    dev.free(a);
    EXPECT_THROW(CudaDevice(0, [] { auto o = small(); o.ordinal = rp::cuda_device_count(); return o; }()), rp::Error);
}

TEST(CudaDevice, StreamsAreNonBlocking) {
    RP_REQUIRE_GPU();
    CudaDeviceOptions o = small();
    o.num_streams = 6;
    CudaDevice dev(0, o);
    for (int s = 0; s < 6; ++s) {
        unsigned flags = 0;
        ASSERT_EQ(cudaStreamGetFlags(native(dev.stream(s)), &flags), cudaSuccess);
        EXPECT_EQ(flags & cudaStreamNonBlocking, unsigned(cudaStreamNonBlocking)) << s;
    }
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







TEST(CudaDevice, ALauncherArgumentErrorPoisonsItsStream) {
    RP_REQUIRE_GPU();
    CudaDevice dev(0, small());
    rp::Stream & up = dev.stream(StreamKind::WeightUpload);
    up.launch("bad launch", [&] { rp::cuda::rms_norm_fwd(nullptr, nullptr, nullptr, -1, 1, 0.0f, native(up)); });
    EXPECT_THROW(up.synchronize(), rp::Error);
}

// cudaEventQuery's cudaErrorNotReady is also the thread's last error: a query of a pending event (what the
// transfer engine and the graph runner do before every job) must not leave it for the next launch check,
// which would report "device not ready" and poison a healthy stream.
TEST(CudaDevice, QueryingAPendingEventDoesNotFailTheNextLaunch) {
    RP_REQUIRE_GPU();
    CudaDevice dev(0, small());
    rp::Stream & s = dev.stream(StreamKind::Compute);
    // Everything that may wait for the whole device comes before the callback holds the stream, or it would
    // wait for a release that comes after it: the buffers (cudaMalloc, the synchronous cudaMemcpy / cudaMemset)
    // and the kernel's first launch (CUDA 12 loads modules lazily, and loading one may synchronize the context;
    // on the H200 this test hung at that launch).
    cutest::Dev<float> x(std::vector<float>(256, 2.0f)), y(256);
    rp::cuda::scale(x.p, 1.0f, y.p, 256, native(s));
    ASSERT_EQ(cudaStreamSynchronize(native(s)), cudaSuccess);
    std::atomic<bool> release{false};
    enqueue_host(s, [&] { while (!release.load()) std::this_thread::sleep_for(std::chrono::microseconds(50)); });
    auto ev = dev.create_event();
    s.record(*ev);
    EXPECT_FALSE(ev->query());  // held by the callback
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
    s.launch("scale after a pending query", [&] { rp::cuda::scale(x.p, 3.0f, y.p, 256, native(s)); });
    release.store(true);
    EXPECT_NO_THROW(s.synchronize());
    EXPECT_TRUE(ev->query());
    EXPECT_EQ(y.get()[255], 6.0f);
}

// One error model for launches, copies, records and waits: a poisoned stream still records and waits (events
// complete, nobody waits forever), skips its work, and synchronize() reports the first error.
TEST(CudaDevice, APoisonedStreamStillRecordsAndWaits) {
    RP_REQUIRE_GPU();
    CudaDevice dev(0, small());
    rp::Stream & s = dev.stream(StreamKind::Compute);
    s.launch("bad launch", [&] { rp::cuda::rms_norm_fwd(nullptr, nullptr, nullptr, -1, 1, 0.0f, native(s)); });
    auto before = dev.create_event(), after = dev.create_event();
    dev.stream(StreamKind::WeightUpload).record(*before);
    EXPECT_NO_THROW(s.wait(*before));
    EXPECT_NO_THROW(s.record(*after));
    after->synchronize();
    EXPECT_TRUE(after->query());
    bool ran = false;
    s.launch("skipped", [&] { ran = true; });
    EXPECT_FALSE(ran);
    try {
        s.synchronize();
        ADD_FAILURE() << "the poisoned stream synchronized without its error";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("bad launch"), std::string::npos) << e.what();
    }
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
}



TEST(CudaDevice, PinnedMemoryIsCudaHostMemoryAndRegistrationsAreShared) {
    RP_REQUIRE_GPU();
    auto devs = rp::make_cuda_devices(2, 1 << 20);
    CudaDevice & dev = *devs[0];
    {
        rp::PinnedBuffer a(dev, 1000);
        cudaPointerAttributes attr{};
        ASSERT_EQ(cudaPointerGetAttributes(&attr, a.data()), cudaSuccess);
        EXPECT_EQ(attr.type, cudaMemoryTypeHost);
    }
    std::vector<char> range(1 << 16);
    auto kind = [&] {
        cudaPointerAttributes attr{};
        EXPECT_EQ(cudaPointerGetAttributes(&attr, range.data()), cudaSuccess);
        return attr.type;
    };
    dev.register_host(range.data(), range.size());
    EXPECT_EQ(kind(), cudaMemoryTypeHost);
    devs[1]->register_host(range.data(), range.size());  // the second logical device shares the pinning
    dev.unregister_host(range.data());
    EXPECT_EQ(kind(), cudaMemoryTypeHost);  // still held by cuda:1
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
