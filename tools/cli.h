// Helpers shared by the command-line programs: reading input files and parsing flag values. Every failure
// throws rp::Error naming the file or the flag, which the tools print as "error: ..." before exiting 1.
#pragma once

#include "base/error.h"
#include "base/read_file.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace rp::cli {

// How OpenMP threads wait at barriers in this process, for the tools' startup line: "GOMP_SPINCOUNT=10000"
// (the tools' default, set by tools/omp_defaults.cpp before libgomp starts) or what the user's environment
// set (OMP_WAIT_POLICY=..., GOMP_SPINCOUNT=...).
std::string omp_wait_setting();

// What each tool's --help says under --threads (Options::threads; tools/options.h indents it).
inline const char * threads_wait_help() {
    return "threads spin 10,000 times at a barrier, then sleep (GOMP_SPINCOUNT=10000: measured best on\n"
           "idle and busy machines); OMP_WAIT_POLICY or GOMP_SPINCOUNT in the environment take precedence";
}

using ::rp::read_file;  // base/read_file.h

inline long long parse_int(const std::string & flag, const std::string & v, long long lo, long long hi) {
    char * end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi)
        throw rp::Error(flag + ": '" + v + "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return x;
}

// A finite float.
inline float parse_float(const std::string & flag, const std::string & v) {
    char * end = nullptr;
    errno = 0;
    const float x = std::strtof(v.c_str(), &end);
    if (v.empty() || *end != '\0' || errno != 0 || !std::isfinite(x)) throw rp::Error(flag + ": '" + v + "' is not a number");
    return x;
}

// A finite double, in [lo, hi] (the same wording as the floats).
inline double parse_double(const std::string & flag, const std::string & v, double lo, double hi) {
    char * end = nullptr;
    errno = 0;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || errno != 0 || !std::isfinite(x)) throw rp::Error(flag + ": '" + v + "' is not a number");
    if (!(x >= lo && x <= hi)) {
        char range[64];
        std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
        throw rp::Error(flag + ": '" + v + "' is not a number in " + range);
    }
    return x;
}

// A float in [lo, hi].
inline float parse_float(const std::string & flag, const std::string & v, float lo, float hi) {
    const float x = parse_float(flag, v);
    if (!(x >= lo && x <= hi)) {
        char range[64];
        std::snprintf(range, sizeof range, "[%g, %g]", static_cast<double>(lo), static_cast<double>(hi));
        throw rp::Error(flag + ": '" + v + "' is not a number in " + range);
    }
    return x;
}

// A byte count: an integer with an optional binary suffix K, M, G, T (also KiB, MiB, ... and KB, MB, ...,
// all powers of 1024, as for memory sizes), e.g. "64M", "1.5G", "4096".
inline size_t parse_size(const std::string & flag, const std::string & v) {
    char * end = nullptr;
    errno = 0;
    const double x = std::strtod(v.c_str(), &end);
    std::string unit(end ? end : "");
    for (char & c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (unit.size() >= 2 && unit.back() == 'B') unit.pop_back();
    if (unit.size() == 2 && unit.back() == 'I') unit.pop_back();
    double mul = 1;
    if (unit == "K") mul = 1024.0;
    else if (unit == "M") mul = 1024.0 * 1024;
    else if (unit == "G") mul = 1024.0 * 1024 * 1024;
    else if (unit == "T") mul = 1024.0 * 1024 * 1024 * 1024;
    else if (!unit.empty() && unit != "B") mul = -1;
    const double bytes = x * mul;
    if (v.empty() || end == v.c_str() || errno != 0 || mul < 0 || !(bytes >= 1) || bytes > 9.0e18)
        throw rp::Error(flag + ": '" + v + "' is not a size (e.g. 4096, 64M, 1.5G)");
    return static_cast<size_t>(bytes);
}

// "a,b,c" -> {"a", "b", "c"}; empty fields are dropped, or with keep_empty kept (for values that must each
// parse: "8M,,4M" names the empty one).
inline std::vector<std::string> split_commas(const std::string & s, bool keep_empty = false) {
    std::vector<std::string> out;
    size_t b = 0;
    while (b <= s.size()) {
        const size_t e = std::min(s.find(',', b), s.size());
        if (e > b || keep_empty) out.push_back(s.substr(b, e - b));
        b = e + 1;
    }
    return out;
}

// Library errors name the library's parameters ("lora_rank 0 must be >= 1"); a tool shows them as its flags.
// Each parameter is replaced where it stands as a whole word (letters, digits and '_' do not continue it).
using FlagNames = std::vector<std::pair<std::string, std::string>>;
inline std::string with_flag_names(std::string msg, const FlagNames & names) {
    auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    for (const auto & [param, flag] : names) {
        for (size_t p = msg.find(param); p != std::string::npos; p = msg.find(param, p)) {
            const size_t e = p + param.size();
            if ((p > 0 && word(msg[p - 1])) || (e < msg.size() && word(msg[e])) || (p > 0 && msg[p - 1] == '-')) {
                p = e;
                continue;
            }
            msg.replace(p, param.size(), flag);
            p += flag.size();
        }
    }
    return msg;
}

} // namespace rp::cli
