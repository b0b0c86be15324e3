// The --lora FILE [--lora-scale S] arguments of the inference tools (rp-generate, rp-perplexity), loaded
// against the model they apply to.
#pragma once

#include "models/arch/lora.h"
#include "models/arch/model.h"

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

inline std::unique_ptr<LoadedLoras> load_loras(const std::vector<LoraArg> & args, const Model & model) {
    auto l = std::make_unique<LoadedLoras>();
    for (const LoraArg & a : args) {
        l->adapters.push_back(LoraAdapter::load(a.path, model));
        l->lora.add(*l->adapters.back(), a.scale);
    }
    return l;
}

} // namespace rp::cli
