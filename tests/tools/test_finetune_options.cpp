// rp-finetune's declared options (tools/finetune_options.cpp): every flag parses to the value the old
// hand-written parser gave on the same input (one table; a check that the table covers every declared flag),
// bad values fail in the tools' wording, the run file reads back to the same configuration and reports the
// file, line and key at fault, and --help documents exactly the declared flags.
#include "tools/finetune_options.h"

#include "base/error.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using rp::FinetuneJob;

// Parses a command line ("--lora-rank 4 --full") into a fresh job.
struct Parsed {
    FinetuneJob job;
    rp::cli::Options opts{"rp-finetune", "usage: rp-finetune"};
    Parsed() { rp::cli::declare_finetune_options(opts, job); }
    bool parse(const std::vector<std::string> & args) {
        std::vector<char *> argv{const_cast<char *>("rp-finetune")};
        for (const std::string & a : args) argv.push_back(const_cast<char *>(a.c_str()));
        return opts.parse(static_cast<int>(argv.size()), argv.data());
    }
};

std::vector<std::string> words(const std::string & s) {
    std::istringstream in(s);
    std::vector<std::string> out;
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}

std::string parse_error(const std::string & args) {
    Parsed p;
    try {
        p.parse(words(args));
    } catch (const rp::Error & e) {
        return e.what();
    }
    return "(no error)";
}

std::string run_file_error(const std::string & text) {
    Parsed p;
    try {
        p.opts.read_run_text(text, "run.toml");
    } catch (const rp::Error & e) {
        return e.what();
    }
    return "(no error)";
}

struct Row {
    std::string args;
    std::function<void(const FinetuneJob &)> check;
};

} // namespace

TEST(FinetuneOptions, EveryFlagParsesAsTheOldParserDid) {
    const std::vector<Row> rows = {
        {"-m base.gguf --data d.txt -o out.gguf", [](const FinetuneJob & j) {
             EXPECT_EQ(j.model_path, "base.gguf");
             EXPECT_EQ(j.data_path, "d.txt");
             EXPECT_EQ(j.loop.out_path, "out.gguf");
         }},
        {"--model m.gguf --file f.jsonl --output o.gguf", [](const FinetuneJob & j) {  // llama.cpp's --file
             EXPECT_EQ(j.model_path, "m.gguf");
             EXPECT_EQ(j.data_path, "f.jsonl");
             EXPECT_EQ(j.loop.out_path, "o.gguf");
         }},
        {"--seq-len 16", [](const FinetuneJob & j) { EXPECT_EQ(j.seq_len, 16); }},
        {"--ctx-size 32", [](const FinetuneJob & j) { EXPECT_EQ(j.seq_len, 32); }},
        {"-c 48", [](const FinetuneJob & j) { EXPECT_EQ(j.seq_len, 48); }},
        {"--train-analysis", [](const FinetuneJob & j) { EXPECT_TRUE(j.train_analysis); }},
        {"--allow-binary --train-on-inputs", [](const FinetuneJob & j) {
             EXPECT_TRUE(j.allow_binary);
             EXPECT_TRUE(j.train_on_inputs);
         }},
        {"--chat-template chatml", [](const FinetuneJob & j) { EXPECT_EQ(j.chat_template, "chatml"); }},
        {"--chat-template-file t.jinja", [](const FinetuneJob & j) { EXPECT_EQ(j.chat_template, "t.jinja"); }},
        {"--no-pack", [](const FinetuneJob & j) { EXPECT_EQ(j.pack, false); }},
        {"--no-pack --pack", [](const FinetuneJob & j) { EXPECT_EQ(j.pack, true); }},  // the last one wins
        {"--full", [](const FinetuneJob & j) { EXPECT_TRUE(j.session.finetune.full); }},
        {"--lora-rank 4 --lora-alpha 8 --lora-dropout 0.1", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.finetune.lora_rank, 4);
             EXPECT_EQ(j.session.finetune.lora_alpha, 8.0f);
             EXPECT_EQ(j.session.finetune.lora_dropout, 0.1f);
         }},
        {"--lora-rank=6", [](const FinetuneJob & j) { EXPECT_EQ(j.session.finetune.lora_rank, 6); }},
        {"--lora-targets attn_q,,ffn_down", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.finetune.lora_targets, (std::vector<std::string>{"attn_q", "ffn_down"}));
         }},
        {"--moe-aux-loss 0.01", [](const FinetuneJob & j) { EXPECT_EQ(j.session.finetune.moe_aux_loss, 0.01f); }},
        {"--batch 2 --micro-batches 2", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.batch, 2);
             EXPECT_EQ(j.session.micro_batches, 2);
         }},
        {"--optimizer sgd --momentum 0.9 --weight-decay 0.1", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.optimizer.kind, rp::OptimizerKind::Sgd);
             EXPECT_EQ(j.session.optimizer.sgd.momentum, 0.9);
             EXPECT_EQ(j.session.optimizer.sgd.weight_decay, 0.1);
             EXPECT_EQ(j.session.optimizer.adamw.weight_decay, 0.1);
         }},
        {"--optimizer-state bf16", [](const FinetuneJob & j) { EXPECT_TRUE(j.session.optimizer.bf16_state); }},
        // Rates are doubles, read as doubles (the old parser rounded them to floats first).
        {"--lr 2e-3 --lr-min 1e-5 --lr-schedule linear --warmup 2", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.lr.lr_max, 2e-3);
             EXPECT_EQ(j.session.lr.lr_min, 1e-5);
             EXPECT_EQ(j.session.lr.decay, rp::LrDecay::Linear);
             EXPECT_EQ(j.session.lr.warmup_steps, 2);
         }},
        {"--learning-rate 3e-4 --learning-rate-min 1e-6", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.lr.lr_max, 3e-4);
             EXPECT_EQ(j.session.lr.lr_min, 1e-6);
         }},
        {"--epochs 3 --steps 7 --stop-at 4 --clip 0 --max-bad-steps 5", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.epochs, 3);
             EXPECT_EQ(j.session.steps, 7);
             EXPECT_EQ(j.loop.stop_at, 4);
             EXPECT_EQ(j.session.clip, 0.0f);
             EXPECT_EQ(j.session.max_bad_steps, 5);
         }},
        {"--seed 5", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.finetune.seed, 5u);
         }},
        {"-s 6 -t 3", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.finetune.seed, 6u);
             EXPECT_EQ(j.session.threads, 3);
         }},
        {"-t2", [](const FinetuneJob & j) { EXPECT_EQ(j.session.threads, 2); }},
        {"--threads 0", [](const FinetuneJob & j) { EXPECT_EQ(j.session.threads, 0); }},
        {"--val-split 0.25 --eval-every 4 --early-stop 2 --save-best --save-every 3", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.val_split, 0.25);
             EXPECT_EQ(j.loop.eval_every, 4);
             EXPECT_EQ(j.loop.early_stop, 2);
             EXPECT_TRUE(j.loop.save_best);
             EXPECT_EQ(j.loop.save_every, 3);
         }},
        {"--resume r.ckpt.gguf --dump-grads g.gguf", [](const FinetuneJob & j) {
             EXPECT_EQ(j.resume_path, "r.ckpt.gguf");
             EXPECT_EQ(j.session.dump_grads, "g.gguf");
         }},
        {"--sample-every 2 --sample-prompt a --sample-prompt b --sample-tokens 5", [](const FinetuneJob & j) {
             EXPECT_EQ(j.loop.sample_every, 2);
             EXPECT_EQ(j.loop.sample_prompts, (std::vector<std::string>{"a", "b"}));
             EXPECT_EQ(j.loop.sample_tokens, 5);
         }},
        {"--activation-memory 0", [](const FinetuneJob & j) { EXPECT_EQ(j.session.finetune.activation_memory, 0u); }},
        {"--host-mem 12G", [](const FinetuneJob & j) { EXPECT_EQ(j.host_memory, size_t(12) << 30); }},
        {"--adapter a.gguf", [](const FinetuneJob & j) { EXPECT_EQ(j.session.finetune.start_adapter, "a.gguf"); }},
        {"--method simpo --beta 2.5 --label-smoothing 0.1 --gamma 0.3 --max-prompt-len 128", [](const FinetuneJob & j) {
             const auto p = j.session_options().finetune.preference;
             ASSERT_TRUE(p.has_value());
             EXPECT_EQ(p->method, rp::PreferenceMethod::Simpo);
             EXPECT_EQ(p->beta, 2.5);
             EXPECT_EQ(p->label_smoothing, 0.1);
             EXPECT_EQ(p->gamma, 0.3);
             EXPECT_EQ(j.max_prompt_len, 128);
         }},
        {"--method orpo --orpo-lambda 0.25", [](const FinetuneJob & j) {
             const auto p = j.session_options().finetune.preference;
             ASSERT_TRUE(p.has_value());
             EXPECT_EQ(p->method, rp::PreferenceMethod::Orpo);
             EXPECT_EQ(p->beta, 0.25);  // ORPO's lambda is the op's beta
         }},
        {"--method sft", [](const FinetuneJob & j) { EXPECT_FALSE(j.session_options().finetune.preference.has_value()); }},
        {"--method kto --desirable-weight 1.5 --undesirable-weight 0.75", [](const FinetuneJob & j) {
             const auto p = j.session_options().finetune.preference;
             ASSERT_TRUE(p.has_value());
             EXPECT_EQ(p->method, rp::PreferenceMethod::Kto);
             EXPECT_EQ(p->desirable_weight, 1.5);
             EXPECT_EQ(p->undesirable_weight, 0.75);
         }},
        {"--method grpo --reward exact:answer --reward regex:x --reward-cmd ./score --reward-timeout 5 --reward-weights 1,0.5,2 --group 4 "
         "--max-completion-len 32 --temp 0.7 --top-p 0.9 --top-k 20 --epsilon 0.1 --epsilon-high 0.28 --loss-type dr_grpo --no-scale-rewards "
         "--beta 0.04 --stop . --stop END --rollout-batch 2 --iterations 3",
         [](const FinetuneJob & j) {
             EXPECT_FALSE(j.session_options().finetune.preference.has_value());
             const auto g = j.grpo_options();
             EXPECT_EQ(j.rewards, (std::vector<std::string>{"exact:answer", "regex:x"}));
             EXPECT_EQ(j.reward_cmd, "./score");
             EXPECT_EQ(j.reward_timeout, 5.0);
             EXPECT_EQ(j.reward_weights, (std::vector<std::string>{"1", "0.5", "2"}));
             EXPECT_EQ(g.group, 4);
             EXPECT_EQ(g.max_completion_len, 32);
             EXPECT_EQ(g.temperature, 0.7f);
             EXPECT_EQ(g.top_p, 0.9f);
             EXPECT_EQ(g.top_k, 20);
             EXPECT_EQ(g.loss.epsilon_low, 0.1);
             EXPECT_EQ(g.loss.epsilon_high, 0.28);
             EXPECT_EQ(g.loss.beta, 0.04);
             EXPECT_EQ(g.loss_type, rp::GrpoLossType::DrGrpo);
             EXPECT_EQ(g.rollout_batch, 2);
             EXPECT_EQ(g.iterations, 3);
             EXPECT_FALSE(g.loss.on_policy);  // (the later updates: a ratio against the sampling policy)
             EXPECT_FALSE(g.scale_rewards);
             EXPECT_EQ(g.stop, (std::vector<std::string>{".", "END"}));
             ASSERT_TRUE(j.session_options().finetune.grpo.has_value());
             EXPECT_EQ(j.session_options().finetune.grpo->beta, 0.04);
         }},
        {"--method grpo", [](const FinetuneJob & j) {  // TRL's defaults: no KL term, clip 0.2, bnpo
             const auto g = j.grpo_options();
             EXPECT_EQ(g.loss.beta, 0.0);
             EXPECT_EQ(g.loss.epsilon_high, 0.2);
             EXPECT_EQ(g.loss_type, rp::GrpoLossType::Bnpo);
             EXPECT_TRUE(g.scale_rewards);
         }},
        {"--method dpo", [](const FinetuneJob & j) { EXPECT_EQ(j.session_options().finetune.preference->beta, 0.1); }},
        {"--no-scale-rewards --scale-rewards", [](const FinetuneJob & j) { EXPECT_TRUE(j.grpo.scale_rewards); }},
        {"--activation-memory 1.5G", [](const FinetuneJob & j) { EXPECT_EQ(j.session.finetune.activation_memory, size_t(3) << 29); }},
        {"--token-chunk auto", [](const FinetuneJob & j) { EXPECT_EQ(j.token_chunk, -1); }},
        {"--token-chunk 0", [](const FinetuneJob & j) { EXPECT_EQ(j.token_chunk, 0); }},
        {"--boundary-dtype bf16", [](const FinetuneJob & j) { EXPECT_EQ(j.session.finetune.boundary_type, rp::DType::BF16); }},
        {"--rollout-matvec exact", [](const FinetuneJob & j) { EXPECT_EQ(j.grpo.rollout_matvec, rp::RolloutMatvec::Exact); }},
        {"--rollout-matvec fast", [](const FinetuneJob & j) { EXPECT_EQ(j.grpo.rollout_matvec, rp::RolloutMatvec::Fast); }},
        {"--attention-type f16 --f32-gemm f32", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.finetune.attention_type, rp::DType::F16);
             EXPECT_FALSE(j.session.devices.tf32_gemm);
         }},
        {"--profile-ops --plan --max-seq", [](const FinetuneJob & j) {
             EXPECT_TRUE(j.profile_ops);
             EXPECT_TRUE(j.plan_only);
             EXPECT_TRUE(j.max_seq);
         }},
        {"--devices 2 --backend cuda --device-mem 64M --link 32GB/s,10us", [](const FinetuneJob & j) {
             EXPECT_TRUE(j.session.pipelined);
             EXPECT_EQ(j.session.devices.count, 2);
             EXPECT_EQ(j.session.devices.backend, "cuda");
             EXPECT_EQ(j.session.devices.memory_each, size_t(64) << 20);
             EXPECT_EQ(j.link, "32GB/s,10us");
         }},
        {"--schedule 1f1b --async --recompute layer --resident-weights off --trace t.json", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.pipeline.schedule, rp::ScheduleKind::OneFOneB);
             EXPECT_TRUE(j.session.pipeline.async);
             EXPECT_EQ(j.session.pipeline.grain, rp::RecomputeGrain::Layer);
             EXPECT_FALSE(j.session.pipeline.resident_weights);
             EXPECT_EQ(j.trace_path, "t.json");
         }},
        {"--async --sync", [](const FinetuneJob & j) { EXPECT_FALSE(j.session.pipeline.async); }},
        {"--vocab-on-host on", [](const FinetuneJob & j) { EXPECT_EQ(j.session.pipeline.vocab_on_host, 1); }},
        {"--vocab-on-host off --vocab-on-host auto", [](const FinetuneJob & j) { EXPECT_EQ(j.session.pipeline.vocab_on_host, -1); }},
        {"--devices 3 --dispatch round-robin --device-speed 1,0.5,2", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.pipeline.dispatch, rp::DispatchKind::RoundRobin);
             EXPECT_EQ(j.session.pipeline.device_speed, (std::vector<double>{1, 0.5, 2}));
         }},
        {"--devices 4 --device-mem 24G,16G,16G,1.5G", [](const FinetuneJob & j) {
             const size_t G = size_t(1) << 30;
             EXPECT_EQ(j.session.devices.memories, (std::vector<size_t>{24 * G, 16 * G, 16 * G, 3 * G / 2}));
         }},
        {"--devices 2 --device-mem 8M,4M --device-mem 64M", [](const FinetuneJob & j) {  // one size again: every device's
             EXPECT_TRUE(j.session.devices.memories.empty());
             EXPECT_EQ(j.session.devices.memory_each, size_t(64) << 20);
         }},
        {"--devices 2", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.pipeline.dispatch, rp::DispatchKind::Ready);
             EXPECT_TRUE(j.session.pipeline.device_speed.empty());
         }},
        {"--pin register", [](const FinetuneJob & j) { EXPECT_EQ(j.session.pipeline.frozen_pinning, rp::FrozenPinning::Register); }},
        {"--pin off", [](const FinetuneJob & j) { EXPECT_EQ(j.session.pipeline.frozen_pinning, rp::FrozenPinning::Pageable); }},
        {"--devices 2", [](const FinetuneJob & j) { EXPECT_FALSE(j.session.pipeline.frozen_pinning.has_value()); }},
        {"--dp --dp-timeout 2.5 --dp-check-every 7 --dp-link 25Gbit/s,10us --dp-groups 3", [](const FinetuneJob & j) {
             EXPECT_TRUE(j.dp.required);
             EXPECT_EQ(j.dp.timeout_s, 2.5);
             EXPECT_EQ(j.dp.check_every, 7);
             EXPECT_EQ(j.dp.link, "25Gbit/s,10us");
             EXPECT_EQ(j.session.accumulate_groups, 3);
         }},
        {"--inject-delays 9 --inject-fault copy:25 --inject-dp-fault corrupt:all:3", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.devices.delay_seed, 9u);
             EXPECT_EQ(j.session.pipeline.fuzz_seed, 9u);
             EXPECT_EQ(j.session.devices.max_delay_us, 50.0);
             EXPECT_EQ(j.session.pipeline.fuzz_max_delay_us, 50.0);
             EXPECT_EQ(j.session.devices.faults.copy_at, 25);
             EXPECT_EQ(j.rank_fault.kind, "corrupt");
             EXPECT_EQ(j.rank_fault.rank, -1);
             EXPECT_EQ(j.rank_fault.step, 3);
         }},
        {"--inject-fault alloc:1 --inject-dp-fault die:1:4", [](const FinetuneJob & j) {
             EXPECT_EQ(j.session.devices.faults.alloc_at, 1);
             EXPECT_EQ(j.rank_fault.rank, 1);
         }},
    };
    std::set<std::string> covered;
    for (const Row & r : rows) {
        Parsed p;
        ASSERT_NO_THROW(ASSERT_TRUE(p.parse(words(r.args)))) << r.args;
        r.check(p.job);
        for (const std::string & w : words(r.args)) {
            const std::string name = w.substr(0, w.find('='));
            if (name.rfind("--", 0) == 0) covered.insert(name);
        }
    }
    // Every declared flag is in the table (but --help and the run-file flags, tested below).
    Parsed p;
    for (const std::string & name : p.opts.long_names()) {
        const bool run_file_flag = name == "--help" || name == "--config" || name == "--print-config";
        EXPECT_TRUE(run_file_flag || covered.count(name)) << name << " has no row";
    }
}

TEST(FinetuneOptions, BadValuesFailInTheToolsWording) {
    EXPECT_EQ(parse_error("--lora-rank 0"), "--lora-rank: '0' is not an integer in [1, 1048576]");
    EXPECT_EQ(parse_error("--lora-rank four"), "--lora-rank: 'four' is not an integer in [1, 1048576]");
    EXPECT_EQ(parse_error("--lora-dropout 1"), "--lora-dropout: '1' is not a number in [0, 0.999999]");
    EXPECT_EQ(parse_error("--frobnicate"), "unknown option '--frobnicate' (see --help)");
    EXPECT_EQ(parse_error("--lora-rank"), "option --lora-rank needs a value");
    EXPECT_EQ(parse_error("stray"), "unexpected argument 'stray' (options take the form --name VALUE; see --help)");
    EXPECT_EQ(parse_error("--device-mem 12Q"), "--device-mem: '12Q' is not a size (e.g. 4096, 64M, 1.5G)");
    EXPECT_EQ(parse_error("--device-mem 8M,,4M"), "--device-mem: '' is not a size (e.g. 4096, 64M, 1.5G)");
    EXPECT_EQ(parse_error("--device-speed 1,2,"), "--device-speed: '' is not a number");
    EXPECT_EQ(parse_error("--backend tpu"), "--backend: 'tpu' is not one of cpu, cuda");
    EXPECT_EQ(parse_error("--pin pinned"), "--pin: 'pinned' is not one of alloc, register, off");
    EXPECT_EQ(parse_error("--optimizer-state fp8"), "--optimizer-state: 'fp8' is not one of f32, bf16");
    EXPECT_EQ(parse_error("--boundary-dtype f16"), "--boundary-dtype: 'f16' is not one of f32, bf16");
    EXPECT_EQ(parse_error("--vocab-on-host yes"), "--vocab-on-host: 'yes' is not one of auto, on, off");
    EXPECT_EQ(parse_error("--rollout-matvec quick"), "--rollout-matvec: 'quick' is not one of auto, fast, exact");
    EXPECT_EQ(parse_error("--lr nan"), "--lr: 'nan' is not a number");
    EXPECT_EQ(parse_error("--inject-fault disk:3"), "--inject-fault: 'disk:3' is not KIND:N (KIND alloc, copy or launch; N >= 1)");
    EXPECT_NE(parse_error("--schedule cosine").find("the learning-rate schedule is --lr-schedule"), std::string::npos);
}

TEST(FinetuneOptions, ARunFileReadsBackToTheSameConfiguration) {
    Parsed a;
    ASSERT_TRUE(a.parse(words("-m m.gguf --data d.jsonl -o o.gguf --lora-rank 4 --lr 2e-4 --weight-decay 0.1 --sample-prompt x "
                              "--sample-prompt \"y --no-pack --devices 3 --async --pin off --token-chunk auto --vocab-on-host on --inject-fault launch:7")));
    const std::string text = a.opts.run_file();
    Parsed b;
    b.opts.read_run_text(text, "printed.toml");
    EXPECT_EQ(b.opts.run_file(), text);
    EXPECT_EQ(b.opts.values(), a.opts.values());
    EXPECT_EQ(b.job.session.lr.lr_max, 2e-4);
    EXPECT_EQ(b.job.loop.sample_prompts, (std::vector<std::string>{"x", "\"y"}));
    EXPECT_EQ(b.job.token_chunk, -1);
    EXPECT_EQ(b.job.session.pipeline.vocab_on_host, 1);
    EXPECT_EQ(b.job.session.pipeline.frozen_pinning, rp::FrozenPinning::Pageable);
    // The defaults that are not floats (AdamW's weight decay 0.01) read back to the same double.
    Parsed d, e;
    e.opts.read_run_text(d.opts.run_file(), "defaults.toml");
    EXPECT_EQ(e.job.session.optimizer.adamw.weight_decay, d.job.session.optimizer.adamw.weight_decay);
    EXPECT_EQ(e.opts.values(), d.opts.values());
}

TEST(FinetuneOptions, TheCommandLineOverridesTheRunFile) {
    Parsed p;
    p.opts.read_run_text("lora-rank = 4\nsample-prompt = [\"a\", \"b\"]\nasync = true\n", "run.toml");
    ASSERT_TRUE(p.parse(words("--lora-rank 6 --sample-prompt c --sync")));
    EXPECT_EQ(p.job.session.finetune.lora_rank, 6);
    EXPECT_EQ(p.job.loop.sample_prompts, std::vector<std::string>{"c"});  // replaced, not extended
    EXPECT_FALSE(p.job.session.pipeline.async);
}

TEST(FinetuneOptions, RunFileErrorsNameTheFileLineAndKey) {
    EXPECT_EQ(run_file_error("# a run\nfrobnicate = 1\n"),
              "run.toml:2: unknown key 'frobnicate' (the keys are rp-finetune's long option names without the dashes; see rp-finetune --help)");
    EXPECT_EQ(run_file_error("lora-rank = \"four\"\n"), "run.toml:1: lora-rank: expected an integer, got a string");
    EXPECT_EQ(run_file_error("seq-len = 16\n\nlora-rank = 0\n"),
              "run.toml:3: lora-rank = 0: --lora-rank: '0' is not an integer in [1, 1048576]");
    EXPECT_EQ(run_file_error("full = 1\n"), "run.toml:1: full: expected a boolean, got an integer");
    EXPECT_EQ(run_file_error("lr = 1e-3\nlr = 2e-3\n"), "run.toml:2: the key 'lr' is given twice");
    EXPECT_EQ(run_file_error("resume = \"a.ckpt.gguf\"\n"), "run.toml:1: 'resume' is not a run-file key: give --resume on the command line");
    EXPECT_EQ(run_file_error("[lora]\nrank = 4\n"),
              "run.toml:1: tables ([...]) are not used in a run file: write each option as `key = value` at the top level");
    EXPECT_EQ(run_file_error("model = base.gguf\n"), "run.toml:1: 'base.gguf' is not a value (a string needs quotes: \"base.gguf\")");
    EXPECT_EQ(run_file_error("model = \"base.gguf\n"), "run.toml:1: the string is not closed on its line");
    EXPECT_EQ(run_file_error("backend = \"tpu\"\n"), "run.toml:1: backend = \"tpu\": --backend: 'tpu' is not one of cpu, cuda");
    EXPECT_EQ(run_file_error("lora-targets = [\"attn_q\", 3]\n"),
              "run.toml:1: lora-targets: expected a string or an array, got an array (or an array holding something else)");
    // What a run file may hold: comments, multi-line arrays, escapes, integers with separators.
    Parsed p;
    p.opts.read_run_text("lora-targets = [\n  \"attn_q\",  # the queries\n  'ffn_down',\n]\nsample-prompt = \"tab\\there \\u00e9\"\n"
                         "device-mem = 67_108_864\nlr = 5e-4 # peak\n",
                         "run.toml");
    EXPECT_EQ(p.job.session.finetune.lora_targets, (std::vector<std::string>{"attn_q", "ffn_down"}));
    EXPECT_EQ(p.job.loop.sample_prompts, std::vector<std::string>{"tab\there \xc3\xa9"});
    EXPECT_EQ(p.job.session.devices.memory_each, size_t(64) << 20);
    EXPECT_EQ(p.job.session.lr.lr_max, 5e-4);
}

TEST(FinetuneOptions, HelpDocumentsExactlyTheDeclaredFlags) {
    Parsed p;
    const std::string help = p.opts.help();
    std::set<std::string> documented;
    for (size_t at = help.find("--"); at != std::string::npos; at = help.find("--", at + 2)) {
        size_t e = at + 2;
        while (e < help.size() && (std::isalnum(static_cast<unsigned char>(help[e])) || help[e] == '-')) ++e;
        if (e > at + 2) documented.insert(help.substr(at, e - at));
        at = e - 2;
    }
    const std::vector<std::string> declared = p.opts.long_names();
    EXPECT_EQ(documented, std::set<std::string>(declared.begin(), declared.end()));
    EXPECT_EQ(std::set<std::string>(declared.begin(), declared.end()).size(), declared.size()) << "a flag is declared twice";
}
