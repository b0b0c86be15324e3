// A whole file's bytes, or rp::Error naming the file (a directory, a missing or unreadable file).
#pragma once

#include "base/error.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

namespace rp {

inline std::string read_file(const std::string & path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a directory");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open file: " + std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw Error(path + ": read error");
    return ss.str();
}

} // namespace rp
