#include "models/convert/peft.h"

#include "base/atomic_file.h"
#include "base/error.h"
#include "base/read_file.h"
#include "ggml_rp/core/json.h"
#include "models/arch/hparams.h"
#include "models/arch/lora.h"
#include "models/arch/model.h"
#include "models/convert/hf_names.h"
#include "models/convert/safetensors.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace rp {

namespace {

const char * const kPrefix = "base_model.model.";

// The last part of a module's name: what PEFT's target_modules lists ("q_proj", "gate", "embed_tokens").
std::string short_name(const std::string & module) { return module.substr(module.rfind('.') + 1); }

// "<module>.lora_A.weight" -> module, is_a; also lora_B and the embedding's lora_embedding_A / _B. False for
// anything else (DoRA's lora_magnitude_vector, a module_to_save's weights).
bool split_factor(std::string & name, bool & is_a, bool & embedding) {
    struct Suffix {
        const char * text;
        bool a, embedding;
    };
    for (const Suffix & s : {Suffix{".lora_A.weight", true, false}, Suffix{".lora_B.weight", false, false},
                             Suffix{".lora_embedding_A", true, true}, Suffix{".lora_embedding_B", false, true}}) {
        const size_t n = std::strlen(s.text);
        if (name.size() > n && name.ends_with(s.text)) {
            name.resize(name.size() - n);
            is_a = s.a, embedding = s.embedding;
            return true;
        }
    }
    return false;
}


} // namespace

void export_peft(const LoraAdapter & ad, const Model & model, const std::string & dir, const PeftExportOptions & o) {
    if (!safetensors_dtype_size(o.dtype)) throw Error("PEFT export: dtype " + o.dtype + " is not one of F32, F16, BF16");
    const std::string what = ad.path().empty() ? std::string("the adapter") : ad.path();
    if (ad.tensors().empty()) throw Error(what + ": holds no LoRA pair");
    SafetensorsWriter st;
    st.set_metadata("format", "pt");
    const int64_t rank = ad.tensors().front().rank();
    std::set<std::string> targets;
    for (const LoraTensor & t : ad.tensors()) {
        const std::string module = hf_module_of(model.hparams(), t.base);
        if (module.empty()) throw Error(what + ": tensor '" + t.base + "' has no module in PEFT's layout");
        if (t.rank() != rank)
            throw Error(what + ": tensor '" + t.base + "' has rank " + std::to_string(t.rank()) + ", the first " + std::to_string(rank) +
                        " (PEFT's adapter_config.json holds one r)");
        targets.insert(short_name(module));
        const std::vector<float> a = tensor_get_f32(t.a), b = tensor_get_f32(t.b);
        const std::string key = kPrefix + module;
        if (t.embedding) {  // A ne [r, vocab] is (vocab, r): PEFT's lora_embedding_A is (r, vocab)
            const int64_t vocab = t.a->ne[1];
            std::vector<float> at(a.size());
            for (int64_t v = 0; v < vocab; ++v)
                for (int64_t k = 0; k < rank; ++k) at[static_cast<size_t>(k * vocab + v)] = a[static_cast<size_t>(v * rank + k)];
            st.add_f32(key + ".lora_embedding_A", o.dtype, {rank, vocab}, at.data());
            st.add_f32(key + ".lora_embedding_B", o.dtype, {t.b->ne[1], rank}, b.data());
            continue;
        }
        const int64_t n_in = t.a->ne[0], n_out = t.b->ne[1], experts = t.a->ne[2];
        // gpt-oss and qwen35moe in transformers: the experts are packed parameters (no per-expert modules for PEFT to
        // name), the router a module of its own (no Linear that PEFT's LoRA can wrap).
        const Arch arch = model.hparams().arch->arch;
        if ((arch == Arch::GptOss || arch == Arch::Qwen35Moe) && experts > 1)
            throw Error(what + ": '" + t.base + "': " + model.hparams().arch->name + "'s experts are packed parameters in transformers (no "
                        "per-expert modules for PEFT to name); export an adapter without expert targets");
        if ((arch == Arch::GptOss || arch == Arch::Qwen35Moe) && (module.ends_with(".mlp.router") || module.ends_with(".mlp.gate")))
            throw Error(what + ": '" + t.base + "': " + model.hparams().arch->name + "'s router is no Linear module in transformers (PEFT's "
                        "LoRA cannot wrap it); export an adapter without router targets");
        const int64_t heads = permuted_row_heads(model.hparams(), t.base);
        std::vector<float> bh = heads ? reorder_qk_rows(b.data(), n_out, rank, heads, true) : b;
        // Qwen3.5's value heads in transformers' order: B's output rows, or A's input columns (out_proj).
        const ValueHeads vh = value_heads_of(model.hparams(), t.base);
        const std::vector<float> ah = vh.columns ? reorder_value_heads(a, n_in, vh, model.hparams(), true) : a;
        if (!vh.columns) bh = reorder_value_heads(bh, rank, vh, model.hparams(), true);
        for (int64_t e = 0; e < experts; ++e) {
            const std::string name = kPrefix + hf_expert_module(module, e);
            st.add_f32(name + ".lora_A.weight", o.dtype, {rank, n_in}, ah.data() + e * rank * n_in);
            st.add_f32(name + ".lora_B.weight", o.dtype, {n_out, rank}, bh.data() + e * n_out * rank);
        }
    }
    const float alpha = ad.alpha() != 0.0f ? ad.alpha() : static_cast<float>(rank);
    char alpha_text[32];
    std::snprintf(alpha_text, sizeof alpha_text, "%.9g", static_cast<double>(alpha));
    std::string base_name = o.base_model_name;
    if (base_name.empty()) base_name = model.file().get_string_or("general.name", model.path());
    std::string target_list;
    for (const std::string & t : targets) {
        if (!target_list.empty()) target_list += ", ";
        target_list += json::quoted(t);
    }
    const std::string config = "{\n"
                               "  \"base_model_name_or_path\": " + json::quoted(base_name) + ",\n"
                               "  \"bias\": \"none\",\n"
                               "  \"fan_in_fan_out\": false,\n"
                               "  \"inference_mode\": true,\n"
                               "  \"lora_alpha\": " + alpha_text + ",\n"
                               "  \"lora_dropout\": 0.0,\n"
                               "  \"modules_to_save\": null,\n"
                               "  \"peft_type\": \"LORA\",\n"
                               "  \"r\": " + std::to_string(rank) + ",\n"
                               "  \"target_modules\": [" + target_list + "],\n"
                               "  \"task_type\": \"CAUSAL_LM\",\n"
                               "  \"use_dora\": false,\n"
                               "  \"use_rslora\": false\n"
                               "}\n";
    // Both files complete under temporary names before either is renamed.
    OutputDir out(dir);
    AtomicFile weights(out.file("adapter_model.safetensors")), conf(out.file("adapter_config.json"));
    weights.write(st.bytes());
    conf.write(config);
    weights.commit();
    conf.commit();
    out.commit();
}

void import_peft(const std::string & dir, const Model & model, const std::string & out_path) {
    const std::string cfg_path = dir + "/adapter_config.json";
    const json::Value cfg = json::parse(read_file(cfg_path), cfg_path);
    if (!cfg.is_object()) throw Error(cfg_path + ": not a JSON object");
    auto refuse = [&](const std::string & key, const std::string & why) { throw Error(cfg_path + ": " + key + ": " + why); };
    const json::Value * type = cfg.find("peft_type");
    if (type && (!type->is_string() || type->string != "LORA")) refuse("peft_type", "not LORA (only LoRA adapters are read)");
    const json::Value * r = cfg.find("r");
    const json::Value * alpha_v = cfg.find("lora_alpha");
    if (!r || !r->is_number() || r->number < 1 || r->number != std::floor(r->number) || r->number > (1 << 20)) refuse("r", "expected a rank >= 1");
    if (!alpha_v || !alpha_v->is_number() || !std::isfinite(alpha_v->number)) refuse("lora_alpha", "expected a number");
    const int64_t rank = static_cast<int64_t>(r->number);
    double alpha = alpha_v->number;
    auto is_true = [&](const char * key) {
        const json::Value * v = cfg.find(key);
        return v && v->type == json::Value::Type::Bool && v->boolean;
    };
    auto non_empty = [&](const char * key) {
        const json::Value * v = cfg.find(key);
        return v && ((v->is_object() && !v->object.empty()) || (v->is_array() && !v->array.empty()) || v->is_string());
    };
    if (is_true("use_dora")) refuse("use_dora", "DoRA's magnitude vectors have no place in a GGUF adapter");
    if (is_true("fan_in_fan_out")) refuse("fan_in_fan_out", "transposed (Conv1D) weights are not a model we load");
    if (non_empty("modules_to_save")) refuse("modules_to_save", "whole trained modules have no place in a GGUF adapter");
    if (non_empty("rank_pattern")) refuse("rank_pattern", "a GGUF adapter has one rank per tensor pair, but our import takes one r");
    if (non_empty("alpha_pattern")) refuse("alpha_pattern", "a GGUF adapter holds one alpha");
    if (const json::Value * bias = cfg.find("bias"); bias && (!bias->is_string() || bias->string != "none"))
        refuse("bias", "trained biases have no place in a GGUF adapter (\"none\" only)");
    if (is_true("use_rslora")) alpha *= std::sqrt(static_cast<double>(rank));  // scale alpha / sqrt(r) = (alpha sqrt(r)) / r

    const auto st = SafetensorsReader::open(dir + "/adapter_model.safetensors");
    struct Pair {
        const SafetensorsTensor * a = nullptr;
        const SafetensorsTensor * b = nullptr;
    };
    std::map<std::string, std::map<int64_t, Pair>> pairs;  // GGUF base -> expert (-1) -> its factors
    for (const SafetensorsTensor & t : st->tensors()) {
        const std::string where = st->path() + ": tensor '" + t.name + "'";
        if (t.name.compare(0, std::strlen(kPrefix), kPrefix) != 0) throw Error(where + ": does not start with " + std::string(kPrefix));
        std::string module = t.name.substr(std::strlen(kPrefix));
        bool is_a = false, embedding = false;
        if (!split_factor(module, is_a, embedding))
            throw Error(where + ": not a LoRA factor (lora_A / lora_B / lora_embedding_A / lora_embedding_B)");
        const auto [base, expert] = gguf_weight_of(model.hparams(), module);
        if (base.empty()) throw Error(where + ": module '" + module + "' is not one a GGUF adapter can hold");
        if (!model.find(base)) throw Error(where + ": " + model.path() + " has no " + base + " for module '" + module + "'");
        if (embedding != (base == "token_embd.weight")) throw Error(where + ": embedding factors belong to model.embed_tokens only");
        Pair & p = pairs[base][expert];
        (is_a ? p.a : p.b) = &t;
    }
    if (pairs.empty()) throw Error(st->path() + ": holds no LoRA factor");
    std::vector<std::string> targets;
    for (const auto & [base, experts] : pairs) {
        const Tensor * w = model.find(base);
        const int64_t n_expert = w->ne[2];
        for (const auto & [e, p] : experts) {
            const std::string name = e < 0 ? base : base + " expert " + std::to_string(e);
            if (!p.a || !p.b) throw Error(st->path() + ": " + name + " has lora_" + (p.a ? "A" : "B") + " but no lora_" + (p.a ? "B" : "A"));
            if (e >= n_expert) throw Error(st->path() + ": " + name + ": " + base + " has " + std::to_string(n_expert) + " experts");
        }
        if (n_expert > 1 && static_cast<int64_t>(experts.size()) != n_expert)
            throw Error(st->path() + ": " + base + ": pairs for " + std::to_string(experts.size()) + " of its " + std::to_string(n_expert) +
                        " experts (a GGUF adapter holds every expert's)");
        targets.push_back(base);
    }
    auto ad = LoraAdapter::create(model, targets, rank, static_cast<float>(alpha));
    for (const LoraTensor & t : ad->tensors()) {
        const auto & experts = pairs.at(t.base);
        auto expect = [&](const SafetensorsTensor & f, std::vector<int64_t> shape) {
            if (f.shape != shape) {
                std::string want, got;
                for (int64_t d : shape) {
                    if (!want.empty()) want += ", ";
                    want += std::to_string(d);
                }
                for (int64_t d : f.shape) {
                    if (!got.empty()) got += ", ";
                    got += std::to_string(d);
                }
                throw Error(st->path() + ": tensor '" + f.name + "' has shape (" + got + "), " + t.base + " at r = " + std::to_string(rank) +
                            " needs (" + want + ")");
            }
            return st->to_f32(f);
        };
        if (t.embedding) {
            const Pair & p = experts.at(-1);
            const int64_t vocab = t.a->ne[1];
            const std::vector<float> a = expect(*p.a, {rank, vocab});
            std::vector<float> at(a.size());
            for (int64_t v = 0; v < vocab; ++v)
                for (int64_t k = 0; k < rank; ++k) at[static_cast<size_t>(v * rank + k)] = a[static_cast<size_t>(k * vocab + v)];
            tensor_set_f32(t.a, at);
            tensor_set_f32(t.b, expect(*p.b, {t.b->ne[1], rank}));
            continue;
        }
        const int64_t n_in = t.a->ne[0], n_out = t.b->ne[1], n_expert = t.a->ne[2];
        std::vector<float> a, b;
        for (int64_t e = 0; e < n_expert; ++e) {
            const Pair & p = experts.at(n_expert > 1 ? e : experts.begin()->first);
            const std::vector<float> ae = expect(*p.a, {rank, n_in}), be = expect(*p.b, {n_out, rank});
            a.insert(a.end(), ae.begin(), ae.end());
            b.insert(b.end(), be.begin(), be.end());
        }
        if (const int64_t heads = permuted_row_heads(model.hparams(), t.base)) b = reorder_qk_rows(b.data(), n_out, rank, heads, false);
        const ValueHeads vh = value_heads_of(model.hparams(), t.base);
        if (vh.columns) a = reorder_value_heads(a, n_in, vh, model.hparams(), false);
        else b = reorder_value_heads(b, rank, vh, model.hparams(), false);
        tensor_set_f32(t.a, a);
        tensor_set_f32(t.b, b);
    }
    ad->save(out_path);
}

} // namespace rp
