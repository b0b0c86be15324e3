// model_check.h: the reference checks, composed from the engine's pieces and llama.cpp through rp-oracle.
#include "models/check/model_check.h"

#include "base/temp_dir.h"

#include "base/error.h"
#include "ggml_rp/ggml_rp.h"
#include "ggml_rp/roundpipe/call_planner.h"
#include "gguf/gguf.h"
#include "models/data/dataset.h"
#include "models/check/gradient_check.h"
#include "models/arch/inference.h"
#include "models/arch/lora.h"
#include "models/convert/merge_lora.h"
#include "models/arch/model.h"
#include "models/train/session.h"
#include "models/text/tokenizer.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>

namespace rp {

namespace fs = std::filesystem;

const char * check_status_name(CheckStatus s) {
    switch (s) {
    case CheckStatus::Pass: return "pass";
    case CheckStatus::Fail: return "FAIL";
    case CheckStatus::Skipped: return "skipped";
    }
    return "?";
}

namespace {

const char * const kDefaultText =
    "Once upon a time, in a small village at the edge of a forest, there lived a girl named Lily. Every morning "
    "she walked to the river with her dog, Max, and counted the boats: one, two, three. \"Look!\" she said. "
    "\"The sun is up, and the water is warm.\" Her mother smiled and said, \"Be home before dinner.\" The day "
    "was long and bright; they found 12 stones, 3 feathers and a map drawn in 1987.\n\nThe End.";

std::string fmt(const char * f, double v) {
    char b[64];
    std::snprintf(b, sizeof b, f, v);
    return b;
}

std::string quote(const std::string & s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

std::string ids_text(const std::vector<int32_t> & ids) {
    std::string s;
    for (int32_t t : ids) {
        if (!s.empty()) s += ' ';
        s += std::to_string(t);
    }
    return s;
}

std::vector<int32_t> parse_ids(const std::string & line) {
    std::vector<int32_t> v;
    std::istringstream in(line);
    long x;
    while (in >> x) v.push_back(static_cast<int32_t>(x));
    return v;
}

// rp-oracle (llama.cpp's prebuilt libraries) as a subprocess.
class Oracle {
public:
    explicit Oracle(std::string bin) : bin_(std::move(bin)) {}
    bool available() const {
        std::error_code ec;
        return !bin_.empty() && fs::is_regular_file(bin_, ec);
    }
    // Its standard output; throws naming the command when it fails.
    std::string run(const std::string & args, const std::string & stdin_path = "") const {
        const std::string err = tmp_.file("oracle.err");
        const std::string cmd = quote(bin_) + " " + args + " < " + quote(stdin_path.empty() ? "/dev/null" : stdin_path) + " 2> " + quote(err);
        std::FILE * p = popen(cmd.c_str(), "r");
        if (!p) throw Error("cannot run " + bin_);
        std::string out;
        char buf[4096];
        size_t n;
        while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
        const int st = pclose(p);
        if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            std::ifstream e(err);
            const std::string msg((std::istreambuf_iterator<char>(e)), {});
            throw Error("llama.cpp (rp-oracle " + args.substr(0, args.find(' ')) + ") failed: " + msg.substr(0, 400));
        }
        return out;
    }
    // n_ctx: llama.cpp's context size, as ours (it chooses phi3's LongRoPE factors); 0: the oracle's default.
    std::vector<float> logits(const std::string & model, const std::vector<int32_t> & ids, const std::string & lora, int64_t n_ctx = 0) const {
        const std::string out = tmp_.file("logits.f32");
        run("logits " + quote(model) + " --tokens " + quote(ids_text(ids)) + (lora.empty() ? "" : " --lora " + quote(lora)) +
            (n_ctx > 0 ? " --ctx " + std::to_string(n_ctx) : "") + " --out " + quote(out));
        std::ifstream f(out, std::ios::binary);
        const std::string s((std::istreambuf_iterator<char>(f)), {});
        std::vector<float> v(s.size() / sizeof(float));
        std::memcpy(v.data(), s.data(), v.size() * sizeof(float));
        return v;
    }
    std::vector<int32_t> generate(const std::string & model, const std::vector<int32_t> & prompt, int n, const std::string & lora,
                                  int64_t n_ctx = 0) const {
        const std::string out = run("generate " + quote(model) + " --tokens " + quote(ids_text(prompt)) + " -n " + std::to_string(n) +
                                    " --ignore-eos" + (lora.empty() ? "" : " --lora " + quote(lora)) +
                                    (n_ctx > 0 ? " --ctx " + std::to_string(n_ctx) : ""));
        return parse_ids(out);
    }
    // One line of ids per case.
    std::vector<std::vector<int32_t>> tokenize(const std::string & model, const std::vector<std::string> & cases, bool add_special) const {
        const std::string in = tmp_.file("cases.txt");
        {
            std::ofstream f(in, std::ios::binary);
            for (const std::string & c : cases) f << c << "\n__ggml_vocab_test__\n";
        }
        const std::string out = run("tokenize " + quote(model) + " --cases" + (add_special ? " --special" : ""), in);
        std::vector<std::vector<int32_t>> r;
        std::istringstream s(out);
        for (std::string line; std::getline(s, line);) r.push_back(parse_ids(line));
        return r;
    }

private:
    std::string bin_;
    TempDir tmp_{"rp-check"};
};

// The loosest tolerance the model's matrices need: llama.cpp rounds the activations to the weight type's dot
// format (f16, bf16, q8_0 / q8_1 / q8_K) before each matmul, we multiply in f32. About 3x the largest measured
// (2026-12-01, 96 tokens): f16 3.3e-4, bf16 2.1e-3 (stories260K) and 2.4e-3 (Qwen3-0.6B shape), q8_0 8.1e-3,
// q4_0 / q2_K .. q6_K 0.9e-2 .. 1.3e-2 (stories260K-Q4_0, a generated llama in every k-mix, a Q4_K_M Qwen3-0.6B).
struct Tolerance {
    double logits;     // max |d| / logit range
    double top1;       // fraction of positions whose argmax agrees
    int greedy;        // leading greedy tokens that must agree (of 16)
    std::string why;
};

// llama.cpp's CPU GeGLU (gemma3) reads GELU from an fp16 table indexed by the input rounded to fp16: a step
// function, so one f32 rounding anywhere upstream can move an activation by a whole fp16 step (2^-11 relative).
// An f32 gemma3 reaches 1.5e-4 of the logit range (tests/models/test_gemma3.cpp) instead of the ~1e-6 of float
// summation order; at near-ties the argmax may flip.
constexpr double kGeluTableLogits = 1e-3;
bool reads_gelu_table(const Model & m) { return m.hparams().arch->glu == GluKind::GeluTanh; }

Tolerance tolerance_for(const Model & m) {
    int worst = 0;  // 0 f32, 1 f16, 2 bf16, 3 q8_0, 4 q6_k/q5_k/q4_k/q5_x, 5 q4_0/q4_1/q3_k/q2_k
    std::string worst_name = "f32";
    for (const Tensor * t : m.weights()) {
        if (t->ne[1] <= 1) continue;
        int r = 0;
        switch (t->type) {
        case DType::F32: r = 0; break;
        case DType::F16: r = 1; break;
        case DType::BF16: r = 2; break;
        case DType::Q8_0: r = 3; break;
        case DType::Q6_K: case DType::Q5_K: case DType::Q4_K: case DType::Q5_0: case DType::Q5_1: r = 4; break;
        default: r = 5; break;
        }
        if (r > worst) {
            worst = r;
            worst_name = dtype_name(t->type);
        }
    }
    static const Tolerance table[] = {
        {1e-4, 1.0, 16, ": float summation order only"},
        {2e-3, 0.9, 4, ": llama.cpp rounds activations to f16"},
        {8e-3, 0.9, 4, ": llama.cpp rounds activations to bf16"},
        {2e-2, 0.8, 2, ": llama.cpp rounds activations to q8_0"},
        {4e-2, 0.85, 1, ": llama.cpp rounds activations to q8_K / q8_1 (k-quants, q5)"},
        {4e-2, 0.85, 1, ": llama.cpp rounds activations to q8 (q4_0, q4_1, q3_K, q2_K)"},
    };
    Tolerance t = table[worst];
    t.why = "the model's coarsest matrices are " + worst_name + t.why;
    if (worst == 0 && reads_gelu_table(m)) {
        t = {kGeluTableLogits, 0.98, 8, "the model's matrices are f32: float summation order, and llama.cpp's fp16 GELU table"};
    }
    return t;
}

struct Context_ {
    const ModelCheckOptions & opt;
    std::unique_ptr<Model> model;
    std::unique_ptr<Tokenizer> tok;
    std::unique_ptr<LoraAdapter> adapter;
    LoraSet lora;
    Oracle oracle;
    std::string text;
    std::vector<CheckRow> rows;
    void (*on_row)(const CheckRow &, void *);
    void * user;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

    void add(CheckRow r) {
        const auto now = std::chrono::steady_clock::now();
        r.seconds = std::chrono::duration<double>(now - t0).count();
        t0 = now;
        if (on_row) on_row(r, user);
        rows.push_back(std::move(r));
    }
    void skip(const std::string & check, const std::string & what, const std::string & why) {
        add({check, what, "-", "-", CheckStatus::Skipped, why, 0});
    }
    // The first n tokens of the text (BOS first when the model adds one), at most the training context.
    std::vector<int32_t> tokens(size_t n) const {
        std::vector<int32_t> ids = tok->encode(text, true, false);
        const size_t cap = std::min<size_t>(n, std::max<uint32_t>(2, model->hparams().n_ctx_train));
        while (ids.size() < cap) {  // a short text: repeat it
            const std::vector<int32_t> more = tok->encode(text, false, false);
            if (more.empty()) break;
            ids.insert(ids.end(), more.begin(), more.end());
        }
        if (ids.size() > cap) ids.resize(cap);
        return ids;
    }
};

const char * kNoOracle = "llama.cpp's libraries are not available: run scripts/fetch-oracle.sh, reconfigure and build "
                         "(cmake), so that build/bin/rp-oracle exists, or give --oracle PATH";

void check_forward(Context_ & c) {
    const char * name = "forward";
    if (!c.oracle.available()) return c.skip(name, "logits vs llama.cpp", kNoOracle);
    const Tolerance tol = tolerance_for(*c.model);
    const std::vector<int32_t> ids = c.tokens(c.opt.quick ? 24 : 96);
    const int64_t nv = c.model->hparams().n_vocab, n = static_cast<int64_t>(ids.size());
    // Both engines in the same context: llama.cpp's is the asked one padded to 256 tokens, which e.g. chooses
    // phi3's LongRoPE factors; ours, the same (within the model's).
    const auto same_ctx = [&](int64_t want) { return std::min<int64_t>((want + 255) / 256 * 256, c.model->hparams().n_ctx_train); };
    InferenceSession ours(*c.model, same_ctx(n + 32), c.opt.threads, c.lora.empty() ? nullptr : &c.lora);
    const std::vector<float> a = ours.eval(ids, true);
    const std::vector<float> b = c.oracle.logits(c.opt.model, ids, c.opt.lora, ours.n_ctx());
    if (b.size() != a.size()) {
        c.add({name, "logits vs llama.cpp", "-", "-", CheckStatus::Fail,
               "llama.cpp returned " + std::to_string(b.size()) + " logits, we " + std::to_string(a.size()), 0});
        return;
    }
    float lo = b[0], hi = b[0], d = 0;
    int64_t same = 0;
    for (int64_t p = 0; p < n; ++p) {
        const float * x = a.data() + p * nv, * y = b.data() + p * nv;
        for (int64_t v = 0; v < nv; ++v) {
            lo = std::min(lo, y[v]), hi = std::max(hi, y[v]);
            d = std::max(d, std::fabs(x[v] - y[v]));
        }
        same += std::max_element(x, x + nv) - x == std::max_element(y, y + nv) - y;
    }
    const double rel = d / std::max(1e-30f, hi - lo);
    c.add({name, "max |logit diff| / logit range, " + std::to_string(n) + " tokens", fmt("%.3g", rel), "<= " + fmt("%g", tol.logits),
           rel <= tol.logits ? CheckStatus::Pass : CheckStatus::Fail,
           tol.why + "; max |diff| " + fmt("%.4g", d) + " of range " + fmt("%.4g", hi - lo) +
               (c.opt.lora.empty() ? "" : "; the adapter applied by both engines"),
           0});
    const double top = static_cast<double>(same) / static_cast<double>(n);
    c.add({name, "top-1 agreement", fmt("%.3f", top), ">= " + fmt("%g", tol.top1), top >= tol.top1 ? CheckStatus::Pass : CheckStatus::Fail,
           std::to_string(same) + " of " + std::to_string(n) + " positions", 0});
    // Greedy continuation of the first 8 tokens, 16 new tokens.
    const std::vector<int32_t> prompt(ids.begin(), ids.begin() + std::min<int64_t>(8, n));
    InferenceSession g(*c.model, same_ctx(static_cast<int64_t>(prompt.size()) + 17), c.opt.threads, c.lora.empty() ? nullptr : &c.lora);
    std::vector<float> last = g.eval(prompt, false);
    std::vector<int32_t> mine;
    for (int i = 0; i < 16; ++i) {
        const int32_t next = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
        mine.push_back(next);
        last = g.eval({next}, false);
    }
    const std::vector<int32_t> theirs = c.oracle.generate(c.opt.model, prompt, 16, c.opt.lora, g.n_ctx());
    int lead = 0;
    while (lead < 16 && lead < static_cast<int>(theirs.size()) && mine[static_cast<size_t>(lead)] == theirs[static_cast<size_t>(lead)]) ++lead;
    c.add({name, "greedy continuation (16 tokens)", std::to_string(lead) + " equal", ">= " + std::to_string(tol.greedy),
           lead >= tol.greedy ? CheckStatus::Pass : CheckStatus::Fail,
           lead < 16 ? "first difference at token " + std::to_string(lead) : "identical", 0});
}

void check_tokenizer(Context_ & c) {
    const char * name = "tokenizer";
    if (!c.oracle.available()) return c.skip(name, "token ids vs llama.cpp", kNoOracle);
    std::vector<std::string> cases;
    {
        std::istringstream in(c.text);
        for (std::string line; std::getline(in, line);)
            if (!line.empty()) cases.push_back(line);
        if (c.opt.quick && cases.size() > 20) cases.resize(20);
    }
    const size_t n_text = cases.size();
    for (const char * s : {"Hello world", " leading space", "trailing spaces   ", "a  b\t\tc\n\n\nd", "   ", "\n",
                           "1234567890 3.14159 1,000,000 0x1F -42 2026-12-01", "h\xc3\xa9llo w\xc3\xb6rld na\xc3\xafve caf\xc3\xa9",
                           "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xe4\xb8\xad\xe6\x96\x87 \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4",
                           "emoji \xf0\x9f\x99\x82\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", "\xc3\x9c\xc3\xaf \xc3\x9f \xe1\xba\x9e \xc4\xb0\xc4\xb1",
                           "don't I'll we've THEY'RE", "    def f(x):\n        return x**2  # comment", "<<>>{}[]()!!??...---___"})
        cases.push_back(s);
    // The model's special tokens as text, parsed as specials.
    std::string specials;
    for (int32_t id : {c.tok->bos(), c.tok->eos()})
        if (id != kTokenNull) specials += std::string(c.tok->token_text(id)) + " x ";
    if (!specials.empty()) cases.push_back(specials + "end");
    std::vector<std::vector<int32_t>> ours;
    for (const std::string & s : cases) ours.push_back(c.tok->encode(s, false, true));
    const auto theirs = c.oracle.tokenize(c.opt.model, cases, false);
    size_t bad = 0;
    std::string first;
    for (size_t i = 0; i < cases.size(); ++i) {
        if (i < theirs.size() && theirs[i] == ours[i]) continue;
        if (bad++ == 0)
            first = "case " + std::to_string(i) + " \"" + cases[i].substr(0, 40) + "\": ours [" + ids_text(ours[i]).substr(0, 60) + "] llama.cpp [" +
                    (i < theirs.size() ? ids_text(theirs[i]).substr(0, 60) : std::string("none")) + "]";
    }
    // The whole text with the model's BOS / EOS rules.
    const auto whole_ours = c.tok->encode(c.text, true, false);
    const auto whole = c.oracle.tokenize(c.opt.model, {c.text}, true);
    // llama.cpp's tokenize mode parses specials by default; the text has none unless the user's does.
    const bool whole_ok = !whole.empty() && (whole[0] == whole_ours || whole[0] == c.tok->encode(c.text, true, true));
    if (!whole_ok && bad++ == 0) first = "the whole text with BOS/EOS differs";
    c.add({name, "token ids vs llama.cpp (" + std::to_string(n_text) + " text lines, " + std::to_string(cases.size() - n_text) +
                     " stress strings, the whole text)",
           std::to_string(bad) + " differ", "0", bad == 0 ? CheckStatus::Pass : CheckStatus::Fail, first, 0});
}

void check_gradients(Context_ & c) {
    const char * name = "gradients";
    GradientCheckOptions g;
    g.threads = c.opt.threads;
    g.directions = c.opt.quick ? 1 : 3;
    g.richardson = !c.opt.quick;
    if (c.opt.quick) g.loss_step = 1e-3;  // one central difference: a smaller step keeps its O(h^2) error down
    const std::vector<int32_t> ids = c.tokens(c.opt.quick ? 9 : 17);
    const double tol = 2e-3;
    auto report = [&](const std::vector<TensorGradientCheck> & v, const std::string & kind) {
        for (const TensorGradientCheck & t : v) {
            if (t.skipped) {
                c.skip(name, t.tensor, t.note);
                continue;
            }
            c.add({name, t.tensor + kind, fmt("%.2e", t.error), "<= " + fmt("%g", tol), t.error <= tol ? CheckStatus::Pass : CheckStatus::Fail,
                   "rel. error of the directional derivative (|grad| rms " + fmt("%.3g", t.grad_rms) + ", " + std::to_string(g.directions) +
                       " direction" + (g.directions > 1 ? "s" : "") + ")",
                   0});
        }
    };
    report(check_base_gradients(*c.model, gradient_check_tensors(*c.model), ids, g), "");
    report(check_lora_gradients(*c.model, c.adapter.get(), ids, g), c.adapter ? " (the adapter's)" : " (random adapter)");
}

void check_pipeline(Context_ & c) {
    const char * name = "pipeline";
    const int32_t seq = c.opt.quick ? 16 : 32;
    DatasetOptions dopt;
    dopt.seq_len = seq;
    dopt.n_ctx = c.model->hparams().n_ctx_train;
    std::string text = c.text;
    while (c.tok->encode(text, false, false).size() < static_cast<size_t>(4 * seq + 4)) text += "\n" + c.text;
    const Dataset data = Dataset::from_text(text, "check text", *c.tok, dopt);
    int64_t params = 0;
    for (const Tensor * t : c.model->weights()) params += t->nelements();
    for (const bool full : {false, true}) {
        const std::string what = std::string(full ? "full" : "LoRA") + " step: 2 devices vs host";
        if (full && params > 50'000'000) {
            c.skip(name, what, "model has " + std::to_string(params / 1000000) + "M parameters; full finetune checked up to 50M");
            continue;
        }
        SessionOptions so;
        so.finetune.full = full;
        so.finetune.lora_rank = 4;
        so.batch = 2;
        so.micro_batches = 2;
        so.steps = 1;
        so.threads = c.opt.threads;
        so.lr.lr_max = 1e-3;
        auto masters = [](const TrainingSession & s) {
            std::vector<std::vector<float>> out;
            for (const auto & p : s.trainer().params()) out.emplace_back(p.t->data_as<float>(), p.t->data_as<float>() + p.t->nelements());
            return out;
        };
        TrainingSession host(*c.model, data, so);
        host.step();
        const auto a = masters(host);
        so.pipelined = true;
        so.devices.count = 2;
        std::unique_ptr<TrainingSession> pipe;
        for (size_t mem = size_t(64) << 20; !pipe; mem *= 2) {
            so.devices.memory_each = mem;
            try {
                pipe = std::make_unique<TrainingSession>(*c.model, data, so);
            } catch (const MemoryError &) {
                if (mem > (size_t(64) << 30)) throw;
            }
        }
        pipe->step();
        pipe->synchronize();
        const auto b = masters(*pipe);
        size_t diff = 0;
        std::string first;
        for (size_t i = 0; i < a.size(); ++i)
            if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
                if (diff++ == 0) first = host.trainer().params()[i].name;
        c.add({name, what, std::to_string(diff) + " of " + std::to_string(a.size()) + " tensors differ", "0 (bitwise)",
               diff == 0 ? CheckStatus::Pass : CheckStatus::Fail,
               diff ? "first: " + first : std::to_string(so.devices.memory_each >> 20) + " MiB devices, sync", 0});
    }
}

void check_round_trip(Context_ & c) {
    const char * name = "round trip";
    TempDir dir("rp-check");
    const gguf::Reader & f = c.model->file();
    {
        // The writer copies the metadata and (quick: the 16 smallest) tensors; every byte must come back.
        gguf::Writer w(f.alignment());
        gguf::copy_kvs(f, w);
        std::vector<const gguf::TensorInfo *> ts;
        for (const gguf::TensorInfo & t : f.tensors()) ts.push_back(&t);
        if (c.opt.quick) {
            std::sort(ts.begin(), ts.end(), [](auto * x, auto * y) { return x->nbytes < y->nbytes; });
            if (ts.size() > 16) ts.resize(16);
        }
        for (const gguf::TensorInfo * t : ts) w.add_tensor(t->name, t->type, t->n_dims, t->ne, f.tensor_data(*t));
        w.write(dir.file("copy.gguf"));
        const auto r = gguf::Reader::open(dir.file("copy.gguf"));
        size_t bad = 0;
        std::string first;
        for (const gguf::TensorInfo * t : ts) {
            const gguf::TensorInfo * u = r->find_tensor(t->name);
            if (u && u->type == t->type && u->nbytes == t->nbytes && std::memcmp(r->tensor_data(*u), f.tensor_data(*t), t->nbytes) == 0) continue;
            if (bad++ == 0) first = t->name;
        }
        size_t bad_kv = 0;
        for (const gguf::KV & kv : f.kvs()) {
            const gguf::KV * k = r->find(kv.key);
            if (!k || k->type != kv.type || k->arr_type != kv.arr_type || k->count != kv.count || k->data != kv.data || k->strs != kv.strs)
                if (bad_kv++ == 0 && first.empty()) first = kv.key;
        }
        c.add({name, "GGUF rewrite: " + std::to_string(f.kvs().size()) + " keys, " + std::to_string(ts.size()) + " tensors" +
                         (c.opt.quick ? " (--quick: the smallest)" : ""),
               std::to_string(bad + bad_kv) + " differ", "0 (byte for byte)", bad + bad_kv == 0 ? CheckStatus::Pass : CheckStatus::Fail,
               first.empty() ? "" : "first: " + first, 0});
    }
    const std::string what = "merge of a random adapter: llama.cpp's logits of the merged file vs base + adapter";
    if (c.opt.quick) return c.skip(name, what, "--quick: writes a whole copy of the model");
    if (!c.oracle.available()) return c.skip(name, what, kNoOracle);
    bool float_base = true;
    for (const Tensor * t : c.model->weights())
        if (t->ne[1] > 1 && t->type != DType::F32) float_base = false;
    if (!float_base)
        return c.skip(name, what, "needs an f32 model (a merge into f16/bf16/quantized weights rounds the delta; the test suite checks those bytes)");
    std::vector<std::string> targets;
    for (uint32_t il = 0; il < c.model->hparams().n_layer; ++il)
        for (const char * k : {"attn_q", "attn_v", "attn_qkv", "ffn_down", "ffn_down_exps"}) {  // a dense model's down, or the experts'; phi3's qkv
            const std::string t = "blk." + std::to_string(il) + "." + k + ".weight";
            if (c.model->find(t)) targets.push_back(t);
        }
    auto ad = LoraAdapter::create(*c.model, targets, 2, 4.0f);
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> u(-0.05, 0.05);
    for (const LoraTensor & t : ad->tensors())
        for (Tensor * x : {t.a, t.b}) {
            std::vector<float> v(static_cast<size_t>(x->nelements()));
            for (float & e : v) e = static_cast<float>(u(rng));
            tensor_set_f32(x, v);
        }
    ad->save(dir.file("a.gguf"));
    merge_lora(c.opt.model, {{dir.file("a.gguf"), 1.0f}}, dir.file("m.gguf"));
    const std::vector<int32_t> ids = c.tokens(32);
    const std::vector<float> x = c.oracle.logits(dir.file("m.gguf"), ids, ""), y = c.oracle.logits(c.opt.model, ids, dir.file("a.gguf"));
    float lo = y.empty() ? 0 : y[0], hi = lo, d = 0;
    for (size_t i = 0; i < y.size() && i < x.size(); ++i) {
        lo = std::min(lo, y[i]), hi = std::max(hi, y[i]);
        d = std::max(d, std::fabs(x[i] - y[i]));
    }
    const double rel = x.size() == y.size() && !y.empty() ? d / std::max(1e-30f, hi - lo) : 1e30;
    // Both sides are llama.cpp's; the merged weights differ from base + B A by one rounding (and through a GELU
    // table, by a step where that rounding crosses one).
    const bool table = reads_gelu_table(*c.model);
    const double bound = table ? kGeluTableLogits : 1e-4;
    c.add({name, what, fmt("%.3g", rel), table ? "<= 1e-3" : "<= 1e-4", rel <= bound ? CheckStatus::Pass : CheckStatus::Fail,
           "max |diff| / logit range, " + std::to_string(ids.size()) + " tokens" + (table ? " (fp16 GELU table)" : ""), 0});
}

} // namespace

std::vector<CheckRow> run_model_checks(const ModelCheckOptions & opt, void (*on_row)(const CheckRow &, void *), void * user) {
    Context_ c{opt, Model::load(opt.model), nullptr, nullptr, {}, Oracle(opt.oracle), opt.text.empty() ? kDefaultText : opt.text, {}, on_row, user};
    c.tok = std::make_unique<Tokenizer>(c.model->file());
    if (!opt.lora.empty()) {
        c.adapter = LoraAdapter::load(opt.lora, *c.model);
        c.lora.add(*c.adapter);
    }
    using Fn = void (*)(Context_ &);
    const std::pair<bool, Fn> steps[] = {{opt.tokenizer, check_tokenizer}, {opt.forward, check_forward}, {opt.gradients, check_gradients},
                                         {opt.pipeline, check_pipeline}, {opt.round_trip, check_round_trip}};
    for (const auto & [on, fn] : steps) {
        if (!on) continue;
        try {
            fn(c);
        } catch (const std::exception & e) {  // a check that cannot run is a failure, not a crash of the others
            c.add({"error", "a check could not run", "-", "-", CheckStatus::Fail, e.what(), 0});
        }
    }
    return c.rows;
}

} // namespace rp
