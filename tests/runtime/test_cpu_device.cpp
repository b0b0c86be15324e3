// The CPU virtual device: the Device contract (tests/common/device_contract.h: memory limits and errors,
// in-order streams, events within and across devices with CUDA's semantics, host synchronisation, copies,
// sticky job errors, the op hook, clean shutdown, pinned memory, its graph runner), and what only the CPU
// device has: delay injection and the link model (coarse timing: the machine is shared).
#include "ggml_rp/runtime/clock.h"
#include "ggml_rp/runtime/cpu_device.h"
#include "ggml_rp/runtime/link_model.h"
#include "base/error.h"
#include "tests/common/device_contract.h"

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

struct CpuKind {
    static const char * prefix() { return "cpu"; }
    static bool available() { return true; }
    static std::unique_ptr<rp::Device> make(int index, size_t bytes, int streams = 4, rp::OpHook hook = {}) {
        CpuDeviceOptions o = small(bytes);
        o.num_streams = streams;
        o.hook = std::move(hook);
        return std::make_unique<CpuDevice>(index, o);
    }
    // A launch's work runs on the stream's own thread, in stream order.
    static void host_work(rp::Stream & s, rp::OpLabel label, std::function<void()> fn) { s.launch(std::move(label), std::move(fn)); }
};

} // namespace

namespace rp_device_contract {
INSTANTIATE_TYPED_TEST_SUITE_P(Cpu, DeviceContract, ::testing::Types<CpuKind>);
} // namespace rp_device_contract


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

// A device memory the host cannot provide (4 PiB: beyond any x86-64 address space, so refused under every
// overcommit policy) is an rp::Error naming the device and the size, not std::bad_alloc.
TEST(CpuDevice, MemoryTheHostCannotProvideIsANamedError) {
    CpuDeviceOptions o = small(size_t(1) << 52);
    o.name = "cpu:too-big";
    try {
        CpuDevice d(0, o);
        FAIL() << "a 4 PiB device was created";
    } catch (const rp::Error & e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("cpu:too-big"), std::string::npos) << msg;
        EXPECT_NE(msg.find("4194304.00 GiB (4503599627370496 bytes)"), std::string::npos) << msg;
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




