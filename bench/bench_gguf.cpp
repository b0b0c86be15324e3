// rp-bench gguf: how fast a quantized GGUF file is written, mapped and dequantized, next to a memcpy of the same
// bytes on the same machine in the same run.
//
// The file (default ~1 GiB) holds 4096-wide Q4_K and Q8_0 matrices, alternating, filled with random valid
// blocks (random quants, sane f16 scales). Dequantization goes row by row into a small per-thread buffer that
// stays in cache, so it measures decoding speed against reading the quantized bytes once; its GB/s count
// quantized bytes read. memcpy copies the same bytes from the mapping into a separate buffer; "read" only
// streams them in (an XOR of every 8 bytes; the best of the hardware prefetchers alone and software prefetches into
// L2 ahead, as the row dots issue them), the limit of work that reads each weight byte once (generation).
#include "bench/bench.h"
#include "ggml_rp/core/fp16.h"
#include "ggml_rp/core/quant.h"
#include "gguf/gguf.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#if defined(_OPENMP)
#include <omp.h>
#define RP_OMP(x) _Pragma(#x)
#else
#define RP_OMP(x)
#endif

namespace {

using gguf::TensorType;
namespace fs = std::filesystem;

constexpr int64_t kCols = 4096;  // ne[0] of every matrix: a multiple of both block sizes

int max_threads() {
#if defined(_OPENMP)
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// Random valid blocks: xorshift bytes everywhere, then each f16 scale field set to a small finite value.
void fill_random(TensorType t, uint8_t * dst, size_t nbytes, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    size_t i = 0;
    for (; i + 8 <= nbytes; i += 8) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        std::memcpy(dst + i, &s, 8);
    }
    for (; i < nbytes; ++i) dst[i] = static_cast<uint8_t>(s >> (8 * (i & 7)));
    const gguf::TypeTraits * tt = gguf::type_traits(static_cast<uint32_t>(t));
    const size_t bs = tt->type_size;
    // Scale fields (formats.md §2.4): Q8_0 d at 0; Q4_K d at 0 and dmin at 2.
    const uint16_t d = rp::fp32_to_fp16(1.0f / 512), dmin = rp::fp32_to_fp16(1.0f / 1024);
    for (size_t b = 0; b + bs <= nbytes; b += bs) {
        std::memcpy(dst + b, &d, 2);
        if (t == TensorType::Q4_K) std::memcpy(dst + b + 2, &dmin, 2);
    }
}

struct Tensor {
    std::string name;
    TensorType type;
    int64_t rows;
};

// Rows are the unit of work: (tensor data, row bytes, type) for every row of every tensor.
struct Row {
    const uint8_t * data;
    TensorType type;
};

double gbps(double bytes, double s) { return s > 0 ? bytes / s / 1e9 : 0; }

void print_line(const char * what, double bytes, const rp::bench::Timing & t, double ref_gbps) {
    const double g = gbps(bytes, t.best_s);
    std::printf("  %-34s %9.4f s  %8.2f GB/s", what, t.best_s, g);
    if (ref_gbps > 0) std::printf("  %6.2fx memcpy", g / ref_gbps);
    std::printf("   (median %.4f s)\n", t.median_s);
}

// Drops the file's pages from the page cache (best effort) so that the next read comes from the disk.
void drop_cache(const std::string & path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
}

int run_gguf(int argc, char ** argv) {
    int64_t size_mb = 1024;
    int reps = 3, threads = max_threads();
    std::string base = fs::temp_directory_path().string();
    bool cold = false, keep = false;
    rp::cli::Options opt("rp-bench gguf",
                         "usage: rp-bench gguf [--size MB] [--reps N] [--threads N] [--dir PATH] [--cold] [--keep]\n"
                         "  Writes a ~MB MiB GGUF file of random Q4_K and Q8_0 matrices in a temporary folder under PATH, then\n"
                         "  times: writing it, opening it and touching every page, and dequantizing all tensors on 1 thread and\n"
                         "  on N OpenMP threads, each next to a memcpy of the same bytes. Best of N repetitions.");
    opt.integer("--size", size_mb, 1, 1 << 30, "the file's size in MiB", "MB");
    opt.integer("--reps", reps, 1, 1 << 20, "repetitions (the best counts)");
    opt.threads(threads, 1, "threads (default: all)");
    opt.text("--dir", base, "where the temporary folder goes (default: the system temp dir)", "PATH");
    opt.flag("--cold", cold, "drop the page cache before each read");
    opt.flag("--keep", keep, "leave the file in place");
    if (!opt.parse(argc, argv)) return 0;

    // ---- plan and write the file ----
    std::string tmpl = (fs::path(base) / "rp-bench-gguf-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw rp::Error("cannot create a temporary folder under " + base);
    const fs::path dir = tmpl;
    struct RemoveDir {  // the temporary folder goes away on every exit path, unless --keep
        fs::path dir;
        bool keep;
        ~RemoveDir() {
            std::error_code ec;
            if (!keep) fs::remove_all(dir, ec);
        }
    } remove_dir{dir, keep};
    const std::string path = (dir / "bench.gguf").string();

    const int64_t target = size_mb << 20;
    std::vector<Tensor> plan;
    int64_t planned = 0;
    for (int i = 0; planned < target; ++i) {
        const TensorType t = i % 2 == 0 ? TensorType::Q4_K : TensorType::Q8_0;
        const int64_t row = static_cast<int64_t>(gguf::row_bytes(t, kCols));
        const int64_t rows = std::min<int64_t>(4096, std::max<int64_t>(1, (target - planned) / row));
        plan.push_back({"blk." + std::to_string(i / 2) + (t == TensorType::Q4_K ? ".q4_k" : ".q8_0"), t, rows});
        planned += rows * row;
    }

    gguf::Writer w;
    w.set_string("general.architecture", "rp-bench");
    w.set_string("general.name", "rp-bench gguf random weights");
    for (size_t i = 0; i < plan.size(); ++i) {
        const int64_t ne[2] = {kCols, plan[i].rows};
        const TensorType t = plan[i].type;
        w.add_tensor(plan[i].name, t, 2, ne, [t, i](uint8_t * dst, size_t n) { fill_random(t, dst, n, i + 1); });
    }
    const double t0 = rp::bench::now_s();
    w.write(path);
    const double write_s = rp::bench::now_s() - t0;

    // ---- read: open (parse + mmap) and touch every page ----
    volatile uint64_t sink = 0;
    rp::bench::Timing read_t = rp::bench::time_it(
        [&] {
            if (cold) drop_cache(path);
            const auto r = gguf::Reader::open(path);
            const uint8_t * p = r->bytes();
            uint64_t s = 0;
            for (uint64_t off = 0; off < r->file_size(); off += 4096) s += p[off];
            sink = sink + s;
        },
        reps, cold ? 0 : 1);

    const auto reader = gguf::Reader::open(path);
    std::vector<Row> rows;
    double bytes_all = 0, bytes_q4k = 0, bytes_q80 = 0;
    for (const gguf::TensorInfo & t : reader->tensors()) {
        const size_t rb = gguf::row_bytes(t.type, t.ne[0]);
        for (int64_t r = 0; r < t.ne[1]; ++r) rows.push_back({reader->tensor_data(t) + r * rb, t.type});
        (t.type == TensorType::Q4_K ? bytes_q4k : bytes_q80) += static_cast<double>(t.nbytes);
        bytes_all += static_cast<double>(t.nbytes);
    }

    std::printf("rp-bench gguf: %s, %.1f MiB of tensor data (%zu tensors, %zu rows of %lld: q4_k %.0f MiB, "
                "q8_0 %.0f MiB), best of %d, %d threads%s\n",
                path.c_str(), bytes_all / (1 << 20), plan.size(), rows.size(), static_cast<long long>(kCols),
                bytes_q4k / (1 << 20), bytes_q80 / (1 << 20), reps, threads, cold ? ", cold reads" : "");

    // ---- memcpy of the same bytes: from the mapping into a separate, pre-faulted buffer ----
    std::vector<uint8_t> copy(static_cast<size_t>(bytes_all));
    const uint8_t * first = reader->tensor_data(reader->tensors().front());
    const size_t span = static_cast<size_t>(bytes_all);  // tensors are contiguous up to alignment padding
    const size_t file_span = static_cast<size_t>(reader->file_size() - reader->data_offset());
    const size_t n_copy = std::min(span, file_span);
    auto memcpy_1 = [&] { std::memcpy(copy.data(), first, n_copy); };
    auto memcpy_n = [&] {
        const int64_t chunks = 4L * threads;
        RP_OMP(omp parallel for num_threads(threads) schedule(static))
        for (int64_t c = 0; c < chunks; ++c) {
            const size_t lo = n_copy * c / chunks, hi = n_copy * (c + 1) / chunks;
            std::memcpy(copy.data() + lo, first + lo, hi - lo);
        }
    };
    const rp::bench::Timing mc1 = rp::bench::time_it(memcpy_1, reps);
    const rp::bench::Timing mcn = rp::bench::time_it(memcpy_n, reps);
    // ---- read only: the same bytes streamed in, 8 at a time, XORed (integer: vectorizes, nothing stored), the best
    // of the hardware prefetchers alone and software prefetches ahead ----
    const rp::bench::Timing rdn = rp::bench::time_read_stream(first, n_copy, threads, reps, sink);

    // ---- dequantize, row by row into a per-thread buffer ----
    auto dequant = [&](int nthreads, int only) {  // only: -1 all types, else a TensorType id
        double chk = 0;
        RP_OMP(omp parallel num_threads(nthreads) reduction(+ : chk))
        {
            std::vector<float> buf(kCols);
            RP_OMP(omp for schedule(static))
            for (int64_t i = 0; i < static_cast<int64_t>(rows.size()); ++i) {
                if (only >= 0 && static_cast<int>(rows[i].type) != only) continue;
                rp::dequantize_row(rows[i].type, rows[i].data, buf.data(), kCols);
                chk += buf[i % kCols];
            }
        }
        sink = sink + static_cast<uint64_t>(chk != 0);
    };
    const int q4k = static_cast<int>(TensorType::Q4_K), q80 = static_cast<int>(TensorType::Q8_0);
    const rp::bench::Timing d1_all = rp::bench::time_it([&] { dequant(1, -1); }, reps);
    const rp::bench::Timing d1_q4k = rp::bench::time_it([&] { dequant(1, q4k); }, reps);
    const rp::bench::Timing d1_q80 = rp::bench::time_it([&] { dequant(1, q80); }, reps);
    const rp::bench::Timing dn_all = rp::bench::time_it([&] { dequant(threads, -1); }, reps);
    const rp::bench::Timing dn_q4k = rp::bench::time_it([&] { dequant(threads, q4k); }, reps);
    const rp::bench::Timing dn_q80 = rp::bench::time_it([&] { dequant(threads, q80); }, reps);

    std::printf("  %-34s %9.4f s  %8.2f GB/s\n", "write (gguf::Writer, incl. fill)", write_s, gbps(bytes_all, write_s));
    print_line(cold ? "read: open + touch pages (cold)" : "read: open + touch pages (cached)",
               static_cast<double>(reader->file_size()), read_t, 0);
    const double m1 = gbps(static_cast<double>(n_copy), mc1.best_s), mn = gbps(static_cast<double>(n_copy), mcn.best_s);
    print_line("memcpy, 1 thread", static_cast<double>(n_copy), mc1, 0);
    print_line("dequantize all, 1 thread", bytes_all, d1_all, m1);
    print_line("  q4_k only, 1 thread", bytes_q4k, d1_q4k, m1);
    print_line("  q8_0 only, 1 thread", bytes_q80, d1_q80, m1);
    char label[64];
    std::snprintf(label, sizeof label, "memcpy, %d threads", threads);
    print_line(label, static_cast<double>(n_copy), mcn, 0);
    std::snprintf(label, sizeof label, "read, %d threads", threads);
    print_line(label, static_cast<double>(n_copy / 8 * 8), rdn, 0);
    std::snprintf(label, sizeof label, "dequantize all, %d threads", threads);
    print_line(label, bytes_all, dn_all, mn);
    std::snprintf(label, sizeof label, "  q4_k only, %d threads", threads);
    print_line(label, bytes_q4k, dn_q4k, mn);
    std::snprintf(label, sizeof label, "  q8_0 only, %d threads", threads);
    print_line(label, bytes_q80, dn_q80, mn);
    std::printf("  (dequantize GB/s count quantized bytes read; output is %.2fx / %.2fx as many f32 bytes for "
                "q4_k / q8_0)\n", 4.0 * 256 / 144, 4.0 * 32 / 34);

    if (keep) std::printf("  kept %s\n", path.c_str());
    return 0;
}

} // namespace

RP_BENCH_FAMILY(gguf, "GGUF write / mmap read / dequantize (Q4_K, Q8_0) speed vs memcpy", run_gguf);
