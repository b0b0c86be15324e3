#include "ggml_rp/runtime/link_model.h"

#include "base/error.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace rp {

namespace {

struct Unit {
    const char * name;
    double factor;
    bool is_rate;
};

// Longest names first so "GiB/s" is not read as "GB/s"-something; case-sensitive on purpose ("Mb" vs "MB"
// ambiguity is refused rather than guessed).
const Unit kUnits[] = {
    {"Gbit/s", 1e9 / 8, true},     {"Mbit/s", 1e6 / 8, true},  // network links are quoted in bits
    {"GiB/s", 1073741824.0, true}, {"MiB/s", 1048576.0, true}, {"KiB/s", 1024.0, true},
    {"GB/s", 1e9, true},           {"MB/s", 1e6, true},        {"KB/s", 1e3, true},  {"kB/s", 1e3, true},
    {"B/s", 1.0, true},            {"ms", 1e-3, false},        {"us", 1e-6, false},  {"ns", 1e-9, false},
    {"s", 1.0, false},
};

std::string trim(const std::string & s) {
    size_t a = 0, b = s.size();
    while (a < b && (s[a] == ' ' || s[a] == '\t')) ++a;
    while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t')) --b;
    return s.substr(a, b - a);
}

} // namespace

LinkModel LinkModel::parse(const std::string & text) {
    LinkModel m;
    bool have_rate = false, have_latency = false;
    size_t pos = 0;
    if (trim(text).empty()) throw Error("link model '" + text + "': empty (expected e.g. \"32GB/s,10us\")");
    while (pos <= text.size()) {
        size_t comma = text.find(',', pos);
        if (comma == std::string::npos) comma = text.size();
        const std::string part = trim(text.substr(pos, comma - pos));
        pos = comma + 1;
        if (part.empty()) throw Error("link model '" + text + "': empty part");

        errno = 0;
        char * end = nullptr;
        const double value = std::strtod(part.c_str(), &end);
        if (end == part.c_str() || errno != 0 || !std::isfinite(value) || value < 0) {
            throw Error("link model '" + text + "': '" + part + "' does not start with a non-negative number");
        }
        const std::string unit = trim(std::string(end));
        const Unit * found = nullptr;
        for (const Unit & u : kUnits) {
            if (unit == u.name) { found = &u; break; }
        }
        if (!found) {
            throw Error("link model '" + text + "': unknown unit '" + unit +
                        "' in '" + part + "' (use B/s, KB/s, MB/s, GB/s, KiB/s, MiB/s, GiB/s, s, ms, us, ns)");
        }
        if (found->is_rate) {
            if (have_rate) throw Error("link model '" + text + "': bandwidth given twice");
            if (value == 0) throw Error("link model '" + text + "': zero bandwidth");
            m.bytes_per_s = value * found->factor;
            have_rate = true;
        } else {
            if (have_latency) throw Error("link model '" + text + "': latency given twice");
            m.latency_s = value * found->factor;
            have_latency = true;
        }
        if (comma == text.size()) break;
    }
    return m;
}

std::string LinkModel::to_string() const {
    char buf[96];
    if (bytes_per_s > 0) {
        std::snprintf(buf, sizeof buf, "%g GB/s, %g us", bytes_per_s / 1e9, latency_s * 1e6);
    } else {
        std::snprintf(buf, sizeof buf, "unlimited bandwidth, %g us", latency_s * 1e6);
    }
    return buf;
}

} // namespace rp
