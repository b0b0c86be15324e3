#include "tools/finetune_options.h"

#include "base/error.h"
#include "models/arch/model.h"

#include <cstdio>
#include <filesystem>
#include <sstream>

namespace rp::cli {

namespace {

using O = Options;

std::optional<std::string> quoted(const char * s) { return toml_string(s); }

void declare_model_and_data(Options & p, FinetuneJob & j) {
    p.group("Model, data and output");
    p.text("-m,--model", j.model_path, "base model (" + supported_architectures() + "; any weight dtype, frozen for LoRA)");
    p.text("--data,--file", j.data_path, "training text (.txt: one token stream) or .jsonl (text / prompt+completion / messages;\n"
                                         "prompt+chosen+rejected pairs for the preference methods)");
    p.text("-o,--output", j.loop.out_path, "the adapter (or with --full the finetuned model)");
    p.integer("--seq-len,--ctx-size,-c", j.seq_len, 1, 1 << 30, "tokens per sequence");
    p.flag("--allow-binary", j.allow_binary, "train on data with NUL bytes or invalid UTF-8 (refused otherwise)");
    p.text("--chat-template,--chat-template-file", j.chat_template,
           "chat template for \"messages\" lines: a FILE.jinja, or chatml / llama3\n"
           "(default: the model's tokenizer.chat_template)",
           "T");
    p.flag("--train-on-inputs", j.train_on_inputs, "\"messages\" lines: train on every token, not only the assistant replies");
    p.flag("--train-analysis", j.train_analysis,
           "\"messages\" lines, gpt-oss: train the replies' analysis channel (their \"reasoning_content\")\n"
           "too, not only the final answers");
    p.integer("--max-prompt-len", j.max_prompt_len, 0, 1 << 30,
              "preference pairs: each prompt keeps at most its last N tokens (then answers are cut to\n"
              "what --seq-len leaves); 0 = whole prompts",
              "N");
    p.toggle("--pack", "--no-pack", j.pack,
             "JSONL: several examples per sequence, each attending only to itself (positions restart\n"
             "per example; no padding between them) or one padded sequence each (default: SFT --pack,\n"
             "preference pairs --no-pack; packed, a pair's two answers share one sequence; plain text is\n"
             "one token stream either way)");
}

void declare_adapter(Options & p, FinetuneJob & j) {
    FinetuneConfig & f = j.session.finetune;
    p.group("What trains");
    p.flag("--full", f.full, "full finetune: every float tensor trainable (fp32 masters)");
    p.integer("--lora-rank", f.lora_rank, 1, 1 << 20, "LoRA rank");
    p.number("--lora-alpha", f.lora_alpha, "LoRA alpha (the branch is scaled by alpha / rank)", "A");
    p.list("--lora-targets", f.lora_targets, "the weights that get a LoRA, comma-separated");
    p.text("--adapter", f.start_adapter, "start from this LoRA adapter (ours, or any llama.cpp loads): its rank, alpha and\n"
                                         "tensors replace --lora-rank, --lora-alpha and --lora-targets");
    p.number("--lora-dropout", f.lora_dropout, 0.0f, 0.999999f, "dropout on the LoRA branch input, in [0, 1)", "P");
    p.number("--moe-aux-loss", f.moe_aux_loss, 0.0f, 1e6f,
             "mixture of experts: add C x the load-balancing loss of every MoE layer (Switch\n"
             "Transformer's n_expert * sum f_e P_e, per graph, scaled like the loss)",
             "C");
}

void declare_objective(Options & p, FinetuneJob & j) {
    p.group("Objective");
    p.value("--method", "NAME",
            "sft (next-token cross-entropy) | dpo | ipo | simpo | orpo (preference pairs) | kto (unpaired\n"
            "examples with a label) | grpo (completions sampled from prompts, scored by --reward /\n"
            "--reward-cmd), as TRL defines them; dpo, ipo and kto compare with the model as it starts:\n"
            "the reference",
            O::String, [&j](const std::string &, const std::string & v) { j.method = v; }, [&j] { return quoted(j.method.c_str()); });
    p.value("--beta", "X",
            "dpo / ipo / simpo: the preference loss's beta (TRL's default 0.1); grpo: the weight of the\n"
            "KL term to the base model without the adapter (default 0: none, as TRL)",
            O::Float | O::Int, [&j](const std::string & flag, const std::string & v) { j.beta = parse_double(flag, v, -1e300, 1e300); },
            [&j] { return j.beta ? std::optional<std::string>(toml_float(*j.beta, 17)) : std::nullopt; });
    p.number("--label-smoothing", j.preference.label_smoothing, -1e300, 1e300,
             "dpo / simpo: the share of pairs assumed mislabelled, in [0, 0.5) (cDPO / robust DPO)");
    p.number("--gamma", j.preference.gamma, -1e300, 1e300, "simpo: the target reward margin (TRL's simpo_gamma, default 0.5)");
    p.number("--orpo-lambda", j.orpo_lambda, -1e300, 1e300, "orpo: the odds-ratio term's weight beside the chosen answers' NLL (default 0.1)");
    p.number("--desirable-weight", j.preference.desirable_weight, -1e300, 1e300, "kto: the weight of the desirable examples' losses (default 1)");
    p.number("--undesirable-weight", j.preference.undesirable_weight, -1e300, 1e300, "kto: the weight of the undesirable examples' losses (default 1)");
}

void declare_grpo(Options & p, FinetuneJob & j) {
    GrpoOptions & g = j.grpo;
    p.group("GRPO (--method grpo; --data: JSONL prompts {\"prompt\": text or messages, other fields for the rewards})");
    p.repeated("--reward", "SPEC",
               "a built-in reward, summed with the others (repeatable): exact:FIELD (the completion's\n"
               "last \\boxed{} or number equals the prompt line's FIELD), regex:PATTERN (POSIX extended),\n"
               "length:N (the completion ends by itself within N tokens)",
               [&j](const std::string &, const std::string & v) { j.rewards.push_back(v); }, [&j] { j.rewards.clear(); },
               [&j] { return j.rewards.empty() ? std::nullopt : std::optional<std::string>(toml_array(j.rewards)); });
    p.text("--reward-cmd", j.reward_cmd,
           "a reward program (run with /bin/sh -c, kept running): one JSON line a completion on its\n"
           "stdin ({\"prompt\", \"completion\", the line's other fields}), one number a line back",
           "CMD");
    p.number("--reward-timeout", j.reward_timeout, 0.0, 1e9, "seconds the reward program may take to score a batch (default 60)", "S");
    p.list("--reward-weights", j.reward_weights, "the rewards' weights, the --reward ones first, then --reward-cmd's (default 1 each)", "W,...");
    p.integer("--group", g.group, 2, 1 << 16, "completions sampled per prompt (TRL's num_generations; default 8)");
    p.integer("--max-completion-len", g.max_completion_len, 1, 1 << 20, "tokens a completion may take, its end token included (default 64)");
    p.integer("--rollout-batch", g.rollout_batch, 0, 1 << 16,
              "completions of a prompt decoded together (default 0: the whole group; their KV caches\n"
              "take layers x 2 x kv-dim x seq-len x N floats; the same completions whatever N)", "N");
    p.value("--rollout-matvec", "M",
            "auto | fast | exact: the rollouts' decode steps as per-row dot products with the activations\n"
            "in the weights' format (fast: llama.cpp's arithmetic, as rp-generate's fast one) or the\n"
            "training graphs' arithmetic (exact); auto (the default): fast for a quantized base, exact\n"
            "for float weights. Each is reproducible; the loss reads the training graphs' log-probabilities",
            O::String,
            [&g](const std::string & f, const std::string & v) {
                if (v != "auto" && v != "fast" && v != "exact") throw rp::Error(f + ": '" + v + "' is not one of auto, fast, exact");
                g.rollout_matvec = v == "fast" ? RolloutMatvec::Fast : v == "exact" ? RolloutMatvec::Exact : RolloutMatvec::Auto;
            },
            [&g] {
                return quoted(g.rollout_matvec == RolloutMatvec::Fast ? "fast" : g.rollout_matvec == RolloutMatvec::Exact ? "exact" : "auto");
            });
    p.number("--temp", g.temperature, 0.0f, 100.0f, "the sampler's temperature (default 1)");
    p.number("--top-p", g.top_p, 0.0f, 1.0f, "the sampler's nucleus (default 1: all)");
    p.integer("--top-k", g.top_k, 0, 1 << 30, "the sampler's top-k (default 0: all)");
    p.repeated("--stop", "TEXT", "a stop string (repeatable): a completion ends at the token that completes it in its text",
               [&g](const std::string &, const std::string & v) { g.stop.push_back(v); }, [&g] { g.stop.clear(); },
               [&g] { return g.stop.empty() ? std::nullopt : std::optional<std::string>(toml_array(g.stop)); });
    p.number("--epsilon", g.loss.epsilon_low, -1e300, 1e300, "the policy ratio's clip: [1 - epsilon, 1 + epsilon-high] (default 0.2)");
    p.number("--epsilon-high", g.loss.epsilon_high, -1e300, 1e300, "the clip's upper side (DAPO's clip-higher; default 0.2)");
    p.choice("--loss-type", j.grpo_loss_type, {"grpo", "bnpo", "dr_grpo"},
             "the tokens' normalisation: grpo (per completion, then per batch), bnpo (per batch's tokens;\n"
             "the default), dr_grpo (per batch x --max-completion-len)");
    p.integer("--iterations", g.iterations, 1, 1 << 16,
              "updates per rollout batch (TRL's num_iterations; default 1): > 1 trains that many steps on\n"
              "one batch of rollouts, the ratio against the sampling policy's log-probabilities");
    p.toggle("--scale-rewards", "--no-scale-rewards", g.scale_rewards,
             "advantages divided by their group's standard deviation (GRPO; the default) or not (Dr. GRPO)");
}

void declare_optimization(Options & p, FinetuneJob & j) {
    SessionOptions & o = j.session;
    p.group("Optimization");
    p.integer("--batch", o.batch, 1, 1 << 20, "sequences (preference pairs; grpo: prompts) per optimizer step");
    p.optional_integer("--micro-batches", o.micro_batches, 1, 1 << 20,
                       "split each batch in M parts, gradients accumulated (default: one per data-parallel\n"
                       "rank, 1 in a single process)",
                       "M");
    p.value("--optimizer", "NAME", "adamw | sgd", O::String,
            [&o](const std::string &, const std::string & v) { o.optimizer.kind = optimizer_kind_from_name(v); },
            [&o] { return quoted(optimizer_kind_name(o.optimizer.kind)); });
    p.number("--lr,--learning-rate", o.lr.lr_max, -1e300, 1e300, "peak learning rate");
    p.number("--lr-min,--learning-rate-min", o.lr.lr_min, -1e300, 1e300, "final learning rate of linear/cosine decay");
    p.value("--lr-schedule", "NAME", "cosine | linear | constant", O::String,
            [&o](const std::string &, const std::string & v) { o.lr.decay = lr_decay_from_name(v); },
            [&o] { return quoted(lr_decay_name(o.lr.decay)); });
    p.integer("--warmup", o.lr.warmup_steps, 0, 1LL << 40, "linear warmup steps");
    p.value("--weight-decay", "X", "decoupled weight decay (default 0.01 for adamw, 0 for sgd)", O::Int | O::Float,
            [&o](const std::string & f, const std::string & v) {
                o.optimizer.adamw.weight_decay = o.optimizer.sgd.weight_decay = parse_double(f, v, -1e300, 1e300);
            },
            [&o] {
                const bool sgd = o.optimizer.kind == OptimizerKind::Sgd;
                return std::optional(toml_float(sgd ? o.optimizer.sgd.weight_decay : o.optimizer.adamw.weight_decay, 17));
            });
    p.number("--momentum", o.optimizer.sgd.momentum, -1e300, 1e300, "SGD momentum");
    p.value("--optimizer-state", "TYPE",
            "f32 | bf16: the optimizer's state (AdamW m and v, SGD momentum) in fp32, or in bfloat16 for\n"
            "half its host memory (updates computed in fp32 and rounded to nearest even; not f32's bits)",
            O::String,
            [&o](const std::string & f, const std::string & v) {
                if (v != "f32" && v != "bf16") throw rp::Error(f + ": '" + v + "' is not one of f32, bf16");
                o.optimizer.bf16_state = v == "bf16";
            },
            [&o] { return quoted(o.optimizer.bf16_state ? "bf16" : "f32"); });
    p.integer("--epochs", o.epochs, 1, 1 << 20, "passes over the training data");
    p.optional_integer("--steps", o.steps, 1, 1LL << 40, "optimizer steps (overrides --epochs)");
    p.optional_integer("--stop-at", j.loop.stop_at, 1, 1LL << 40, "stop after step N (checkpoint written), keeping the schedule of --steps");
    p.not_resumed();
    p.number("--clip", o.clip, 0.0f, 1e30f, "global gradient-norm clipping, 0 = off");
    p.value("-s,--seed", "N", "data order, split and LoRA init (default 42)", O::Int,
            [&o](const std::string & f, const std::string & v) { o.finetune.seed = static_cast<uint64_t>(parse_int(f, v, 0, 1LL << 62)); },
            [&o] { return std::optional(std::to_string(o.finetune.seed)); });
    p.integer("--max-bad-steps", o.max_bad_steps, 1, 1 << 20,
              "a step with a non-finite loss or gradient norm is not applied; K in a row stop\n"
              "the run (exit 1, the last checkpoint kept, no output written)",
              "K");
}

void declare_evaluation(Options & p, FinetuneJob & j) {
    RunLoopOptions & l = j.loop;
    p.group("Evaluation, samples and checkpoints");
    p.number("--val-split", j.session.val_split, -1e300, 1e300, "fraction of the sequences held out for validation", "F");
    p.integer("--eval-every", l.eval_every, 0, 1LL << 40, "validation loss every N steps (and at the end) when --val-split > 0");
    p.optional_integer("--early-stop", l.early_stop, 1, 1LL << 40, "stop after N evaluations in a row without a better validation loss");
    p.flag("--save-best", l.save_best, "keep the result of the best evaluation in OUT.best.gguf (rewritten when beaten)");
    p.integer("--save-every", l.save_every, 0, 1LL << 40, "write the checkpoint OUT.ckpt.gguf every N steps (it is also written at the end)");
    p.text("--resume", j.resume_path, "continue from a checkpoint (its recorded options are the defaults), or start from an\n"
                                      "adapter's weights");
    p.local();
    p.optional_integer("--sample-every", l.sample_every, 1, 1LL << 40,
                       "every N steps (and at the end) print a greedy completion of each --sample-prompt\n"
                       "with the current weights (KV-cache generation), also logged to the metrics JSONL");
    p.repeated("--sample-prompt", "P", "a prompt (repeatable), or a file of prompts, one per line",
               [&l](const std::string & f, const std::string & v) {
                   std::error_code ec;
                   if (!std::filesystem::is_regular_file(v, ec)) return l.sample_prompts.push_back(v);
                   std::istringstream lines(read_file(v));
                   const size_t before = l.sample_prompts.size();
                   for (std::string line; std::getline(lines, line);)
                       if (!line.empty()) l.sample_prompts.push_back(line);
                   if (l.sample_prompts.size() == before) throw rp::Error(f + " " + v + ": the file has no prompt");
               },
               [&l] { l.sample_prompts.clear(); },
               [&l] { return l.sample_prompts.empty() ? std::nullopt : std::optional<std::string>(toml_array(l.sample_prompts)); });
    p.integer("--sample-tokens", l.sample_tokens, 1, 1 << 20, "tokens per completion");
    p.text("--dump-grads", j.session.dump_grads, "the accumulated gradients of the first step, before clipping (GGUF)");
    p.not_resumed();
}

void declare_compute(Options & p, FinetuneJob & j) {
    SessionOptions & o = j.session;
    p.group("Compute");
    p.threads(o.threads);
    p.size("--activation-memory", o.finetune.activation_memory,
           "host training (no --devices): keep the layers' activations from the forward to the\n"
           "backward while they take at most SIZE (no recompute: a third less forward work, the same\n"
           "gradients); the other layers are recomputed. 0 = always recompute (default 2G; --plan\n"
           "shows what it keeps)",
           true);
    p.size("--host-mem", j.host_memory,
           "host memory the run may take: its planned host peak (--plan) must fit beside what the\n"
           "process already holds, or it is refused before anything is allocated (default: what the\n"
           "system lets this process take, MemAvailable and its cgroup's limit, less 5%)",
           true);
    p.local();  // a property of the machine, not of the run
    p.value("--token-chunk", "N|auto",
            "tokens per feed-forward / LM-head graph, so no [tokens x n_ff] or [tokens x vocab]\n"
            "tensor is whole (the backward then recomputes attention once more); 0 = off; auto (with\n"
            "--devices, the default): the fastest that fits --device-mem",
            O::Int | O::String,
            [&j](const std::string & f, const std::string & v) { j.token_chunk = v == "auto" ? -1 : parse_int(f, v, 0, 1LL << 40); },
            [&j]() -> std::optional<std::string> {
                if (j.token_chunk == -2) return std::nullopt;
                return j.token_chunk == -1 ? toml_string("auto") : std::to_string(j.token_chunk);
            });
    p.value("--attention-type", "T",
            "bf16 | f16 | f32: what CUDA devices round attention inputs to (default bf16: tensor\n"
            "cores; the CPU computes attention in f32 whatever it is)",
            O::String,
            [&o](const std::string & f, const std::string & v) {
                if (v != "bf16" && v != "f16" && v != "f32") throw rp::Error(f + ": '" + v + "' is not one of bf16, f16, f32");
                o.finetune.attention_type = v == "bf16" ? DType::BF16 : v == "f16" ? DType::F16 : DType::F32;
            },
            [&o] {
                const DType t = o.finetune.attention_type;
                return quoted(t == DType::BF16 ? "bf16" : t == DType::F16 ? "f16" : "f32");
            });
    p.value("--boundary-dtype", "T",
            "f32 | bf16: the hidden state between layers as the host keeps it (RoundPipe's checkpoints\n"
            "in pinned RAM) and the link moves it; bf16 halves both, every layer's output then rounded\n"
            "to bf16 on every path (results differ from f32's, not between runs; default f32)",
            O::String,
            [&o](const std::string & f, const std::string & v) {
                if (v != "f32" && v != "bf16") throw rp::Error(f + ": '" + v + "' is not one of f32, bf16");
                o.finetune.boundary_type = v == "bf16" ? DType::BF16 : DType::F32;
            },
            [&o] { return quoted(o.finetune.boundary_type == DType::BF16 ? "bf16" : "f32"); });
    p.value("--f32-gemm", "M",
            "tf32 | f32: how CUDA devices run f32 GEMMs (LoRA products, weight gradients,\n"
            "dequantized K-quant weights; default tf32: tensor cores, ~1e-3 relative error)",
            O::String,
            [&o](const std::string & f, const std::string & v) {
                if (v != "tf32" && v != "f32") throw rp::Error(f + ": '" + v + "' is not one of tf32, f32");
                o.devices.tf32_gemm = v == "tf32";
            },
            [&o] { return quoted(o.devices.tf32_gemm ? "tf32" : "f32"); });
    p.flag("--profile-ops", j.profile_ops, "at the end, the wall time of every op kind over the training steps (CPU kernels)");
    p.not_resumed();
    p.flag("--plan", j.plan_only,
           "print the memory plan and exit (needs only -m; the weights are never read): the stage\n"
           "partition, the device peak region by region, host RAM, link bytes");
    p.local();
    p.flag("--max-seq", j.max_seq, "with --plan: also the longest --seq-len that fits --device-mem");
    p.local();
    p.note("Ctrl-C (SIGINT) or SIGTERM: the current step finishes, the checkpoint is written, exit 130; a second one\n"
           "exits at once (the last checkpoint stays valid). The metrics log records each step's RSS.\n");
}

void declare_roundpipe(Options & p, FinetuneJob & j) {
    SessionOptions & o = j.session;
    p.group("RoundPipe (roundpipe.md: the model stays in host memory, layers stream to the devices round-robin)");
    p.value("--devices", "N", "train through the RoundPipe runtime on N devices (default 0: host)", O::Int,
            [&o](const std::string & f, const std::string & v) { o.devices.count = static_cast<int>(parse_int(f, v, 1, 64)), o.pipelined = true; },
            [&o]() -> std::optional<std::string> { return o.pipelined ? std::optional(std::to_string(o.devices.count)) : std::nullopt; });
    p.choice("--backend", o.devices.backend, {"cpu", "cuda"},
             "cpu | cuda: CPU virtual devices, or logical CUDA devices over the visible GPUs");
    p.sizes("--device-mem", o.devices.memory_each, o.devices.memories,
            "memory of each device, e.g. 64M (default 256M), or one per device, e.g. 24G,16G,16G,24G:\n"
            "the planner restricts the stages that fit only the larger devices to them");
    p.text("--link", j.link, "host<->device link model of the CPU devices, e.g. 32GB/s,10us (default: memcpy speed)", "BW,LAT");
    p.value("--schedule", "NAME", "roundpipe | gpipe | 1f1b (the baselines bind stages to devices)", O::String,
            [&o](const std::string & f, const std::string & v) {
                if (v == "cosine" || v == "linear" || v == "constant")
                    throw rp::Error(f + " " + v + ": " + f + " is the pipeline schedule (roundpipe, gpipe, 1f1b); "
                                    "the learning-rate schedule is --lr-schedule");
                o.pipeline.schedule = schedule_from_name(v);
            },
            [&o] { return quoted(schedule_name(o.pipeline.schedule)); });
    p.value("--dispatch", "NAME",
            "ready | round-robin: a job's device: the one that finishes it first by the devices' speeds\n"
            "(identical devices: the round-robin pointer; on mixed ones a call's stages may instead be\n"
            "sized by speed for the pointer's devices), or always the pointer and the planner's stages",
            O::String,
            [&o](const std::string & f, const std::string & v) {
                if (v != "ready" && v != "round-robin") throw rp::Error(f + ": '" + v + "' is not one of ready, round-robin");
                o.pipeline.dispatch = dispatch_from_name(v);
            },
            [&o] { return quoted(dispatch_name(o.pipeline.dispatch)); });
    p.value("--device-speed", "S,...",
            "each device's relative speed, e.g. 1,1,0.5,0.5: CPU devices then really compute that much\n"
            "slower (a mixed machine emulated); on GPUs the dispatcher takes them instead of measuring.\n"
            "Default: measured from each device's kernels, updated every call",
            O::String,
            [&o](const std::string & f, const std::string & v) {
                o.pipeline.device_speed.clear();
                for (const std::string & field : split_commas(v, true)) o.pipeline.device_speed.push_back(parse_double(f, field, 1e-6, 1e6));
            },
            [&o]() -> std::optional<std::string> {
                if (o.pipeline.device_speed.empty()) return std::nullopt;
                std::string s;
                for (double x : o.pipeline.device_speed) {
                    char b[32];
                    std::snprintf(b, sizeof b, "%s%.17g", s.empty() ? "" : ",", x);
                    s += b;
                }
                return toml_string(s);
            });
    p.toggle("--async", "--sync", o.pipeline.async,
             "optimizer step overlapped with the next step (staleness 1), or synchronous (default --sync)");
    p.value("--recompute", "GRAIN", "stage | layer: what a backward job recomputes from", O::String,
            [&o](const std::string & f, const std::string & v) {
                if (v != "stage" && v != "layer") throw rp::Error(f + ": '" + v + "' is not one of stage, layer");
                o.pipeline.grain = v == "layer" ? RecomputeGrain::Layer : RecomputeGrain::Stage;
            },
            [&o] { return quoted(o.pipeline.grain == RecomputeGrain::Layer ? "layer" : "stage"); });
    p.value("--resident-weights", "on|off",
            "keep the frozen weights (LoRA's base) on every device when the plan fits them:\n"
            "each job then uploads only its trainable tensors",
            O::String | O::Bool,
            [&o](const std::string & f, const std::string & v) {
                if (v != "on" && v != "off" && v != "true" && v != "false") throw rp::Error(f + ": '" + v + "' is not one of on, off");
                o.pipeline.resident_weights = v == "on" || v == "true";
            },
            [&o] { return quoted(o.pipeline.resident_weights ? "on" : "off"); });
    p.value("--vocab-on-host", "auto|on|off",
            "keep the frozen embedding and LM-head matrices in host memory: the embedding uploads the\n"
            "rows of each batch's tokens, the head its rows range by range for every micro-batch (no\n"
            "job holds either whole); auto (default): only when no plan fits the devices without it",
            O::String,
            [&o](const std::string & f, const std::string & v) {
                if (v != "auto" && v != "on" && v != "off") throw rp::Error(f + ": '" + v + "' is not one of auto, on, off");
                o.pipeline.vocab_on_host = v == "auto" ? -1 : v == "on" ? 1 : 0;
            },
            [&o] { return quoted(o.pipeline.vocab_on_host < 0 ? "auto" : o.pipeline.vocab_on_host > 0 ? "on" : "off"); });
    p.value("--pin", "MODE",
            "alloc | register | off: how the frozen weights are pinned for their uploads: a pinned\n"
            "copy (one more copy in RAM), pinned where they are mapped (no copy; slow to set up on\n"
            "some systems), or not at all (models larger than RAM). Default on GPUs: alloc when the\n"
            "plan with the copy fits the host memory (--host-mem), else register",
            O::String,
            [&o](const std::string & f, const std::string & v) {
                const auto mode = parse_frozen_pinning(v);
                if (!mode) throw rp::Error(f + ": '" + v + "' is not one of alloc, register, off");
                o.pipeline.frozen_pinning = *mode;
            },
            [&o]() -> std::optional<std::string> {
                return o.pipeline.frozen_pinning ? std::optional(quoted(frozen_pinning_name(*o.pipeline.frozen_pinning))) : std::nullopt;
            });
    p.text("--trace", j.trace_path, "Chrome trace of every stream operation (draw it with rp-trace)");
    p.not_resumed();
}

void declare_data_parallel(Options & p, FinetuneJob & j) {
    p.group("Data parallel over MPI (architecture.md 8)");
    p.note("mpirun -np R rp-finetune ... trains on R processes (each with its own --devices), rank r taking micro-batches\n"
           "r, r+R, ... of every step; gradients are summed in rank order (bit-identical on every rank and run) and every\n"
           "rank applies the same update. Rank 0 prints and writes.\n");
    p.flag("--dp", j.dp.required, "require an mpirun launch (otherwise it is detected)");
    p.number("--dp-timeout", j.dp.timeout_s, 0.001, 1e9, "a peer silent for S seconds (dead or hung) is an error on every rank", "S");
    p.integer("--dp-check-every", j.dp.check_every, 0, 1LL << 40,
              "compare every rank's masters and optimizer state every N steps (also at the end)");
    p.text("--dp-link", j.dp.link, "emulate an inter-node link on one machine, e.g. 25Gbit/s,10us (benchmarks)", "BW,LAT");
    p.integer("--dp-groups", j.session.accumulate_groups, 1, 1 << 20,
              "one process: sum the gradients in G groups as G ranks would (the bit-exact\n"
              "reference of a G-rank run, host path)",
              "G");
}

void declare_fault_injection(Options & p, FinetuneJob & j) {
    SessionOptions & o = j.session;
    p.group("Testing the failure paths (CPU devices)");
    p.value("--inject-delays", "SEED", "random delays in every stream and runtime thread", O::Int,
            [&o](const std::string & f, const std::string & v) {
                o.devices.delay_seed = o.pipeline.fuzz_seed = static_cast<uint64_t>(parse_int(f, v, 1, 1LL << 62));
                o.devices.max_delay_us = o.pipeline.fuzz_max_delay_us = 50;
            },
            [&o]() -> std::optional<std::string> { return o.devices.delay_seed ? std::optional(std::to_string(o.devices.delay_seed)) : std::nullopt; });
    p.not_resumed();
    p.value("--inject-fault", "K:N", "the Nth allocation / copy / launch of device 0 fails (K = alloc, copy, launch)", O::String,
            [&o](const std::string & f, const std::string & v) {
                const size_t colon = v.find(':');
                const std::string kind = v.substr(0, colon);
                const long long n = colon == std::string::npos ? 0 : parse_int(f, v.substr(colon + 1), 1, 1LL << 40);
                if (n == 0 || (kind != "alloc" && kind != "copy" && kind != "launch"))
                    throw rp::Error(f + ": '" + v + "' is not KIND:N (KIND alloc, copy or launch; N >= 1)");
                (kind == "alloc" ? o.devices.faults.alloc_at : kind == "copy" ? o.devices.faults.copy_at : o.devices.faults.launch_at) = n;
            },
            [&o]() -> std::optional<std::string> {
                const FaultPlan & fp = o.devices.faults;
                if (fp.alloc_at) return toml_string("alloc:" + std::to_string(fp.alloc_at));
                if (fp.copy_at) return toml_string("copy:" + std::to_string(fp.copy_at));
                if (fp.launch_at) return toml_string("launch:" + std::to_string(fp.launch_at));
                return std::nullopt;
            });
    p.not_resumed();
    p.value("--inject-dp-fault", "K:R:N",
            "at the start of step N rank R (or 'all') K = die (SIGKILL), hang, or corrupt\n"
            "(flips a bit of its first master: the replica check must catch it)",
            O::String,
            [&j](const std::string & f, const std::string & v) {
                const size_t c1 = v.find(':'), c2 = c1 == std::string::npos ? c1 : v.find(':', c1 + 1);
                if (c2 == std::string::npos) throw rp::Error(f + ": '" + v + "' is not KIND:RANK:STEP");
                RankFault & rf = j.rank_fault;
                rf.kind = v.substr(0, c1);
                if (rf.kind != "die" && rf.kind != "hang" && rf.kind != "corrupt")
                    throw rp::Error(f + ": '" + rf.kind + "' is not die, hang or corrupt");
                const std::string r = v.substr(c1 + 1, c2 - c1 - 1);
                rf.rank = r == "all" ? -1 : static_cast<int>(parse_int(f, r, 0, 1 << 20));
                rf.step = parse_int(f, v.substr(c2 + 1), 1, 1LL << 40);
            },
            [&j]() -> std::optional<std::string> {
                const RankFault & rf = j.rank_fault;
                if (rf.kind.empty()) return std::nullopt;
                return toml_string(rf.kind + ":" + (rf.rank < 0 ? std::string("all") : std::to_string(rf.rank)) + ":" + std::to_string(rf.step));
            });
    p.not_resumed();
}

} // namespace

void declare_finetune_options(Options & p, FinetuneJob & j) {
    declare_model_and_data(p, j);
    declare_adapter(p, j);
    declare_objective(p, j);
    declare_grpo(p, j);
    declare_optimization(p, j);
    declare_evaluation(p, j);
    declare_compute(p, j);
    declare_roundpipe(p, j);
    declare_data_parallel(p, j);
    declare_fault_injection(p, j);
    p.group("");
    p.run_files();
}

const FlagNames & finetune_flag_names() {
    static const FlagNames names = {
        {"lora_rank", "--lora-rank"}, {"lora_alpha", "--lora-alpha"}, {"lora_targets", "--lora-targets"}, {"lora_dropout", "--lora-dropout"},
        {"start_adapter", "--adapter"}, {"host_memory", "--host-mem"}, {"boundary_type", "--boundary-dtype"},
        {"moe_aux_loss", "--moe-aux-loss"}, {"seq_len", "--seq-len"}, {"micro_batches", "--micro-batches"}, {"batch_size", "--batch"},
        {"val_split", "--val-split"}, {"lr_max", "--lr"}, {"lr_min", "--lr-min"}, {"warmup_steps", "--warmup"},
        {"weight_decay", "--weight-decay"}, {"pipeline schedule", "--schedule"}, {"allow_binary", "--allow-binary"},
        {"max_bad_steps", "--max-bad-steps"}, {"timeout_s", "--dp-timeout"}, {"accumulate_groups", "--dp-groups"},
        {"replica_check_every", "--dp-check-every"}, {"sample_every", "--sample-every"}, {"sample_prompt", "--sample-prompt"},
        {"early_stop", "--early-stop"}, {"save_best", "--save-best"}, {"eval_every", "--eval-every"},
        {"method", "--method"}, {"beta", "--beta"}, {"label_smoothing", "--label-smoothing"}, {"gamma", "--gamma"},
        {"orpo_lambda", "--orpo-lambda"}, {"max_prompt_len", "--max-prompt-len"}, {"desirable_weight", "--desirable-weight"},
        {"undesirable_weight", "--undesirable-weight"}, {"rewards", "--reward"}, {"reward_cmd", "--reward-cmd"},
        {"reward_weights", "--reward-weights"}, {"reward_timeout", "--reward-timeout"}, {"group", "--group"},
        {"max_completion_len", "--max-completion-len"}, {"rollout_batch", "--rollout-batch"}, {"iterations", "--iterations"}, {"temperature", "--temp"}, {"top_p", "--top-p"}, {"top_k", "--top-k"},
        {"epsilon_high", "--epsilon-high"}, {"stop", "--stop"}, {"epsilon", "--epsilon"}, {"pack", "--pack"},
        // FinetuneJob::validate
        {"model_path", "-m BASE.gguf"}, {"data_path", "--data FILE"}, {"out_path", "-o OUT.gguf"}, {"devices.count", "--devices N"},
        {"devices.link", "--link"}, {"devices.backend", "--backend"}, {"pipeline.async", "--async"}, {"pipeline.schedule", "--schedule"},
        {"pipeline.dispatch", "--dispatch"}, {"pipeline.device_speed", "--device-speed"}, {"devices.memories", "--device-mem"},
        {"trace_path", "--trace"}, {"token_chunk", "--token-chunk"}, {"max_seq", "--max-seq"}, {"plan_only", "--plan"},
        {"dp.required", "--dp"}, {"dp.link", "--dp-link"}, {"rank_fault", "--inject-dp-fault"}};
    return names;
}

} // namespace rp::cli
