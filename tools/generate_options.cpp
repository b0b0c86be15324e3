#include "tools/generate_options.h"

#include "base/error.h"
#include "models/arch/hparams.h"

namespace rp::cli {

void declare_generate_options(Options & p, GenerateSettings & s) {
    p.text("-m,--model", s.model_path, "GGUF model (" + supported_architectures() + ")");
    p.text("-p,--prompt", s.prompt, "prompt text");
    p.text("-f,--file", s.prompt_file, "read the prompt from FILE");
    p.integer("-n,--n-predict", s.n_predict, 0, 1 << 30, "tokens to generate");
    p.number("--temp", s.sampler.temperature, 0.0f, 100.0f, "temperature; 0 = greedy", "T");
    p.integer("--top-k", s.sampler.top_k, 0, 1 << 30, "keep the K most likely tokens; 0 = all", "K");
    p.number("--top-p", s.sampler.top_p, 0.0f, 1.0f, "nucleus: keep the smallest set with probability >= P", "P");
    p.value("--seed", "S", "random seed (default: a random one, printed)", Options::Int,
            [&s](const std::string & flag, const std::string & v) { s.seed = static_cast<uint64_t>(parse_int(flag, v, 0, INT64_MAX)); },
            [&s] { return s.seed ? std::optional(std::to_string(*s.seed)) : std::nullopt; });
    p.flag("--chat", s.chat, "wrap the prompt as a user turn of the model's chat template");
    p.value("--chat-template", "T", "a FILE.jinja, or chatml / llama3, instead of the model's (implies --chat)", Options::String,
            [&s](const std::string &, const std::string & v) { s.chat_template = v, s.chat = true; },
            [&s] { return s.chat_template.empty() ? std::nullopt : std::optional(toml_string(s.chat_template)); });
    p.toggle("--show-thinking", "--hide-thinking", s.show_thinking,
             "print a thinking model's reasoning (<think> ... </think>) when the output is not a\n"
             "terminal (on a terminal it is shown dimmed, apart from the answer), or never print it\n"
             "(a line on stderr says how long it was)");
    p.flag("--no-thinking", s.no_thinking, "ask the template for no reasoning (enable_thinking = false)");
    declare_lora_options(p, s.loras);
    p.threads(s.threads);
    p.value("--matvec", "M",
            "fast or exact: how the products are computed. fast (default): with the activations in\n"
            "the weight's format, as llama.cpp (int8 per 32 values with an f32 scale for the Q4_0..Q8_0\n"
            "and Q2_K..Q6_K types, bf16 for BF16, f32 otherwise): a generated token's as per-row dot\n"
            "products, the prompt's as an int8 product (a block of weight rows decoded once); exact: the\n"
            "training graphs' arithmetic, bit for bit (slower)",
            Options::String,
            [&s](const std::string & flag, const std::string & v) {
                if (v != "fast" && v != "exact") throw Error(flag + ": '" + v + "' is not fast or exact");
                s.row_dots = v == "fast";
            },
            [&s] { return std::optional(toml_string(s.row_dots ? "fast" : "exact")); });
    p.integer("-c,--ctx-size", s.n_ctx, 0, 1 << 24, "context size in tokens (default: the model's, at most 4096)");
}

void GenerateSettings::validate() const {
    if (model_path.empty()) throw Error("no model given (-m MODEL.gguf)");
    if (prompt.has_value() == !prompt_file.empty()) throw Error("give exactly one of -p PROMPT and -f FILE");
    if (!chat && (show_thinking || no_thinking)) throw Error("--show-thinking, --hide-thinking and --no-thinking need --chat");
}

} // namespace rp::cli
