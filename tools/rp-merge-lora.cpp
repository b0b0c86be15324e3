// rp-merge-lora: merges LoRA adapters into their base model like llama.cpp's llama-export-lora
// (formats.md §5.5; models/merge_lora.h), optionally re-quantizing the merged tensors.
//
//   rp-merge-lora -m BASE.gguf --lora A.gguf[:SCALE] [--lora B.gguf[:SCALE] ...] -o OUT.gguf [--type T]
#include "ggml_rp/core/dtype.h"
#include "base/error.h"
#include "models/merge_lora.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace {

void usage(FILE * f) {
    std::fprintf(f,
                 "usage: rp-merge-lora -m BASE.gguf --lora ADAPTER.gguf[:SCALE] [...] -o OUT.gguf [--type T]\n"
                 "  -m, --model FILE         base model\n"
                 "      --lora FILE[:SCALE]  adapter and its user scale (default 1); repeatable\n"
                 "  -o, --output FILE        merged model\n"
                 "      --type T             store the merged tensors as T (f32, f16, bf16, q8_0, q4_0, ...);\n"
                 "                           default: F32 when the base tensor was F32, else F16\n"
                 "  -h, --help               this text\n");
}

std::optional<rp::DType> parse_type(const std::string & s) {
    for (int id = 0; id < 64; ++id) {
        const auto t = static_cast<rp::DType>(id);
        const std::string n = rp::dtype_name(t);
        if (n.rfind("type#", 0) == 0) continue;
        std::string a = n, b = s;
        for (char & c : a) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        for (char & c : b) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (a == b && (rp::dtype_is_float(t) || rp::dtype_is_quantized(t))) return t;
    }
    throw rp::Error("--type: unknown tensor type '" + s + "' (f32, f16, bf16, q8_0, q4_0, ...)");
}

} // namespace

int main(int argc, char ** argv) {
    try {
        std::string base, out;
        std::vector<rp::MergeInput> loras;
        std::optional<rp::DType> type;
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            auto value = [&]() -> std::string {
                if (i + 1 >= argc) throw rp::Error("option " + a + " needs a value");
                return argv[++i];
            };
            if (a == "-m" || a == "--model") base = value();
            else if (a == "-o" || a == "--output") out = value();
            else if (a == "--type") type = parse_type(value());
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
        rp::merge_lora(base, loras, out, type);
        std::fprintf(stderr, "wrote %s\n", out.c_str());
        return 0;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
