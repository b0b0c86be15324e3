#include "tools/simulate_options.h"

#include <cstdio>

namespace rp::cli {

void declare_simulate_options(Options & p, SimulateSettings & s) {
    SimConfig & c = s.sim.config;
    c.devices = 8, c.micro_batches = 16, c.hop_ms = -1;
    p.note("models (per-layer times of roundpipe.md 13.8: RTX 4090, sequence 2048, 4 sequences per micro-batch):\n  " +
           sim_preset_keys());
    p.group("What to simulate");
    p.text("--model", s.model, "one of the models above", "NAME");
    p.flag("--all", s.all, "every model above (with --max-seq: those the paper gives a figure for)");
    p.optional_integer("--layers", s.custom.layers, 1, 1000000, "a custom model: decoder layers, with the four times below");
    p.number("--fwd-ms", s.custom.fwd_ms, 0, 1e9, "custom: forward (= recompute) of one decoder layer per micro-batch, ms (no default:\nrequired with --layers)");
    p.number("--bwd-ms", s.custom.bwd_ms, 0, 1e9, "custom: backward of one decoder layer per micro-batch, ms (no default:\nrequired with --layers)");
    p.number("--head-fwd-ms", s.custom.head_fwd_ms, 0, 1e9, "custom: forward of the postfix (norm, head, loss), ms (no default: required\nwith --layers)");
    p.number("--head-bwd-ms", s.custom.head_bwd_ms, 0, 1e9, "custom: backward of the postfix, ms (no default: required with --layers)");
    p.group("Schedule");
    p.integer("--gpus", c.devices, 1, 1000000, "devices", "G");
    p.integer("--micro-batches", c.micro_batches, 1, 1000000, "micro-batches per iteration (16 as in roundpipe.md 13.8)", "M");
    p.list("--device-speed", s.device_speed,
           "each GPU's speed, its compute time divided by it (e.g. 1,1,1,1,0.6,0.6,0.6,0.6 for four\n"
           "4090s beside four slower cards, or a straggler at 0.25; default: all 1)", "S,...");
    std::string gpus;
    for (const GpuSpeed & g : gpu_speeds()) {
        char line[160];
        std::snprintf(line, sizeof line, "\n  %-6s %-12s %.2f  %s", g.key.c_str(), g.name.c_str(), g.speed, g.source.c_str());
        gpus += line;
    }
    p.text("--devices", s.devices,
           "a mixed machine: named GPUs with counts, e.g. 4090x4,3090x4 (or speeds: 1x4,0.5x4); sets\n"
           "--gpus and the speeds, relative to the RTX 4090 of the presets' times:" + gpus,
           "MIX");
    p.choice("--dispatch", s.dispatch, {"round-robin", "ready", "both"},
             "a job's GPU: the paper's round-robin pointer, the GPU that can start it first (a slower GPU\n"
             "gets fewer jobs), or both side by side (default round-robin)");
    p.integer("--iterations", s.sim.iterations, 0, 1000000,
              "iterations to simulate (default 0: 2 + 8 x the cycle after which the stage -> GPU\n"
              "mapping repeats; the steady period is the mean over the second half)");
    p.toggle("--async", "--sync", c.async_optimizer, "optimizer step overlapping the next iteration (staleness 1) or synchronous (default --async)");
    p.number("--hop-ms", c.hop_ms, -1, 1e9, "activation hand-off device -> host -> device (default: the model's, from 13.8)");
    p.text("--partition", s.sim.partition, "decoder layers per stage \"F0,F1,..|FB,B1,..\" instead of the planner", "P");
    p.flag("--published", s.sim.published, "the roundpipe.md 11.4 partition of the model");
    p.toggle("--balance", "--no-balance", s.sim.balance, "re-spread the planner's greedy split evenly, or keep it (default --balance)");
    p.number("--weight-mb", s.sim.weight_mb, 0, 1e12, "weights uploaded per decoder layer and job, in MB (0: not modelled)");
    p.text("--link", s.link, "host link for weights, e.g. 32GB/s,10us", "L");
    p.number("--optimizer-ms", c.optimizer_ms, 0, 1e9, "CPU optimizer update per step");
    p.number("--copy-back-ms", c.copy_back_ms, 0, 1e9, "master -> working weight copy per step");
    p.number("--tokens-per-mb", s.tokens_per_mb, 1, 1e12, "tokens per micro-batch for throughput", "N");
    p.text("--trace", s.trace, "write the modelled timeline as Chrome trace JSON (one model only)");
    p.group("Max sequence (the memory model of the runtime, roundpipe/call_planner.h, on the real model shape)");
    p.flag("--max-seq", s.max_seq,
           "the longest sequence one device of --device-mem trains: bf16 weights, LoRA\n"
           "--lora-rank on every linear layer, one sequence per micro-batch; with the\n"
           "breakdown at that length and the paper's figure (qwen3-1.7b 73k, llama3.1-8b 49k,\n"
           "qwen3-32b 28k on an RTX 4090); --all: those three");
    p.size("--device-mem", s.mem.device_memory, "memory of one device");
    p.size("--host-mem", s.mem.host_memory,
           "--max-seq: the host RAM the plan must fit too (its host peak: the pinned boundary\n"
           "checkpoints grow with the sequence); 0 = the devices alone decide (default)",
           true);
    p.integer("--lora-rank", s.mem.lora_rank, 1, 1000000, "LoRA rank (--max-seq and the --nodes gradients)");
    p.choice("--vocab-on-host", s.vocab_on_host, {"auto", "on", "off"},
             "--max-seq: the frozen embedding and LM-head matrices in host memory, uploaded row range by\n"
             "row range (auto: when no plan fits without; default auto)");
    p.group("Data parallel (architecture.md 8)");
    p.note("R servers, each this many GPUs, gradients all-reduced between them as each layer is handed off\n"
           "(deep layers first, 8 MiB buckets, reduce-scatter + all-gather on one link per server)");
    p.integer("--nodes", c.nodes, 1, 1000000, "servers; prints per model the efficiency = iteration time on 1 / on R", "R");
    p.text("--node-link", s.node_link, "the inter-server link, e.g. 25Gbit/s,10us or 100Gbit/s,5us", "L");
    p.flag("--full", s.full,
           "all-reduce every weight's fp32 gradient (default: LoRA --lora-rank on every linear\n"
           "layer), from the model's real shapes (the per-layer times stay the presets')");
}

} // namespace rp::cli
