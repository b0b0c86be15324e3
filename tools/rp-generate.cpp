// rp-generate: generate text with a GGUF model on the CPU (KV-cached inference, optional LoRA adapters).
//
//   rp-generate -m MODEL.gguf (-p PROMPT | -f FILE) [-n N] [--temp T] [--top-k K] [--top-p P] [--seed S]
//               [--chat] [--chat-template FILE.jinja|NAME] [--lora ADAPTER [--lora-scale S]]... [-t THREADS] [-c CTX]
//
// The prompt is printed, then each generated token as soon as it is sampled. Generation stops after N
// tokens, at an end-of-generation token, or when the context is full. The last line on stderr is
// "N tokens, X tokens/s (prompt: Y tokens/s)".
#include "tools/cli.h"
#include "base/error.h"
#include "ggml_rp/cpu/matvec_dot.h"
#include "models/text/chat_template.h"
#include "models/arch/hparams.h"
#include "models/arch/inference.h"
#include "tools/cli_lora.h"
#include "models/arch/model.h"
#include "models/text/reasoning.h"
#include "models/text/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

void usage(FILE * f) {
    std::fprintf(f,
                 "usage: rp-generate -m MODEL.gguf (-p PROMPT | -f FILE) [options]\n"
                 "  -m, --model FILE        GGUF model (%s)\n"
                 "  -p, --prompt TEXT       prompt text\n"
                 "  -f, --file FILE         read the prompt from FILE\n"
                 "  -n, --n-predict N       tokens to generate (default 128)\n"
                 "      --temp T            temperature; 0 = greedy (default 0.8)\n"
                 "      --top-k K           keep the K most likely tokens; 0 = all (default 40)\n"
                 "      --top-p P           nucleus: keep the smallest set with probability >= P (default 0.95)\n"
                 "      --seed S            random seed (default: a random one, printed)\n"
                 "      --chat              wrap the prompt as a user turn of the model's chat template\n"
                 "      --chat-template T   a FILE.jinja, or chatml / llama3, instead of the model's (implies --chat)\n"
                 "      --show-thinking     print a thinking model's reasoning (<think> ... </think>) when the output is\n"
                 "                          not a terminal (on a terminal it is shown dimmed, apart from the answer)\n"
                 "      --hide-thinking     never print the reasoning (a line on stderr says how long it was)\n"
                 "      --no-thinking       ask the template for no reasoning (enable_thinking = false)\n"
                 "      --lora FILE         apply a LoRA adapter (repeatable)\n"
                 "      --lora-scale S      user scale of the preceding --lora (default 1)\n"
                 "  -t, --threads N         CPU threads (default: all)\n" RP_THREADS_WAIT_HELP
                 "      --matvec M          fast or exact: how a generated token's products are computed.\n"
                 "                          fast (default): per-row dot products with the activations in the\n"
                 "                          weight's format, as llama.cpp (int8 per 32 values with an f32 scale\n"
                 "                          for Q8_0/Q4_K/Q5_K/Q6_K, bf16 for BF16, f32 otherwise); exact: the\n"
                 "                          prompt batch's arithmetic, bit for bit (slower)\n"
                 "  -c, --ctx-size N        context size in tokens (default: the model's, at most 4096)\n"
                 "  -h, --help              this text\n",
                 rp::supported_architectures().c_str());
}

using rp::cli::read_file;
using rp::cli::parse_int;
using rp::cli::parse_float;


double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void write_out(const std::string & s) {
    if (!s.empty() && std::fwrite(s.data(), 1, s.size(), stdout) != s.size()) throw rp::Error("cannot write to standard output");
    std::fflush(stdout);
}

using rp::cli::LoraArg;

} // namespace

int main(int argc, char ** argv) {
    try {
        std::string model_path, prompt, file, chat_name;
        bool have_prompt = false, chat = false, have_seed = false;
        int show_thinking = -1;  // -1: on a terminal only (dimmed); 0 / 1: --hide-thinking / --show-thinking
        bool thinking = true;
        long long n_predict = 128, n_ctx = 0, threads = 0;
        bool row_dots = true;
        rp::SamplerParams sp;
        std::vector<LoraArg> loras;
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            auto value = [&]() -> std::string {
                if (i + 1 >= argc) throw rp::Error("option " + a + " needs a value");
                return argv[++i];
            };
            if (a == "-m" || a == "--model") model_path = value();
            else if (a == "-p" || a == "--prompt") { prompt = value(); have_prompt = true; }
            else if (a == "-f" || a == "--file") file = value();
            else if (a == "-n" || a == "--n-predict") n_predict = parse_int(a, value(), 0, 1 << 30);
            else if (a == "--temp") sp.temperature = parse_float(a, value(), 0.0f, 100.0f);
            else if (a == "--top-k") sp.top_k = static_cast<int32_t>(parse_int(a, value(), 0, 1 << 30));
            else if (a == "--top-p") sp.top_p = parse_float(a, value(), 0.0f, 1.0f);
            else if (a == "--seed") { sp.seed = static_cast<uint64_t>(parse_int(a, value(), 0, INT64_MAX)); have_seed = true; }
            else if (a == "--chat") chat = true;
            else if (a == "--show-thinking") show_thinking = 1;
            else if (a == "--hide-thinking") show_thinking = 0;
            else if (a == "--no-thinking") thinking = false;
            else if (a == "--chat-template") { chat_name = value(); chat = true; }
            else if (a == "--lora") loras.push_back({value(), 1.0f});
            else if (a == "--lora-scale") {
                if (loras.empty()) throw rp::Error("--lora-scale must follow a --lora ADAPTER");
                loras.back().scale = parse_float(a, value(), -1e6f, 1e6f);
            }
            else if (a == "-t" || a == "--threads") threads = parse_int(a, value(), 0, 4096);
            else if (a == "--matvec") {
                const std::string v = value();
                if (v != "fast" && v != "exact") throw rp::Error("--matvec: '" + v + "' is not fast or exact");
                row_dots = v == "fast";
            }
            else if (a == "-c" || a == "--ctx-size") n_ctx = parse_int(a, value(), 0, 1 << 24);
            else if (a == "-h" || a == "--help") { usage(stdout); return 0; }
            else throw rp::Error("unknown option '" + a + "' (see --help)");
        }
        if (model_path.empty()) throw rp::Error("no model given (-m MODEL.gguf)");
        if (have_prompt == !file.empty()) throw rp::Error("give exactly one of -p PROMPT and -f FILE");
        if (!have_seed) sp.seed = std::random_device{}();

        const std::string text = have_prompt ? prompt : read_file(file);
        auto model = rp::Model::load(model_path);
        rp::Tokenizer tok(model->file());
        const auto lora = rp::cli::load_loras(loras, *model);

        if (!chat && (show_thinking >= 0 || !thinking)) throw rp::Error("--show-thinking, --hide-thinking and --no-thinking need --chat");
        std::vector<int32_t> ids;
        std::optional<rp::ReasoningSplitter> reasoning;  // a thinking template's reply: reasoning apart from the answer
        std::optional<rp::ThinkingMarkers> markers;
        if (chat) {
            // The model's own Jinja template (or the one named), with its BOS / EOS texts; a BOS the
            // template writes is dropped because encode() adds it.
            const rp::ChatTemplate ct = rp::chat_template_for(tok, chat_name);
            rp::ChatOptions co;
            co.add_generation_prompt = true;
            co.enable_thinking = thinking;
            const rp::RenderedChat r = ct.render({{"user", text}}, co);
            ids = tok.encode(r.text, true, true);
            markers = rp::thinking_markers(ct.source());
            if (markers) reasoning.emplace(*markers, rp::prompt_opens_thinking(r.text, *markers));
        } else {
            ids = tok.encode(text, true, false);
        }
        if (ids.empty()) throw rp::Error("the prompt is empty (no tokens)");

        rp::cpu::set_row_dots(row_dots);
        rp::InferenceSession session(*model, n_ctx, static_cast<int>(threads), lora->set());
        if (static_cast<int64_t>(ids.size()) > session.n_ctx())
            throw rp::Error("the prompt has " + std::to_string(ids.size()) + " tokens, more than the context size " +
                            std::to_string(session.n_ctx()) + " (-c)");
        rp::Sampler sampler(sp);
        std::fprintf(stderr, "model: %s (%s, %lld parameters), context %lld, seed %llu, %d threads (%s), matvec %s\n",
                     model_path.c_str(), model->hparams().arch->name, static_cast<long long>(model->n_params()),
                     static_cast<long long>(session.n_ctx()), static_cast<unsigned long long>(sp.seed),
                     threads > 0 ? static_cast<int>(threads) : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
                     rp::cli::omp_wait_setting().c_str(), row_dots ? "fast" : "exact");
        if (!chat) write_out(text);
        // The reasoning: dimmed on a terminal, as the model wrote it (with its markers) with --show-thinking
        // into a file or pipe, else left out.
        const bool tty = isatty(fileno(stdout)) != 0;
        const bool shown = show_thinking == 1 || (show_thinking == -1 && tty);
        bool reasoning_open = false;  // inside a reasoning block of the output
        auto out = [&](const std::string & piece) {
            if (!reasoning) return write_out(piece);
            for (const rp::ReasoningSplitter::Piece & p : reasoning->feed(piece)) {
                if (p.reasoning != reasoning_open && shown) {
                    if (tty) write_out(p.reasoning ? "\x1b[2m" : "\x1b[0m\n");
                    else write_out(p.reasoning ? markers->open + "\n" : "\n" + markers->close + "\n\n");
                }
                reasoning_open = p.reasoning;
                if (!p.reasoning || shown) write_out(p.text);
            }
        };

        const auto t_prompt = std::chrono::steady_clock::now();
        std::vector<float> logits = session.eval(ids, false);
        const double prompt_s = seconds_since(t_prompt);

        const auto t_gen = std::chrono::steady_clock::now();
        long long n_gen = 0;
        while (n_gen < n_predict) {
            const int32_t next = sampler.sample(logits.data(), session.n_vocab());
            ++n_gen;
            if (tok.is_eog(next)) break;
            out(tok.token_to_piece(next, false));
            if (n_gen == n_predict) break;
            if (session.n_past() >= session.n_ctx()) {
                std::fprintf(stderr, "\n(context of %lld tokens is full)\n", static_cast<long long>(session.n_ctx()));
                break;
            }
            logits = session.eval({next}, false);
        }
        const double gen_s = seconds_since(t_gen);
        if (reasoning) {
            for (const rp::ReasoningSplitter::Piece & p : reasoning->finish())
                if (!p.reasoning || shown) write_out(p.text);
            if (reasoning_open && shown) write_out(tty ? "\x1b[0m" : "\n" + markers->close);
            if (!shown && reasoning->reasoning_bytes() > 0)
                std::fprintf(stderr, "(reasoning of %zu bytes left out: --show-thinking prints it)\n", reasoning->reasoning_bytes());
        }
        write_out("\n");
        std::fprintf(stderr, "%lld tokens, %.1f tokens/s (prompt: %.1f tokens/s)\n", n_gen,
                     gen_s > 0 ? static_cast<double>(n_gen) / gen_s : 0.0,
                     prompt_s > 0 ? static_cast<double>(ids.size()) / prompt_s : 0.0);
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
