// rp-gguf: look inside, dump, re-type and compare GGUF files.
//
//   rp-gguf info FILE                        header, metadata, tensor table, totals
//   rp-gguf dump FILE TENSOR [-n N]          first N dequantized values (default 16, 0 = all)
//   rp-gguf convert IN OUT --type T          quantize like llama-quantize (mixes q4_k_m ..., types q8_0 ...)
//   rp-gguf diff A B                         per-tensor max |a - b| after dequantization
//   rp-gguf synth OUT --vocab V [shape]      a random-weight model of any supported architecture and shape
//   rp-gguf export-peft A.gguf -m BASE -o DIR  a LoRA adapter in PEFT's layout (models/convert/peft.h)
//   rp-gguf import-peft DIR -m BASE -o A.gguf  and back
//   rp-gguf export-hf MODEL.gguf -o DIR         the model as Hugging Face safetensors (convert/hf_export.h)
//   rp-gguf export-tokenizer FILE.gguf -o DIR   its vocabulary as tokenizer.json + tokenizer_config.json
//
// Every command builds its whole output before printing it (models/convert/gguf_inspect.h), so an error
// leaves no partial output; files are written through gguf::Writer (temp file + rename).
#include "gguf/gguf.h"
#include "models/arch/lora.h"
#include "models/arch/model.h"
#include "models/convert/gguf_inspect.h"
#include "models/convert/hf_export.h"
#include "models/convert/hf_tokenizer.h"
#include "models/convert/peft.h"
#include "models/convert/safetensors.h"
#include "models/convert/quantize_model.h"
#include "models/convert/synth_model.h"
#include "tools/gguf_options.h"

#include <chrono>
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
    "  export-peft A.gguf -m BASE.gguf -o DIR\n"
    "                            a LoRA adapter as PEFT's adapter_config.json + adapter_model.safetensors\n"
    "  import-peft DIR -m BASE.gguf -o A.gguf\n"
    "                            a PEFT LoRA adapter as a GGUF adapter (llama.cpp's layout)\n"
    "  export-hf MODEL.gguf -o DIR  the model as Hugging Face safetensors + config.json (transformers, vLLM)\n"
    "  export-tokenizer FILE.gguf -o DIR\n"
    "                            the vocabulary as Hugging Face's tokenizer.json + tokenizer_config.json\n"
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
              "  mxfp4_moe                            a mixture's experts MXFP4 (gpt-oss's format), the rest Q8_0\n"
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

int cmd_synth(int argc, char ** argv) {
    rp::cli::SynthSettings s;
    if (const std::optional<std::string> shape = Options::find(argc, argv, "--shape")) s.apply_preset(*shape);  // first, wherever it stands
    Options p("rp-gguf synth",
              "usage: rp-gguf synth OUT (--vocab VOCAB.gguf | --n-vocab N | --shape NAME) [options]\n"
              "\n"
              "Writes a llama / qwen2 / qwen3 / qwen3moe / gpt-oss / gemma2 / gemma3 / mistral3 / phi3 / qwen35 / qwen35moe model\n"
              "with random weights (seeded, O(1) activations) whose tokenizer is copied from VOCAB.gguf (which sets n_vocab),\n"
              "e.g. ../shared/models/vocab/ggml-vocab-qwen2.gguf\n"
              "for the real 151,936-token Qwen vocabulary. Prints 'params N'. Weights are generated while writing: the\n"
              "model never sits in memory.\n");
    rp::cli::declare_synth_options(p, s);
    if (!p.parse(argc, argv)) return 0;
    s.finish();
    rp::write_synth_model(s.spec, s.out[0]);
    int64_t n_params = 0;  // read back from the file, so the figure is what the engines will train
    const std::unique_ptr<gguf::Reader> written = gguf::Reader::open(s.out[0]);  // named: the loop must not outlive it
    for (const gguf::TensorInfo & t : written->tensors()) n_params += t.nelements();
    std::printf("params %" PRId64 "\n", n_params);
    return 0;
}

int cmd_export_peft(int argc, char ** argv) {
    std::vector<std::string> in;
    std::string base, out;
    rp::PeftExportOptions opt;
    Options p("rp-gguf export-peft",
              "usage: rp-gguf export-peft ADAPTER.gguf -m BASE.gguf -o DIR [--dtype f32|f16|bf16] [--base-name NAME]\n"
              "\n"
              "Writes DIR/adapter_config.json and DIR/adapter_model.safetensors: the adapter in PEFT's layout (vLLM,\n"
              "SGLang, PEFT load it), its tensors named and shaped as PEFT names them for the base's Hugging Face\n"
              "model; a llama model's q/k rows back in Hugging Face's order.\n");
    p.positionals("ADAPTER.gguf", in, 1, 1, "the LoRA adapter (GGUF)");
    p.text("-m,--model", base, "the base model it adapts");
    p.text("-o,--output", out, "the directory to write", "DIR");
    std::string dtype = "f32";
    p.choice("--dtype", dtype, {"f32", "f16", "bf16"}, "the tensors' type", "T");
    p.text("--base-name", opt.base_model_name, "adapter_config.json's base_model_name_or_path (default: the base's general.name)", "NAME");
    if (!p.parse(argc, argv)) return 0;
    if (base.empty() || out.empty()) throw rp::Error("'export-peft' needs -m BASE.gguf and -o DIR (see rp-gguf export-peft --help)");
    opt.dtype = rp::safetensors_dtype_from_name(dtype);
    const auto model = rp::Model::load(base);
    const auto adapter = rp::LoraAdapter::load(in[0], *model);
    rp::export_peft(*adapter, *model, out, opt);
    print("wrote " + out + "/adapter_config.json and " + out + "/adapter_model.safetensors (" + std::to_string(adapter->tensors().size()) +
          " LoRA pairs)\n");
    return 0;
}

int cmd_import_peft(int argc, char ** argv) {
    std::vector<std::string> in;
    std::string base, out;
    Options p("rp-gguf import-peft",
              "usage: rp-gguf import-peft DIR -m BASE.gguf -o ADAPTER.gguf\n"
              "\n"
              "Reads a PEFT LoRA adapter (DIR/adapter_config.json, DIR/adapter_model.safetensors) trained on the\n"
              "base's Hugging Face model and writes it as a GGUF adapter in llama.cpp's layout. DoRA, modules_to_save,\n"
              "trained biases and per-module ranks are refused, naming the key; rsLoRA's scale is kept.\n");
    p.positionals("DIR", in, 1, 1, "the PEFT adapter's directory");
    p.text("-m,--model", base, "the base model (GGUF) the adapter is for");
    p.text("-o,--output", out, "the GGUF adapter to write", "ADAPTER.gguf");
    if (!p.parse(argc, argv)) return 0;
    if (base.empty() || out.empty()) throw rp::Error("'import-peft' needs -m BASE.gguf and -o ADAPTER.gguf (see rp-gguf import-peft --help)");
    const auto model = rp::Model::load(base);
    rp::import_peft(in[0], *model, out);
    print("wrote " + out + "\n");
    return 0;
}

int cmd_export_hf(int argc, char ** argv) {
    std::vector<std::string> in;
    std::string out;
    rp::HfExportOptions opt;
    Options p("rp-gguf export-hf", "usage: rp-gguf export-hf MODEL.gguf -o DIR [--dtype auto|f32|f16|bf16] [--shard-size SIZE]\n\n"
                                   "Writes DIR/model-0000N-of-0000M.safetensors, model.safetensors.index.json, config.json and\n"
                                   "generation_config.json: the model as transformers loads it, and tokenizer.json and\n"
                                   "tokenizer_config.json where the vocabulary can be written exactly (byte-level BPE; it says\n"
                                   "why not otherwise).\n");
    p.positionals("MODEL.gguf", in, 1, 1, "the model (a merge, a full finetune, any GGUF of ours)");
    p.text("-o,--output", out, "the directory to write", "DIR");
    p.choice("--dtype", opt.dtype, {"auto", "f32", "f16", "bf16"}, "auto: f32 when every tensor is, bf16 when one is, else f16", "T");
    p.size("--shard-size", opt.shard_bytes, "tensor bytes per file at most");
    if (!p.parse(argc, argv)) return 0;
    if (out.empty()) throw rp::Error("'export-hf' needs -o DIR (see rp-gguf export-hf --help)");
    if (opt.dtype != "auto") opt.dtype = rp::safetensors_dtype_from_name(opt.dtype);
    // Progress on stderr, at most once a second: tensors, GB, ETA.
    const auto t0 = std::chrono::steady_clock::now();
    double last = -1.0;
    opt.progress = [&](size_t done, size_t total, size_t bytes_done, size_t bytes) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (done < total && s - last < 1.0) return;
        last = s;
        const double eta = bytes_done ? s * static_cast<double>(bytes - bytes_done) / static_cast<double>(bytes_done) : 0.0;
        std::fprintf(stderr, "\rtensor %zu/%zu, %.2f / %.2f GB, %.0f s, ETA %.0f s ", done, total, static_cast<double>(bytes_done) / 1e9,
                     static_cast<double>(bytes) / 1e9, s, eta);
        if (done == total) std::fputc('\n', stderr);
    };
    const rp::HfExportReport r = rp::export_hf(*rp::Model::load(in[0]), out, opt);
    size_t shards = 0;
    for (const std::string & f : r.files) shards += f.size() > 12 && f.compare(f.size() - 12, 12, ".safetensors") == 0;
    print("wrote " + std::to_string(r.tensors) + " " + r.dtype + " tensors (" + std::to_string(r.bytes) + " bytes) in " +
          std::to_string(shards) + " safetensors files and the configs to " + out + "\n");
    print(r.tokenizer_refused.empty() ? "wrote tokenizer.json and tokenizer_config.json\n"
                                      : "tokenizer files not written: " + r.tokenizer_refused + "\n");
    return 0;
}

int cmd_export_tokenizer(int argc, char ** argv) {
    std::vector<std::string> in;
    std::string out;
    Options p("rp-gguf export-tokenizer", "usage: rp-gguf export-tokenizer FILE.gguf -o DIR\n\n"
                                          "Writes DIR/tokenizer.json and DIR/tokenizer_config.json (special tokens, chat template):\n"
                                          "the vocabulary as Hugging Face's tokenizers read it, where it can be written exactly\n"
                                          "(byte-level BPE vocabularies; the error says why not otherwise).\n");
    p.positionals("FILE.gguf", in, 1, 1, "a model or a vocabulary-only GGUF");
    p.text("-o,--output", out, "the directory to write", "DIR");
    if (!p.parse(argc, argv)) return 0;
    if (out.empty()) throw rp::Error("'export-tokenizer' needs -o DIR (see rp-gguf export-tokenizer --help)");
    rp::export_hf_tokenizer(in[0], out);
    print("wrote tokenizer.json and tokenizer_config.json to " + out + "\n");
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
    if (cmd == "export-peft") return cmd_export_peft(argc - 1, argv + 1);
    if (cmd == "import-peft") return cmd_import_peft(argc - 1, argv + 1);
    if (cmd == "export-hf") return cmd_export_hf(argc - 1, argv + 1);
    if (cmd == "export-tokenizer") return cmd_export_tokenizer(argc - 1, argv + 1);
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
