#include "ggml_rp/optim/optimizer.h"

#include "base/error.h"
#include "ggml_rp/core/fp16.h"

#include <algorithm>
#include <cstring>
#include <map>

namespace rp {

OptimizerKind optimizer_kind_from_name(std::string_view name) {
    if (name == "adamw") return OptimizerKind::AdamW;
    if (name == "sgd") return OptimizerKind::Sgd;
    throw Error("unknown optimizer '" + std::string(name) + "' (expected adamw or sgd)");
}

const char * optimizer_kind_name(OptimizerKind k) { return k == OptimizerKind::AdamW ? "adamw" : "sgd"; }

Optimizer::Optimizer(const OptimizerConfig & cfg) : cfg_(cfg) {
    if (cfg.kind == OptimizerKind::AdamW) {
        validate(cfg.adamw);
    } else {
        validate(cfg.sgd);
    }
}

std::vector<const char *> Optimizer::state_suffixes() const {
    if (cfg_.kind == OptimizerKind::AdamW) return {".adam_m", ".adam_v"};
    if (cfg_.sgd.momentum != 0.0) return {".momentum"};
    return {};
}

size_t Optimizer::add_param(const std::string & name, size_t n) {
    if (name.empty()) throw Error("optimizer: a parameter needs a name");
    for (const Slot & s : slots_) {
        if (s.name == name) throw Error("optimizer: parameter '" + name + "' is registered twice");
    }
    Slot s;
    s.name = name;
    s.n = n;
    const size_t n_arrays = state_suffixes().size();
    if (n_arrays >= 1) (cfg_.bf16_state ? s.a16.assign(n, 0) : s.a.assign(n, 0.0f));
    if (n_arrays >= 2) (cfg_.bf16_state ? s.b16.assign(n, 0) : s.b.assign(n, 0.0f));
    s.updated_at = step_;
    slots_.push_back(std::move(s));
    return slots_.size() - 1;
}

void Optimizer::update(size_t i, std::span<float> param, std::span<const float> grad, double lr) {
    // GradientUse{} only reads the gradient.
    update(i, param, std::span<float>(const_cast<float *>(grad.data()), grad.size()), lr, GradientUse{});
}

void Optimizer::update(size_t i, std::span<float> param, std::span<float> grad, double lr, GradientUse use) {
    Slot & s = slots_.at(i);
    if (param.size() != s.n || grad.size() != s.n) {
        throw Error("optimizer: parameter '" + s.name + "' has " + std::to_string(s.n) + " elements, got " +
                    std::to_string(param.size()) + " (param) and " + std::to_string(grad.size()) + " (grad)");
    }
    const int64_t t = step_ + 1;
    if (s.updated_at == t) {
        throw Error("optimizer: parameter '" + s.name + "' updated twice in step " + std::to_string(t));
    }
    if (!cfg_.bf16_state) {
        if (cfg_.kind == OptimizerKind::AdamW) adamw_update(cfg_.adamw, t, lr, param, grad, s.a, s.b, use);
        else sgd_update(cfg_.sgd, t, lr, param, grad, s.a, use);
    } else {
        // bf16 state: a block at a time read as fp32, updated as the fp32 state is, rounded back (element-wise,
        // so the blocks change nothing).
        constexpr size_t kBlock = 1024;
        float a[kBlock], b[kBlock];
        for (size_t i0 = 0; i0 < s.n; i0 += kBlock) {
            const size_t k = std::min(kBlock, s.n - i0);
            const std::span<float> sa = s.a16.empty() ? std::span<float>() : std::span<float>(a, k);
            const std::span<float> sb = s.b16.empty() ? std::span<float>() : std::span<float>(b, k);
            for (size_t j = 0; j < sa.size(); ++j) sa[j] = bf16_to_fp32(s.a16[i0 + j]);
            for (size_t j = 0; j < sb.size(); ++j) sb[j] = bf16_to_fp32(s.b16[i0 + j]);
            if (cfg_.kind == OptimizerKind::AdamW) adamw_update(cfg_.adamw, t, lr, param.subspan(i0, k), grad.subspan(i0, k), sa, sb, use);
            else sgd_update(cfg_.sgd, t, lr, param.subspan(i0, k), grad.subspan(i0, k), sa, use);
            for (size_t j = 0; j < sa.size(); ++j) s.a16[i0 + j] = fp32_to_bf16(sa[j]);
            for (size_t j = 0; j < sb.size(); ++j) s.b16[i0 + j] = fp32_to_bf16(sb[j]);
        }
    }
    s.updated_at = t;
}

void Optimizer::end_step() {
    const int64_t t = step_ + 1;
    for (const Slot & s : slots_) {
        if (s.updated_at != t) {
            throw Error("optimizer: parameter '" + s.name + "' was not updated in step " + std::to_string(t));
        }
    }
    step_ = t;
}

std::vector<StateArray> Optimizer::state_arrays() const {
    const std::vector<const char *> suffixes = state_suffixes();
    std::vector<StateArray> out;
    out.reserve(slots_.size() * suffixes.size());
    for (const Slot & s : slots_) {
        for (size_t k = 0; k < suffixes.size(); ++k) {
            StateArray a{s.name + suffixes[k], {}, {}};
            if (cfg_.bf16_state) a.bf16 = k == 0 ? std::span<const uint16_t>(s.a16) : std::span<const uint16_t>(s.b16);
            else a.data = k == 0 ? std::span<const float>(s.a) : std::span<const float>(s.b);
            out.push_back(std::move(a));
        }
    }
    return out;
}

void Optimizer::load_state(int64_t step, std::span<const StateArray> arrays) {
    if (step < 0) throw Error("optimizer state: negative step count " + std::to_string(step));
    std::map<std::string, const StateArray *> by_name;
    for (const StateArray & a : arrays) {
        if (!by_name.emplace(a.name, &a).second) throw Error("optimizer state: array '" + a.name + "' appears twice");
    }
    const std::vector<StateArray> mine = state_arrays();
    // Check everything before copying anything.
    for (const StateArray & want : mine) {
        const auto it = by_name.find(want.name);
        if (it == by_name.end()) throw Error("optimizer state: array '" + want.name + "' is missing");
        if (it->second->size() != want.size()) {
            throw Error("optimizer state: array '" + want.name + "' has " + std::to_string(it->second->size()) +
                        " elements, expected " + std::to_string(want.size()));
        }
        if (it->second->bf16.empty() != want.bf16.empty() && want.size() > 0)
            throw Error("optimizer state: array '" + want.name + "' is " + (want.bf16.empty() ? "bf16" : "fp32") + ", this run keeps it in " +
                        (want.bf16.empty() ? "fp32" : "bf16") + " (the optimizer's state type)");
    }
    if (by_name.size() != mine.size()) {
        for (const StateArray & a : arrays) {
            const bool known = std::any_of(mine.begin(), mine.end(), [&](const StateArray & m) { return m.name == a.name; });
            if (!known) {
                throw Error("optimizer state: unexpected array '" + a.name + "' (a different optimizer or parameter set)");
            }
        }
    }
    const std::vector<const char *> suffixes = state_suffixes();
    for (Slot & s : slots_) {
        for (size_t k = 0; k < suffixes.size(); ++k) {
            const StateArray & src = *by_name.at(s.name + suffixes[k]);
            std::vector<float> & dst = k == 0 ? s.a : s.b;
            std::vector<uint16_t> & dst16 = k == 0 ? s.a16 : s.b16;
            if (!dst.empty()) std::memcpy(dst.data(), src.data.data(), dst.size() * sizeof(float));
            if (!dst16.empty()) std::memcpy(dst16.data(), src.bf16.data(), dst16.size() * sizeof(uint16_t));
        }
        s.updated_at = step;
    }
    step_ = step;
}

} // namespace rp
