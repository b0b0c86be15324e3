// rp-merge-lora: merges LoRA adapters into their base model like llama.cpp's llama-export-lora
// (formats.md §5.5; models/merge_lora.h), keeping the base's tensor types or quantizing to a mix.
//
//   rp-merge-lora -m BASE.gguf --lora A.gguf[:SCALE] [--lora B.gguf[:SCALE] ...] -o OUT.gguf [--type T]
#include "tools/cli.h"

#include "ggml_rp/core/dtype.h"
#include "base/error.h"
#include "models/convert/merge_lora.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <optional>
#include <thread>
#include <string>
#include <vector>

namespace {

void usage(FILE * f) {
    std::fprintf(f,
                 "usage: rp-merge-lora -m BASE.gguf --lora ADAPTER.gguf[:SCALE] [...] -o OUT.gguf [--type T]\n"
                 "  -m, --model FILE         base model\n"
                 "      --lora FILE[:SCALE]  adapter and its user scale (default 1); repeatable\n"
                 "  -o, --output FILE        merged model\n"
                 "      --type T             write the merge quantized to T, a mix or a type as llama-quantize\n"
                 "                           names them (q4_k_m, q5_k_m, q6_k, q8_0, f16, ...: rp-gguf convert\n"
                 "                           --help): the file llama-quantize makes from the f32 merge;\n"
                 "                           default: every tensor keeps its base type (a Q4_K_M base gives a\n"
                 "                           Q4_K_M file)\n"
                 "  -t, --threads N          threads that re-quantize (default: all cores)\n"
                 "  -h, --help               this text\n" RP_THREADS_WAIT_SENTENCE);
}

rp::QuantMix parse_type(const std::string & s) {
    rp::QuantMix m;
    if (!rp::quant_mix_from_name(s, m))
        throw rp::Error("--type: '" + s + "' is not one of " + rp::quant_mix_names());
    return m;
}

} // namespace

int main(int argc, char ** argv) {
    try {
        std::string base, out;
        std::vector<rp::MergeInput> loras;
        rp::MergeOptions opt;
        opt.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            auto value = [&]() -> std::string {
                if (i + 1 >= argc) throw rp::Error("option " + a + " needs a value");
                return argv[++i];
            };
            if (a == "-m" || a == "--model") base = value();
            else if (a == "-o" || a == "--output") out = value();
            else if (a == "--type") opt.mix = parse_type(value());
            else if (a == "-t" || a == "--threads") {
                const std::string v = value();
                char * end = nullptr;
                const long n = std::strtol(v.c_str(), &end, 10);
                if (v.empty() || *end != '\0' || n < 1 || n > 4096) throw rp::Error("--threads: '" + v + "' is not a count in [1, 4096]");
                opt.threads = static_cast<int>(n);
            }
            else if (a == "--lora") {
                const std::string v = value();
                rp::MergeInput in{v, 1.0f};
                const size_t colon = v.rfind(':');
                if (colon != std::string::npos) {
                    const std::string s = v.substr(colon + 1);
                    char * end = nullptr;
                    errno = 0;
                    const float x = std::strtof(s.c_str(), &end);
                    if (s.empty() || *end != '\0' || errno != 0 || !std::isfinite(x))
                        throw rp::Error("--lora " + v + ": '" + s + "' is not a scale");
                    in = {v.substr(0, colon), x};
                }
                loras.push_back(in);
            }
            else if (a == "-h" || a == "--help") { usage(stdout); return 0; }
            else throw rp::Error("unknown option '" + a + "' (see --help)");
        }
        if (base.empty()) throw rp::Error("no base model given (-m BASE.gguf)");
        if (out.empty()) throw rp::Error("no output given (-o OUT.gguf)");
        rp::merge_lora(base, loras, out, opt);
        std::fprintf(stderr, "wrote %s\n", out.c_str());
        return 0;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
