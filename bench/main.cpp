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

// ---- Options ------------------------------------------------------------------------------------------

Options::Options(int argc, char ** argv) {
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") { help_ = true; continue; }
        if (a.rfind("--", 0) != 0 || a.size() == 2) throw Error("unexpected argument '" + a + "'");
        Opt o;
        const size_t eq = a.find('=');
        if (eq != std::string::npos) {
            o.name = a.substr(0, eq);
            o.value = a.substr(eq + 1);
            o.has_value = true;
        } else {
            o.name = a;
            // The next word is this option's value unless it is itself an option.
            if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) {
                o.value = argv[++i];
                o.has_value = true;
            }
        }
        opts_.push_back(o);
    }
}

const std::string * Options::value_of(const std::string & name) {
    for (Opt & o : opts_) {
        if (o.name != name) continue;
        if (!o.has_value) throw Error("option " + name + " needs a value");
        o.used = true;
        return &o.value;
    }
    return nullptr;
}

bool Options::flag(const std::string & name) {
    for (Opt & o : opts_) {
        if (o.name != name) continue;
        if (o.has_value) throw Error("option " + name + " takes no value (got '" + o.value + "')");
        o.used = true;
        return true;
    }
    return false;
}

int64_t Options::get_int(const std::string & name, int64_t dflt) {
    const std::string * v = value_of(name);
    if (!v) return dflt;
    char * end = nullptr;
    const long long x = std::strtoll(v->c_str(), &end, 10);
    if (v->empty() || *end != '\0') throw Error("option " + name + ": '" + *v + "' is not an integer");
    return x;
}

double Options::get_double(const std::string & name, double dflt) {
    const std::string * v = value_of(name);
    if (!v) return dflt;
    char * end = nullptr;
    const double x = std::strtod(v->c_str(), &end);
    if (v->empty() || *end != '\0') throw Error("option " + name + ": '" + *v + "' is not a number");
    return x;
}

std::string Options::get_string(const std::string & name, const std::string & dflt) {
    const std::string * v = value_of(name);
    return v ? *v : dflt;
}

void Options::finish() const {
    for (const Opt & o : opts_)
        if (!o.used) throw Error("unknown option " + o.name);
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
