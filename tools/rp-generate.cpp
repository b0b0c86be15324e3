// rp-generate: generate text with a GGUF model on the CPU (KV-cached inference, optional LoRA adapters).
//
//   rp-generate -m MODEL.gguf (-p PROMPT | -f FILE) [-n N] [--temp T] [--top-k K] [--top-p P] [--seed S]
//               [--chat] [--chat-template FILE.jinja|NAME] [--lora ADAPTER [--lora-scale S]]... [-t THREADS] [-c CTX]
//
// The prompt is printed, then each generated token as soon as it is sampled. Generation stops after N
// tokens, at an end-of-generation token, or when the context is full. The last line on stderr is
// "N tokens, X tokens/s (prompt: Y tokens/s)".
#include "tools/generate_options.h"

#include "base/error.h"
#include "ggml_rp/cpu/matvec_dot.h"
#include "models/text/chat_template.h"
#include "models/arch/hparams.h"
#include "models/arch/inference.h"
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

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void write_out(const std::string & s) {
    if (!s.empty() && std::fwrite(s.data(), 1, s.size(), stdout) != s.size()) throw rp::Error("cannot write to standard output");
    std::fflush(stdout);
}

} // namespace

int main(int argc, char ** argv) {
    try {
        rp::cli::GenerateSettings s;
        rp::cli::Options opts("rp-generate", "usage: rp-generate -m MODEL.gguf (-p PROMPT | -f FILE) [options]");
        rp::cli::declare_generate_options(opts, s);
        if (!opts.parse(argc, argv)) return 0;
        s.validate();
        rp::SamplerParams sp = s.sampler;
        sp.seed = s.seed ? *s.seed : std::random_device{}();
        const std::string & model_path = s.model_path;
        const bool chat = s.chat, row_dots = s.row_dots;
        const long long n_predict = s.n_predict;
        const int threads = s.threads;
        const std::string text = s.prompt ? *s.prompt : rp::cli::read_file(s.prompt_file);
        auto model = rp::Model::load(model_path);
        rp::Tokenizer tok(model->file());
        const auto lora = rp::cli::load_loras(s.loras, *model);

        std::vector<int32_t> ids;
        std::optional<rp::ReasoningSplitter> reasoning;  // a thinking template's reply: reasoning apart from the answer
        std::optional<rp::ThinkingMarkers> markers;
        if (chat) {
            // The model's own Jinja template (or the one named), with its BOS / EOS texts; a BOS the
            // template writes is dropped because encode() adds it.
            const rp::ChatTemplate ct = rp::chat_template_for(tok, s.chat_template);
            rp::ChatOptions co;
            co.add_generation_prompt = true;
            co.enable_thinking = !s.no_thinking;
            const rp::RenderedChat r = ct.render({{"user", text}}, co);
            ids = tok.encode(r.text, true, true);
            markers = rp::thinking_markers(ct.source());
            if (markers) reasoning.emplace(*markers, rp::prompt_opens_thinking(r.text, *markers));
        } else {
            ids = tok.encode(text, true, false);
        }
        if (ids.empty()) throw rp::Error("the prompt is empty (no tokens)");

        rp::cpu::set_row_dots(row_dots);
        rp::InferenceSession session(*model, s.n_ctx, threads, lora->set());
        if (static_cast<int64_t>(ids.size()) > session.n_ctx())
            throw rp::Error("the prompt has " + std::to_string(ids.size()) + " tokens, more than the context size " +
                            std::to_string(session.n_ctx()) + " (-c)");
        rp::Sampler sampler(sp);
        std::fprintf(stderr, "model: %s (%s, %lld parameters), context %lld, seed %llu, %d threads (%s), matvec %s\n",
                     model_path.c_str(), model->hparams().arch->name, static_cast<long long>(model->n_params()),
                     static_cast<long long>(session.n_ctx()), static_cast<unsigned long long>(sp.seed),
                     threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
                     rp::cli::omp_wait_setting().c_str(), row_dots ? "fast" : "exact");
        if (!chat) write_out(text);
        // The reasoning: dimmed on a terminal, as the model wrote it (with its markers) with --show-thinking
        // into a file or pipe, else left out.
        const bool tty = isatty(fileno(stdout)) != 0;
        const bool shown = s.show_thinking.value_or(tty);
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
