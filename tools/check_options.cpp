#include "tools/check_options.h"

#include "base/error.h"
#include "models/arch/hparams.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <thread>

namespace rp::cli {

namespace {

std::string default_oracle() {
    if (const char * e = std::getenv("RP_ORACLE_BIN"); e && *e) return e;
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return "";
    const auto p = self.parent_path() / "rp-oracle";
    return std::filesystem::is_regular_file(p, ec) ? p.string() : "";
}

} // namespace

void declare_check_options(Options & p, CheckSettings & s) {
    ModelCheckOptions & c = s.check;
    c.oracle = default_oracle();
    p.text("-m,--model", c.model, "the model (" + supported_architectures() + "; any weight type)");
    p.text("--lora", c.lora, "also check this adapter (applied by both engines; its gradients)");
    p.text("--text", s.text_file, "the text the tokens come from (default: a built-in paragraph)");
    p.flag("--quick", c.quick, "fewer tokens and directions, no whole-file copies (~30 s on a 1B model)");
    p.value("--only", "LIST", "some checks: forward,tokenizer,gradients,pipeline,round-trip (default: all)", Options::String | Options::Array,
            [&c](const std::string & flag, const std::string & v) {
                c.forward = c.tokenizer = c.gradients = c.pipeline = c.round_trip = false;
                for (const std::string & k : split_commas(v)) {
                    if (k == "forward") c.forward = true;
                    else if (k == "tokenizer") c.tokenizer = true;
                    else if (k == "gradients") c.gradients = true;
                    else if (k == "pipeline") c.pipeline = true;
                    else if (k == "round-trip") c.round_trip = true;
                    else throw Error(flag + ": unknown check '" + k + "' (forward, tokenizer, gradients, pipeline, round-trip)");
                }
            },
            [&c]() -> std::optional<std::string> {
                std::vector<std::string> on;
                for (const auto & [name, set] : {std::pair<const char *, bool>{"forward", c.forward}, {"tokenizer", c.tokenizer},
                                                 {"gradients", c.gradients}, {"pipeline", c.pipeline}, {"round-trip", c.round_trip}})
                    if (set) on.push_back(name);
                return on.size() == 5 ? std::nullopt : std::optional(toml_array(on));
            });
    p.flag("--json", s.json, "one JSON object on stdout instead of the table");
    p.text("--oracle", c.oracle, "the rp-oracle program (default: next to rp-check, else $RP_ORACLE_BIN)", "PATH");
    p.threads(c.threads);
}

void CheckSettings::validate() const {
    if (check.model.empty()) throw Error("no model given (-m MODEL.gguf)");
    if (!check.oracle.empty() && !std::filesystem::is_regular_file(check.oracle)) throw Error("--oracle " + check.oracle + ": no such program");
}

void declare_merge_lora_options(Options & p, MergeSettings & s) {
    s.merge.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    p.text("-m,--model", s.base, "base model");
    p.repeated("--lora", "FILE[:SCALE]", "adapter and its user scale (default 1); repeatable",
               [&s](const std::string & flag, const std::string & v) {
                   MergeInput in{v, 1.0f};
                   if (const size_t colon = v.rfind(':'); colon != std::string::npos) {
                       const std::string scale = v.substr(colon + 1);
                       char * end = nullptr;
                       errno = 0;
                       const float x = std::strtof(scale.c_str(), &end);
                       if (scale.empty() || *end != '\0' || errno != 0 || !std::isfinite(x))
                           throw Error(flag + " " + v + ": '" + scale + "' is not a scale");
                       in = {v.substr(0, colon), x};
                   }
                   s.adapters.push_back(in);
               },
               [&s] { s.adapters.clear(); },
               [&s]() -> std::optional<std::string> {
                   std::vector<std::string> items;
                   for (const MergeInput & a : s.adapters) items.push_back(a.path + ":" + toml_float(a.scale, 9));
                   return items.empty() ? std::nullopt : std::optional(toml_array(items));
               });
    p.text("-o,--output", s.out, "merged model");
    p.value("--type", "T",
            "write the merge quantized to T, a mix or a type as llama-quantize names them\n"
            "(q4_k_m, q5_k_m, q6_k, q8_0, f16, ...: rp-gguf convert --help): the file llama-quantize\n"
            "makes from the f32 merge; default: every tensor keeps its base type (a Q4_K_M base\n"
            "gives a Q4_K_M file)",
            Options::String,
            [&s](const std::string & flag, const std::string & v) {
                QuantMix m;
                if (!quant_mix_from_name(v, m)) throw Error(flag + ": '" + v + "' is not one of " + quant_mix_names());
                s.merge.mix = m;
            },
            [] { return std::nullopt; });
    p.threads(s.merge.threads, 1, "threads that re-quantize (default: all cores)");
}

void MergeSettings::validate() const {
    if (base.empty()) throw Error("no base model given (-m BASE.gguf)");
    if (out.empty()) throw Error("no output given (-o OUT.gguf)");
}

} // namespace rp::cli
