// rp-gguf: look inside, dump, re-type and compare GGUF files.
//
//   rp-gguf info FILE                        header, metadata, tensor table, totals
//   rp-gguf dump FILE TENSOR [-n N]          first N dequantized values (default 16, 0 = all)
//   rp-gguf convert IN OUT --type T          quantize like llama-quantize (mixes q4_k_m ..., types q8_0 ...)
//   rp-gguf diff A B                         per-tensor max |a - b| after dequantization
//   rp-gguf synth OUT --vocab V [shape]      a random-weight llama/qwen2/qwen3/qwen3moe model of any shape
//
// Every command builds its whole output before printing it (models/convert/gguf_inspect.h), so an error
// leaves no partial output; files are written through gguf::Writer (temp file + rename).
#include "gguf/gguf.h"
#include "models/convert/gguf_inspect.h"
#include "models/convert/quantize_model.h"
#include "models/convert/synth_model.h"
#include "tools/options.h"

#include <cinttypes>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace {

using rp::cli::Options;

const char * const kUsage =
    "usage: rp-gguf COMMAND ARGS\n"
    "\n"
    "  info FILE                 header, metadata (one line per key), tensor table and totals\n"
    "  dump FILE TENSOR [-n N]   the first N values of a tensor, dequantized to f32 (default 16, 0 = all)\n"
    "  convert IN OUT --type T   quantize like llama-quantize: T = q4_k_m, q6_k, q8_0, ... (see convert --help)\n"
    "  diff A B                  per-tensor max |a - b| after dequantization; missing, extra and reshaped tensors\n"
    "  synth OUT --vocab V ...   write a random-weight model of a given shape (benchmarks, tests)\n"
    "\n"
    "  rp-gguf COMMAND --help    details of one command\n";

void print(const std::string & out) {
    if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0)
        throw rp::Error("cannot write to standard output");
}

int cmd_info(int argc, char ** argv) {
    std::vector<std::string> files;
    Options p("rp-gguf info",
              "usage: rp-gguf info FILE\n"
              "\n"
              "Prints the header (version, alignment, sizes), every metadata key with its type and value (arrays\n"
              "abbreviated), a table of tensors (index, name, type, shape in ne order, bytes, offset in the data\n"
              "section) and totals (tensors, parameters, bytes).\n");
    p.positionals("FILE", files, 1, 1, "the GGUF file");
    if (!p.parse(argc, argv)) return 0;
    print(rp::gguf_info(*gguf::Reader::open(files[0])));
    return 0;
}

int cmd_dump(int argc, char ** argv) {
    std::vector<std::string> args;
    int64_t n = 16;
    Options p("rp-gguf dump",
              "usage: rp-gguf dump FILE TENSOR [-n N]\n"
              "\n"
              "Prints a header line (starting with '#') and then the first N values of TENSOR in storage order\n"
              "(ne[0] fastest), dequantized to f32, one per line.\n");
    p.positionals("FILE TENSOR", args, 2, 2, "the GGUF file and the tensor's name");
    p.integer("-n,--values", n, 0, INT64_MAX, "values to print; 0: all");
    if (!p.parse(argc, argv)) return 0;
    print(rp::gguf_dump(*gguf::Reader::open(args[0]), args[1], n));
    return 0;
}

int cmd_convert(int argc, char ** argv) {
    std::vector<std::string> files;
    rp::QuantizeOptions opt;
    opt.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    bool typed = false;
    Options p("rp-gguf convert",
              "usage: rp-gguf convert IN OUT --type T [--pure] [--threads N]\n"
              "\n"
              "Writes OUT quantized like llama-quantize (no importance matrix): the same type for every tensor and the\n"
              "same bytes. T is a mix or a type, llama-quantize's names:\n"
              "  q2_k q2_k_s q3_k_s q3_k_m q3_k_l q4_k_s q4_k_m q5_k_s q5_k_m q6_k   K-quant mixes (q3_k, q4_k, q5_k:\n"
              "                                                                     the _m mix)\n"
              "  q4_0 q4_1 q5_0 q5_1 q8_0 f16 bf16 f32                               one type\n"
              "Only weight matrices are re-typed (1-D tensors and norms keep their type). A mix gives the output head\n"
              "(the token embedding too when it is the head) Q6_K, and more bits to attn_v / ffn_down of some layers.\n"
              "A row length the chosen type's block does not divide falls back (Q4_K -> Q5_0, Q5_K -> Q5_1,\n"
              "Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0, else F16); each fallback is listed. Quantized inputs are dequantized\n"
              "first. Metadata is copied; general.file_type and general.quantization_version are set.\n");
    p.positionals("IN OUT", files, 2, 2, "the model and the file to write");
    p.value("--type", "T", "the mix or type (required)", Options::String,
            [&](const std::string & flag, const std::string & v) {
                if (v == "q2_k_s" || v.rfind("iq", 0) == 0)
                    throw rp::Error(flag + ": '" + v + "' needs an importance matrix (llama-quantize refuses it without one), which rp-gguf "
                                    "does not compute; use one of " + rp::quant_mix_names());
                if (!rp::quant_mix_from_name(v, opt.mix)) throw rp::Error(flag + ": '" + v + "' is not one of " + rp::quant_mix_names());
                typed = true;
            },
            [] { return std::nullopt; });
    p.flag("--pure", opt.pure, "every weight matrix gets T's base type (no mix)");
    p.integer("-t,--threads", opt.threads, 1, 1024, "threads (the bytes do not depend on them; default: all cores)\n" +
                                                       std::string(rp::cli::threads_wait_help()));
    if (!p.parse(argc, argv)) return 0;
    if (!typed) throw rp::Error("'convert' needs --type T (" + rp::quant_mix_names() + ") (see rp-gguf convert --help)");
    const rp::QuantizeReport rep = rp::quantize_model(files[0], files[1], opt);
    std::string log;
    for (const std::string & note : rep.notes) log += "note: " + note + "\n";
    std::string summary;
    int n = 0;
    for (const auto & [name, c] : rep.tensors_by_type) {
        summary += (summary.empty() ? "" : ", ") + std::to_string(c) + " " + name;
        n += c;
    }
    char sizes[128];
    std::snprintf(sizes, sizeof sizes, "%.2f MiB of tensor data from %.2f MiB", static_cast<double>(rep.bytes_out) / (1 << 20),
                  static_cast<double>(rep.bytes_in) / (1 << 20));
    print(log + "wrote " + files[1] + ": " + std::to_string(n) + " tensors (" + summary + "), " + sizes + "\n");
    return 0;
}

int cmd_diff(int argc, char ** argv) {
    std::vector<std::string> files;
    Options p("rp-gguf diff",
              "usage: rp-gguf diff A B\n"
              "\n"
              "For every tensor of A also in B with the same shape, prints the maximum absolute difference of the\n"
              "dequantized values; then lists tensors only in A, only in B, and shape mismatches. Exit status 0\n"
              "whatever the differences (1 only on an error).\n");
    p.positionals("A B", files, 2, 2, "the two GGUF files");
    if (!p.parse(argc, argv)) return 0;
    print(rp::gguf_diff(*gguf::Reader::open(files[0]), *gguf::Reader::open(files[1])));
    return 0;
}

// A 0 | 1 option into a bool.
void bit(Options & p, const std::string & name, bool & target, const std::string & help) {
    p.value(name, "0|1", help, Options::Int, [&target](const std::string & f, const std::string & v) { target = rp::cli::parse_int(f, v, 0, 1) != 0; },
            [&target] { return std::optional<std::string>(target ? "1" : "0"); });
}

int cmd_synth(int argc, char ** argv) {
    std::vector<std::string> out;
    rp::SynthSpec s;
    // A preset first, wherever it stands: the other options override it.
    const std::optional<std::string> shape = Options::find(argc, argv, "--shape");
    if (shape) s = rp::synth_preset(*shape);
    bool head_dim_given = shape.has_value(), n_vocab_given = false;
    Options p("rp-gguf synth",
              "usage: rp-gguf synth OUT (--vocab VOCAB.gguf | --n-vocab N | --shape NAME) [options]\n"
              "\n"
              "Writes a llama / qwen2 / qwen3 / qwen3moe model with random weights (seeded, O(1) activations) whose tokenizer is\n"
              "copied from VOCAB.gguf (which sets n_vocab), e.g. ../shared/models/vocab/ggml-vocab-qwen2.gguf for the\n"
              "real 151,936-token Qwen vocabulary. Prints 'params N'. Weights are generated while writing: the model\n"
              "never sits in memory.\n");
    p.positionals("OUT", out, 1, 1, "the model to write");
    p.value("--shape", "NAME",
            "a preset: qwen3-0.6b, qwen3-1.7b, qwen3-32b, llama3.1-8b, qwen3-30b-a3b, qwen3-235b-a22b,\n"
            "gpt-oss-20b (its shapes as a qwen3moe) (the real shapes and vocabulary sizes), llama-98m,\n"
            "llama-20m (the benchmark models); the other options override it",
            Options::String, [](const std::string &, const std::string &) {}, [] { return std::nullopt; });
    p.text("--vocab", s.vocab_from, "the GGUF whose tokenizer to copy (sets n_vocab)", "VOCAB.gguf");
    p.value("--n-vocab", "N", "without --vocab: N token rows and no tokenizer (the file plans and trains; it cannot tokenize)", Options::Int,
            [&](const std::string & f, const std::string & v) { s.n_vocab = static_cast<uint32_t>(rp::cli::parse_int(f, v, 1, 1 << 24)), n_vocab_given = true; },
            [] { return std::nullopt; });
    bit(p, "--weights", s.weights, "0: every weight a hole (zeros, a sparse file: no disk), the shapes for rp-finetune --plan");
    p.choice("--arch", s.arch, {"llama", "qwen2", "qwen3", "qwen3moe"}, "llama | qwen2 | qwen3 | qwen3moe", "A");
    p.integer("--experts", s.n_expert, 1, 1 << 24, "qwen3moe: experts per layer");
    p.integer("--experts-used", s.n_expert_used, 1, 1 << 24, "qwen3moe: experts per token", "K");
    p.integer("--expert-ff", s.n_ff_exp, 1, 1 << 24, "qwen3moe: each expert's n_ff", "F");
    p.integer("--n-embd", s.n_embd, 1, 1 << 24, "hidden size");
    p.integer("--n-head", s.n_head, 1, 1 << 24, "attention heads");
    p.integer("--n-head-kv", s.n_head_kv, 1, 1 << 24, "key / value heads");
    p.value("--head-dim", "N", "dimension of a head (default: n_embd / n_head)", Options::Int,
            [&](const std::string & f, const std::string & v) { s.head_dim = static_cast<uint32_t>(rp::cli::parse_int(f, v, 1, 1 << 24)), head_dim_given = true; },
            [] { return std::nullopt; });
    p.integer("--n-ff", s.n_ff, 1, 1 << 24, "feed-forward width");
    p.integer("--n-layer", s.n_layer, 1, 1 << 24, "decoder layers");
    p.integer("--n-ctx", s.n_ctx_train, 1, 1 << 24, "training context");
    p.number("--rope-base", s.rope_base, 1.0f, 1e9f, "RoPE frequency base");
    bit(p, "--tied", s.tied, "1: no output.weight, the head reuses token_embd");
    p.value("--type", "T", "the 2-D weights: f32 | f16 | bf16 | q8_0 | q4_0 (default f32; norms stay f32)", Options::String,
            [&s](const std::string & f, const std::string & v) {
                using gguf::TensorType;
                if (!gguf::type_from_name(v.c_str(), s.wtype) || (s.wtype != TensorType::F32 && s.wtype != TensorType::F16 &&
                                                                  s.wtype != TensorType::BF16 && s.wtype != TensorType::Q8_0 && s.wtype != TensorType::Q4_0))
                    throw rp::Error(f + ": '" + v + "' is not one of f32, f16, bf16, q8_0, q4_0");
            },
            [] { return std::nullopt; });
    p.integer("--seed", s.seed, 0, 1LL << 62, "random seed");
    if (!p.parse(argc, argv)) return 0;
    if (!head_dim_given) s.head_dim = s.n_embd / s.n_head;
    if (s.vocab_from.empty() && !n_vocab_given && !shape)
        throw rp::Error("'synth' needs --vocab VOCAB.gguf (the tokenizer to copy) or --n-vocab N (see rp-gguf synth --help)");
    rp::write_synth_model(s, out[0]);
    int64_t n_params = 0;  // read back from the file, so the figure is what the engines will train
    const std::unique_ptr<gguf::Reader> written = gguf::Reader::open(out[0]);  // named: the loop must not outlive it
    for (const gguf::TensorInfo & t : written->tensors()) n_params += t.nelements();
    std::printf("params %" PRId64 "\n", n_params);
    return 0;
}

// Each command parses its own arguments (argv[0]: the command's name).
int run(int argc, char ** argv) {
    if (argc < 2) throw rp::Error("no command given (see rp-gguf --help)");
    const std::string cmd = argv[1];
    if (cmd == "-h" || cmd == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
    }
    if (cmd == "info") return cmd_info(argc - 1, argv + 1);
    if (cmd == "dump") return cmd_dump(argc - 1, argv + 1);
    if (cmd == "convert") return cmd_convert(argc - 1, argv + 1);
    if (cmd == "diff") return cmd_diff(argc - 1, argv + 1);
    if (cmd == "synth") return cmd_synth(argc - 1, argv + 1);
    throw rp::Error("unknown command '" + cmd + "' (see rp-gguf --help)");
}

} // namespace

int main(int argc, char ** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
