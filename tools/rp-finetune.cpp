// rp-finetune: LoRA or full finetuning of a GGUF model, on the host (CPU) or pipelined by the RoundPipe
// runtime over N devices. The run itself is models/session.h; this program parses flags, prints progress
// and writes the files.
//
//   rp-finetune -m BASE.gguf --data FILE -o OUT.gguf [options]     (see --help)
//
// Output: OUT.gguf (a llama.cpp LoRA adapter, or with --full the whole model), OUT.gguf.metrics.jsonl (one
// line per step and per evaluation), OUT.gguf.loss.svg (train and validation loss), and the checkpoint
// OUT.gguf.ckpt.gguf (written every --save-every steps and at the end; --resume continues it bit for bit).
// Every file is written to a temporary name and renamed; on an error nothing is left behind but what earlier
// steps completed.
#include "tools/cli.h"

#include "base/error.h"
#include "ggml_rp/cpu/op_profile.h"
#include "ggml_rp/dist/mpi_world.h"
#include "ggml_rp/runtime/arena.h"
#include "ggml_rp/runtime/clock.h"
#include "ggml_rp/roundpipe/trace.h"
#include "models/train/finetune_report.h"
#include "models/arch/hparams.h"
#include "models/train/run_loop.h"
#include "models/train/run_plan.h"
#include "models/train/session.h"
#include "models/text/tokenizer.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

const char * const kUsage =
    "usage: rp-finetune -m BASE.gguf --data FILE -o OUT.gguf [options]\n"
    "  -m, --model FILE        base model (%s; any weight dtype, frozen for LoRA)\n"
    "      --data FILE         training text (.txt: one token stream) or .jsonl (text / prompt+completion / messages)\n"
    "  -o, --output FILE       the adapter (or with --full the finetuned model)\n"
    "      --full              full finetune: every float tensor trainable (fp32 masters)\n"
    "      --lora-rank N       (default 8)\n"
    "      --lora-alpha A      (default 16)\n"
    "      --lora-targets L    comma-separated (default attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down)\n"
    "      --lora-dropout P    dropout on the LoRA branch input, in [0, 1) (default 0)\n"
    "      --moe-aux-loss C    mixture of experts: add C x the load-balancing loss of every MoE layer (Switch\n"
    "                          Transformer's n_expert * sum f_e P_e, per graph, scaled like the loss) (default 0)\n"
    "      --attention-type T  bf16 | f16 | f32: what CUDA devices round attention inputs to (default bf16: tensor\n"
    "                          cores; the CPU computes attention in f32 whatever it is)\n"
    "      --f32-gemm M        tf32 | f32: how CUDA devices run f32 GEMMs (LoRA products, weight gradients,\n"
    "                          dequantized K-quant weights; default tf32: tensor cores, ~1e-3 relative error)\n"
    "      --seq-len N         tokens per sequence (default 64)\n"
    "      --batch N           sequences per optimizer step (default 8)\n"
    "      --micro-batches M   split each batch in M parts, gradients accumulated (default: one per\n"
    "                          data-parallel rank, 1 in a single process)\n"
    "      --optimizer NAME    adamw | sgd (default adamw)\n"
    "      --lr X              peak learning rate (default 1e-3)\n"
    "      --lr-min X          final learning rate of linear/cosine decay (default 0)\n"
    "      --lr-schedule NAME  cosine | linear | constant (default cosine)\n"
    "      --warmup N          linear warmup steps (default 0)\n"
    "      --weight-decay X    decoupled weight decay (default 0)\n"
    "      --momentum X        SGD momentum (default 0)\n"
    "      --epochs N          passes over the training data (default 1)\n"
    "      --steps N           optimizer steps (overrides --epochs)\n"
    "      --stop-at N         stop after step N (checkpoint written), keeping the schedule of --steps\n"
    "      --clip X            global gradient-norm clipping, 0 = off (default 1)\n"
    "      --seed N            data order, split and LoRA init (default 42)\n"
    "  -t, --threads N         CPU threads (default: all)\n" RP_THREADS_WAIT_HELP
    "      --activation-memory SIZE  host training (no --devices): keep the layers' activations from the forward\n"
    "                          to the backward while they take at most SIZE (no recompute: a third less forward\n"
    "                          work, the same gradients); the other layers are recomputed. 0 = always recompute\n"
    "                          (default 2G; --plan shows what it keeps)\n"
    "      --profile-ops       at the end, the wall time of every op kind over the training steps (CPU kernels)\n"
    "      --save-every N      write the checkpoint OUT.ckpt.gguf every N steps (it is also written at the end)\n"
    "      --resume FILE       continue from a checkpoint, or start from an adapter's weights\n"
    "      --eval-every N      validation loss every N steps (and at the end) when --val-split > 0\n"
    "      --val-split F       fraction of the sequences held out for validation (default 0)\n"
    "      --early-stop N      stop after N evaluations in a row without a better validation loss\n"
    "      --save-best         keep the result of the best evaluation in OUT.best.gguf (rewritten when beaten)\n"
    "      --sample-every N    every N steps (and at the end) print a greedy completion of each --sample-prompt\n"
    "                          with the current weights (KV-cache generation), also logged to the metrics JSONL\n"
    "      --sample-prompt P   a prompt (repeatable), or a file of prompts, one per line\n"
    "      --sample-tokens N   tokens per completion (default 32)\n"
    "      --dump-grads FILE   the accumulated gradients of the first step, before clipping (GGUF)\n"
    "      --max-bad-steps K   a step with a non-finite loss or gradient norm is not applied; K in a row stop\n"
    "                          the run (exit 1, the last checkpoint kept, no output written) (default 3)\n"
    "      --allow-binary      train on data with NUL bytes or invalid UTF-8 (refused otherwise)\n"
    "      --chat-template T   chat template for \"messages\" lines: a FILE.jinja, or chatml / llama3\n"
    "                          (default: the model's tokenizer.chat_template)\n"
    "      --train-on-inputs   \"messages\" lines: train on every token, not only the assistant replies\n"
    "      --pack | --no-pack  JSONL: several examples per sequence, each attending only to itself (positions\n"
    "                          restart per example; no padding between them) or one padded sequence each\n"
    "                          (default --pack for JSONL; plain text is one token stream either way)\n"
    "Ctrl-C (SIGINT) or SIGTERM: the current step finishes, the checkpoint is written, exit 130; a second one\n"
    "exits at once (the last checkpoint stays valid). The metrics log records each step's RSS.\n"
    "RoundPipe (roundpipe.md): the model stays in host memory, layers stream to the devices round-robin\n"
    "      --devices N         train through the RoundPipe runtime on N devices (default 0: host)\n"
    "      --backend NAME      cpu | cuda: CPU virtual devices, or logical CUDA devices over the visible GPUs (default cpu)\n"
    "      --device-mem SIZE   memory of each device, e.g. 64M (default 256M)\n"
    "      --link BW,LAT       host<->device link model of the CPU devices, e.g. 32GB/s,10us (default: memcpy speed)\n"
    "      --schedule NAME     roundpipe | gpipe | 1f1b (default roundpipe; the baselines bind stages to devices)\n"
    "      --sync | --async    optimizer step synchronous, or overlapped with the next step (staleness 1; default sync)\n"
    "      --recompute GRAIN   stage | layer: what a backward job recomputes from (default stage)\n"
    "      --resident-weights on|off  keep the frozen weights (LoRA's base) on every device when the plan fits\n"
    "                          them: each job then uploads only its trainable tensors (default on)\n"
    "      --trace FILE        Chrome trace of every stream operation (draw it with rp-trace)\n"
    "      --token-chunk N|auto  tokens per feed-forward / LM-head graph, so no [tokens x n_ff] or [tokens x vocab]\n"
    "                          tensor is whole (the backward then recomputes attention once more); 0 = off;\n"
    "                          auto (with --devices, the default): the fastest that fits --device-mem\n"
    "      --plan              print the memory plan and exit (needs only -m; the weights are never read):\n"
    "                          the stage partition, the device peak region by region, host RAM, link bytes\n"
    "      --max-seq           with --plan: also the longest --seq-len that fits --device-mem\n"
    "Data parallel over MPI (architecture.md 8): mpirun -np R rp-finetune ... trains on R processes (each with its\n"
    "own --devices), rank r taking micro-batches r, r+R, ... of every step; gradients are summed in rank order\n"
    "(bit-identical on every rank and run) and every rank applies the same update. Rank 0 prints and writes.\n"
    "      --dp                require an mpirun launch (otherwise it is detected)\n"
    "      --dp-timeout S      a peer silent for S seconds (dead or hung) is an error on every rank (default 300)\n"
    "      --dp-check-every N  compare every rank's masters and optimizer state every N steps (default 100; also\n"
    "                          at the end)\n"
    "      --dp-link BW,LAT    emulate an inter-node link on one machine, e.g. 25Gbit/s,10us (benchmarks)\n"
    "      --dp-groups G       one process: sum the gradients in G groups as G ranks would (the bit-exact\n"
    "                          reference of a G-rank run, host path)\n"
    "Testing the failure paths (CPU devices):\n"
    "      --inject-delays SEED  random delays in every stream and runtime thread\n"
    "      --inject-fault K:N  the Nth allocation / copy / launch of device 0 fails (K = alloc, copy, launch)\n"
    "      --inject-dp-fault K:R:N  at the start of step N rank R (or 'all') K = die (SIGKILL), hang, or corrupt\n"
    "                          (flips a bit of its first master: the replica check must catch it)\n"
    "  -h, --help              this text\n";

// The library's parameter names as this tool's flags, for its error messages.
const rp::cli::FlagNames kFlagNames = {
    {"lora_rank", "--lora-rank"}, {"lora_alpha", "--lora-alpha"}, {"lora_targets", "--lora-targets"},
    {"lora_dropout", "--lora-dropout"}, {"moe_aux_loss", "--moe-aux-loss"}, {"seq_len", "--seq-len"}, {"micro_batches", "--micro-batches"},
    {"batch_size", "--batch"}, {"val_split", "--val-split"}, {"lr_max", "--lr"}, {"lr_min", "--lr-min"},
    {"warmup_steps", "--warmup"}, {"weight_decay", "--weight-decay"}, {"pipeline schedule", "--schedule"},
    {"allow_binary", "--allow-binary"}, {"max_bad_steps", "--max-bad-steps"}, {"timeout_s", "--dp-timeout"},
    {"accumulate_groups", "--dp-groups"}, {"replica_check_every", "--dp-check-every"}, {"sample_every", "--sample-every"},
    {"sample_prompt", "--sample-prompt"}, {"early_stop", "--early-stop"}, {"save_best", "--save-best"}, {"eval_every", "--eval-every"}};

// SIGINT / SIGTERM: the first asks the loop to stop after the step (SA_RESETHAND: a second one kills).
volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_interrupt(int sig) { g_interrupted = sig; }

void catch_interrupts() {
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

size_t current_rss_bytes() {
    long pages = 0, resident = 0;
    if (FILE * f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        std::fclose(f);
    }
    return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

double peak_rss_mib() {
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

} // namespace

// --inject-dp-fault
struct DpFault {
    std::string kind;  // "" = none
    int rank = -1;     // -1 = every rank
    int64_t step = 0;
};

static int finetune(int argc, char ** argv, rp::Communicator * world) {
    {
        namespace cli = rp::cli;
        const int rank = world ? world->rank() : 0, ranks = world ? world->size() : 1;
        const bool lead = rank == 0;  // prints and writes; the other ranks only compute
        FILE * info = lead ? stderr : nullptr;
        auto say = [&](const char * fmt, auto... xs) {
            if (info) std::fprintf(info, fmt, xs...);
        };
        bool dp_required = false;
        double dp_timeout = 300;
        int64_t dp_check_every = 100;
        std::string dp_link;
        DpFault dp_fault;
        std::string model_path, data_path, out_path, resume, trace_path, link, schedule = "roundpipe";
        rp::SessionOptions o;
        o.lr.lr_max = 1e-3;
        int64_t seq_len = 64, stop_at = 0, save_every = 0, eval_every = 0, early_stop = 0;
        bool save_best = false;
        bool plan_only = false, max_seq = false, allow_binary = false, profile_ops = false;
        std::string chat_template;     // --chat-template
        bool train_on_inputs = false;  // --train-on-inputs
        int pack = -1;  // -1: on for JSONL
        int64_t sample_every = 0, sample_tokens = 32;
        std::vector<std::string> sample_prompts;
        int64_t token_chunk = -2;  // -2: not given
        float lr = 1e-3f, lr_min = 0.0f;
        cli::Args args(argc, argv);
        while (args.next()) {
            const std::string & a = args.flag();
            if (a == "-h" || a == "--help") { std::printf(kUsage, rp::supported_architectures().c_str()); return 0; }
            else if (a == "-m" || a == "--model") model_path = args.value();
            else if (a == "--data") data_path = args.value();
            else if (a == "-o" || a == "--output") out_path = args.value();
            else if (a == "--full") o.finetune.full = true;
            else if (a == "--lora-rank") o.finetune.lora_rank = args.integer(1, 1 << 20);
            else if (a == "--lora-alpha") o.finetune.lora_alpha = args.number();
            else if (a == "--lora-targets") o.finetune.lora_targets = cli::split_commas(args.value());
            else if (a == "--lora-dropout") o.finetune.lora_dropout = args.number(0.0f, 0.999999f);
            else if (a == "--moe-aux-loss") o.finetune.moe_aux_loss = args.number(0.0f, 1e6f);
            else if (a == "--f32-gemm") o.devices.tf32_gemm = args.choice({"tf32", "f32"}) == "tf32";
            else if (a == "--attention-type") {
                const std::string t = args.choice({"bf16", "f16", "f32"});
                o.finetune.attention_type = t == "bf16" ? rp::DType::BF16 : t == "f16" ? rp::DType::F16 : rp::DType::F32;
            }
            else if (a == "--seq-len") seq_len = args.integer(1, 1 << 30);
            else if (a == "--batch") o.batch = args.integer(1, 1 << 20);
            else if (a == "--micro-batches") o.micro_batches = args.integer(1, 1 << 20);
            else if (a == "--optimizer") o.optimizer.kind = rp::optimizer_kind_from_name(args.value());
            else if (a == "--lr") lr = args.number();
            else if (a == "--lr-min") lr_min = args.number();
            else if (a == "--lr-schedule") o.lr.decay = rp::lr_decay_from_name(args.value());
            else if (a == "--warmup") o.lr.warmup_steps = args.integer(0, 1LL << 40);
            else if (a == "--weight-decay") o.optimizer.adamw.weight_decay = o.optimizer.sgd.weight_decay = args.number();
            else if (a == "--momentum") o.optimizer.sgd.momentum = args.number();
            else if (a == "--epochs") o.epochs = args.integer(1, 1 << 20);
            else if (a == "--steps") o.steps = args.integer(1, 1LL << 40);
            else if (a == "--stop-at") stop_at = args.integer(1, 1LL << 40);
            else if (a == "--clip") o.clip = args.number(0.0f, 1e30f);
            else if (a == "--seed") o.seed = o.finetune.seed = static_cast<uint64_t>(args.integer(0, 1LL << 62));
            else if (a == "-t" || a == "--threads") o.threads = static_cast<int>(args.integer(0, 4096));
            else if (a == "--save-every") save_every = args.integer(0, 1LL << 40);
            else if (a == "--resume") resume = args.value();
            else if (a == "--eval-every") eval_every = args.integer(0, 1LL << 40);
            else if (a == "--early-stop") early_stop = args.integer(1, 1LL << 40);
            else if (a == "--save-best") save_best = true;
            else if (a == "--val-split") o.val_split = args.number();
            else if (a == "--dump-grads") o.dump_grads = args.value();
            else if (a == "--devices") o.devices.count = static_cast<int>(args.integer(1, 64)), o.pipelined = true;
            else if (a == "--backend") o.devices.backend = args.choice({"cpu", "cuda"});
            else if (a == "--device-mem") o.devices.memory_each = cli::parse_size(a, args.value());
            else if (a == "--link") link = args.value();
            else if (a == "--schedule") {
                schedule = args.value();
                if (schedule == "cosine" || schedule == "linear" || schedule == "constant")
                    throw rp::Error("--schedule " + schedule + ": --schedule is the pipeline schedule (roundpipe, gpipe, 1f1b); "
                                    "the learning-rate schedule is --lr-schedule");
                o.pipeline.schedule = rp::schedule_from_name(schedule);
            }
            else if (a == "--resident-weights") o.pipeline.resident_weights = args.choice({"on", "off"}) == "on";
            else if (a == "--sync") o.pipeline.async = false;
            else if (a == "--async") o.pipeline.async = true;
            else if (a == "--recompute") o.pipeline.grain = args.choice({"stage", "layer"}) == "layer" ? rp::RecomputeGrain::Layer : rp::RecomputeGrain::Stage;
            else if (a == "--trace") trace_path = args.value();
            else if (a == "--plan") plan_only = true;
            else if (a == "--profile-ops") profile_ops = true;
            else if (a == "--activation-memory") {
                const std::string v = args.value();
                o.finetune.activation_memory = v == "0" ? 0 : cli::parse_size(a, v);
            }
            else if (a == "--max-bad-steps") o.max_bad_steps = static_cast<int>(args.integer(1, 1 << 20));
            else if (a == "--allow-binary") allow_binary = true;
            else if (a == "--chat-template") chat_template = args.value();
            else if (a == "--train-on-inputs") train_on_inputs = true;
            else if (a == "--pack") pack = 1;
            else if (a == "--sample-every") sample_every = args.integer(1, 1LL << 40);
            else if (a == "--sample-tokens") sample_tokens = args.integer(1, 1 << 20);
            else if (a == "--sample-prompt") {
                const std::string v = args.value();
                std::error_code ec;
                if (std::filesystem::is_regular_file(v, ec)) {
                    std::istringstream lines(cli::read_file(v));
                    size_t before = sample_prompts.size();
                    for (std::string line; std::getline(lines, line);)
                        if (!line.empty()) sample_prompts.push_back(line);
                    if (sample_prompts.size() == before) throw rp::Error("--sample-prompt " + v + ": the file has no prompt");
                } else {
                    sample_prompts.push_back(v);
                }
            }
            else if (a == "--no-pack") pack = 0;
            else if (a == "--inject-delays") {
                o.devices.delay_seed = static_cast<uint64_t>(args.integer(1, 1LL << 62));
                o.devices.max_delay_us = 50;
                o.pipeline.fuzz_seed = o.devices.delay_seed;
                o.pipeline.fuzz_max_delay_us = 50;
            }
            else if (a == "--inject-fault") {
                const std::string v = args.value();
                const size_t colon = v.find(':');
                const std::string kind = v.substr(0, colon);
                const long long n = colon == std::string::npos ? 0 : cli::parse_int(a, v.substr(colon + 1), 1, 1LL << 40);
                if (n == 0 || (kind != "alloc" && kind != "copy" && kind != "launch"))
                    throw rp::Error("--inject-fault: '" + v + "' is not KIND:N (KIND alloc, copy or launch; N >= 1)");
                (kind == "alloc" ? o.devices.faults.alloc_at : kind == "copy" ? o.devices.faults.copy_at : o.devices.faults.launch_at) = n;
            }
            else if (a == "--token-chunk") {
                const std::string v = args.value();
                token_chunk = v == "auto" ? -1 : cli::parse_int(a, v, 0, 1LL << 40);
            }
            else if (a == "--max-seq") max_seq = true;
            else if (a == "--dp") dp_required = true;
            else if (a == "--dp-timeout") dp_timeout = args.number(0.001f, 1e9f);
            else if (a == "--dp-check-every") dp_check_every = args.integer(0, 1LL << 40);
            else if (a == "--dp-link") dp_link = args.value();
            else if (a == "--dp-groups") o.accumulate_groups = args.integer(1, 1 << 20);
            else if (a == "--inject-dp-fault") {
                const std::string v = args.value();
                const size_t c1 = v.find(':'), c2 = c1 == std::string::npos ? c1 : v.find(':', c1 + 1);
                if (c2 == std::string::npos) throw rp::Error("--inject-dp-fault: '" + v + "' is not KIND:RANK:STEP");
                dp_fault.kind = v.substr(0, c1);
                if (dp_fault.kind != "die" && dp_fault.kind != "hang" && dp_fault.kind != "corrupt")
                    throw rp::Error("--inject-dp-fault: '" + dp_fault.kind + "' is not die, hang or corrupt");
                const std::string r = v.substr(c1 + 1, c2 - c1 - 1);
                dp_fault.rank = r == "all" ? -1 : static_cast<int>(cli::parse_int(a, r, 0, 1 << 20));
                dp_fault.step = cli::parse_int(a, v.substr(c2 + 1), 1, 1LL << 40);
            }
            else args.unknown();
        }
        if (model_path.empty()) throw rp::Error("no model given (-m BASE.gguf)");
        if (dp_required && !world)
            throw rp::Error(rp::MpiWorld::available() ? "--dp: this process was not launched by mpirun (mpirun -np R rp-finetune ... --dp)"
                                                      : "--dp needs a build with MPI (apt-get install libopenmpi-dev openmpi-bin; cmake -DRP_MPI=ON)");
        if (!world && (!dp_link.empty() || !dp_fault.kind.empty()))
            throw rp::Error("--dp-link and --inject-dp-fault need a data-parallel run (mpirun -np R rp-finetune ...)");
        if (world) {
            rp::CommOptions co;
            co.timeout_s = dp_timeout;
            if (!dp_link.empty()) co.link = rp::LinkModel::parse(dp_link);
            world->set_options(co);
            o.comm = world;
            o.replica_check_every = dp_check_every;
        }
        if (max_seq && !plan_only) throw rp::Error("--max-seq needs --plan");
        if (token_chunk == -1 && !o.pipelined) throw rp::Error("--token-chunk auto needs --devices N (the memory it must fit)");
        if (token_chunk >= 0) o.finetune.token_chunk = token_chunk;
        o.pipeline.token_chunk = token_chunk == -2 ? -1 : token_chunk;
        if (plan_only) {  // a dry run: metadata and tensor infos only
            auto model = rp::Model::load(model_path);
            rp::RunPlanOptions po;
            po.finetune = o.finetune;
            po.optimizer = o.optimizer.kind;
            po.momentum = o.optimizer.sgd.momentum != 0;
            po.seq_len = seq_len;
            po.batch = o.batch;
            po.micro_batches = rp::resolved_micro_batches(o);
            po.devices = o.pipelined ? o.devices.count : 0;
            po.device_memory = o.devices.memory_each;
            po.backend = o.devices.backend;
            po.schedule = o.pipeline.schedule;
            po.grain = o.pipeline.grain;
            po.token_chunk = o.pipeline.token_chunk;
            po.resident_weights = o.pipeline.resident_weights;
            po.packed = pack == 1 || (pack == -1 && data_path.ends_with(".jsonl"));
            if (max_seq) po.max_seq_limit = 1 << 22;
            if (max_seq && !o.pipelined) throw rp::Error("--max-seq needs --devices N (the device memory it must fit)");
            if (lead) {
                std::fputs(rp::plan_run(*model, po).report().c_str(), stdout);
                std::printf("plan rss: %.0f bytes (this process: the weights were mapped, not read)\n", peak_rss_mib() * 1048576.0);
            }
            return 0;
        }
        if (data_path.empty()) throw rp::Error("no training data given (--data FILE)");
        if (out_path.empty()) throw rp::Error("no output given (-o OUT.gguf)");
        if (!o.pipelined && (!link.empty() || !trace_path.empty() || o.pipeline.async || schedule != "roundpipe" || o.devices.backend != "cpu"))
            throw rp::Error("--link, --trace, --async, --schedule and --backend need --devices N (the RoundPipe runtime)");
        rp::RunLoopOptions loop;
        loop.out_path = out_path;
        loop.stop_at = stop_at;
        loop.eval_every = eval_every;
        loop.early_stop = early_stop;
        loop.save_best = save_best;
        loop.save_every = save_every;
        loop.sample_every = sample_every;
        loop.sample_prompts = sample_prompts;
        loop.sample_tokens = sample_tokens;
        loop.writes = lead;
        loop.validate(o);
        if (!link.empty()) o.devices.link = rp::LinkModel::parse(link);
        if (!link.empty() && o.devices.backend == "cuda") throw rp::Error("--link models the CPU devices' link; it does not apply to --backend cuda");
        o.lr.lr_max = lr;
        o.lr.lr_min = lr_min;
        // Data parallel: absolute times, shifted to a moment every rank agrees on (after a collective) so that
        // rp-trace can merge the ranks' files; each rank writes its own (TRACE.rankR.json).
        rp::TraceRecorder recorder(ranks > 1);
        if (!trace_path.empty()) {
            o.devices.hook = recorder.hook();
            if (world) {
                rp::CommOptions co = world->options();
                co.trace = recorder.hook();
                co.trace_device = o.devices.count;
                world->set_options(co);
                recorder.name_device(o.devices.count, "all-reduce");
            }
            if (ranks > 1) {
                const size_t dot = trace_path.rfind('.');
                const std::string ext = dot == std::string::npos || trace_path.find('/', dot) != std::string::npos ? "" : trace_path.substr(dot);
                trace_path = trace_path.substr(0, trace_path.size() - ext.size()) + ".rank" + std::to_string(rank) + ext;
            }
        }

        // Setup: everything that can fail on bad input happens before any file is written.
        auto model = rp::Model::load(model_path);
        const rp::Tokenizer tok(model->file());
        rp::DatasetOptions dopt;
        dopt.seq_len = static_cast<int32_t>(seq_len);
        dopt.n_ctx = model->hparams().n_ctx_train;
        dopt.allow_binary = allow_binary;
        // "messages" lines are rendered with the model's own template (or the one named); a model without
        // one leaves it unset, and the dataset refuses "messages" lines naming the line.
        if (!chat_template.empty() || !tok.chat_template().empty()) dopt.chat = rp::chat_template_for(tok, chat_template);
        dopt.train_on_inputs = train_on_inputs;
        dopt.pack = pack != 0;
        const rp::Dataset data = rp::Dataset::load(data_path, tok, dopt);
        rp::TrainingSession run(*model, data, o);
        double trace_t0 = 0;
        if (world && ranks > 1) {  // every rank has built its session: the common origin of the traces
            const uint64_t zero = 0;
            world->allgather(std::span<const uint64_t>(&zero, 1), "clock origin");
            trace_t0 = rp::clock_us();
            const int64_t M = run.options().micro_batches;
            say("data parallel: rank 0 of %d (each rank computes %lld of %lld micro-batches per step%s), timeout %g s, replica check every %lld steps%s\n",
                ranks, static_cast<long long>((M + ranks - 1) / ranks), static_cast<long long>(M),
                o.micro_batches == 0 ? ": --micro-batches defaults to one per rank, a step is the same --batch sequences" : "", dp_timeout,
                static_cast<long long>(dp_check_every), dp_link.empty() ? "" : (", link " + world->options().link->to_string()).c_str());
        }
        if (!resume.empty()) {
            const std::string what = run.resume(resume);
            say("%s\n", what.c_str());
        }
        if (o.pipelined)
            say("RoundPipe: %d %s devices x %s%s, schedule %s, %s steps, recompute %s\n", o.devices.count,
                         o.devices.backend == "cuda" ? "CUDA" : "CPU", rp::format_bytes(o.devices.memory_each).c_str(),
                         o.devices.link ? (", link " + o.devices.link->to_string()).c_str() : "", schedule.c_str(),
                         o.pipeline.async ? "async" : "sync", o.pipeline.grain == rp::RecomputeGrain::Layer ? "layer" : "stage");
        if (o.pipelined)
            say("memory plan: device peak %s = %s; plan %s\n", rp::format_bytes(run.planned().memory.peak()).c_str(),
                         run.planned().memory.describe().c_str(), run.planned().plan.describe().c_str());
        const int64_t total = run.total_steps();
        say("%s: %zu sequences of %lld tokens (%zu train, %zu validation), %zu trainable tensors, %lld steps\n",
                     data_path.c_str(), data.size(), static_cast<long long>(seq_len), run.split().train.size(),
                     run.split().val.size(), run.trainer().params().size(), static_cast<long long>(total));
        say("CPU threads: %d (%s)\n", o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
            rp::cli::omp_wait_setting().c_str());
        const rp::DatasetStats & ds = data.stats();
        if (ds.n_unpacked > 0) {  // JSONL: what packing saved
            char padding[160];
            if (data.packed())
                std::snprintf(padding, sizeof padding, "packed into %zu sequences: padding %.1f%% -> %.1f%% (unpacked: %zu sequences)",
                              data.size(), 100.0 * ds.unpacked_padding_fraction(), 100.0 * ds.padding_fraction(), ds.n_unpacked);
            else
                std::snprintf(padding, sizeof padding, "one sequence each: padding %.1f%% (--pack shares sequences)",
                              100.0 * ds.padding_fraction());
            say("%s: %zu examples %s; %zu longer than --seq-len %lld (cut to it), %zu skipped (no trained token left)\n", data_path.c_str(),
                ds.n_examples, padding, ds.n_truncated, static_cast<long long>(seq_len), ds.n_skipped);
        }

        const std::string ckpt_path = loop.checkpoint_path(), best_path = loop.best_path();
        // What the loop reports, as progress lines (rank 0 prints).
        struct Progress : rp::RunObserver {
            std::function<void(const std::string &)> print;
            void step(const rp::StepReport & r, const rp::RunProgress & p) override {
                const std::string norm_of = r.grad_norm_step > 0 && r.grad_norm_step != r.step ? " (step " + std::to_string(r.grad_norm_step) + ")" : "";
                char buf[320];
                std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f%s | %.0f tok/s | ETA %.1fs\n",
                              static_cast<long long>(r.step), static_cast<long long>(p.total), r.loss, r.lr, r.grad_norm, norm_of.c_str(),
                              static_cast<double>(r.tokens) / r.seconds,
                              p.elapsed / static_cast<double>(r.step - p.first) * static_cast<double>(p.end - r.step));
                print(buf);
                if (r.skipped) {
                    std::snprintf(buf, sizeof buf, "warning: step %lld skipped (%s, gradient norm %g, %lld trained tokens)\n",
                                  static_cast<long long>(r.grad_norm_step), r.skip_reason.c_str(), r.grad_norm,
                                  static_cast<long long>(r.trained_tokens));
                    print(buf);
                }
            }
            void eval(int64_t step, double loss, const rp::EvalProgress & ep, bool best) override {
                char best_text[96] = " (best)", buf[256];
                if (!best)
                    std::snprintf(best_text, sizeof best_text, "; best %.4f at step %lld", ep.best_loss, static_cast<long long>(ep.best_step));
                std::snprintf(buf, sizeof buf, "eval step %lld: val loss %.4f, ppl %s%s\n", static_cast<long long>(step), loss,
                              rp::format_perplexity(loss).c_str(), best_text);
                print(buf);
            }
            void sample(int64_t step, const std::string & prompt, const std::string & completion) override {
                print("sample step " + std::to_string(step) + ": " + prompt + " -> " + completion + "\n");
            }
        } progress;
        progress.print = [&](const std::string & line) { if (info) std::fputs(line.c_str(), info); };
        loop.tokenizer = &tok;
        loop.interrupted = [] { return g_interrupted != 0; };
        loop.rss_bytes = current_rss_bytes;
        if (!dp_fault.kind.empty())
            loop.before_step = [&](int64_t step) {
                if (step != dp_fault.step || (dp_fault.rank >= 0 && dp_fault.rank != rank)) return;
                if (dp_fault.kind == "die") raise(SIGKILL);
                if (dp_fault.kind == "hang")
                    for (;;) pause();
                run.synchronize();  // corrupt: one bit of the first master
                auto * w = static_cast<unsigned char *>(run.trainer().params().front().t->data);
                w[0] ^= 1;
            };
        if (profile_ops) rp::cpu::reset_op_profile(), rp::cpu::set_op_profiling(true);
        catch_interrupts();
        const rp::RunOutcome outcome = rp::run_training(run, loop, progress);
        if (outcome.end == rp::RunEnd::Interrupted) {
            say("interrupted at step %lld; resume with the same command and --resume %s\n", static_cast<long long>(run.steps_done()),
                ckpt_path.c_str());
            return 130;
        }
        if (outcome.end == rp::RunEnd::Diverged) {
            say("error: %s; stopped without writing %s%s\n", rp::cli::with_flag_names(outcome.stop, kFlagNames).c_str(), out_path.c_str(),
                save_every > 0 ? (" (the last checkpoint: " + ckpt_path + ")").c_str() : "");
            return 1;
        }
        if (outcome.end == rp::RunEnd::EarlyStopped)
            say("early stop at step %lld: %lld evaluations without a better validation loss than %.4f (step %lld)\n",
                static_cast<long long>(run.steps_done()), static_cast<long long>(outcome.at_stop.since_best), outcome.at_stop.best_loss,
                static_cast<long long>(outcome.at_stop.best_step));
        const rp::TrainCurve & curve = run.curve();
        const int64_t first = outcome.first;
        const double tokens = outcome.tokens, trained = outcome.trained_tokens, step_seconds = outcome.step_seconds;
        run.synchronize();
        if (!trace_path.empty()) {
            rp::Trace trace = recorder.snapshot();
            if (ranks > 1)
                for (rp::TraceEvent & e : trace.events) e.ts_us -= trace_t0;
            rp::write_chrome_trace(trace_path, trace);
            const rp::TraceStats ts = rp::analyse_trace(trace);
            say("trace %s: %zu operations on %d devices, bubble ratio %.1f%%, exposed communication %.1f%%\n",
                         trace_path.c_str(), trace.events.size(), ts.devices, 100.0 * ts.bubble_ratio, 100.0 * ts.exposed_comm_fraction);
        }
        if (o.pipelined)  // planned vs measured, per device
            for (size_t i = 0; i < run.devices().size(); ++i) {
                const rp::DeviceMemoryPlan u = run.pipeline()->device_regions_used(static_cast<int>(i));
                say("memory %s: high-water %zu bytes, planned %zu (used: resident %zu, weights %zu, activations %zu, graph %zu); "
                    "weights sent %zu bytes\n",
                    run.devices()[i]->name().c_str(), run.devices()[i]->high_water(), run.planned().memory.peak(), u.resident,
                    u.weight_slot, u.activations, u.graph, run.pipeline()->device_weight_bytes_uploaded(static_cast<int>(i)));
            }
        const double secs = outcome.seconds;
        const auto & tl = curve.train_loss;
        say("done: %lld steps in %.2f s, %.0f tok/s (%.0f trained tok/s); loss %.4f -> %.4f",
                     static_cast<long long>(run.steps_done() - first), secs, secs > 0 ? tokens / secs : 0.0,
                     secs > 0 ? trained / secs : 0.0, tl.empty() ? 0.0 : tl.front(), tl.empty() ? 0.0 : tl.back());
        if (!curve.eval_loss.empty()) {
            say("; val loss %.4f -> %.4f (ppl %s -> %s)", curve.eval_loss.front(), curve.eval_loss.back(),
                rp::format_perplexity(curve.eval_loss.front()).c_str(), rp::format_perplexity(curve.eval_loss.back()).c_str());
            const rp::EvalProgress ep = rp::eval_progress(curve);
            if (ep.best_step == curve.eval_step.front())
                say(" -- validation never improved on its first value: the run overfits or the lr is too high");
            else if (ep.since_best > 0)
                say(" -- best %.4f at step %lld%s", ep.best_loss, static_cast<long long>(ep.best_step),
                             save_best ? (" (" + best_path + ")").c_str() : "");
        }
        say("; peak graph %.1f KiB, peak RSS %.1f MiB\nwrote %s\n", static_cast<double>(run.trainer().peak_graph_bytes()) / 1024.0,
                     peak_rss_mib(), out_path.c_str());
        if (profile_ops && lead) {
            rp::cpu::set_op_profiling(false);
            const std::vector<rp::cpu::OpTime> rows = rp::cpu::op_profile();
            double in_ops = 0;
            for (const rp::cpu::OpTime & t : rows) in_ops += t.seconds;
            say("op profile: %.3f s of training steps, %.3f s in graph nodes%s\n%s", step_seconds, in_ops,
                o.pipelined ? " (summed over the devices' threads)" : "",
                rp::cpu::format_op_profile(rows, o.pipelined ? 0 : std::max(0.0, step_seconds - in_ops)).c_str());
        }
        return 0;
    }
}

int main(int argc, char ** argv) {
    // mpirun -np R: every rank one data-parallel node. Launched by mpirun without MPI in this build, R copies
    // would each train alone and write the same files: refused.
    std::unique_ptr<rp::Communicator> world;
    int ranks = 1, rank = 0;
    try {
        if (rp::MpiWorld::launched()) {
            if (rp::MpiWorld::available()) {
                world = rp::MpiWorld::init(&argc, &argv, rp::CommOptions{});
                rank = world->rank();
                ranks = world->size();
            } else if (rp::MpiWorld::launched_size() > 1) {
                throw rp::Error("launched by mpirun with " + std::to_string(rp::MpiWorld::launched_size()) +
                                " ranks, but this rp-finetune was built without MPI: each rank would train alone "
                                "(apt-get install libopenmpi-dev openmpi-bin; cmake -DRP_MPI=ON)");
            }
        }
        const int rc = finetune(argc, argv, world.get());
        world.reset();
        rp::MpiWorld::finalize();
        return rc;
    } catch (const std::exception & e) {
        const std::string msg = rp::cli::with_flag_names(e.what(), kFlagNames);
        if (ranks > 1) {
            // The peers may be blocked on this rank: end the whole job (mpirun reports it).
            std::fprintf(stderr, "rank %d: error: %s\n", rank, msg.c_str());
            std::fflush(stderr);
            rp::MpiWorld::abort(1);
        }
        std::fprintf(stderr, "error: %s\n", msg.c_str());
        world.reset();
        rp::MpiWorld::finalize();
        return 1;
    }
}
