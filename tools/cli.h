// Helpers shared by the command-line programs: reading input files and parsing flag values. Every failure
// throws rp::Error naming the file or the flag, which the tools print as "error: ..." before exiting 1.
#pragma once

#include "gguf/error.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace rp::cli {

inline std::string read_file(const std::string & path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) throw rp::Error(path + ": is a directory");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw rp::Error(path + ": cannot open file: " + std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw rp::Error(path + ": read error");
    return ss.str();
}

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

// A float in [lo, hi].
inline float parse_float(const std::string & flag, const std::string & v, float lo, float hi) {
    const float x = parse_float(flag, v);
    if (!(x >= lo && x <= hi))
        throw rp::Error(flag + ": '" + v + "' is not a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
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

} // namespace rp::cli
