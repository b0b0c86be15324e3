// rp-gguf: look inside, dump, re-type and compare GGUF files.
//
//   rp-gguf info FILE                        header, metadata, tensor table, totals
//   rp-gguf dump FILE TENSOR [-n N]          first N dequantized values (default 16, 0 = all)
//   rp-gguf convert IN OUT --type T          quantize like llama-quantize (mixes q4_k_m ..., types q8_0 ...)
//   rp-gguf diff A B                         per-tensor max |a - b| after dequantization
//   rp-gguf synth OUT --vocab V [shape]      a random-weight llama/qwen2/qwen3/qwen3moe model of any shape
//
// Every command builds its whole output before printing it, so an error leaves no partial output; files
// are written through gguf::Writer (temp file + rename).
#include "ggml_rp/core/quant.h"
#include "gguf/gguf.h"
#include "gguf/value.h"
#include "models/convert/quantize_model.h"
#include "models/convert/synth_model.h"
#include "tools/cli.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

using gguf::KV;
using gguf::Reader;
using gguf::TensorInfo;
using gguf::TensorType;
using gguf::ValueType;

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

const char * const kInfoHelp =
    "usage: rp-gguf info FILE\n"
    "\n"
    "Prints the header (version, alignment, sizes), every metadata key with its type and value (arrays\n"
    "abbreviated), a table of tensors (index, name, type, shape in ne order, bytes, offset in the data\n"
    "section) and totals (tensors, parameters, bytes).\n";

const char * const kDumpHelp =
    "usage: rp-gguf dump FILE TENSOR [-n N]\n"
    "\n"
    "Prints a header line (starting with '#') and then the first N values of TENSOR in storage order\n"
    "(ne[0] fastest), dequantized to f32, one per line. N defaults to 16; -n 0 prints all values.\n";

const char * const kConvertHelp =
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
    "first. --pure: every weight matrix gets T's base type. --threads: default all cores (the bytes do\n"
    "not depend on it). Metadata is copied; general.file_type and general.quantization_version are set.\n"
    RP_THREADS_WAIT_SENTENCE;

const char * const kDiffHelp =
    "usage: rp-gguf diff A B\n"
    "\n"
    "For every tensor of A also in B with the same shape, prints the maximum absolute difference of the\n"
    "dequantized values; then lists tensors only in A, only in B, and shape mismatches. Exit status 0\n"
    "whatever the differences (1 only on an error).\n";

const char * const kSynthHelp =
    "usage: rp-gguf synth OUT (--vocab VOCAB.gguf | --n-vocab N | --shape NAME) [options]\n"
    "\n"
    "Writes a llama / qwen2 / qwen3 / qwen3moe model with random weights (seeded, O(1) activations) whose tokenizer is\n"
    "copied from VOCAB.gguf (which sets n_vocab), e.g. ../shared/models/vocab/ggml-vocab-qwen2.gguf for the\n"
    "real 151,936-token Qwen vocabulary. Prints 'params N'. Weights are generated while writing: the model\n"
    "never sits in memory.\n"
    "  --shape NAME      a preset: qwen3-0.6b, qwen3-1.7b, qwen3-32b, llama3.1-8b, qwen3-30b-a3b, qwen3-235b-a22b,\n"
    "                    gpt-oss-20b (its shapes as a qwen3moe) (the real shapes and vocabulary sizes), llama-98m,\n"
    "                    llama-20m (the benchmark models); later options override it\n"
    "  --n-vocab N       without --vocab: N token rows and no tokenizer (the file plans and trains; it cannot tokenize)\n"
    "  --weights 0|1     0: every weight a hole (zeros, a sparse file: no disk), the shapes for rp-finetune --plan\n"
    "  --arch A          llama | qwen2 | qwen3 | qwen3moe (default llama)\n"
    "  --experts N --experts-used K --expert-ff F   qwen3moe: experts per layer, per token, each expert's n_ff\n"
    "  --n-embd N --n-head N --n-head-kv N --head-dim N --n-ff N --n-layer N --n-ctx N\n"
    "  --rope-base X     (default 10000)\n"
    "  --tied 0|1        no output.weight: the head reuses token_embd\n"
    "  --type T          the 2-D weights: f32 | f16 | bf16 | q8_0 | q4_0 (default f32; norms stay f32)\n"
    "  --seed N          (default 1)\n";

[[noreturn]] void usage_error(const std::string & msg) { throw rp::Error(msg + " (see rp-gguf --help)"); }

std::string strf(const char * fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char buf[512];
    const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < static_cast<int>(sizeof buf)) return std::string(buf, n < 0 ? 0 : static_cast<size_t>(n));
    std::string s(static_cast<size_t>(n) + 1, '\0');
    va_start(ap, fmt);
    std::vsnprintf(s.data(), s.size(), fmt, ap);
    va_end(ap);
    s.resize(static_cast<size_t>(n));
    return s;
}

bool is_help(const std::string & a) { return a == "-h" || a == "--help"; }

// Splits a command's arguments into positionals and the values of the options it knows; -h/--help print
// `help` and exit.
struct Args {
    std::vector<std::string> pos;
    std::map<std::string, std::string> opt;
};

// `flag_opts` take no value.
Args parse_args(const char * cmd, int argc, char ** argv, const std::vector<std::string> & value_opts, const char * help,
                const std::vector<std::string> & flag_opts = {}) {
    Args a;
    for (int i = 0; i < argc; ++i) {
        std::string s = argv[i];
        if (is_help(s)) {
            std::fputs(help, stdout);
            std::exit(0);
        }
        if (s.size() > 1 && s[0] == '-') {
            std::string name = s, value;
            bool has_value = false;
            if (const size_t eq = s.find('='); s.rfind("--", 0) == 0 && eq != std::string::npos) {
                name = s.substr(0, eq);
                value = s.substr(eq + 1);
                has_value = true;
            }
            bool known = false, is_flag = false;
            for (const std::string & o : value_opts) known |= o == name;
            for (const std::string & o : flag_opts) is_flag |= o == name;
            if (is_flag) {
                if (has_value) usage_error(strf("option '%s' takes no value", name.c_str()));
                a.opt[name] = "";
                continue;
            }
            if (!known) usage_error(strf("unknown option '%s' for '%s'", name.c_str(), cmd));
            if (!has_value) {
                if (i + 1 >= argc) usage_error(strf("option '%s' needs a value", name.c_str()));
                value = argv[++i];
            }
            a.opt[name] = value;
            continue;
        }
        a.pos.push_back(s);
    }
    return a;
}

void expect_positionals(const Args & a, size_t n, const char * cmd, const char * what) {
    if (a.pos.size() != n)
        usage_error(strf("'%s' takes %s, got %zu argument%s", cmd, what, a.pos.size(), a.pos.size() == 1 ? "" : "s"));
}

// ---- formatting ------------------------------------------------------------------------------------------

// Shortest decimal text that reads back to the same float (or double).
std::string fmt_float(double v, bool single) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
    char buf[40];
    for (int p = 6; p <= 17; ++p) {
        std::snprintf(buf, sizeof buf, "%.*g", p, v);
        if (single ? std::strtof(buf, nullptr) == static_cast<float>(v) : std::strtod(buf, nullptr) == v) break;
    }
    return buf;
}

// A string value quoted, with control characters escaped and long text cut.
std::string fmt_string(const std::string & s, size_t max_chars = 60) {
    std::string out = "'";
    size_t shown = 0;
    for (unsigned char ch : s) {
        if (shown >= max_chars) {
            out += "...";
            break;
        }
        if (ch == '\n') out += "\\n";
        else if (ch == '\t') out += "\\t";
        else if (ch == '\r') out += "\\r";
        else if (ch == '\\') out += "\\\\";
        else if (ch == '\'') out += "\\'";
        else if (ch < 32 || ch == 127) out += strf("\\x%02x", ch);
        else out += static_cast<char>(ch);   // UTF-8 bytes pass through
        ++shown;
    }
    return out + "'" + (s.size() > max_chars ? strf(" (%zu bytes)", s.size()) : "");
}

std::string fmt_element(ValueType t, const KV & kv, size_t i) {
    if (t == ValueType::STRING) return fmt_string(kv.strs[i]);
    if (t == ValueType::BOOL) return kv.data[i] ? "true" : "false";
    if (t == ValueType::F32 || t == ValueType::F64) return fmt_float(gguf::read_float(t, kv.data.data(), i), t == ValueType::F32);
    const gguf::IntValue v = gguf::read_int(t, kv.data.data(), i);
    return strf("%s%" PRIu64, v.negative ? "-" : "", v.magnitude);
}

std::string fmt_value(const KV & kv) {
    if (kv.type != ValueType::ARRAY) return std::string(gguf::value_type_name(kv.type)) + " " + fmt_element(kv.type, kv, 0);
    const size_t preview = kv.arr_type == ValueType::STRING ? 2 : 4;
    std::string s = strf("[%s x %" PRIu64 "] [", gguf::value_type_name(kv.arr_type), kv.count);
    for (size_t i = 0; i < kv.count && i < preview; ++i) s += (i ? ", " : "") + fmt_element(kv.arr_type, kv, i);
    if (kv.count > preview) s += ", ...";
    return s + "]";
}

std::string fmt_shape(const TensorInfo & t) {
    std::string s = "[";
    for (uint32_t d = 0; d < t.n_dims; ++d) s += strf("%s%" PRId64, d ? ", " : "", t.ne[d]);
    return s + "]";
}

bool same_shape(const TensorInfo & a, const TensorInfo & b) {
    if (a.n_dims != b.n_dims) return false;
    for (int d = 0; d < 4; ++d)
        if (a.ne[d] != b.ne[d]) return false;
    return true;
}

void print(const std::string & out) { std::fwrite(out.data(), 1, out.size(), stdout); }

// ---- dequantization --------------------------------------------------------------------------------------

// Calls fn(row_index, values) for each row of a tensor, dequantized, until fn returns false.
template <typename Fn> void for_each_row(const Reader & r, const TensorInfo & t, Fn fn) {
    if (!rp::can_dequantize(t.type))
        throw rp::Error(strf("%s: tensor '%s' has type %s, which rp-gguf cannot dequantize", r.path().c_str(),
                             t.name.c_str(), gguf::type_name(static_cast<uint32_t>(t.type))));
    const int64_t ne0 = t.ne[0];
    if (ne0 == 0) return;
    const int64_t rows = t.nelements() / ne0;
    const size_t rb = gguf::row_bytes(t.type, ne0);
    std::vector<float> row(static_cast<size_t>(ne0));
    const uint8_t * src = r.tensor_data(t);
    for (int64_t i = 0; i < rows; ++i) {
        rp::dequantize_row(t.type, src + static_cast<size_t>(i) * rb, row.data(), ne0);
        if (!fn(i, row)) return;
    }
}

// ---- commands --------------------------------------------------------------------------------------------

int cmd_info(int argc, char ** argv) {
    const Args a = parse_args("info", argc, argv, {}, kInfoHelp);
    expect_positionals(a, 1, "info", "one FILE");
    const auto r = Reader::open(a.pos[0]);

    std::string out;
    out += strf("file:      %s\n", r->path().c_str());
    out += strf("version:   GGUF v%u\n", r->version());
    out += strf("alignment: %u\n", r->alignment());
    out += strf("size:      %" PRIu64 " bytes (header, metadata and tensor info: %" PRIu64 " bytes; data section: %" PRIu64
                " bytes at offset %" PRIu64 ")\n",
                r->file_size(), r->data_offset(), r->file_size() - r->data_offset(), r->data_offset());

    size_t kw = 0;
    for (const KV & kv : r->kvs()) kw = std::max(kw, kv.key.size());
    out += strf("\nmetadata: %zu keys\n", r->kvs().size());
    for (const KV & kv : r->kvs()) out += strf("  %-*s  %s\n", static_cast<int>(kw), kv.key.c_str(), fmt_value(kv).c_str());

    size_t nw = 4;
    for (const TensorInfo & t : r->tensors()) nw = std::max(nw, t.name.size());
    out += strf("\ntensors: %zu\n", r->tensors().size());
    out += strf("  %5s  %-*s  %-7s  %-22s  %12s  %12s\n", "index", static_cast<int>(nw), "name", "type", "shape", "bytes", "offset");
    int64_t params = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < r->tensors().size(); ++i) {
        const TensorInfo & t = r->tensors()[i];
        out += strf("  %5zu  %-*s  %-7s  %-22s  %12" PRIu64 "  %12" PRIu64 "\n", i, static_cast<int>(nw), t.name.c_str(),
                    gguf::type_name(static_cast<uint32_t>(t.type)), fmt_shape(t).c_str(), t.nbytes, t.offset);
        params += t.nelements();   // no overflow: the reader checked each count, and the file holds the bytes
        bytes += t.nbytes;
    }
    out += strf("\ntotals: %zu tensors, %" PRId64 " parameters, %" PRIu64 " bytes\n", r->tensors().size(), params, bytes);
    print(out);
    return 0;
}

int cmd_dump(int argc, char ** argv) {
    const Args a = parse_args("dump", argc, argv, {"-n"}, kDumpHelp);
    expect_positionals(a, 2, "dump", "FILE and TENSOR");
    int64_t n = 16;
    if (auto it = a.opt.find("-n"); it != a.opt.end()) {
        char * end = nullptr;
        errno = 0;
        const long long v = std::strtoll(it->second.c_str(), &end, 10);
        if (it->second.empty() || *end || errno || v < 0)
            usage_error(strf("option '-n': '%s' is not a non-negative integer", it->second.c_str()));
        n = v;
    }
    const auto r = Reader::open(a.pos[0]);
    const TensorInfo * t = r->find_tensor(a.pos[1]);
    if (!t) throw rp::Error(strf("%s: no tensor named '%s'", r->path().c_str(), a.pos[1].c_str()));
    const int64_t total = t->nelements();
    const int64_t count = n == 0 || n > total ? total : n;

    std::string out = strf("# %s: tensor '%s' %s %s, %" PRId64 " values; first %" PRId64 ":\n", r->path().c_str(),
                           t->name.c_str(), gguf::type_name(static_cast<uint32_t>(t->type)), fmt_shape(*t).c_str(), total, count);
    int64_t done = 0;
    if (count > 0)
        for_each_row(*r, *t, [&](int64_t, const std::vector<float> & row) {
            for (size_t j = 0; j < row.size() && done < count; ++j, ++done) out += fmt_float(row[j], true) + "\n";
            return done < count;
        });
    print(out);
    return 0;
}

int cmd_convert(int argc, char ** argv) {
    const Args a = parse_args("convert", argc, argv, {"--type", "--pure", "--threads"}, kConvertHelp, {"--pure"});
    expect_positionals(a, 2, "convert", "IN and OUT");
    const auto it = a.opt.find("--type");
    if (it == a.opt.end()) usage_error("'convert' needs --type T (" + rp::quant_mix_names() + ")");
    rp::QuantizeOptions opt;
    if (it->second == "q2_k_s" || it->second.rfind("iq", 0) == 0)
        usage_error(strf("option '--type': '%s' needs an importance matrix (llama-quantize refuses it without one), "
                         "which rp-gguf does not compute; use one of %s", it->second.c_str(), rp::quant_mix_names().c_str()));
    if (!rp::quant_mix_from_name(it->second, opt.mix))
        usage_error(strf("option '--type': '%s' is not one of %s", it->second.c_str(), rp::quant_mix_names().c_str()));
    opt.pure = a.opt.count("--pure") != 0;
    if (const auto t = a.opt.find("--threads"); t != a.opt.end())
        opt.threads = static_cast<int>(rp::cli::parse_int("--threads", t->second, 1, 1024));
    else
        opt.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const rp::QuantizeReport rep = rp::quantize_model(a.pos[0], a.pos[1], opt);
    std::string log;
    for (const std::string & n : rep.notes) log += "note: " + n + "\n";
    std::string summary;
    int n = 0;
    for (const auto & [name, c] : rep.tensors_by_type) {
        summary += strf("%s%d %s", summary.empty() ? "" : ", ", c, name.c_str());
        n += c;
    }
    log += strf("wrote %s: %d tensors (%s), %.2f MiB of tensor data from %.2f MiB\n", a.pos[1].c_str(), n, summary.c_str(),
                static_cast<double>(rep.bytes_out) / (1 << 20), static_cast<double>(rep.bytes_in) / (1 << 20));
    print(log);
    return 0;
}

int cmd_diff(int argc, char ** argv) {
    const Args a = parse_args("diff", argc, argv, {}, kDiffHelp);
    expect_positionals(a, 2, "diff", "two files A and B");
    const auto ra = Reader::open(a.pos[0]);
    const auto rb = Reader::open(a.pos[1]);

    size_t nw = 6;
    for (const TensorInfo & t : ra->tensors()) nw = std::max(nw, t.name.size());
    std::string out = strf("%-*s  %-7s  %-7s  %s\n", static_cast<int>(nw), "tensor", "type A", "type B", "max|a-b|");
    std::vector<std::string> only_a, only_b, reshaped;
    double worst = 0;
    std::string worst_name;
    size_t compared = 0;
    for (const TensorInfo & ta : ra->tensors()) {
        const TensorInfo * tb = rb->find_tensor(ta.name);
        if (!tb) {
            only_a.push_back(ta.name);
            continue;
        }
        if (!same_shape(ta, *tb)) {
            reshaped.push_back(ta.name + " " + fmt_shape(ta) + " vs " + fmt_shape(*tb));
            continue;
        }
        std::string d = "n/a (type cannot be dequantized)";
        if (rp::can_dequantize(ta.type) && rp::can_dequantize(tb->type)) {
            // Dequantize B row by row alongside A.
            std::vector<float> rowb(static_cast<size_t>(tb->ne[0]));
            const size_t rbytes = gguf::row_bytes(tb->type, tb->ne[0]);
            double m = 0;
            for_each_row(*ra, ta, [&](int64_t i, const std::vector<float> & rowa) {
                rp::dequantize_row(tb->type, rb->tensor_data(*tb) + static_cast<size_t>(i) * rbytes, rowb.data(), tb->ne[0]);
                for (size_t j = 0; j < rowa.size(); ++j) {
                    const double e = std::fabs(static_cast<double>(rowa[j]) - static_cast<double>(rowb[j]));
                    if (std::isnan(e)) m = NAN;
                    else if (!std::isnan(m) && e > m) m = e;
                }
                return true;
            });
            d = fmt_float(m, false);
            ++compared;
            // NaN is the worst difference of all.
            const bool worse = std::isnan(m) ? !std::isnan(worst) : (!std::isnan(worst) && m > worst);
            if (worst_name.empty() || worse) {
                worst = m;
                worst_name = ta.name;
            }
        }
        out += strf("%-*s  %-7s  %-7s  %s\n", static_cast<int>(nw), ta.name.c_str(), gguf::type_name(static_cast<uint32_t>(ta.type)),
                    gguf::type_name(static_cast<uint32_t>(tb->type)), d.c_str());
    }
    for (const TensorInfo & tb : rb->tensors())
        if (!ra->find_tensor(tb.name)) only_b.push_back(tb.name);
    for (const std::string & s : only_a) out += "only in A: " + s + "\n";
    for (const std::string & s : only_b) out += "only in B: " + s + "\n";
    for (const std::string & s : reshaped) out += "shape mismatch: " + s + "\n";
    const std::string worst_text = compared ? fmt_float(worst, false) + " (" + worst_name + ")" : "n/a";
    out += strf("summary: %zu tensors compared, max|a-b| = %s, %zu only in A, %zu only in B, %zu shape mismatches\n",
                compared, worst_text.c_str(), only_a.size(), only_b.size(), reshaped.size());
    print(out);
    return 0;
}

int cmd_synth(int argc, char ** argv) {
    const Args a = parse_args("synth", argc, argv,
                              {"--vocab", "--shape", "--arch", "--n-embd", "--n-head", "--n-head-kv", "--head-dim", "--n-ff",
                               "--n-layer", "--n-ctx", "--rope-base", "--tied", "--type", "--seed", "--n-vocab", "--weights",
                               "--experts", "--experts-used", "--expert-ff"},
                              kSynthHelp);
    expect_positionals(a, 1, "synth", "OUT");
    auto opt = [&](const char * name) -> const std::string * {
        const auto it = a.opt.find(name);
        return it == a.opt.end() ? nullptr : &it->second;
    };
    rp::SynthSpec s;
    if (const std::string * v = opt("--shape")) s = rp::synth_preset(*v);
    auto u32 = [&](const char * name, uint32_t & dst) {
        if (const std::string * v = opt(name)) dst = static_cast<uint32_t>(rp::cli::parse_int(name, *v, 1, 1 << 24));
    };
    if (const std::string * v = opt("--arch")) {
        if (*v != "llama" && *v != "qwen2" && *v != "qwen3" && *v != "qwen3moe")
            usage_error("--arch: '" + *v + "' is not llama, qwen2, qwen3 or qwen3moe");
        s.arch = *v;
    }
    u32("--experts", s.n_expert);
    u32("--experts-used", s.n_expert_used);
    u32("--expert-ff", s.n_ff_exp);
    u32("--n-embd", s.n_embd);
    u32("--n-head", s.n_head);
    u32("--n-head-kv", s.n_head_kv);
    u32("--n-ff", s.n_ff);
    u32("--n-layer", s.n_layer);
    u32("--n-ctx", s.n_ctx_train);
    if (!opt("--head-dim") && !opt("--shape")) s.head_dim = s.n_embd / s.n_head;
    u32("--head-dim", s.head_dim);
    if (const std::string * v = opt("--rope-base")) s.rope_base = rp::cli::parse_float("--rope-base", *v, 1.0f, 1e9f);
    if (const std::string * v = opt("--tied")) s.tied = rp::cli::parse_int("--tied", *v, 0, 1) != 0;
    if (const std::string * v = opt("--type")) {
        if (!gguf::type_from_name(v->c_str(), s.wtype) ||
            (s.wtype != TensorType::F32 && s.wtype != TensorType::F16 && s.wtype != TensorType::BF16 &&
             s.wtype != TensorType::Q8_0 && s.wtype != TensorType::Q4_0))
            usage_error("--type: '" + *v + "' is not one of f32, f16, bf16, q8_0, q4_0");
    }
    if (const std::string * v = opt("--seed")) s.seed = static_cast<uint64_t>(rp::cli::parse_int("--seed", *v, 0, 1LL << 62));
    const std::string * vocab = opt("--vocab");
    u32("--n-vocab", s.n_vocab);
    if (vocab) s.vocab_from = *vocab;
    else if (!opt("--n-vocab") && !opt("--shape")) usage_error("'synth' needs --vocab VOCAB.gguf (the tokenizer to copy) or --n-vocab N");
    if (const std::string * v = opt("--weights")) s.weights = rp::cli::parse_int("--weights", *v, 0, 1) != 0;
    rp::write_synth_model(s, a.pos[0]);
    int64_t n_params = 0;  // read back from the file, so the figure is what the engines will train
    const std::unique_ptr<Reader> written = Reader::open(a.pos[0]);  // named: the loop must not outlive it
    for (const TensorInfo & t : written->tensors()) n_params += t.nelements();
    std::printf("params %" PRId64 "\n", n_params);
    return 0;
}

int run(int argc, char ** argv) {
    if (argc < 2) usage_error("no command given");
    const std::string cmd = argv[1];
    if (is_help(cmd)) {
        std::fputs(kUsage, stdout);
        return 0;
    }
    if (cmd == "info") return cmd_info(argc - 2, argv + 2);
    if (cmd == "dump") return cmd_dump(argc - 2, argv + 2);
    if (cmd == "convert") return cmd_convert(argc - 2, argv + 2);
    if (cmd == "diff") return cmd_diff(argc - 2, argv + 2);
    if (cmd == "synth") return cmd_synth(argc - 2, argv + 2);
    usage_error("unknown command '" + cmd + "'");
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
