// rp-finetune: LoRA or full finetuning of a GGUF model, on the host (CPU) or pipelined by the RoundPipe
// runtime over N devices (--devices N: CPU virtual devices with a bounded memory and an optional link model,
// or with --backend cuda N logical CUDA devices sharing the visible GPUs, each with its own memory cap).
//
//   rp-finetune -m BASE.gguf --data FILE -o OUT.gguf [options]     (see --help)
//
// Output: OUT.gguf (a llama.cpp LoRA adapter, or with --full the whole model), OUT.gguf.metrics.jsonl (one
// line per step and per evaluation), OUT.gguf.loss.svg (train and validation loss), and the checkpoint
// OUT.gguf.ckpt.gguf (written every --save-every steps and at the end; --resume continues it bit for bit).
// Progress goes to stderr. Every file is written to a temporary name and renamed; on an error nothing is
// left behind but what earlier steps completed.
#include "tools/cli.h"
#include "ggml_rp/core/ggml_rp.h"
#include "ggml_rp/optim/clip.h"
#include "ggml_rp/optim/lr_schedule.h"
#include "ggml_rp/optim/optimizer.h"
#include "gguf/error.h"
#include "gguf/gguf.h"
#include "models/checkpoint.h"
#include "models/dataset.h"
#include "models/finetune.h"
#include "models/finetune_report.h"
#include "models/lora.h"
#include "models/model.h"
#include "models/tokenizer.h"
#include "models/training_program.h"
#include "ggml_rp/roundpipe/pipeline.h"
#include "ggml_rp/roundpipe/trace.h"
#include "ggml_rp/runtime/arena.h"
#include "ggml_rp/runtime/cpu_device.h"
#include "ggml_rp/runtime/link_model.h"
#if defined(RP_HAVE_CUDA)
#include "ggml_rp/cuda/cuda_device.h"
#include "ggml_rp/cuda/cuda_runner.h"
#endif

#include <sys/resource.h>

#include <cerrno>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

void usage(FILE * f) {
    std::fprintf(f,
                 "usage: rp-finetune -m BASE.gguf --data FILE -o OUT.gguf [options]\n"
                 "  -m, --model FILE        base model (llama, qwen2, qwen3; any weight dtype, frozen for LoRA)\n"
                 "      --data FILE         training text (.txt: one token stream) or .jsonl (text / prompt+completion / messages)\n"
                 "  -o, --output FILE       the adapter (or with --full the finetuned model)\n"
                 "      --full              full finetune: every float tensor trainable (fp32 masters)\n"
                 "      --lora-rank N       (default 8)\n"
                 "      --lora-alpha A      (default 16)\n"
                 "      --lora-targets L    comma-separated (default attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down)\n"
                 "      --lora-dropout P    dropout on the LoRA branch input, in [0, 1) (default 0)\n"
                 "      --seq-len N         tokens per sequence (default 64)\n"
                 "      --batch N           sequences per optimizer step (default 8)\n"
                 "      --micro-batches M   split each batch in M parts, gradients accumulated (default 1)\n"
                 "      --optimizer NAME    adamw | sgd (default adamw)\n"
                 "      --lr X              peak learning rate (default 1e-3)\n"
                 "      --lr-min X          final learning rate of linear/cosine decay (default 0)\n"
                 "      --weight-decay X    decoupled weight decay (default 0)\n"
                 "      --momentum X        SGD momentum (default 0)\n"
                 "      --epochs N          passes over the training data (default 1)\n"
                 "      --steps N           optimizer steps (overrides --epochs)\n"
                 "      --stop-at N         stop after step N (checkpoint written), keeping the schedule of --steps\n"
                 "      --warmup N          linear warmup steps (default 0)\n"
                 "      --lr-schedule NAME  cosine | linear | constant (default cosine)\n"
                 "      --clip X            global gradient-norm clipping, 0 = off (default 1)\n"
                 "      --seed N            data order, split and LoRA init (default 42)\n"
                 "  -t, --threads N         CPU threads (default: all)\n"
                 "      --save-every N      write the checkpoint OUT.ckpt.gguf every N steps (it is also written at the end)\n"
                 "      --resume FILE       continue from a checkpoint, or start from an adapter's weights\n"
                 "      --eval-every N      validation loss every N steps (and at the end) when --val-split > 0\n"
                 "      --val-split F       fraction of the sequences held out for validation (default 0)\n"
                 "      --dump-grads FILE   the accumulated gradients of the first step, before clipping (GGUF)\n"
                 "RoundPipe (roundpipe.md): the model stays in host memory, layers stream to the devices round-robin\n"
                 "      --devices N         train through the RoundPipe runtime on N devices (default 0: host)\n"
                 "      --backend NAME      cpu | cuda: CPU virtual devices, or logical CUDA devices over the visible GPUs (default cpu)\n"
                 "      --device-mem SIZE   memory of each device, e.g. 64M (default 256M)\n"
                 "      --link BW,LAT       host<->device link model of the CPU devices, e.g. 32GB/s,10us (default: memcpy speed)\n"
                 "      --schedule NAME     roundpipe | gpipe | 1f1b (default roundpipe; the baselines bind stages to devices)\n"
                 "      --sync | --async    optimizer step synchronous, or overlapped with the next step (staleness 1; default sync)\n"
                 "      --recompute GRAIN   stage | layer: what a backward job recomputes from (default stage)\n"
                 "      --trace FILE        Chrome trace of every stream operation (draw it with rp-trace)\n"
                 "  -h, --help              this text\n");
}

using rp::cli::parse_int;
using rp::cli::parse_float;



std::vector<std::string> split_commas(const std::string & s) {
    std::vector<std::string> out;
    size_t b = 0;
    while (b <= s.size()) {
        const size_t e = std::min(s.find(',', b), s.size());
        if (e > b) out.push_back(s.substr(b, e - b));
        b = e + 1;
    }
    return out;
}

// Mean loss over the unmasked tokens of the given sequences.
double eval_loss(rp::Trainer & tr, const rp::Dataset & data, const std::vector<uint32_t> & idx, int32_t batch, int threads) {
    double sum = 0;
    size_t n = 0;
    for (size_t b = 0; b < idx.size(); b += static_cast<size_t>(batch)) {
        const size_t e = std::min(idx.size(), b + static_cast<size_t>(batch));
        const rp::Batch bt = rp::make_batch(data, std::span<const uint32_t>(idx.data() + b, e - b));
        sum += tr.loss(bt.inputs.data(), bt.labels.data(), bt.seq_len, bt.n_seq, 1.0f, threads);
        n += bt.n_trained();
    }
    return n ? sum / static_cast<double>(n) : 0.0;
}

double peak_rss_mib() {
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

} // namespace

int main(int argc, char ** argv) {
    try {
        std::string model_path, data_path, out_path, resume, dump_grads, optimizer = "adamw", schedule = "cosine";
        std::string link, trace_path, backend = "cpu";
        rp::PipelineOptions popt;
        long long n_devices = 0;
        size_t device_mem = size_t(256) << 20;
        rp::FinetuneConfig cfg;
        long long seq_len = 64, batch = 8, micro = 1, epochs = 1, steps = 0, stop_at = 0, warmup = 0, seed = 42;
        long long threads = 0, save_every = 0, eval_every = 0;
        float lr = 1e-3f, lr_min = 0.0f, wd = 0.0f, momentum = 0.0f, clip = 1.0f, val_split = 0.0f;
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            auto value = [&]() -> std::string {
                if (i + 1 >= argc) throw rp::Error("option " + a + " needs a value");
                return argv[++i];
            };
            if (a == "-m" || a == "--model") model_path = value();
            else if (a == "--data") data_path = value();
            else if (a == "-o" || a == "--output") out_path = value();
            else if (a == "--full") cfg.full = true;
            else if (a == "--lora-rank") cfg.lora_rank = parse_int(a, value(), -(1LL << 30), 1LL << 30);
            else if (a == "--lora-alpha") cfg.lora_alpha = parse_float(a, value());
            else if (a == "--lora-targets") cfg.lora_targets = split_commas(value());
            else if (a == "--lora-dropout") cfg.lora_dropout = parse_float(a, value());
            else if (a == "--seq-len") seq_len = parse_int(a, value(), 1, 1 << 30);
            else if (a == "--batch") batch = parse_int(a, value(), 1, 1 << 20);
            else if (a == "--micro-batches") micro = parse_int(a, value(), 1, 1 << 20);
            else if (a == "--optimizer") optimizer = value();
            else if (a == "--lr") lr = parse_float(a, value());
            else if (a == "--lr-min") lr_min = parse_float(a, value());
            else if (a == "--weight-decay") wd = parse_float(a, value());
            else if (a == "--momentum") momentum = parse_float(a, value());
            else if (a == "--epochs") epochs = parse_int(a, value(), 1, 1 << 20);
            else if (a == "--steps") steps = parse_int(a, value(), 1, 1LL << 40);
            else if (a == "--stop-at") stop_at = parse_int(a, value(), 1, 1LL << 40);
            else if (a == "--warmup") warmup = parse_int(a, value(), 0, 1LL << 40);
            else if (a == "--lr-schedule") schedule = value();
            else if (a == "--schedule") {  // the pipeline schedule; the LR schedule names are accepted for compatibility
                const std::string v = value();
                if (v == "cosine" || v == "linear" || v == "constant") schedule = v;
                else popt.schedule = rp::schedule_from_name(v);
            }
            else if (a == "--devices") n_devices = parse_int(a, value(), 1, 64);
            else if (a == "--backend") backend = value();
            else if (a == "--device-mem") device_mem = rp::cli::parse_size(a, value());
            else if (a == "--link") link = value();
            else if (a == "--sync") popt.async = false;
            else if (a == "--async") popt.async = true;
            else if (a == "--recompute") {
                const std::string v = value();
                if (v == "stage") popt.grain = rp::RecomputeGrain::Stage;
                else if (v == "layer") popt.grain = rp::RecomputeGrain::Layer;
                else throw rp::Error("--recompute: '" + v + "' is not stage or layer");
            }
            else if (a == "--trace") trace_path = value();
            else if (a == "--clip") clip = parse_float(a, value());
            else if (a == "--seed") seed = parse_int(a, value(), 0, (1LL << 62));
            else if (a == "-t" || a == "--threads") threads = parse_int(a, value(), 0, 4096);
            else if (a == "--save-every") save_every = parse_int(a, value(), 0, 1LL << 40);
            else if (a == "--resume") resume = value();
            else if (a == "--eval-every") eval_every = parse_int(a, value(), 0, 1LL << 40);
            else if (a == "--val-split") val_split = parse_float(a, value());
            else if (a == "--dump-grads") dump_grads = value();
            else if (a == "-h" || a == "--help") { usage(stdout); return 0; }
            else throw rp::Error("unknown option '" + a + "' (see --help)");
        }
        if (model_path.empty()) throw rp::Error("no model given (-m BASE.gguf)");
        if (data_path.empty()) throw rp::Error("no training data given (--data FILE)");
        if (out_path.empty()) throw rp::Error("no output given (-o OUT.gguf)");
        if (!cfg.full && cfg.lora_rank < 1) throw rp::Error("--lora-rank must be >= 1, got " + std::to_string(cfg.lora_rank));
        if (micro > batch)
            throw rp::Error("--micro-batches " + std::to_string(micro) + " exceeds --batch " + std::to_string(batch));
        if (clip < 0) throw rp::Error("--clip must be >= 0");
        if (n_devices == 0 && (!link.empty() || !trace_path.empty() || popt.async || popt.schedule != rp::ScheduleKind::RoundPipe))
            throw rp::Error("--link, --trace, --async and --schedule " + std::string(rp::schedule_name(popt.schedule)) +
                            " need --devices N (the RoundPipe runtime)");
        const bool cuda = backend == "cuda";
        if (!cuda && backend != "cpu") throw rp::Error("--backend: '" + backend + "' is not cpu or cuda");
        if (cuda) {
#if defined(RP_HAVE_CUDA)
            if (rp::cuda_device_count() == 0) throw rp::Error("--backend cuda: no CUDA device");
#else
            throw rp::Error("--backend cuda: this build has no CUDA (configure with -DRP_CUDA=ON)");
#endif
            if (n_devices == 0) throw rp::Error("--backend cuda needs --devices N (the RoundPipe runtime)");
            if (!link.empty()) throw rp::Error("--link models the CPU devices' link; it does not apply to --backend cuda");
        }
        std::optional<rp::LinkModel> link_model;
        if (!link.empty()) link_model = rp::LinkModel::parse(link);
        cfg.seed = static_cast<uint64_t>(seed);

        rp::OptimizerConfig ocfg;
        ocfg.kind = rp::optimizer_kind_from_name(optimizer);
        ocfg.adamw.weight_decay = wd;
        ocfg.sgd.weight_decay = wd;
        ocfg.sgd.momentum = momentum;
        rp::LrSchedule sched;
        sched.decay = rp::lr_decay_from_name(schedule);
        sched.lr_max = lr;
        sched.lr_min = lr_min;
        sched.warmup_steps = warmup;

        // Setup: everything that can fail on bad input happens before any file is written.
        auto model = rp::Model::load(model_path);
        rp::Trainer tr(*model, cfg);
        rp::Tokenizer tok(model->file());
        rp::DatasetOptions dopt;
        dopt.seq_len = static_cast<int32_t>(seq_len);
        dopt.n_ctx = model->hparams().n_ctx_train;
        const rp::Dataset data = rp::Dataset::load(data_path, tok, dopt);
        const rp::DatasetSplit split = rp::split_dataset(data.size(), val_split, static_cast<uint64_t>(seed));
        rp::Batcher batcher(data, split.train, static_cast<int32_t>(batch), static_cast<uint64_t>(seed));
        const int64_t steps_per_epoch = (static_cast<int64_t>(split.train.size()) + batch - 1) / batch;
        const int64_t total = steps > 0 ? steps : epochs * steps_per_epoch;
        sched.total_steps = total;
        sched.validate();
        rp::Optimizer opt(ocfg);
        std::vector<size_t> slot;
        for (const rp::Trainer::Param & p : tr.params()) slot.push_back(opt.add_param(p.name, static_cast<size_t>(p.t->nelements())));

        rp::CheckpointState st;
        if (!resume.empty()) {
            const std::string type = gguf::Reader::open(resume)->get_string_or("general.type", "");
            if (type == "adapter") {
                if (cfg.full) throw rp::Error(resume + ": a LoRA adapter cannot start a full finetune (--full)");
                auto init = rp::LoraAdapter::load(resume, *model);  // validates it against this base
                for (const rp::LoraTensor & t : tr.adapter()->tensors()) {
                    const rp::LoraTensor * s = init->find(t.base);
                    if (!s || s->a->nelements() != t.a->nelements() || s->b->nelements() != t.b->nelements())
                        throw rp::Error(resume + ": has no pair of rank " + std::to_string(cfg.lora_rank) + " for '" + t.base +
                                        "' (the adapter must match --lora-rank and --lora-targets)");
                    rp::tensor_set_f32(t.a, rp::tensor_get_f32(s->a));
                    rp::tensor_set_f32(t.b, rp::tensor_get_f32(s->b));
                }
                std::fprintf(stderr, "starting from the weights of adapter %s\n", resume.c_str());
            } else {
                st = rp::load_checkpoint(resume, tr, opt);
                batcher.seek(st.data);
                std::fprintf(stderr, "resumed %s at step %lld\n", resume.c_str(), static_cast<long long>(st.step));
            }
        }

        // The RoundPipe runtime (after --resume, so that it starts from the resumed masters).
        rp::TraceRecorder recorder;
        std::unique_ptr<rp::ModelProgram> program;
        std::vector<std::unique_ptr<rp::CpuDevice>> devices;
#if defined(RP_HAVE_CUDA)
        std::vector<std::unique_ptr<rp::CudaDevice>> cuda_devices;
#endif
        std::vector<rp::RunnerAttachment> runners;  // the CUDA devices' graph runners: gone before the devices
        std::unique_ptr<rp::Pipeline> pipe;
        if (n_devices > 0) {
            program = std::make_unique<rp::ModelProgram>(tr);
            std::vector<rp::Device *> ptrs;
#if defined(RP_HAVE_CUDA)
            if (cuda) {
                cuda_devices = rp::make_cuda_devices(static_cast<int>(n_devices), device_mem,
                                                     trace_path.empty() ? rp::OpHook{} : recorder.hook());
                runners = rp::attach_cuda_runners(cuda_devices);
                for (const auto & d : cuda_devices) {
                    ptrs.push_back(d.get());
                    recorder.name_device(d->index(), d->name());
                }
            }
#endif
            for (long long i = 0; i < n_devices && !cuda; ++i) {
                rp::CpuDeviceOptions o;
                o.memory_bytes = device_mem;
                o.link = link_model;
                if (!trace_path.empty()) o.hook = recorder.hook();
                devices.push_back(std::make_unique<rp::CpuDevice>(static_cast<int>(i), o));
                ptrs.push_back(devices.back().get());
                recorder.name_device(static_cast<int>(i), devices.back()->name());
            }
            const long long hw = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
            popt.threads_per_device = static_cast<int>(std::max<long long>(1, hw / n_devices));
            pipe = std::make_unique<rp::Pipeline>(*program, ptrs, popt);
            std::fprintf(stderr, "RoundPipe: %lld %s devices x %s%s, schedule %s, %s steps, recompute %s\n", n_devices,
                         cuda ? "CUDA" : "CPU",
                         rp::format_bytes(device_mem).c_str(), link_model ? (", link " + link_model->to_string()).c_str() : "",
                         rp::schedule_name(popt.schedule), popt.async ? "async" : "sync",
                         popt.grain == rp::RecomputeGrain::Layer ? "layer" : "stage");
        }
        // Before evaluating or saving: every pending update applied, working weights = masters.
        auto sync_pipe = [&] {
            if (pipe) pipe->synchronize();
        };

        const int64_t end_step = stop_at > 0 ? std::min<int64_t>(stop_at, total) : total;
        const std::string ckpt_path = out_path + ".ckpt.gguf";
        const std::string metrics_path = out_path + ".metrics.jsonl";
        FILE * metrics = std::fopen(metrics_path.c_str(), st.step > 0 ? "a" : "w");
        if (!metrics) throw rp::Error(metrics_path + ": cannot open for writing: " + std::strerror(errno));
        std::fprintf(stderr, "%s: %zu sequences of %lld tokens (%zu train, %zu validation), %zu trainable tensors, %lld steps\n",
                     data_path.c_str(), data.size(), seq_len, split.train.size(), split.val.size(), tr.params().size(),
                     static_cast<long long>(total));

        std::atomic<double> last_norm{std::nan("")};
        const auto t_run = std::chrono::steady_clock::now();
        double tokens_done = 0;
        const int64_t first_step = st.step;
        auto evaluate = [&](int64_t step) {
            if (split.val.empty()) return;
            sync_pipe();
            const double vl = eval_loss(tr, data, split.val, static_cast<int32_t>(batch), static_cast<int>(threads));
            st.curve.eval_step.push_back(static_cast<int32_t>(step));
            st.curve.eval_loss.push_back(static_cast<float>(vl));
            std::fprintf(metrics, "{\"step\":%lld,\"val_loss\":%.6f,\"val_ppl\":%.4f}\n", static_cast<long long>(step), vl, std::exp(vl));
            std::fflush(metrics);
            std::fprintf(stderr, "eval step %lld: val loss %.4f, ppl %.3f\n", static_cast<long long>(step), vl, std::exp(vl));
        };
        if (first_step == 0 && eval_every > 0) evaluate(0);

        for (int64_t step = st.step; step < end_step; ++step) {
            const auto t0 = std::chrono::steady_clock::now();
            const rp::Batch bt = batcher.next();
            const size_t n_trained = bt.n_trained();
            const float loss_scale = n_trained ? 1.0f / static_cast<float>(n_trained) : 0.0f;
            // The update: global-norm clipping and the optimizer on the fp32 masters. With the pipeline it runs
            // on its optimizer thread once every gradient is complete (in async mode after step() returned).
            const float cur_lr = sched.lr(step);
            auto update = [&tr, &opt, &slot, &dump_grads, &last_norm, clip, cur_lr, n_trained, step, first = first_step] {
                if (step == first && !dump_grads.empty()) {
                    gguf::Writer w;
                    w.set_string("general.type", "rp.gradients");
                    for (const rp::Trainer::Param & p : tr.params()) {
                        const int64_t ne[2] = {p.t->ne[0], p.t->ne[1]};
                        w.add_tensor(p.name, rp::DType::F32, 2, ne, p.t->grad->data);
                    }
                    w.write(dump_grads);
                }
                std::vector<std::span<float>> grads;
                for (const rp::Trainer::Param & p : tr.params())
                    grads.emplace_back(p.t->grad->data_as<float>(), static_cast<size_t>(p.t->nelements()));
                std::vector<std::span<const float>> cgrads(grads.begin(), grads.end());
                const double norm = clip > 0 ? rp::clip_grad_norm(grads, clip) : rp::grad_norm(cgrads);
                last_norm.store(norm);
                if (std::isfinite(norm) && n_trained > 0) {
                    for (size_t i = 0; i < tr.params().size(); ++i) {
                        const rp::Trainer::Param & p = tr.params()[i];
                        opt.update(slot[i], std::span<float>(p.t->data_as<float>(), static_cast<size_t>(p.t->nelements())),
                                   cgrads[i], cur_lr);
                    }
                    opt.end_step();
                } else {
                    std::fprintf(stderr, "warning: step %lld skipped (gradient norm %g, %zu trained tokens)\n",
                                 static_cast<long long>(step + 1), norm, n_trained);
                }
            };
            double loss = 0;
            if (pipe) {
                std::vector<rp::MicroBatch> mbs;
                for (long long mb = 0; mb < micro; ++mb) {
                    const int64_t lo = bt.n_seq * mb / micro, hi = bt.n_seq * (mb + 1) / micro;
                    if (hi == lo) continue;
                    const size_t off = static_cast<size_t>(lo * bt.seq_len);
                    rp::MicroBatch m;
                    m.ids = bt.inputs.data() + off;
                    m.labels = bt.labels.data() + off;
                    m.info.seq_len = bt.seq_len;
                    m.info.n_seq = hi - lo;
                    m.info.seq_offset = lo;
                    m.info.step = step;
                    m.info.loss_scale = loss_scale;
                    mbs.push_back(m);
                }
                loss = pipe->forward_backward(mbs);
                pipe->step(update);
            } else {
                tr.zero_grads();
                for (long long mb = 0; mb < micro; ++mb) {  // micro-batch mb: sequences [lo, hi)
                    const int64_t lo = bt.n_seq * mb / micro, hi = bt.n_seq * (mb + 1) / micro;
                    if (hi == lo) continue;
                    const size_t off = static_cast<size_t>(lo * bt.seq_len);
                    loss += tr.accumulate(bt.inputs.data() + off, bt.labels.data() + off, bt.seq_len, hi - lo, loss_scale,
                                          static_cast<int>(threads), step, lo);
                }
                tr.collect_grads();
                update();
            }
            const double norm = last_norm.load();
            st.step = step + 1;
            st.data = batcher.position();
            st.curve.train_loss.push_back(static_cast<float>(loss));

            const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            const double ntok = static_cast<double>(bt.n_seq) * bt.seq_len;
            tokens_done += ntok;
            const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_run).count();
            const double eta = elapsed / static_cast<double>(st.step - first_step) * static_cast<double>(end_step - st.step);
            std::fprintf(stderr, "step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s | ETA %.1fs\n",
                         static_cast<long long>(st.step), static_cast<long long>(total), loss, cur_lr, norm, ntok / dt, eta);
            std::fprintf(metrics, "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.6f,\"tokens_per_s\":%.1f}\n",
                         static_cast<long long>(st.step), loss, cur_lr, norm, ntok / dt);
            std::fflush(metrics);
            if (eval_every > 0 && st.step % eval_every == 0 && st.step != end_step) evaluate(st.step);
            if (save_every > 0 && st.step % save_every == 0 && st.step != end_step) {
                sync_pipe();
                save_checkpoint(ckpt_path, tr, opt, st);
            }
        }
        if (eval_every > 0 && (st.curve.eval_step.empty() || st.curve.eval_step.back() != st.step)) evaluate(st.step);
        std::fclose(metrics);
        sync_pipe();
        if (pipe && !trace_path.empty()) {
            const rp::Trace trace = recorder.snapshot();
            rp::write_chrome_trace(trace_path, trace);
            const rp::TraceStats ts = rp::analyse_trace(trace);
            std::fprintf(stderr, "trace %s: %zu operations on %d devices, bubble ratio %.1f%%, exposed communication %.1f%%\n",
                         trace_path.c_str(), trace.events.size(), ts.devices, 100.0 * ts.bubble_ratio, 100.0 * ts.exposed_comm_fraction);
        }

        save_checkpoint(ckpt_path, tr, opt, st);
        tr.save(out_path);
        rp::write_loss_svg(out_path + ".loss.svg", st.curve);

        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_run).count();
        const auto & tl = st.curve.train_loss;
        std::fprintf(stderr, "done: %lld steps in %.2f s, %.0f tok/s; loss %.4f -> %.4f", static_cast<long long>(st.step - first_step),
                     secs, secs > 0 ? tokens_done / secs : 0.0, tl.empty() ? 0.0 : tl.front(), tl.empty() ? 0.0 : tl.back());
        if (!st.curve.eval_loss.empty())
            std::fprintf(stderr, "; val loss %.4f -> %.4f (ppl %.3f -> %.3f)", st.curve.eval_loss.front(), st.curve.eval_loss.back(),
                         std::exp(st.curve.eval_loss.front()), std::exp(st.curve.eval_loss.back()));
        std::fprintf(stderr, "; peak graph %.1f KiB, peak RSS %.1f MiB\nwrote %s\n", static_cast<double>(tr.peak_graph_bytes()) / 1024.0,
                     peak_rss_mib(), out_path.c_str());
        return 0;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
