// Paths and process helpers for the finetune tests.
#pragma once

#include "tests/common/shared_paths.h"
#include <cstdlib>
#include <string>
#include <sys/wait.h>

namespace ft_test {

using rp_test::shared_dir;
inline std::string model_path(const std::string & rel) { return shared_dir() + "/models/" + rel; }
inline std::string stories() { return model_path("stories260K.gguf"); }
inline std::string tool(const std::string & name) { return std::string(RP_BIN_DIR) + "/" + name; }

// Runs a shell command; returns its exit status (or -1), stderr+stdout captured into *out when given.
inline int run(const std::string & cmd, std::string * out = nullptr) {
    std::string full = cmd + " 2>&1";
    FILE * p = popen(full.c_str(), "r");
    if (!p) return -1;
    char buf[4096];
    size_t n;
    std::string s;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) s.append(buf, n);
    const int st = pclose(p);
    if (out) *out = s;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

} // namespace ft_test
