// rp-bench <family> [options]: dispatches to the benchmark families registered with RP_BENCH_FAMILY.
#include "bench/bench.h"
#include "base/error.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace rp::bench {

namespace {

std::vector<BenchFamily> & registry() {
    static std::vector<BenchFamily> r;  // function-local: safe from static-initialization order
    return r;
}

} // namespace

void register_family(const BenchFamily & f) { registry().push_back(f); }

std::vector<BenchFamily> families() {
    std::vector<BenchFamily> v = registry();
    std::sort(v.begin(), v.end(), [](const BenchFamily & a, const BenchFamily & b) {
        return std::strcmp(a.name, b.name) < 0;
    });
    return v;
}

} // namespace rp::bench

namespace {

void usage(FILE * f) {
    std::fprintf(f, "usage: rp-bench <family> [options]   (rp-bench <family> --help for its options)\n\nfamilies:\n");
    for (const rp::bench::BenchFamily & fam : rp::bench::families())
        std::fprintf(f, "  %-12s %s\n", fam.name, fam.help);
}

} // namespace

int main(int argc, char ** argv) {
    if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    for (const rp::bench::BenchFamily & fam : rp::bench::families()) {
        if (std::strcmp(fam.name, argv[1]) != 0) continue;
        try {
            return fam.run(argc - 1, argv + 1);
        } catch (const std::exception & e) {
            std::fprintf(stderr, "error: %s\n", e.what());
            return 1;
        }
    }
    std::fprintf(stderr, "error: unknown benchmark family '%s'\n", argv[1]);
    usage(stderr);
    return 1;
}
