// rp-simulate: predict RoundPipe iteration time, throughput and bubble ratio from modelled per-layer times,
// with the same planner (roundpipe/planner.h) and a timing model of the library's round-robin dispatch
// (roundpipe/schedule_sim.h). For hardware that is not here, e.g. the 8 x RTX 4090 setting of roundpipe.md
// §13.8:
//
//   rp-simulate --model qwen3-1.7b                  planner partition, 8 GPUs, 16 micro-batches
//   rp-simulate --all --published                   every §13.8 model with the §11.4 partitions
//   rp-simulate --layers 32 --fwd-ms 10 --bwd-ms 22 --head-fwd-ms 20 --head-bwd-ms 40 --hop-ms 2
//   rp-simulate --model llama3.1-8b --trace t.json  then: rp-trace t.json -o t.svg
//
// The sequential view is prefix (embedding, time 0) + decoder layers + postfix (norm, head, loss). Times are
// per micro-batch: forward = recompute time, backward = the backward call alone (the planner's tb is their
// sum). Partitions are written in decoder layers per stage, "F0,F1,...|FB,B1,B2,..." with backward stages
// deep -> shallow, as in roundpipe.md §11.4.
#include "tools/cli.h"

#include "base/atomic_file.h"

#include "ggml_rp/roundpipe/planner.h"
#include "ggml_rp/runtime/arena.h"
#include "models/train/run_plan.h"
#include "models/convert/synth_model.h"
#include "ggml_rp/roundpipe/schedule_sim.h"
#include "ggml_rp/roundpipe/trace.h"
#include "base/error.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

const char * const kUsage =
    "usage: rp-simulate (--model NAME | --all | --layers N --fwd-ms X --bwd-ms X --head-fwd-ms X --head-bwd-ms X)\n"
    "                   [options]\n"
    "\n"
    "models (per-layer times of roundpipe.md 13.8: RTX 4090, sequence 2048, 4 sequences per micro-batch):\n"
    "  qwen3-1.7b  llama3.1-8b  gpt-oss-20b  qwen3-32b  qwen3-235b\n"
    "\n"
    "options:\n"
    "  --gpus G               devices (default 8)\n"
    "  --micro-batches M      micro-batches per iteration (default 16, as in roundpipe.md 13.8)\n"
    "  --iterations N         iterations to simulate (default 2 + 8 x the cycle after which the stage -> GPU\n"
    "                         mapping repeats; the steady period is the mean over the second half)\n"
    "  --sync                 synchronous optimizer step (default: async, staleness 1)\n"
    "  --hop-ms X             activation hand-off device -> host -> device (model default from 13.8)\n"
    "  --partition P          decoder layers per stage \"F0,F1,..|FB,B1,..\" instead of the planner\n"
    "  --published            the roundpipe.md 11.4 partition of the model\n"
    "  --no-balance           keep the planner's greedy split (no even re-spread)\n"
    "  --weight-mb X          weights uploaded per decoder layer and job, in MB (default 0: not modelled)\n"
    "  --link L               host link for weights, e.g. 32GB/s,10us (default 32GB/s)\n"
    "  --optimizer-ms X       CPU optimizer update per step (default 0)\n"
    "  --copy-back-ms X       master -> working weight copy per step (default 0)\n"
    "  --tokens-per-mb N      tokens per micro-batch for throughput (default 8192)\n"
    "\n"
    "max sequence (the memory model of the runtime, roundpipe/call_planner.h, on the real model shape):\n"
    "  --max-seq              the longest sequence one device of --device-mem trains: bf16 weights, LoRA\n"
    "                         --lora-rank on every linear layer, one sequence per micro-batch; with the\n"
    "                         breakdown at that length and the paper's figure (qwen3-1.7b 73k, llama3.1-8b 49k,\n"
    "                         qwen3-32b 28k on an RTX 4090); --all: those three\n"
    "  --device-mem SIZE      (default 24G)\n"
    "  --lora-rank N          (default 32)\n"
    "  --trace FILE           write the modelled timeline as Chrome trace JSON (one model only)\n"
    "Data parallel (architecture.md 8): R servers, each this many GPUs, gradients all-reduced between them as each\n"
    "layer is handed off (deep layers first, 8 MiB buckets, reduce-scatter + all-gather on one link per server)\n"
    "  --nodes R              servers (default 1); prints per model the efficiency = iteration time on 1 / on R\n"
    "  --node-link L          the inter-server link, e.g. 25Gbit/s,10us (default) or 100Gbit/s,5us\n"
    "  --full                 all-reduce every weight's fp32 gradient (default: LoRA --lora-rank on every linear\n"
    "                         layer), from the model's real shapes (the per-layer times stay the presets')\n";

struct Preset {
    const char * key;
    const char * name;
    int layers;
    double fwd, bwd, head_fwd, head_bwd, hop;
    const char * published;  // roundpipe.md 11.4
};

// roundpipe.md 13.8 (simulator inputs) and 11.4 (partitions).
const Preset kPresets[] = {
    {"qwen3-1.7b", "Qwen3-1.7B", 28, 7.43, 15.83, 22.07, 43.71, 1.6, "7,7,7,7|0,3,3,3,3,3,3,3,3,2,2"},
    {"llama3.1-8b", "Llama-3.1-8B", 32, 18.50, 41.21, 37.23, 74.50, 3.2, "5,5,5,5,6,6|0,2x16"},
    {"gpt-oss-20b", "GPT-OSS-20B", 24, 21.64, 81.78, 44.29, 86.26, 2.25, "4,5,5,5,5|0,1x24"},
    {"qwen3-32b", "Qwen3-32B", 64, 40.56, 91.17, 54.93, 108.29, 4.0, "2,2,3x20|0,1x64"},
    {"qwen3-235b", "Qwen3-235B-A22B", 94, 43.02, 58.38, 42.44, 43.29, 3.2, "2x47|0,1x94"},
};

[[noreturn]] void die(const std::string & msg) {
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    std::exit(1);
}

double to_double(const std::string & flag, const char * v) {
    char * end = nullptr;
    const double d = std::strtod(v, &end);
    if (end == v || *end != '\0') die(flag + ": '" + v + "' is not a number");
    return d;
}

int to_int(const std::string & flag, const char * v) {
    char * end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 0 || n > 1000000) die(flag + ": '" + v + "' is not a count");
    return static_cast<int>(n);
}

// "3,3,2x4" -> {3,3,2,2,2,2}
std::vector<int> parse_counts(const std::string & text, const std::string & what) {
    std::vector<int> out;
    size_t pos = 0;
    while (pos <= text.size()) {
        size_t comma = text.find(',', pos);
        if (comma == std::string::npos) comma = text.size();
        const std::string item = text.substr(pos, comma - pos);
        const size_t x = item.find('x');
        char * end = nullptr;
        const long n = std::strtol(item.c_str(), &end, 10);
        long rep = 1;
        if (x != std::string::npos) {
            char * end2 = nullptr;
            rep = std::strtol(item.c_str() + x + 1, &end2, 10);
            if (end != item.c_str() + x || *end2 != '\0' || rep < 1) die(what + ": bad item '" + item + "'");
        } else if (item.empty() || *end != '\0') {
            die(what + ": bad item '" + item + "'");
        }
        if (n < 0 || n > 100000 || rep > 100000) die(what + ": item '" + item + "' out of range");
        for (long i = 0; i < rep; ++i) out.push_back(static_cast<int>(n));
        pos = comma + 1;
    }
    return out;
}

// Decoder-layer counts -> a plan over prefix + decoder + postfix layers.
rp::Plan plan_from_decoder_counts(const std::string & text) {
    const size_t bar = text.find('|');
    if (bar == std::string::npos) die("partition '" + text + "': expected \"forward|backward\"");
    std::vector<int> f = parse_counts(text.substr(0, bar), "partition (forward)");
    std::vector<int> b = parse_counts(text.substr(bar + 1), "partition (backward)");
    if (f.empty() || b.size() < 2) die("partition '" + text + "': need forward stages and FB plus backward stages");
    f.front() += 1;  // the prefix rides in F0
    b.front() += 1;  // the postfix is in FB
    b.back() += 1;   // and the prefix in the last backward stage
    return rp::plan_from_sizes(f, b);
}

std::string decoder_counts(const rp::Plan & p) {
    std::string s;
    for (size_t i = 0; i < p.fwd.size(); ++i) {
        const int n = p.fwd[i].size() - (i == 0 ? 1 : 0);
        if (i) s += ',';
        s += std::to_string(n);
    }
    s += "|";
    for (size_t i = 0; i < p.bwd.size(); ++i) {
        const int n = p.bwd[i].size() - (i == 0 ? 1 : 0) - (i + 1 == p.bwd.size() && i > 0 ? 1 : 0);
        if (i) s += ',';
        s += std::to_string(n);
    }
    return s;
}

struct Options {
    int gpus = 8, micro_batches = 16, iterations = 0;  // 0 = 2 + 8 x the mapping cycle
    bool sync = false, published = false, balance = true, all = false;
    double hop = -1, weight_mb = 0, optimizer_ms = 0, copy_back_ms = 0, tokens_per_mb = 8192;
    std::string link = "32GB/s", partition, trace, model;
    int layers = -1;
    double fwd = -1, bwd = -1, head_fwd = -1, head_bwd = -1;
    bool max_seq = false;
    size_t device_mem = size_t(24) << 30;
    int lora_rank = 32;
    int nodes = 1;
    std::string node_link = "25Gbit/s,10us";
    bool full = false;
};

// Gradient bytes per layer of the sequential view (prefix, decoder layers, postfix) from a preset's real
// shapes: fp32 gradients of every weight (full), or of LoRA rank r pairs on every linear layer (experts
// included; embedding and head frozen).
std::vector<double> layer_grad_bytes(const std::string & key, int layers, bool full, int r) {
    const std::string name = key == "qwen3-235b" ? "qwen3-235b-a22b" : key;
    const rp::SynthSpec sp = rp::synth_preset(name);
    if (static_cast<int>(sp.n_layer) != layers) die(key + ": the shapes have " + std::to_string(sp.n_layer) + " layers, the timing preset " + std::to_string(layers));
    const double d = sp.n_embd, q = double(sp.n_head) * sp.head_dim, kv = double(sp.n_head_kv) * sp.head_dim;
    const double experts = sp.n_expert > 0 ? sp.n_expert : 1, ff = sp.n_expert > 0 ? sp.n_ff_exp : sp.n_ff;
    auto pair = [&](double in, double out) { return full ? in * out : r * (in + out); };
    double block = pair(d, q) + 2 * pair(d, kv) + pair(q, d) + experts * (2 * pair(d, ff) + pair(ff, d));
    if (full) block += 2 * d + (sp.arch == "qwen3" || sp.arch == "qwen3moe" ? 2.0 * sp.head_dim : 0.0) + (sp.n_expert > 0 ? d * sp.n_expert : 0.0);
    std::vector<double> g(static_cast<size_t>(layers + 2), 0);
    for (int l = 1; l <= layers; ++l) g[static_cast<size_t>(l)] = 4 * block;
    if (full) {
        g.front() = 4.0 * sp.n_vocab * d;
        g.back() = 4.0 * (d + (sp.tied ? 0.0 : double(sp.n_vocab) * d));
    }
    return g;
}

struct Outcome {
    std::string name, plan_counts, published;
    double T = 0;
    int stages = 0;
    rp::SimResult alone, steady, dp;  // dp: steady with --nodes
    double grad_mb = 0;               // all-reduced per iteration
};

Outcome run_one(const Options & o, const Preset & m) {
    const int L = m.layers + 2;
    std::vector<double> tf(static_cast<size_t>(L)), tb(static_cast<size_t>(L));
    tf.front() = tb.front() = 0;  // prefix: the embedding lookup is negligible
    for (int l = 1; l <= m.layers; ++l) {
        tf[static_cast<size_t>(l)] = m.fwd;
        tb[static_cast<size_t>(l)] = m.fwd + m.bwd;
    }
    tf.back() = m.head_fwd;
    tb.back() = m.head_fwd + m.head_bwd;

    Outcome out;
    out.name = m.name;
    out.published = m.published ? m.published : "";
    rp::Plan plan;
    if (!o.partition.empty() || o.published) {
        const std::string text = !o.partition.empty() ? o.partition : out.published;
        if (text.empty()) die(std::string(m.name) + ": no published partition");
        plan = plan_from_decoder_counts(text);
        if (plan.num_layers() != L) {
            die("partition '" + text + "' covers " + std::to_string(plan.num_layers() - 2) + " decoder layers, the model has " +
                std::to_string(m.layers));
        }
    } else {
        rp::PlannerInput in;
        in.tf = tf;
        in.tb = tb;
        in.min_stages = o.gpus;
        in.balance = o.balance;
        plan = rp::make_plan(in);
        out.T = plan.stage_bound;
    }
    out.plan_counts = decoder_counts(plan);
    out.stages = plan.num_stages();

    rp::SimModel model;
    model.tf_ms = tf;
    model.tb_ms = tb;
    if (o.weight_mb > 0) {
        model.weight_bytes.assign(static_cast<size_t>(L), 0);
        for (int l = 1; l <= m.layers; ++l) model.weight_bytes[static_cast<size_t>(l)] = o.weight_mb * 1e6;
    }
    rp::SimConfig cfg;
    cfg.devices = o.gpus;
    cfg.micro_batches = o.micro_batches;
    cfg.async_optimizer = !o.sync;
    cfg.hop_ms = o.hop >= 0 ? o.hop : m.hop;
    cfg.link = rp::LinkModel::parse(o.link);
    cfg.optimizer_ms = o.optimizer_ms;
    cfg.copy_back_ms = o.copy_back_ms;

    cfg.iterations = 1;
    out.alone = rp::simulate_roundpipe(plan, model, cfg);
    cfg.iterations = o.iterations > 0 ? o.iterations : 2 + 8 * rp::steady_window(plan.num_stages(), o.gpus);
    if (o.nodes > 1) {
        if (!m.key || std::string(m.key) == "custom") die("--nodes needs a named model (its shapes give the gradient bytes)");
        model.grad_bytes = layer_grad_bytes(m.key, m.layers, o.full, o.lora_rank);
        for (double b : model.grad_bytes) out.grad_mb += b / 1e6;
    }
    out.steady = rp::simulate_roundpipe(plan, model, cfg);
    if (o.nodes > 1) {
        rp::SimConfig dp = cfg;
        dp.nodes = o.nodes;
        dp.node_link = rp::LinkModel::parse(o.node_link);
        out.dp = rp::simulate_roundpipe(plan, model, dp);
    }
    return out;
}

// --max-seq: a shapes-only GGUF of the model (every weight a hole: no disk, never read) in a temporary
// directory, planned by the runtime's own memory model.
int max_seq(const Options & o) {
    struct Paper {
        const char * key;
        int64_t tokens;
    };
    const Paper papers[] = {{"qwen3-1.7b", 73000}, {"llama3.1-8b", 49000}, {"qwen3-32b", 28000}};
    std::vector<std::string> names;
    if (o.all) {
        for (const Paper & p : papers) names.push_back(p.key);
    } else if (!o.model.empty()) {
        names.push_back(o.model);
    } else {
        die("--max-seq needs --model NAME or --all");
    }
    const char * tmp_env = std::getenv("TMPDIR");
    const std::string tmpl = std::string(tmp_env && *tmp_env ? tmp_env : "/tmp") + "/rp-simulate-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    const char * dir = ::mkdtemp(buf.data());
    if (!dir) die("cannot create a temporary directory under " + tmpl.substr(0, tmpl.rfind('/')) + " for the model shapes");
    const std::string path = std::string(dir) + "/shapes.gguf";
    {  // the shapes are tens of GB of holes: refuse a file system that would write them out
        rp::AtomicFile probe(path);
        probe.hole(size_t(64) << 20);
        probe.write("x", 1);
        probe.commit();
        struct stat st {};
        const bool sparse = ::stat(path.c_str(), &st) == 0 && static_cast<long long>(st.st_blocks) * 512 < (16LL << 20);
        std::remove(path.c_str());
        if (!sparse) {
            ::rmdir(dir);
            die(std::string(dir) + ": this file system has no sparse files (the model shapes would be written out); set TMPDIR");
        }
    }
    int rc = 0;
    for (const std::string & name : names) {
        try {
            rp::SynthSpec spec = rp::synth_preset(name);
            spec.wtype = gguf::TensorType::BF16;
            spec.weights = false;
            rp::write_synth_model(spec, path);
            auto model = rp::Model::load(path);
            rp::RunPlanOptions po;
            po.finetune.lora_rank = o.lora_rank;
            po.finetune.lora_alpha = 2.0f * static_cast<float>(o.lora_rank);
            po.seq_len = 1;
            po.batch = po.micro_batches = std::max(2, o.micro_batches);  // one sequence per micro-batch
            po.devices = o.gpus;
            po.device_memory = o.device_mem;
            po.backend = "cuda";
            po.max_seq_limit = 1 << 22;
            const rp::RunPlan probe = rp::plan_run(*model, po);
            std::printf("model: %s (%s of bf16 weights, LoRA r=%d on every linear layer, %d micro-batches of 1 sequence, "
                        "%d devices of %s)\n",
                        name.c_str(), rp::format_bytes(probe.host.mapped_weights).c_str(), o.lora_rank, static_cast<int>(po.micro_batches), o.gpus,
                        rp::format_bytes(o.device_mem).c_str());
            std::printf("max seq: %lld\n", static_cast<long long>(probe.max_seq));
            for (const Paper & p : papers)
                if (name == p.key)
                    std::printf("paper: %lld (RoundPipe on an RTX 4090); ours / paper = %.2f\n", static_cast<long long>(p.tokens),
                                static_cast<double>(probe.max_seq) / static_cast<double>(p.tokens));
            if (probe.max_seq > 0) {
                po.seq_len = probe.max_seq;
                po.max_seq_limit = 0;
                std::printf("at seq %lld:\n%s\n", static_cast<long long>(probe.max_seq), rp::plan_run(*model, po).report().c_str());
            }
        } catch (const std::exception & e) {
            std::fprintf(stderr, "error: %s: %s\n", name.c_str(), e.what());
            rc = 1;
        }
        std::remove(path.c_str());
    }
    ::rmdir(dir);
    return rc;
}

} // namespace

int main(int argc, char ** argv) {
    try {
        Options o;
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            auto next = [&]() -> const char * {
                if (i + 1 >= argc) die(a + " needs a value");
                return argv[++i];
            };
            if (a == "-h" || a == "--help") {
                std::fputs(kUsage, stdout);
                return 0;
            } else if (a == "--model") o.model = next();
            else if (a == "--all") o.all = true;
            else if (a == "--gpus") o.gpus = to_int(a, next());
            else if (a == "--micro-batches") o.micro_batches = to_int(a, next());
            else if (a == "--iterations") o.iterations = to_int(a, next());
            else if (a == "--sync") o.sync = true;
            else if (a == "--hop-ms") o.hop = to_double(a, next());
            else if (a == "--partition") o.partition = next();
            else if (a == "--published") o.published = true;
            else if (a == "--no-balance") o.balance = false;
            else if (a == "--weight-mb") o.weight_mb = to_double(a, next());
            else if (a == "--link") o.link = next();
            else if (a == "--optimizer-ms") o.optimizer_ms = to_double(a, next());
            else if (a == "--copy-back-ms") o.copy_back_ms = to_double(a, next());
            else if (a == "--tokens-per-mb") o.tokens_per_mb = to_double(a, next());
            else if (a == "--trace") o.trace = next();
            else if (a == "--layers") o.layers = to_int(a, next());
            else if (a == "--fwd-ms") o.fwd = to_double(a, next());
            else if (a == "--bwd-ms") o.bwd = to_double(a, next());
            else if (a == "--head-fwd-ms") o.head_fwd = to_double(a, next());
            else if (a == "--head-bwd-ms") o.head_bwd = to_double(a, next());
            else if (a == "--max-seq") o.max_seq = true;
            else if (a == "--device-mem") o.device_mem = rp::cli::parse_size(a, next());
            else if (a == "--lora-rank") o.lora_rank = to_int(a, next());
            else if (a == "--nodes") o.nodes = to_int(a, next());
            else if (a == "--node-link") o.node_link = next();
            else if (a == "--full") o.full = true;
            else die("unknown argument '" + a + "' (see --help)");
        }

        if (o.max_seq) return max_seq(o);
        std::vector<Preset> models;
        if (o.all) {
            models.assign(std::begin(kPresets), std::end(kPresets));
        } else if (!o.model.empty()) {
            for (const Preset & p : kPresets) {
                if (o.model == p.key) models.push_back(p);
            }
            if (models.empty()) die("--model: unknown model '" + o.model + "' (see --help)");
        } else if (o.layers > 0) {
            if (o.fwd < 0 || o.bwd < 0 || o.head_fwd < 0 || o.head_bwd < 0) {
                die("a custom model needs --fwd-ms, --bwd-ms, --head-fwd-ms and --head-bwd-ms");
            }
            models.push_back({"custom", "custom", o.layers, o.fwd, o.bwd, o.head_fwd, o.head_bwd,
                              o.hop >= 0 ? o.hop : 0.0, nullptr});
        } else {
            std::fputs(kUsage, stderr);
            return 1;
        }
        if (!o.trace.empty() && models.size() != 1) die("--trace needs exactly one model");
        if (o.gpus < 1 || o.micro_batches < 1) die("--gpus and --micro-batches must be >= 1");

        std::printf("RoundPipe timing model: %d GPUs, %d micro-batches, %s optimizer%s\n", o.gpus,
                    o.micro_batches, o.sync ? "sync" : "async",
                    o.weight_mb > 0 ? (", weights " + std::to_string(o.weight_mb) + " MB/layer over " + o.link).c_str() : "");
        std::printf("%-16s %7s %-44s %10s %8s %10s %8s %10s %8s\n", "model", "stages", "partition (decoder layers)",
                    "alone ms", "bubble", "steady ms", "bubble", "tokens/s", "exposed");
        for (const Preset & m : models) {
            Outcome r = run_one(o, m);
            const double tput = o.tokens_per_mb * o.micro_batches / (r.steady.steady_iteration_ms / 1e3);
            std::string part = r.plan_counts;
            if (part.size() > 44) part = part.substr(0, 41) + "...";
            std::printf("%-16s %7d %-44s %10.1f %7.2f%% %10.1f %7.2f%% %10.0f %7.2f%%\n", r.name.c_str(), r.stages,
                        part.c_str(), r.alone.makespan_ms, 100 * r.alone.bubble_ratio, r.steady.steady_iteration_ms,
                        100 * r.steady.steady_bubble_ratio, tput, 100 * r.steady.exposed_comm_fraction);
            if (o.partition.empty() && !o.published) {
                const bool same = r.published.empty() ? false : plan_from_decoder_counts(r.published) == plan_from_decoder_counts(r.plan_counts);
                std::printf("  planner T = %.2f ms; full partition %s%s\n", r.T, r.plan_counts.c_str(),
                            r.published.empty() ? "" : (same ? "  (= published 11.4)" : ("  (published 11.4: " + r.published + ")").c_str()));
            }
            if (o.nodes > 1) {
                const double eff = r.steady.steady_iteration_ms / r.dp.steady_iteration_ms;
                std::printf("  %d nodes over %s, %s: %.1f MB of gradients per iteration, all-reduce %.1f ms, exposed %.1f ms; "
                            "iteration %.1f -> %.1f ms; efficiency %.1f%%\n", o.nodes, rp::LinkModel::parse(o.node_link).to_string().c_str(),
                            o.full ? "full (fp32 gradients)" : ("LoRA r=" + std::to_string(o.lora_rank)).c_str(), r.grad_mb,
                            r.dp.allreduce_ms_per_iteration, r.dp.exposed_allreduce_ms_per_iteration, r.steady.steady_iteration_ms,
                            r.dp.steady_iteration_ms, 100 * eff);
            }
            if (!o.trace.empty()) {
                const rp::Trace & t = o.nodes > 1 ? r.dp.trace : r.steady.trace;
                rp::write_chrome_trace(o.trace, t);
                std::printf("  trace: %s (%zu operations)\n", o.trace.c_str(), t.events.size());
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
