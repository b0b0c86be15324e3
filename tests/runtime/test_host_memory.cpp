// host_memory_available (runtime/host_memory.h): MemAvailable, bounded by a cgroup's limit less its usage when
// there is one ("max" and cgroup v1's page-rounded LONG_MAX are no limit); this machine's figure is readable.
#include "ggml_rp/runtime/host_memory.h"

#include <gtest/gtest.h>

namespace {

const char * kMeminfo = "MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\nBuffers: 1 kB\n";

} // namespace

TEST(HostMemory, MemAvailableBoundedByTheCgroupsLimitLessItsUsage) {
    const rp::HostMemoryAvailable plain = rp::host_memory_available_from(kMeminfo, "", "");
    EXPECT_EQ(plain.bytes, size_t(20000000) * 1024);
    EXPECT_EQ(plain.source, "MemAvailable");
    EXPECT_EQ(rp::host_memory_available_from(kMeminfo, "max\n", "123\n").source, "MemAvailable");  // v2: no limit
    EXPECT_EQ(rp::host_memory_available_from(kMeminfo, "9223372036854771712\n", "5000\n", "memory.limit_in_bytes").source,
              "MemAvailable");  // v1: no limit
    const rp::HostMemoryAvailable limited = rp::host_memory_available_from(kMeminfo, "8589934592\n", "1073741824\n");
    EXPECT_EQ(limited.bytes, size_t(7) << 30);
    EXPECT_EQ(limited.source, "cgroup memory.max (limit 8192 MiB, in use 1024 MiB)");
    // A limit above MemAvailable does not raise it; usage over the limit leaves nothing.
    EXPECT_EQ(rp::host_memory_available_from(kMeminfo, "68719476736\n", "0\n").source, "MemAvailable");
    EXPECT_EQ(rp::host_memory_available_from(kMeminfo, "1000\n", "2000\n").bytes, 0u);
    EXPECT_TRUE(rp::host_memory_available_from("", "", "").source.empty());  // nothing readable
}

TEST(HostMemory, ThisMachinesFigureIsReadable) {
    const rp::HostMemoryAvailable a = rp::host_memory_available();
    EXPECT_FALSE(a.source.empty());
    EXPECT_GT(a.bytes, size_t(64) << 20) << a.source;
}
