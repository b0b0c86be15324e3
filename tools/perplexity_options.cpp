#include "tools/perplexity_options.h"

#include "base/error.h"
#include "models/arch/hparams.h"

namespace rp::cli {

void declare_perplexity_options(Options & p, PerplexitySettings & s) {
    p.text("-m,--model", s.model_path, "GGUF model (" + supported_architectures() + ")");
    p.text("-f,--file", s.text_file, "text to score");
    p.value("-c,--ctx-size", "N", "tokens per chunk (default 512)", Options::Int,
            [&s](const std::string & flag, const std::string & v) { s.n_ctx = parse_int(flag, v, 4, 1 << 24); },
            [&s] { return s.n_ctx ? std::optional(std::to_string(*s.n_ctx)) : std::nullopt; });
    p.optional_integer("--stride,--ppl-stride", s.stride, 1, 1 << 24, "sliding windows every S tokens, scoring their last S predictions", "S");
    p.optional_integer("-b,--batch-size", s.n_batch, 1, 1 << 24, "tokens per evaluation (default: the chunk size)");
    p.threads(s.threads);
    declare_lora_options(p, s.loras);
    p.text("--kl-divergence-base", s.kl_base,
           "save this model's log-probabilities of the scored positions to FILE\n"
           "(llama-perplexity's format: 2 bytes per vocabulary entry)");
    p.flag("--kl-divergence", s.kl_divergence,
           "instead compare this model (or base + --lora) with FILE: KL divergence\n"
           "(mean, median, percentiles), PPL ratio, top-token agreement, with errors;\n"
           "FILE gives the tokens and the context size (no -f)");
}

void PerplexitySettings::validate() const {
    if (model_path.empty()) throw Error("no model given (-m MODEL.gguf)");
    if (kl_divergence && kl_base.empty()) throw Error("--kl-divergence needs --kl-divergence-base FILE (the saved base)");
    if (!kl_base.empty() && stride > 0) throw Error("--kl-divergence-base works on chunks, not with --stride");
    if (kl_divergence) return;
    if (text_file.empty()) throw Error("no text given (-f FILE)");
    if (stride >= context())
        throw Error("--stride " + std::to_string(stride) + " must be smaller than the context " + std::to_string(context()));
}

} // namespace rp::cli
