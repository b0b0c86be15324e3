// The --lora FILE [--lora-scale S] arguments of the inference tools (rp-generate, rp-perplexity), loaded
// against the model they apply to.
#pragma once

#include "models/arch/layer.h"
#include "models/arch/lora.h"
#include "models/arch/model.h"
#include "tools/options.h"

#include <memory>
#include <string>
#include <vector>

namespace rp::cli {

struct LoraArg {
    std::string path;
    float scale = 1.0f;
};

// The adapters and the set that applies them; `set()` is null when there are none.
struct LoadedLoras {
    std::vector<std::unique_ptr<LoraAdapter>> adapters;
    LoraSet lora;
    const LoraSet * set() const { return lora.empty() ? nullptr : &lora; }
};

// --lora FILE (repeatable) and --lora-scale S (of the --lora before it).
inline void declare_lora_options(Options & p, std::vector<LoraArg> & loras) {
    p.repeated("--lora", "FILE", "apply a LoRA adapter (repeatable)",
               [&loras](const std::string &, const std::string & v) { loras.push_back({v, 1.0f}); }, [&loras] { loras.clear(); },
               [&loras]() -> std::optional<std::string> {
                   std::vector<std::string> paths;
                   for (const LoraArg & l : loras) paths.push_back(l.path);
                   return paths.empty() ? std::nullopt : std::optional(toml_array(paths));
               });
    p.value("--lora-scale", "S", "user scale of the preceding --lora (default 1)", Options::Int | Options::Float,
            [&loras](const std::string & flag, const std::string & v) {
                if (loras.empty()) throw rp::Error(flag + " must follow a --lora ADAPTER");
                loras.back().scale = parse_float(flag, v, -1e6f, 1e6f);
            },
            [] { return std::nullopt; });
    p.local();
}

inline std::unique_ptr<LoadedLoras> load_loras(const std::vector<LoraArg> & args, const Model & model) {
    auto l = std::make_unique<LoadedLoras>();
    for (const LoraArg & a : args) {
        l->adapters.push_back(LoraAdapter::load(a.path, model));
        l->lora.add(*l->adapters.back(), a.scale);
    }
    return l;
}

} // namespace rp::cli
