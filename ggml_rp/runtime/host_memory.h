// How much host memory this process may still take, as the kernel will enforce it: the system's MemAvailable
// (/proc/meminfo: free pages plus what reclaim can give back) and, inside a cgroup with a memory limit (v2
// memory.max, v1 memory.limit_in_bytes), that limit less the cgroup's usage; the smaller of them. A planned run
// checks its host peak against this before it allocates, instead of meeting the OOM killer mid-run.
#pragma once

#include <cstddef>
#include <string>

namespace rp {

struct HostMemoryAvailable {
    size_t bytes = 0;    // 0 when nothing could be read (not Linux, no /proc)
    std::string source;  // what bounds it: "MemAvailable" or "cgroup memory.max (limit L, usage U)"
};

HostMemoryAvailable host_memory_available();

// The same rule over given files' texts (tests): meminfo is /proc/meminfo's; limit and usage the cgroup's files
// ("max" or empty when there is no limit).
HostMemoryAvailable host_memory_available_from(const std::string & meminfo, const std::string & cgroup_limit,
                                               const std::string & cgroup_usage, const std::string & cgroup_file = "memory.max");

} // namespace rp
