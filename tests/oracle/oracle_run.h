// Running rp-oracle (llama.cpp as the reference, tests/oracle/program/oracle.cpp) from a GoogleTest program.
// Any test program gets RP_ORACLE_BIN / RP_ORACLE_BINS from tests/oracle/extra.cmake when scripts/fetch-oracle.sh
// has been run before configuring; the environment variables of the same names override them. Start a test that
// needs the oracle with RP_REQUIRE_ORACLE(): it skips when the oracle is missing, but fails in CI (CI=true),
// where the oracle is always fetched. Header-only so that any tests/<area>/ can include "tests/oracle/oracle_run.h".
#pragma once

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace rp::oracle {

// Path of the rp-oracle program, or "" when it is not available.
inline std::string bin() {
    std::string p;
    if (const char * e = std::getenv("RP_ORACLE_BIN"); e && *e) p = e;
#ifdef RP_ORACLE_BIN
    if (p.empty()) p = RP_ORACLE_BIN;
#endif
    std::error_code ec;
    return !p.empty() && std::filesystem::is_regular_file(p, ec) ? p : std::string();
}

inline bool in_ci() {
    const char * ci = std::getenv("CI");
    return ci && (std::string(ci) == "true" || std::string(ci) == "1");
}

// Single-quotes an argument for /bin/sh.
inline std::string quote(const std::string & s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

struct Result {
    int status = -1;  // exit status of rp-oracle (0 = success)
    std::string out;  // its standard output; standard error goes to the test's log
};

// Runs rp-oracle with already-quoted arguments `args`, stdin from `stdin_path` (or /dev/null).
inline Result run(const std::string & args, const std::string & stdin_path = "") {
    std::string cmd = quote(bin()) + " " + args + " < " + quote(stdin_path.empty() ? "/dev/null" : stdin_path);
    Result r;
    std::FILE * p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    int st = pclose(p);
    r.status = (st != -1 && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
    return r;
}

// The lines of `text` that start with `prefix` (e.g. "tokens(", "pos ", "mean CE").
inline std::vector<std::string> lines_starting(const std::string & text, const std::string & prefix) {
    std::vector<std::string> v;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);)
        if (l.rfind(prefix, 0) == 0) v.push_back(l);
    return v;
}

// Writes floats as rp-oracle reads its raw inputs (native f32, no header).
inline void write_f32(const std::string & path, const std::vector<float> & v) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char *>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
}

inline std::vector<float> read_f32(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(f)), {});
    std::vector<float> v(s.size() / sizeof(float));
    if (!v.empty()) std::memcpy(v.data(), s.data(), v.size() * sizeof(float));
    return v;
}

// "1 2 3", the form of rp-oracle's --tokens lists (quote it for the shell).
inline std::string id_list(const std::vector<int32_t> & ids) {
    std::string s;
    for (int32_t id : ids) {
        if (!s.empty()) s += ' ';
        s += std::to_string(id);
    }
    return s;
}

// The whitespace-separated integers of rp-oracle's output (its "generate" and "tokenize" ids).
inline std::vector<int32_t> parse_ids(const std::string & out) {
    std::vector<int32_t> ids;
    std::istringstream in(out);
    for (int32_t id; in >> id;) ids.push_back(id);
    return ids;
}

// llama.cpp's greedy continuation of `prompt` (BOS by the vocab's rule): n_new ids, or fewer when it stops at an
// end-of-generation token. An oracle failure is a test failure and gives an empty list.
inline std::vector<int32_t> greedy_continuation(const std::string & model, const std::string & prompt, int n_new) {
    const Result gen = run("generate " + quote(model) + " --prompt " + quote(prompt) + " -n " + std::to_string(n_new));
    if (gen.status != 0) {
        ADD_FAILURE() << "rp-oracle generate failed on " << model << ": " << gen.out;
        return {};
    }
    return parse_ids(gen.out);
}

}  // namespace rp::oracle

#define RP_REQUIRE_ORACLE()                                                                                   \
    do {                                                                                                      \
        if (::rp::oracle::bin().empty()) {                                                                    \
            if (::rp::oracle::in_ci()) FAIL() << "rp-oracle is not available in CI (scripts/fetch-oracle.sh)"; \
            GTEST_SKIP() << "oracle not available (run scripts/fetch-oracle.sh, then reconfigure)";           \
        }                                                                                                     \
    } while (0)
