#include "ggml_rp/runtime/host_memory.h"

#include <fstream>
#include <iterator>
#include <sstream>

namespace rp {

namespace {

std::string read_text(const std::string & path) {
    std::ifstream f(path);
    return f ? std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()) : std::string();
}

// A non-negative integer at the start of text (after blanks); false for "max", empty or other text.
bool parse_bytes(const std::string & text, size_t & out) {
    std::istringstream in(text);
    unsigned long long v = 0;
    if (!(in >> v)) return false;
    out = static_cast<size_t>(v);
    return true;
}

std::string mib(size_t b) { return std::to_string(b >> 20) + " MiB"; }

} // namespace

HostMemoryAvailable host_memory_available_from(const std::string & meminfo, const std::string & cgroup_limit,
                                               const std::string & cgroup_usage, const std::string & cgroup_file) {
    HostMemoryAvailable r;
    std::istringstream lines(meminfo);
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("MemAvailable:", 0) != 0) continue;
        size_t kib = 0;
        if (parse_bytes(line.substr(13), kib)) r = {kib * 1024, "MemAvailable"};
        break;
    }
    size_t limit = 0, usage = 0;
    // cgroup v1 reports "no limit" as a huge number (a page-rounded LONG_MAX): anything beyond the system's
    // memory is no limit either.
    if (parse_bytes(cgroup_limit, limit) && parse_bytes(cgroup_usage, usage) && limit < (size_t(1) << 60)) {
        const size_t left = usage < limit ? limit - usage : 0;
        if (r.source.empty() || left < r.bytes)
            r = {left, "cgroup " + cgroup_file + " (limit " + mib(limit) + ", in use " + mib(usage) + ")"};
    }
    return r;
}

HostMemoryAvailable host_memory_available() {
    const std::string meminfo = read_text("/proc/meminfo");
    // This process's own group in /proc/self/cgroup: "0::/path" (v2) or "N:memory:/path" (v1); each looked up
    // under the mount and, inside a container's namespace, at the mount's root.
    std::string v2, v1;
    std::istringstream cg(read_text("/proc/self/cgroup"));
    for (std::string line; std::getline(cg, line);) {
        if (line.rfind("0::", 0) == 0) v2 = line.substr(3);
        const size_t at = line.find(":memory:");
        if (at != std::string::npos) v1 = line.substr(at + 8);
    }
    for (const std::string & dir : {"/sys/fs/cgroup" + v2, std::string("/sys/fs/cgroup")}) {
        const std::string limit = read_text(dir + "/memory.max");
        if (!limit.empty()) return host_memory_available_from(meminfo, limit, read_text(dir + "/memory.current"), "memory.max");
    }
    for (const std::string & dir : {"/sys/fs/cgroup/memory" + v1, std::string("/sys/fs/cgroup/memory")}) {
        const std::string limit = read_text(dir + "/memory.limit_in_bytes");
        if (!limit.empty())
            return host_memory_available_from(meminfo, limit, read_text(dir + "/memory.usage_in_bytes"), "memory.limit_in_bytes");
    }
    return host_memory_available_from(meminfo, "", "");
}

} // namespace rp
