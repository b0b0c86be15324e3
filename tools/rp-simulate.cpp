// rp-simulate: predict RoundPipe iteration time, throughput and bubble ratio from modelled per-layer times,
// with the same planner (roundpipe/planner.h) and a timing model of the library's round-robin dispatch
// (roundpipe/schedule_sim.h, the paper's settings in roundpipe/sim_presets.h). For hardware that is not here,
// e.g. the 8 x RTX 4090 setting of roundpipe.md §13.8:
//
//   rp-simulate --model qwen3-1.7b                  planner partition, 8 GPUs, 16 micro-batches
//   rp-simulate --all --published                   every §13.8 model with the §11.4 partitions
//   rp-simulate --layers 32 --fwd-ms 10 --bwd-ms 22 --head-fwd-ms 20 --head-bwd-ms 40 --hop-ms 2
//   rp-simulate --model llama3.1-8b --trace t.json  then: rp-trace t.json -o t.svg
//   rp-simulate --max-seq --all                     the longest sequence a 24 GB device trains (check/max_seq.h)
#include "tools/simulate_options.h"

#include "base/error.h"
#include "ggml_rp/roundpipe/trace.h"
#include "ggml_rp/runtime/arena.h"
#include "models/convert/synth_model.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace {

int max_seq(const rp::cli::SimulateSettings & s) {
    std::vector<std::string> names;
    if (s.all) names = rp::paper_max_seq_models();
    else if (!s.model.empty()) names.push_back(s.model);
    else throw rp::Error("--max-seq needs --model NAME or --all");
    rp::MaxSeqOptions o = s.mem;
    o.micro_batches = s.sim.config.micro_batches, o.devices = s.sim.config.devices;
    o.vocab_on_host = s.vocab_on_host == "auto" ? -1 : s.vocab_on_host == "on" ? 1 : 0;
    int rc = 0;
    for (const rp::MaxSeqResult & r : rp::plan_max_seq(names, o)) {
        if (!r.error.empty()) {
            std::fprintf(stderr, "error: %s: %s\n", r.model.c_str(), r.error.c_str());
            rc = 1;
            continue;
        }
        std::printf("model: %s (%s of weights in %s, LoRA r=%d on every linear layer, %d micro-batches of 1 sequence, %d devices of %s)\n",
                    r.model.c_str(), rp::format_bytes(r.weight_bytes).c_str(), r.weight_types.c_str(), o.lora_rank, r.micro_batches, o.devices,
                    rp::format_bytes(o.device_memory).c_str());
        std::printf("max seq: %lld\n", static_cast<long long>(r.max_seq));
        if (o.host_memory > 0)
            std::printf("host RAM %s: %s; the devices alone train %lld tokens\n", rp::format_bytes(o.host_memory).c_str(),
                        r.max_seq < r.device_max_seq ? "it caps the sequence" : "not the limit", static_cast<long long>(r.device_max_seq));
        if (r.paper_max_seq)
            std::printf("paper: %lld (RoundPipe on an RTX 4090); ours / paper = %.2f\n", static_cast<long long>(r.paper_max_seq),
                        static_cast<double>(r.max_seq) / static_cast<double>(r.paper_max_seq));
        if (r.max_seq > 0) std::printf("at seq %lld:\n%s\n", static_cast<long long>(r.max_seq), r.report.c_str());
    }
    return rc;
}

// The models asked for: presets, or the custom one.
std::vector<rp::SimPreset> chosen_models(const rp::cli::SimulateSettings & s) {
    if (s.all) return rp::sim_presets();
    if (!s.model.empty()) {
        const rp::SimPreset * p = rp::find_sim_preset(s.model);
        if (!p) throw rp::Error("--model: unknown model '" + s.model + "' (" + rp::sim_preset_keys() + ")");
        return {*p};
    }
    if (s.custom.layers <= 0) return {};
    if (s.custom.fwd_ms < 0 || s.custom.bwd_ms < 0 || s.custom.head_fwd_ms < 0 || s.custom.head_bwd_ms < 0)
        throw rp::Error("a custom model needs --fwd-ms, --bwd-ms, --head-fwd-ms and --head-bwd-ms");
    rp::SimPreset c = s.custom;
    c.hop_ms = s.sim.config.hop_ms >= 0 ? s.sim.config.hop_ms : 0.0;
    return {c};
}

void print_outcome(const rp::cli::SimulateSettings & s, const rp::SimPreset & m, const rp::PresetSimResult & r) {
    const rp::SimConfig & c = s.sim.config;
    const double tput = s.tokens_per_mb * c.micro_batches / (r.steady.steady_iteration_ms / 1e3);
    std::string part = r.plan_counts;
    if (part.size() > 44) part = part.substr(0, 41) + "...";
    std::printf("%-16s %7d %-44s %10.1f %7.2f%% %10.1f %7.2f%% %10.0f %7.2f%%\n", m.name.c_str(), r.stages, part.c_str(), r.alone.makespan_ms,
                100 * r.alone.bubble_ratio, r.steady.steady_iteration_ms, 100 * r.steady.steady_bubble_ratio, tput,
                100 * r.steady.exposed_comm_fraction);
    if (!c.device_speed.empty() || s.dispatch != "round-robin") {
        std::string jobs;
        for (size_t d = 0; d < r.steady.jobs_per_device.size(); ++d) {
            if (d) jobs += ',';
            jobs += std::to_string(r.steady.jobs_per_device[d]);
        }
        std::printf("  jobs per GPU %s; ideal (no bubble at the GPUs' speeds) %.1f ms: steady / ideal = %.2f%s\n", jobs.c_str(),
                    r.steady.ideal_iteration_ms, r.steady.steady_iteration_ms / r.steady.ideal_iteration_ms,
                    r.steady.sized_iterations > 0 ? "; stages sized by speed" : "");
    }
    if (s.sim.partition.empty() && !s.sim.published) {
        const bool same = !m.published.empty() && rp::plan_from_decoder_counts(m.published) == rp::plan_from_decoder_counts(r.plan_counts);
        std::printf("  planner T = %.2f ms; full partition %s%s\n", r.stage_bound, r.plan_counts.c_str(),
                    m.published.empty() ? "" : (same ? "  (= published 11.4)" : ("  (published 11.4: " + m.published + ")").c_str()));
    }
    if (c.nodes > 1) {
        const double eff = r.steady.steady_iteration_ms / r.dp.steady_iteration_ms;
        std::printf("  %d nodes over %s, %s: %.1f MB of gradients per iteration, all-reduce %.1f ms, exposed %.1f ms; "
                    "iteration %.1f -> %.1f ms; efficiency %.1f%%\n",
                    c.nodes, c.node_link.to_string().c_str(), s.full ? "full (fp32 gradients)" : ("LoRA r=" + std::to_string(s.mem.lora_rank)).c_str(),
                    r.grad_mb, r.dp.allreduce_ms_per_iteration, r.dp.exposed_allreduce_ms_per_iteration, r.steady.steady_iteration_ms,
                    r.dp.steady_iteration_ms, 100 * eff);
    }
    if (!s.trace.empty()) {
        const rp::Trace & t = c.nodes > 1 ? r.dp.trace : r.steady.trace;
        rp::write_chrome_trace(s.trace, t);
        std::printf("  trace: %s (%zu operations)\n", s.trace.c_str(), t.events.size());
    }
}

} // namespace

int main(int argc, char ** argv) {
    try {
        rp::cli::SimulateSettings s;
        rp::cli::Options opts("rp-simulate",
                              "usage: rp-simulate (--model NAME | --all | --layers N --fwd-ms X --bwd-ms X --head-fwd-ms X --head-bwd-ms X)\n"
                              "                   [options]\n");
        rp::cli::declare_simulate_options(opts, s);
        opts.run_files();
        if (!opts.parse(argc, argv)) return 0;
        if (opts.print_config()) {
            std::fputs(opts.run_file().c_str(), stdout);
            return 0;
        }
        if (s.max_seq) return max_seq(s);
        const std::vector<rp::SimPreset> models = chosen_models(s);
        if (models.empty()) {
            std::fputs(opts.help().c_str(), stderr);
            return 1;
        }
        if (!s.trace.empty() && models.size() != 1) throw rp::Error("--trace needs exactly one model");
        rp::SimConfig & c = s.sim.config;
        if (!s.devices.empty()) {
            if (!s.device_speed.empty()) throw rp::Error("--devices and --device-speed both give the GPUs' speeds: give one");
            try {
                c.device_speed = rp::parse_device_mix(s.devices);
            } catch (const rp::Error & e) {
                throw rp::Error(std::string("--devices: ") + e.what());
            }
            c.devices = static_cast<int>(c.device_speed.size());
        }
        if (!s.device_speed.empty() && static_cast<int>(s.device_speed.size()) != c.devices)
            throw rp::Error("--device-speed: " + std::to_string(s.device_speed.size()) + " speeds for --gpus " + std::to_string(c.devices));
        for (const std::string & v : s.device_speed) {
            char * end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            if (v.empty() || *end != '\0' || !(x > 0) || !std::isfinite(x)) throw rp::Error("--device-speed: \"" + v + "\" is not a number > 0");
            c.device_speed.push_back(x);
        }
        c.link = rp::LinkModel::parse(s.link);
        c.node_link = rp::LinkModel::parse(s.node_link);

        std::printf("RoundPipe timing model: %d GPUs, %d micro-batches, %s optimizer%s\n", c.devices, c.micro_batches,
                    c.async_optimizer ? "async" : "sync",
                    s.sim.weight_mb > 0 ? (", weights " + std::to_string(s.sim.weight_mb) + " MB/layer over " + s.link).c_str() : "");
        if (!c.device_speed.empty()) {
            std::printf("GPU speeds (x an RTX 4090's):");
            for (double v : c.device_speed) std::printf(" %.2f", v);
            std::printf("\n");
        }
        std::printf("%-16s %7s %-44s %10s %8s %10s %8s %10s %8s\n", "model", "stages", "partition (decoder layers)", "alone ms", "bubble",
                    "steady ms", "bubble", "tokens/s", "exposed");
        for (const rp::SimPreset & m : models) {
            rp::PresetSimOptions o = s.sim;
            if (c.nodes > 1) {
                if (m.key == "custom") throw rp::Error("--nodes needs a named model (its shapes give the gradient bytes)");
                const rp::SynthSpec shape = rp::synth_preset(m.key == "qwen3-235b" ? "qwen3-235b-a22b" : m.key);
                if (static_cast<int>(shape.n_layer) != m.layers)
                    throw rp::Error(m.key + ": the shapes have " + std::to_string(shape.n_layer) + " layers, the timing preset " +
                                    std::to_string(m.layers));
                o.grad_bytes = rp::synth_grad_bytes(shape, s.full, s.mem.lora_rank);
            }
            if (s.dispatch == "both") {
                rp::SimPreset named = m;
                for (const auto & [mode, tag] : {std::pair{rp::SimDispatch::RoundRobin, " rr"}, std::pair{rp::SimDispatch::Ready, " ready"}}) {
                    o.config.dispatch = mode;
                    named.name = m.name + tag;
                    print_outcome(s, named, rp::simulate_preset(m, o));
                }
            } else {
                o.config.dispatch = s.dispatch == "ready" ? rp::SimDispatch::Ready : rp::SimDispatch::RoundRobin;
                print_outcome(s, m, rp::simulate_preset(m, o));
            }
        }
        std::printf("alone = one iteration by itself (fill and drain exposed); steady = async iterations overlapping,\n"
                    "mean period between iteration ends (second half of the run); bubble = idle compute time / (GPUs x time);\n"
                    "exposed = time a GPU's compute is idle while one of its copy streams is busy (whole run).\n");
        return 0;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
