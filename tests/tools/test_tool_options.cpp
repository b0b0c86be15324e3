// The other tools' declared options (tools/*_options.cpp): for rp-generate, rp-perplexity, rp-tokenize,
// rp-check, rp-merge-lora and rp-simulate, every flag parses to the value the old hand-written parser gave on
// the same input (a table per tool, checked to use every declared flag), bad values fail in the tools'
// wording, the cross-option rules refuse what the old tools refused, and --help documents exactly the
// declared flags. rp-gguf's commands, rp-trace and rp-bench's families declare theirs in the program: their
// --help is read from the binaries (RP_BIN_DIR), with the flags each one took before.
#include "tools/check_options.h"
#include "tools/generate_options.h"
#include "tools/perplexity_options.h"
#include "tools/simulate_options.h"
#include "tools/tokenize_options.h"

#include "base/error.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using rp::cli::Options;

std::vector<std::string> words(const std::string & s) {
    std::istringstream in(s);
    std::vector<std::string> out;
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}

// A tool's settings and its declared options, parsed from a command line.
template <class Settings> struct Parsed {
    Settings s;
    Options opts{"rp-tool", "usage: rp-tool"};
    explicit Parsed(void (*declare)(Options &, Settings &)) { declare(opts, s); }
    void parse(const std::string & args) {
        const std::vector<std::string> w = words(args);
        std::vector<char *> argv{const_cast<char *>("rp-tool")};
        for (const std::string & a : w) argv.push_back(const_cast<char *>(a.c_str()));
        opts.parse(static_cast<int>(argv.size()), argv.data());
    }
};

template <class Settings> std::string parse_error(void (*declare)(Options &, Settings &), const std::string & args) {
    Parsed<Settings> p(declare);
    try {
        p.parse(args);
    } catch (const rp::Error & e) {
        return e.what();
    }
    return "(no error)";
}

template <class Settings> std::string validate_error(void (*declare)(Options &, Settings &), const std::string & args) {
    Parsed<Settings> p(declare);
    try {
        p.parse(args);
        p.s.validate();
    } catch (const rp::Error & e) {
        return e.what();
    }
    return "(no error)";
}

template <class Settings> struct Row {
    std::string args;
    std::function<void(const Settings &)> check;
};

// Runs every row and checks that together they use every long name the tool declares.
template <class Settings> void check_table(void (*declare)(Options &, Settings &), const std::vector<Row<Settings>> & rows) {
    std::set<std::string> used;
    for (const Row<Settings> & r : rows) {
        Parsed<Settings> p(declare);
        ASSERT_NO_THROW(p.parse(r.args)) << r.args;
        r.check(p.s);
        for (const std::string & w : words(r.args)) used.insert(w);
    }
    Parsed<Settings> p(declare);
    for (const std::string & name : p.opts.long_names())
        if (name != "--help" && name != "--config" && name != "--print-config") {
            EXPECT_TRUE(used.count(name)) << name << " is in no row";
        }
}

// The --flags a help text names.
std::set<std::string> documented(const std::string & help) {
    std::set<std::string> out;
    for (size_t at = help.find("--"); at != std::string::npos; at = help.find("--", at + 2)) {
        size_t e = at + 2;
        while (e < help.size() && (std::isalnum(static_cast<unsigned char>(help[e])) || help[e] == '-')) ++e;
        if (e > at + 2 && (at == 0 || help[at - 1] == ' ' || help[at - 1] == '(')) out.insert(help.substr(at, e - at));
        at = e - 2;
    }
    return out;
}

template <class Settings> void check_help(void (*declare)(Options &, Settings &), const std::set<std::string> & expected) {
    Parsed<Settings> p(declare);
    const std::vector<std::string> declared = p.opts.long_names();
    const std::set<std::string> names(declared.begin(), declared.end());
    EXPECT_EQ(names.size(), declared.size()) << "a flag is declared twice";
    EXPECT_EQ(names, expected);
    std::set<std::string> in_help = documented(p.opts.help());
    for (const std::string & n : names) EXPECT_TRUE(in_help.count(n)) << n << " is not in --help";
}

std::string run_help(const std::string & args) {
    const std::string cmd = std::string(RP_BIN_DIR) + "/" + args + " --help 2>&1";
    std::string out;
    FILE * f = popen(cmd.c_str(), "r");
    if (!f) return out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    EXPECT_EQ(pclose(f), 0) << cmd;
    return out;
}

} // namespace

TEST(GenerateOptions, EveryFlagParsesAsTheOldParserDid) {
    using S = rp::cli::GenerateSettings;
    check_table<S>(rp::cli::declare_generate_options, {
        {"-m m.gguf -p hello -n 7 -t 3 -c 64", [](const S & s) {
             EXPECT_EQ(s.model_path, "m.gguf");
             EXPECT_EQ(s.prompt, std::optional<std::string>("hello"));
             EXPECT_EQ(s.n_predict, 7);
             EXPECT_EQ(s.threads, 3);
             EXPECT_EQ(s.n_ctx, 64);
         }},
        {"--model m.gguf --file p.txt --n-predict 0 --threads 0 --ctx-size 0", [](const S & s) {
             EXPECT_EQ(s.prompt_file, "p.txt");
             EXPECT_FALSE(s.prompt);
             EXPECT_EQ(s.n_predict, 0);
             EXPECT_EQ(s.n_ctx, 0);
         }},
        {"--prompt x --temp 0 --top-k 5 --top-p 0.5 --seed 42", [](const S & s) {
             EXPECT_EQ(s.sampler.temperature, 0.0f);
             EXPECT_EQ(s.sampler.top_k, 5);
             EXPECT_EQ(s.sampler.top_p, 0.5f);
             EXPECT_EQ(s.seed, std::optional<uint64_t>(42));
         }},
        {"", [](const S & s) {  // the defaults
             EXPECT_EQ(s.n_predict, 128);
             EXPECT_EQ(s.sampler.temperature, 0.8f);
             EXPECT_EQ(s.sampler.top_k, 40);
             EXPECT_EQ(s.sampler.top_p, 0.95f);
             EXPECT_FALSE(s.seed);
             EXPECT_FALSE(s.chat);
             EXPECT_FALSE(s.show_thinking);
             EXPECT_TRUE(s.row_dots);
         }},
        {"--chat --show-thinking --no-thinking", [](const S & s) {
             EXPECT_TRUE(s.chat);
             EXPECT_EQ(s.show_thinking, std::optional<bool>(true));
             EXPECT_TRUE(s.no_thinking);
         }},
        {"--show-thinking --hide-thinking --chat-template chatml", [](const S & s) {  // the last one wins; a template implies --chat
             EXPECT_EQ(s.show_thinking, std::optional<bool>(false));
             EXPECT_EQ(s.chat_template, "chatml");
             EXPECT_TRUE(s.chat);
         }},
        {"--lora a.gguf --lora-scale 0.5 --lora b.gguf --matvec exact", [](const S & s) {
             ASSERT_EQ(s.loras.size(), 2u);
             EXPECT_EQ(s.loras[0].path, "a.gguf");
             EXPECT_EQ(s.loras[0].scale, 0.5f);
             EXPECT_EQ(s.loras[1].path, "b.gguf");
             EXPECT_EQ(s.loras[1].scale, 1.0f);
             EXPECT_FALSE(s.row_dots);
         }},
    });
}

TEST(GenerateOptions, BadValuesAndCombinationsFailAsBefore) {
    const auto e = [](const std::string & a) { return parse_error(rp::cli::declare_generate_options, a); };
    const auto v = [](const std::string & a) { return validate_error(rp::cli::declare_generate_options, a); };
    EXPECT_EQ(e("--matvec quick"), "--matvec: 'quick' is not fast or exact");
    EXPECT_EQ(e("--temp 200"), "--temp: '200' is not a number in [0, 100]");
    EXPECT_EQ(e("--top-k -1"), "--top-k: '-1' is not an integer in [0, 1073741824]");
    EXPECT_EQ(e("-n"), "option -n needs a value");
    EXPECT_EQ(e("--lora-scale 2"), "--lora-scale must follow a --lora ADAPTER");
    EXPECT_EQ(e("--frobnicate"), "unknown option '--frobnicate' (see --help)");
    EXPECT_EQ(v("-p x"), "no model given (-m MODEL.gguf)");
    EXPECT_EQ(v("-m m.gguf"), "give exactly one of -p PROMPT and -f FILE");
    EXPECT_EQ(v("-m m.gguf -p x -f y"), "give exactly one of -p PROMPT and -f FILE");
    EXPECT_EQ(v("-m m.gguf -p x --hide-thinking"), "--show-thinking, --hide-thinking and --no-thinking need --chat");
    EXPECT_EQ(v("-m m.gguf -p x --no-thinking"), "--show-thinking, --hide-thinking and --no-thinking need --chat");
    Parsed<rp::cli::GenerateSettings> p(rp::cli::declare_generate_options);
    std::vector<char *> argv{const_cast<char *>("rp-generate"), const_cast<char *>("-m"), const_cast<char *>("m.gguf"),
                             const_cast<char *>("-p"), const_cast<char *>("")};
    p.opts.parse(static_cast<int>(argv.size()), argv.data());
    EXPECT_EQ(p.s.prompt, std::optional<std::string>(""));  // an empty prompt is a prompt
    EXPECT_NO_THROW(p.s.validate());
}

TEST(PerplexityOptions, EveryFlagParsesAsTheOldParserDid) {
    using S = rp::cli::PerplexitySettings;
    check_table<S>(rp::cli::declare_perplexity_options, {
        {"-m m.gguf -f t.txt -c 128 -b 32 -t 2 --stride 16", [](const S & s) {
             EXPECT_EQ(s.model_path, "m.gguf");
             EXPECT_EQ(s.text_file, "t.txt");
             EXPECT_EQ(s.context(), 128);
             EXPECT_EQ(s.n_batch, 32);
             EXPECT_EQ(s.threads, 2);
             EXPECT_EQ(s.stride, 16);
         }},
        {"--model m.gguf --file t.txt --ctx-size 4 --batch-size 1 --threads 1 --ppl-stride 3", [](const S & s) {
             EXPECT_EQ(s.n_ctx, std::optional<long long>(4));
             EXPECT_EQ(s.stride, 3);
         }},
        {"", [](const S & s) {
             EXPECT_FALSE(s.n_ctx);
             EXPECT_EQ(s.context(), 512);
             EXPECT_EQ(s.stride, 0);
             EXPECT_EQ(s.n_batch, 0);
         }},
        {"--lora a.gguf --lora-scale -2 --kl-divergence-base base.bin --kl-divergence", [](const S & s) {
             ASSERT_EQ(s.loras.size(), 1u);
             EXPECT_EQ(s.loras[0].scale, -2.0f);
             EXPECT_EQ(s.kl_base, "base.bin");
             EXPECT_TRUE(s.kl_divergence);
         }},
    });
}

TEST(PerplexityOptions, BadValuesAndCombinationsFailAsBefore) {
    const auto e = [](const std::string & a) { return parse_error(rp::cli::declare_perplexity_options, a); };
    const auto v = [](const std::string & a) { return validate_error(rp::cli::declare_perplexity_options, a); };
    EXPECT_EQ(e("-c 2"), "-c: '2' is not an integer in [4, 16777216]");
    EXPECT_EQ(e("--ctx-size 2"), "--ctx-size: '2' is not an integer in [4, 16777216]");
    EXPECT_EQ(e("--stride 0"), "--stride: '0' is not an integer in [1, 16777216]");
    EXPECT_EQ(v("-f t.txt"), "no model given (-m MODEL.gguf)");
    EXPECT_EQ(v("-m m.gguf"), "no text given (-f FILE)");
    EXPECT_EQ(v("-m m.gguf --kl-divergence"), "--kl-divergence needs --kl-divergence-base FILE (the saved base)");
    EXPECT_EQ(v("-m m.gguf -f t --kl-divergence-base b --stride 4"), "--kl-divergence-base works on chunks, not with --stride");
    EXPECT_EQ(v("-m m.gguf -f t --stride 600"), "--stride 600 must be smaller than the context 512");
    EXPECT_EQ(v("-m m.gguf --kl-divergence-base b --kl-divergence"), "(no error)");  // the base gives the tokens
}

TEST(TokenizeOptions, EveryFlagParsesAsTheOldParserDid) {
    using S = rp::cli::TokenizeSettings;
    check_table<S>(rp::cli::declare_tokenize_options, {
        {"-m v.gguf -p hi --no-bos --parse-special --ids", [](const S & s) {
             EXPECT_EQ(s.model_path, "v.gguf");
             EXPECT_EQ(s.prompt, std::optional<std::string>("hi"));
             EXPECT_TRUE(s.no_bos && s.parse_special && s.ids_only);
         }},
        {"--model v.gguf --file t.txt --prompt x", [](const S & s) { EXPECT_EQ(s.text_file, "t.txt"); }},
        {"--render-chat c.jsonl --chat-template chatml --no-generation-prompt --no-thinking --date 2024-01-02 --mask", [](const S & s) {
             EXPECT_EQ(s.chats, "c.jsonl");
             EXPECT_EQ(s.chat_template, "chatml");
             EXPECT_TRUE(s.no_generation_prompt && s.no_thinking && s.mask);
             EXPECT_EQ(s.date, "2024-01-02");
         }},
    });
    const auto v = [](const std::string & a) { return validate_error(rp::cli::declare_tokenize_options, a); };
    EXPECT_EQ(v("-p x"), "no model given (-m MODEL.gguf)");
    EXPECT_EQ(v("-m v.gguf"), "give exactly one of -p TEXT and -f FILE");
    EXPECT_EQ(v("-m v.gguf --render-chat c.jsonl -p x"), "--render-chat takes no -p / -f");
    EXPECT_EQ(v("-m v.gguf --render-chat c.jsonl"), "(no error)");
}

TEST(CheckOptions, EveryFlagParsesAsTheOldParserDid) {
    using S = rp::cli::CheckSettings;
    check_table<S>(rp::cli::declare_check_options, {
        {"-m m.gguf --lora a.gguf --text t.txt --quick --json --oracle /bin/true -t 3", [](const S & s) {
             EXPECT_EQ(s.check.model, "m.gguf");
             EXPECT_EQ(s.check.lora, "a.gguf");
             EXPECT_EQ(s.text_file, "t.txt");
             EXPECT_TRUE(s.check.quick && s.json);
             EXPECT_EQ(s.check.oracle, "/bin/true");
             EXPECT_EQ(s.check.threads, 3);
             EXPECT_TRUE(s.check.forward && s.check.tokenizer && s.check.gradients && s.check.pipeline && s.check.round_trip);
         }},
        {"--model m.gguf --threads 0 --only gradients,round-trip", [](const S & s) {
             EXPECT_FALSE(s.check.forward || s.check.tokenizer || s.check.pipeline);
             EXPECT_TRUE(s.check.gradients && s.check.round_trip);
         }},
    });
    EXPECT_EQ(parse_error(rp::cli::declare_check_options, "--only forward,bogus"),
              "--only: unknown check 'bogus' (forward, tokenizer, gradients, pipeline, round-trip)");
    EXPECT_EQ(validate_error(rp::cli::declare_check_options, "--oracle /bin/true"), "no model given (-m MODEL.gguf)");
    EXPECT_EQ(validate_error(rp::cli::declare_check_options, "-m m.gguf --oracle /no/such/oracle"), "--oracle /no/such/oracle: no such program");
}

TEST(MergeLoraOptions, EveryFlagParsesAsTheOldParserDid) {
    using S = rp::cli::MergeSettings;
    check_table<S>(rp::cli::declare_merge_lora_options, {
        {"-m b.gguf --lora a.gguf --lora c.gguf:0.25 -o o.gguf --type q4_k_m -t 2", [](const S & s) {
             EXPECT_EQ(s.base, "b.gguf");
             EXPECT_EQ(s.out, "o.gguf");
             ASSERT_EQ(s.adapters.size(), 2u);
             EXPECT_EQ(s.adapters[0].path, "a.gguf");
             EXPECT_EQ(s.adapters[0].scale, 1.0f);
             EXPECT_EQ(s.adapters[1].path, "c.gguf");
             EXPECT_EQ(s.adapters[1].scale, 0.25f);
             EXPECT_TRUE(s.merge.mix.has_value());
             EXPECT_EQ(s.merge.threads, 2);
         }},
        {"--model b.gguf --output o.gguf --threads 1", [](const S & s) {
             EXPECT_FALSE(s.merge.mix);  // every tensor keeps its base type
             EXPECT_GE(s.merge.threads, 1);
         }},
    });
    const auto e = [](const std::string & a) { return parse_error(rp::cli::declare_merge_lora_options, a); };
    EXPECT_EQ(e("--lora a.gguf:x"), "--lora a.gguf:x: 'x' is not a scale");
    EXPECT_EQ(e("--threads 0"), "--threads: '0' is not an integer in [1, 4096]");
    EXPECT_EQ(e("--type q9").rfind("--type: 'q9' is not one of ", 0), 0u);
    EXPECT_EQ(validate_error(rp::cli::declare_merge_lora_options, "-o o.gguf"), "no base model given (-m BASE.gguf)");
    EXPECT_EQ(validate_error(rp::cli::declare_merge_lora_options, "-m b.gguf"), "no output given (-o OUT.gguf)");
}

TEST(SimulateOptions, EveryFlagParsesAsTheOldParserDid) {
    using S = rp::cli::SimulateSettings;
    check_table<S>(rp::cli::declare_simulate_options, {
        {"", [](const S & s) {  // the defaults of roundpipe.md 13.8
             EXPECT_EQ(s.sim.config.devices, 8);
             EXPECT_EQ(s.sim.config.micro_batches, 16);
             EXPECT_TRUE(s.sim.config.async_optimizer);
             EXPECT_TRUE(s.sim.balance);
             EXPECT_LT(s.sim.config.hop_ms, 0);  // the model's
             EXPECT_EQ(s.link, "32GB/s");
             EXPECT_EQ(s.node_link, "25Gbit/s,10us");
             EXPECT_EQ(s.sim.config.nodes, 1);
             EXPECT_EQ(s.mem.device_memory, size_t(24) << 30);
             EXPECT_EQ(s.mem.lora_rank, 32);
             EXPECT_EQ(s.tokens_per_mb, 8192);
         }},
        {"--model qwen3-1.7b --all --gpus 4 --micro-batches 9 --iterations 12 --sync --no-balance --hop-ms 2.5 --published", [](const S & s) {
             EXPECT_EQ(s.model, "qwen3-1.7b");
             EXPECT_TRUE(s.all && s.sim.published);
             EXPECT_EQ(s.sim.config.devices, 4);
             EXPECT_EQ(s.sim.config.micro_batches, 9);
             EXPECT_EQ(s.sim.iterations, 12);
             EXPECT_FALSE(s.sim.config.async_optimizer);
             EXPECT_FALSE(s.sim.balance);
             EXPECT_EQ(s.sim.config.hop_ms, 2.5);
         }},
        {"--async --balance --partition 7,7|0,7,7 --weight-mb 100 --link 16GB/s,5us --optimizer-ms 3 --copy-back-ms 2 --tokens-per-mb 4096 --trace t.json",
         [](const S & s) {
             EXPECT_TRUE(s.sim.config.async_optimizer && s.sim.balance);
             EXPECT_EQ(s.sim.partition, "7,7|0,7,7");
             EXPECT_EQ(s.sim.weight_mb, 100);
             EXPECT_EQ(s.link, "16GB/s,5us");
             EXPECT_EQ(s.sim.config.optimizer_ms, 3);
             EXPECT_EQ(s.sim.config.copy_back_ms, 2);
             EXPECT_EQ(s.tokens_per_mb, 4096);
             EXPECT_EQ(s.trace, "t.json");
         }},
        {"--layers 32 --fwd-ms 10 --bwd-ms 22 --head-fwd-ms 20 --head-bwd-ms 40", [](const S & s) {
             EXPECT_EQ(s.custom.layers, 32);
             EXPECT_EQ(s.custom.fwd_ms, 10);
             EXPECT_EQ(s.custom.bwd_ms, 22);
             EXPECT_EQ(s.custom.head_fwd_ms, 20);
             EXPECT_EQ(s.custom.head_bwd_ms, 40);
         }},
        {"--devices 4090x4,3090x4", [](const S & s) { EXPECT_EQ(s.devices, "4090x4,3090x4"); }},
        {"--max-seq --vocab-on-host off", [](const S & s) { EXPECT_EQ(s.vocab_on_host, "off"); }},
        {"--device-speed 1,1,0.5,0.25 --dispatch both", [](const S & s) {
             EXPECT_EQ(s.device_speed, (std::vector<std::string>{"1", "1", "0.5", "0.25"}));
             EXPECT_EQ(s.dispatch, "both");
         }},
        {"--max-seq --device-mem 16G --host-mem 512G --lora-rank 8 --nodes 4 --node-link 100Gbit/s,5us --full", [](const S & s) {
             EXPECT_TRUE(s.max_seq && s.full);
             EXPECT_EQ(s.vocab_on_host, "auto");
             EXPECT_EQ(s.mem.device_memory, size_t(16) << 30);
             EXPECT_EQ(s.mem.host_memory, size_t(512) << 30);
             EXPECT_EQ(s.mem.lora_rank, 8);
             EXPECT_EQ(s.sim.config.nodes, 4);
             EXPECT_EQ(s.node_link, "100Gbit/s,5us");
         }},
    });
    const auto e = [](const std::string & a) { return parse_error(rp::cli::declare_simulate_options, a); };
    EXPECT_EQ(e("--gpus 0"), "--gpus: '0' is not an integer in [1, 1000000]");
    EXPECT_EQ(e("--fwd-ms x"), "--fwd-ms: 'x' is not a number");
    EXPECT_EQ(e("--device-mem lots"), "--device-mem: 'lots' is not a size (e.g. 4096, 64M, 1.5G)");
    EXPECT_EQ(e("--frobnicate"), "unknown option '--frobnicate' (see --help)");
    EXPECT_NE(e("--dispatch fastest").find("--dispatch"), std::string::npos);
    EXPECT_NE(e("--vocab-on-host maybe").find("--vocab-on-host"), std::string::npos);
}

TEST(ToolOptions, HelpDocumentsExactlyTheDeclaredFlags) {
    check_help(rp::cli::declare_generate_options,
               {"--help", "--model", "--prompt", "--file", "--n-predict", "--temp", "--top-k", "--top-p", "--seed", "--chat", "--chat-template",
                "--show-thinking", "--hide-thinking", "--no-thinking", "--lora", "--lora-scale", "--threads", "--matvec", "--ctx-size"});
    check_help(rp::cli::declare_perplexity_options,
               {"--help", "--model", "--file", "--ctx-size", "--stride", "--ppl-stride", "--batch-size", "--threads", "--lora", "--lora-scale",
                "--kl-divergence-base", "--kl-divergence"});
    check_help(rp::cli::declare_tokenize_options,
               {"--help", "--model", "--prompt", "--file", "--no-bos", "--parse-special", "--ids", "--render-chat", "--chat-template",
                "--no-generation-prompt", "--no-thinking", "--date", "--mask"});
    check_help(rp::cli::declare_check_options, {"--help", "--model", "--lora", "--text", "--quick", "--only", "--json", "--oracle", "--threads"});
    check_help(rp::cli::declare_merge_lora_options, {"--help", "--model", "--lora", "--output", "--type", "--threads"});
    check_help(rp::cli::declare_simulate_options,
               {"--help", "--model", "--all", "--layers", "--fwd-ms", "--bwd-ms", "--head-fwd-ms", "--head-bwd-ms", "--gpus", "--micro-batches",
                "--iterations", "--async", "--sync", "--hop-ms", "--partition", "--published", "--balance", "--no-balance", "--weight-mb",
                "--link", "--optimizer-ms", "--copy-back-ms", "--tokens-per-mb", "--trace", "--max-seq", "--device-mem", "--host-mem",
                "--lora-rank", "--vocab-on-host", "--nodes", "--node-link", "--full", "--device-speed", "--devices", "--dispatch"});
}

// rp-gguf's commands, rp-trace and rp-bench's families: each --help names every flag it took before.
TEST(ToolOptions, GgufCommandsTraceAndBenchFamiliesHelpListTheirFlags) {
    const std::vector<std::pair<std::string, std::set<std::string>>> tools = {
        {"rp-gguf info", {"--help"}},
        {"rp-gguf dump", {"--help", "--values"}},
        {"rp-gguf convert", {"--help", "--type", "--pure", "--threads"}},
        {"rp-gguf diff", {"--help"}},
        {"rp-gguf synth", {"--help", "--shape", "--vocab", "--n-vocab", "--weights", "--arch", "--experts", "--experts-used", "--expert-ff", "--window", "--rope-linear", "--yarn", "--yarn-ctx", "--llama3-rope",
                           "--llama3-rope-ctx", "--long-rope", "--ssm-k-heads", "--ssm-v-heads", "--ssm-head-dim", "--ssm-conv", "--mtp-layers", "--full-attn-interval",
                           "--attn-temp", "--attn-softcap", "--final-softcap",
                           "--n-embd", "--n-head", "--n-head-kv", "--head-dim", "--n-ff", "--n-rot", "--n-layer", "--n-ctx", "--rope-base", "--tied",
                           "--type", "--seed"}},
        {"rp-gguf export-peft", {"--help", "--model", "--output", "--dtype", "--base-name"}},
        {"rp-gguf import-peft", {"--help", "--model", "--output"}},
        {"rp-gguf export-hf", {"--help", "--output", "--dtype", "--shard-size"}},
        {"rp-gguf export-tokenizer", {"--help", "--output"}},
        {"rp-trace", {"--help", "--output", "--title", "--width", "--assignment"}},
        {"rp-bench ops", {"--help", "--quick", "--reps", "--threads", "--only", "--shape", "--matvec-mb"}},
        {"rp-bench gguf", {"--help", "--size", "--reps", "--threads", "--dir", "--cold", "--keep"}},
        {"rp-bench dp", {"--help", "--model", "--full", "--rank", "--seq-len", "--seqs", "--gpus", "--micro-batches", "--steps", "--link",
                         "--gpu-tokens"}},
        {"rp-bench roundpipe", {"--help", "--model", "--seq-len", "--seqs", "--steps", "--rank", "--gpu-tokens", "--trace-dir"}},
        {"rp-bench mixed", {"--help", "--model", "--seq-len", "--seqs", "--steps", "--warmup", "--micro-batches", "--devices", "--rank",
                            "--gpu-tokens", "--trace-dir", "--steps-mode"}},
    };
    for (const auto & [tool, flags] : tools) {
        const std::string help = run_help(tool);
        std::set<std::string> listed;
        for (const std::string & f : documented(help))
            if (help.find("  " + f) != std::string::npos || help.find(", " + f) != std::string::npos) listed.insert(f);
        EXPECT_EQ(listed, flags) << tool << "\n" << help;
    }
    EXPECT_NE(run_help("rp-gguf dump").find("  -n, --values N"), std::string::npos);
    EXPECT_NE(run_help("rp-trace").find("  -o, --output TIMELINE.svg"), std::string::npos);
}
