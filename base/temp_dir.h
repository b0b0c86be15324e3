// A fresh directory under $TMPDIR (else /tmp), removed with everything in it when the object goes.
#pragma once

#include "base/error.h"

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace rp {

class TempDir {
public:
    // `prefix` names the directory: "rp-check" -> /tmp/rp-check-Ab12Cd. Throws rp::Error if it cannot be made.
    explicit TempDir(const std::string & prefix) {
        std::error_code ec;
        const std::filesystem::path base = std::filesystem::temp_directory_path(ec);
        std::string t = ((ec ? std::filesystem::path("/tmp") : base) / (prefix + "-XXXXXX")).string();
        if (!::mkdtemp(t.data())) throw Error("cannot create a temporary directory " + t);
        path_ = t;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir &) = delete;
    TempDir & operator=(const TempDir &) = delete;

    const std::string & path() const { return path_; }
    std::string file(const std::string & name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

} // namespace rp
