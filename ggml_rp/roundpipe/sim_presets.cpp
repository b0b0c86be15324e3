#include "ggml_rp/roundpipe/sim_presets.h"

#include "base/error.h"
#include "ggml_rp/roundpipe/planner.h"

#include <cstdlib>

namespace rp {

const std::vector<SimPreset> & sim_presets() {
    // roundpipe.md 13.8 (simulator inputs) and 11.4 (partitions). GPT-OSS-120B is not in the paper: its layers
    // compute what GPT-OSS-20B's do per token (hidden 2880, 64 heads, 4 experts of 2880), so they take the
    // 20B's measured times; it has 36 of them and no published partition.
    static const std::vector<SimPreset> presets = {
        {"qwen3-1.7b", "Qwen3-1.7B", 28, 7.43, 15.83, 22.07, 43.71, 1.6, "7,7,7,7|0,3,3,3,3,3,3,3,3,2,2"},
        {"llama3.1-8b", "Llama-3.1-8B", 32, 18.50, 41.21, 37.23, 74.50, 3.2, "5,5,5,5,6,6|0,2x16"},
        {"gpt-oss-20b", "GPT-OSS-20B", 24, 21.64, 81.78, 44.29, 86.26, 2.25, "4,5,5,5,5|0,1x24"},
        {"gpt-oss-120b", "GPT-OSS-120B", 36, 21.64, 81.78, 44.29, 86.26, 2.25, ""},
        {"qwen3-32b", "Qwen3-32B", 64, 40.56, 91.17, 54.93, 108.29, 4.0, "2,2,3x20|0,1x64"},
        {"qwen3-235b", "Qwen3-235B-A22B", 94, 43.02, 58.38, 42.44, 43.29, 3.2, "2x47|0,1x94"},
    };
    return presets;
}

const std::vector<GpuSpeed> & gpu_speeds() {
    // Paper: RoundPipe tokens/s on 8 devices / on 8 x RTX 4090, mean over Qwen3-1.7B, Llama-3.1-8B, Qwen3-32B.
    static const std::vector<GpuSpeed> g = {
        {"4090", "RTX 4090", 1.0, "the presets' device"},
        {"a800", "A800", (84692.0 / 65417 + 28427.0 / 24275 + 6301.0 / 5516) / 3, "paper 13.3 vs 13.2 (RoundPipe, dense models)"},
        {"910b", "Ascend 910B", (50599.0 / 65417 + 23253.0 / 24275 + 5028.0 / 5516) / 3, "paper 13.9"},
        {"w7800", "AMD W7800", (17852.0 / 65417 + 5915.0 / 24275 + 1450.0 / 5516) / 3, "paper 13.9"},
        {"3090", "RTX 3090", 71.0 / 165.2, "peak dense FP16 tensor TFLOPS, FP32 accumulate: 71 vs 165.2 (compute-bound work)"},
    };
    return g;
}

std::vector<double> parse_device_mix(const std::string & mix) {
    std::vector<double> speeds;
    size_t at = 0;
    for (;;) {
        const size_t comma = mix.find(',', at);
        const std::string entry = mix.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        const size_t x = entry.rfind('x');
        const std::string what = x == std::string::npos ? entry : entry.substr(0, x);
        long count = 1;
        if (x != std::string::npos) {
            char * end = nullptr;
            count = std::strtol(entry.c_str() + x + 1, &end, 10);
            if (x + 1 == entry.size() || *end != '\0' || count < 1 || count > 100000)
                throw Error("device mix '" + mix + "': '" + entry + "': the count after x must be a whole number >= 1");
        }
        double speed = 0;
        bool known = false;
        for (const GpuSpeed & g : gpu_speeds())
            if (what == g.key) speed = g.speed, known = true;
        if (!known) {
            char * end = nullptr;
            speed = std::strtod(what.c_str(), &end);
            // (a speed above 100 is a GPU name mistyped, "5090", not a device a hundred times a 4090)
            if (what.empty() || *end != '\0' || !(speed > 0) || !(speed <= 100)) {
                std::string keys;
                for (const GpuSpeed & g : gpu_speeds()) keys += (keys.empty() ? "" : ", ") + g.key;
                throw Error("device mix '" + mix + "': '" + what + "' is neither a GPU (" + keys + ") nor a speed in (0, 100]");
            }
        }
        speeds.insert(speeds.end(), static_cast<size_t>(count), speed);
        if (comma == std::string::npos) break;
        at = comma + 1;
    }
    return speeds;
}

const SimPreset * find_sim_preset(const std::string & key) {
    for (const SimPreset & p : sim_presets())
        if (p.key == key) return &p;
    return nullptr;
}

std::string sim_preset_keys() {
    std::string s;
    for (const SimPreset & p : sim_presets()) s += (s.empty() ? "" : "  ") + p.key;
    return s;
}

PresetSimResult simulate_preset(const SimPreset & m, PresetSimOptions o) {
    const int L = m.layers + 2;
    std::vector<double> tf(static_cast<size_t>(L)), tb(static_cast<size_t>(L));
    tf.front() = tb.front() = 0;  // prefix: the embedding lookup is negligible
    for (int l = 1; l <= m.layers; ++l) {
        tf[static_cast<size_t>(l)] = m.fwd_ms;
        tb[static_cast<size_t>(l)] = m.fwd_ms + m.bwd_ms;
    }
    tf.back() = m.head_fwd_ms;
    tb.back() = m.head_fwd_ms + m.head_bwd_ms;

    PresetSimResult out;
    Plan plan;
    if (!o.partition.empty() || o.published) {
        const std::string text = !o.partition.empty() ? o.partition : m.published;
        if (text.empty()) throw Error(m.name + ": no published partition");
        plan = plan_from_decoder_counts(text);
        if (plan.num_layers() != L)
            throw Error("partition '" + text + "' covers " + std::to_string(plan.num_layers() - 2) + " decoder layers, the model has " +
                        std::to_string(m.layers));
    } else {
        PlannerInput in;
        in.tf = tf;
        in.tb = tb;
        in.min_stages = o.config.devices;
        in.balance = o.balance;
        plan = make_plan(in);
        out.stage_bound = plan.stage_bound;
        o.config.size_by_speed = true;  // as the runtime does with the planner's plan (a pinned one stays)
    }
    out.plan_counts = decoder_counts(plan);
    out.stages = plan.num_stages();

    SimModel model;
    model.tf_ms = tf;
    model.tb_ms = tb;
    if (o.weight_mb > 0) {
        model.weight_bytes.assign(static_cast<size_t>(L), 0);
        for (int l = 1; l <= m.layers; ++l) model.weight_bytes[static_cast<size_t>(l)] = o.weight_mb * 1e6;
    }
    SimConfig cfg = o.config;
    if (cfg.hop_ms < 0) cfg.hop_ms = m.hop_ms;
    const int nodes = cfg.nodes;
    cfg.nodes = 1;
    cfg.iterations = 1;
    out.alone = simulate_roundpipe(plan, model, cfg);
    cfg.iterations = o.iterations > 0 ? o.iterations : 2 + 8 * steady_window(plan.num_stages(), cfg.devices);
    if (nodes > 1) {
        if (o.grad_bytes.size() != static_cast<size_t>(L))
            throw Error(m.name + ": data parallel needs the gradient bytes of its " + std::to_string(L) + " layers");
        model.grad_bytes = o.grad_bytes;
        for (double b : model.grad_bytes) out.grad_mb += b / 1e6;
    }
    out.steady = simulate_roundpipe(plan, model, cfg);
    if (nodes > 1) {
        cfg.nodes = nodes;
        out.dp = simulate_roundpipe(plan, model, cfg);
    }
    return out;
}

} // namespace rp
