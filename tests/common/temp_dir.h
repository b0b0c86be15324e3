// A fresh directory under the system temp folder, removed with its contents at scope exit. Unique per
// process and per instance, so tests that ctest runs in parallel never share files.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace rp_test {

struct TempDir {
    std::filesystem::path path;
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "rp-test-XXXXXX").string();
        if (!mkdtemp(tmpl.data())) std::abort();  // the test machine itself is broken
        path = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir &) = delete;
    TempDir & operator=(const TempDir &) = delete;
    std::string file(const std::string & name) const { return (path / name).string(); }
};

} // namespace rp_test
