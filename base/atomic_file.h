// Writing a file so that nobody ever sees half of it: the bytes go to PATH.tmp, and commit() flushes, syncs
// and renames it to PATH; an AtomicFile destroyed without commit() removes its temporary file. Every output
// of ggml-rp (GGUF files, checkpoints, metrics, plots, traces) is written this way. Errors throw rp::Error
// naming the file.
#pragma once

#include "base/error.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <string_view>

namespace rp {

class AtomicFile {
public:
    // The bytes go to PATH + suffix until commit().
    explicit AtomicFile(std::string path, const char * suffix = ".tmp") : path_(std::move(path)), tmp_(path_ + suffix) {
        f_ = std::fopen(tmp_.c_str(), "wb");
        if (!f_) throw Error(tmp_ + ": cannot create: " + std::strerror(errno));
    }
    ~AtomicFile() {
        if (f_) std::fclose(f_);
        if (!committed_) std::remove(tmp_.c_str());
    }
    AtomicFile(const AtomicFile &) = delete;
    AtomicFile & operator=(const AtomicFile &) = delete;

    const std::string & path() const { return path_; }
    const std::string & temp_path() const { return tmp_; }

    void write(const void * p, size_t n) {
        if (n && std::fwrite(p, 1, n, f_) != n) throw Error(tmp_ + ": write failed: " + std::strerror(errno));
    }
    void write(std::string_view s) { write(s.data(), s.size()); }
    void zeros(size_t n) {
        static const uint8_t z[256] = {};
        while (n) {
            const size_t k = n < sizeof z ? n : sizeof z;
            write(z, k);
            n -= k;
        }
    }
    // n zero bytes without writing them: a hole where the file system has sparse files.
    void hole(size_t n) {
        if (n && ::fseeko(f_, static_cast<off_t>(n), SEEK_CUR) != 0) throw Error(tmp_ + ": seek failed: " + std::strerror(errno));
        holes_ = holes_ || n > 0;
    }
    // Makes what was written so far visible in the temporary file (e.g. a log someone follows).
    void flush() {
        if (std::fflush(f_) != 0) throw Error(tmp_ + ": write failed: " + std::strerror(errno));
    }
    void commit() {
        FILE * f = f_;
        f_ = nullptr;
        // A trailing hole is only a file position: the size must cover it.
        const bool ok = std::fflush(f) == 0 && (!holes_ || ::ftruncate(fileno(f), ::ftello(f)) == 0) && ::fsync(fileno(f)) == 0;
        const int err = errno;
        if (std::fclose(f) != 0 || !ok) throw Error(tmp_ + ": write failed: " + std::strerror(ok ? errno : err));
        kill_point();
        if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
            throw Error(path_ + ": cannot rename " + tmp_ + " into place: " + std::strerror(errno));
        committed_ = true;
    }

private:
    // Fault injection for the kill -9 tests: with RP_TEST_KILL_AT_COMMIT=N the process kills itself (SIGKILL)
    // at its Nth commit, after the temporary file is complete and before the rename — the worst moment.
    static void kill_point() {
        static const long at = [] {
            const char * v = std::getenv("RP_TEST_KILL_AT_COMMIT");
            return v ? std::strtol(v, nullptr, 10) : 0L;
        }();
        static std::atomic<long> commits{0};
        if (at > 0 && ++commits == at) ::raise(SIGKILL);
    }

    std::string path_, tmp_;
    FILE * f_ = nullptr;
    bool committed_ = false;
    bool holes_ = false;
};

// The directory an output of several files goes to, made if missing; when the files are not committed
// (commit() not called), a directory this made is removed again, so a failed write leaves nothing behind.
class OutputDir {
public:
    explicit OutputDir(std::string path) : path_(std::move(path)) {
        std::error_code ec;
        made_ = std::filesystem::create_directories(path_, ec);
        if (ec) throw Error(path_ + ": cannot create the directory: " + ec.message());
    }
    ~OutputDir() {
        std::error_code ec;
        if (made_ && !committed_) std::filesystem::remove(path_, ec);  // only if empty: the files' temporaries are gone by then
    }
    OutputDir(const OutputDir &) = delete;
    OutputDir & operator=(const OutputDir &) = delete;
    std::string file(const std::string & name) const { return path_ + "/" + name; }
    void commit() { committed_ = true; }

private:
    std::string path_;
    bool made_ = false, committed_ = false;
};

// The whole content at once.
inline void write_file_atomically(const std::string & path, std::string_view content) {
    AtomicFile f(path);
    f.write(content);
    f.commit();
}

} // namespace rp
