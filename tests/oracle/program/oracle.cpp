// rp-oracle: llama.cpp as an independent reference for the forward pass, tokenizer and runtime LoRA.
// Linked against the prebuilt CPU libraries from npm (scripts/fetch-oracle.sh); how and why:
// docs/reference-oracle.md. Usage:
//   rp-oracle logits   MODEL (--prompt TEXT | --prompt-file F | --tokens "1 2 3") [--lora A [--lora-scale S]]
//                      [--out FILE.f32] [--ce N] [--step N]   (--step: decode N tokens at a time, e.g. 1: a recurrent
//                      layer's one-token form instead of its chunked prompt form)
//   rp-oracle tokenize MODEL [--special] [--no-parse-special] [--cases] < text
//   rp-oracle generate MODEL (--prompt TEXT | --prompt-file F | --tokens "...") -n N [--lora A] [--ignore-eos]
//   rp-oracle detok    MODEL [--remove-special] [--no-special] ID...
//   rp-oracle quantize MODEL --out FILE --ftype NAME [--pure]   llama-quantize without an importance matrix;
//                      NAME is llama-quantize's (q2_k, q3_k_m, q4_k_m, q6_k, q8_0, ...); --pure: one type for all
//   rp-oracle quantize-rows IN.f32 --ftype TYPE --row N --out FILE
//                      ggml_quantize_chunk on rows of N floats (TYPE: ggml's type name, e.g. mxfp4), then the
//                      type's to_float of those bytes: FILE holds the quantized rows, then their f32 values
//   rp-oracle rope IN.f32 --row D --heads H --tokens "P0 P1 ..." --rope "n_rot,mode,base,scale,ext,attn,fast,slow,ctx"
//                      --out FILE   ggml_rope_ext on the CPU backend: x [D, H, T] (T = the positions given) -> FILE
//   rp-oracle swiglu-oai IN.f32 --row N --params "alpha,limit" --out FILE
//                      ggml_swiglu_oai (gpt-oss's clamped SwiGLU) on the CPU backend: IN holds the gate rows, then
//                      as many up rows, N floats each -> FILE
//   rp-oracle geglu IN.f32 --row N --out FILE
//                      ggml_geglu_split (Gemma's GELU-tanh gated FFN, as llama.cpp's build_ffn runs it) likewise
// Common: --bins DIR (else $RP_ORACLE_BINS, else the directory configured at build time) holds the
// libggml-cpu-*.so backends; --backend NAME|FILE|best (else $RP_ORACLE_BACKEND) picks the CPU build (default
// zen4, see load_backends); --threads N (default 1, see Args); --verbose shows llama.cpp's log; --ctx N: the context
// size of logits / generate (default max(512, tokens)), which chooses e.g. phi3's LongRoPE factors.
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Args {
    std::string mode, model, prompt, tokens, lora, out, bins, backend;
    bool has_prompt = false, has_tokens = false;
    float lora_scale = 1.0f;
    int n_ctx = 0;  // --ctx: 0 = max(512, tokens)
    int step = 0;   // --step: tokens per llama_decode of logits (0: all at once)
    // One thread by default: the logits are bit-identical for 1, 2 or 3 threads (each dot product is computed by
    // one thread), while the reference files' 2 threads stall for seconds at ggml's thread barrier when a
    // 2-core machine is busy with other tests.
    int ce = -1, n_gen = -1, threads = 1;
    bool add_special = false, parse_special = true, cases = false, ignore_eos = false;
    bool remove_special = false, render_special = true, verbose = false;
    std::string ftype;  // quantize
    long long row = 0;  // quantize-rows, rope (head_dim)
    long long heads = 0;  // rope
    std::string rope;     // rope: "n_rot,mode,freq_base,freq_scale,ext_factor,attn_factor,beta_fast,beta_slow,n_ctx_orig"
    std::string params;   // swiglu-oai: "alpha,limit"
    bool pure = false;
    std::vector<llama_token> ids;  // detok
};

std::string g_backend;  // which CPU backend build runs, printed by the logits mode

[[noreturn]] void fail(const std::string & msg) { throw std::runtime_error(msg); }

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string read_file(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("cannot open " + path);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

std::vector<llama_token> parse_ids(const std::string & s) {
    std::vector<llama_token> ids;
    std::istringstream in(s);
    std::string w;
    while (in >> w) {
        char * end = nullptr;
        long v = std::strtol(w.c_str(), &end, 10);
        if (*end != '\0' || v < 0 || v > INT32_MAX) fail("bad token id '" + w + "'");
        ids.push_back((llama_token) v);
    }
    return ids;
}

Args parse_args(int argc, char ** argv) {
    if (argc < 3) fail("usage: rp-oracle logits|tokenize|generate|detok|quantize|quantize-rows MODEL [options] (see oracle.cpp)");
    Args a;
    a.mode = argv[1];
    a.model = argv[2];
    for (int i = 3; i < argc; ++i) {
        std::string k = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) fail("flag " + k + " needs a value");
            return argv[++i];
        };
        if (k == "--prompt") { a.prompt = val(); a.has_prompt = true; }
        else if (k == "--prompt-file") { a.prompt = read_file(val()); a.has_prompt = true; }
        else if (k == "--tokens") { a.tokens = val(); a.has_tokens = true; }
        else if (k == "--lora") a.lora = val();
        else if (k == "--lora-scale") a.lora_scale = std::stof(val());
        else if (k == "--ctx") a.n_ctx = std::stoi(val());
        else if (k == "--step") a.step = std::stoi(val());
        else if (k == "--out") a.out = val();
        else if (k == "--ce") a.ce = std::stoi(val());
        else if (k == "-n") a.n_gen = std::stoi(val());
        else if (k == "--threads") a.threads = std::stoi(val());
        else if (k == "--bins") a.bins = val();
        else if (k == "--backend") a.backend = val();
        else if (k == "--special") a.add_special = true;
        else if (k == "--no-parse-special") a.parse_special = false;
        else if (k == "--cases") a.cases = true;
        else if (k == "--ignore-eos") a.ignore_eos = true;
        else if (k == "--remove-special") a.remove_special = true;
        else if (k == "--no-special") a.render_special = false;
        else if (k == "--verbose") a.verbose = true;
        else if (k == "--ftype") a.ftype = val();
        else if (k == "--pure") a.pure = true;
        else if (k == "--row") a.row = std::stoll(val());
        else if (k == "--heads") a.heads = std::stoll(val());
        else if (k == "--rope") a.rope = val();
        else if (k == "--params") a.params = val();
        else if (a.mode == "detok" && !k.empty() && k[0] != '-') { auto v = parse_ids(k); a.ids.insert(a.ids.end(), v.begin(), v.end()); }
        else fail("unknown flag '" + k + "'");
    }
    return a;
}

void log_cb(ggml_log_level level, const char * text, void * verbose) {
    if (*(bool *) verbose || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

// The libraries link no backend: register a CPU backend before loading a model (reference-oracle.md §4).
// llama.cpp would pick the best-scoring ISA build for the host, but builds differ in the last bits (the
// sapphirerapids build's AMX/FP16 paths change F16 and Q8_0 results, non-AVX-512 builds even F32 sums), so by
// default we pin the zen4 build the reference files were made with and fall back to llama.cpp's choice only
// where the host cannot run it. Returns the name of what was loaded, for the "backend:" line.
std::string load_backends(const Args & a) {
    std::string dir = a.bins;
    if (dir.empty() && std::getenv("RP_ORACLE_BINS")) dir = std::getenv("RP_ORACLE_BINS");
#ifdef RP_ORACLE_DEFAULT_BINS
    if (dir.empty()) dir = RP_ORACLE_DEFAULT_BINS;
#endif
    std::string want = a.backend, used;
    if (want.empty() && std::getenv("RP_ORACLE_BACKEND")) want = std::getenv("RP_ORACLE_BACKEND");
    const bool chosen = !want.empty();  // asked for by name: no silent fallback
    if (want.empty()) want = "zen4";
    if (want.find('/') != std::string::npos) {  // an explicit backend file
        if (!ggml_backend_load(want.c_str())) fail("cannot load CPU backend " + want + " (missing, or not supported by this CPU)");
        used = want.substr(want.find_last_of('/') + 1);  // libggml-cpu-NAME.so -> NAME
        if (used.rfind("libggml-cpu-", 0) == 0 && used.size() > 15) used = used.substr(12, used.size() - 15);
    } else {
        if (dir.empty()) fail("no backend directory: pass --bins DIR or set RP_ORACLE_BINS");
        if (want != "best" && ggml_backend_load((dir + "/libggml-cpu-" + want + ".so").c_str())) {
            used = want;
        } else if (want != "best" && chosen) {
            fail("cannot load CPU backend " + dir + "/libggml-cpu-" + want + ".so (missing, or not supported by this CPU)");
        } else {
            if (want != "best")
                std::fprintf(stderr, "note: this CPU cannot run the reference build libggml-cpu-%s.so; using llama.cpp's "
                             "choice, whose logits may differ from the reference files in the last bits\n", want.c_str());
            ggml_backend_load_all_from_path(dir.c_str());
            used = "best";
        }
    }
    if (ggml_backend_dev_count() == 0) fail("no CPU backend could be loaded from '" + dir + "' (--bins / RP_ORACLE_BINS)");
    return used;
}

llama_model * load_model(const Args & a, bool vocab_only) {
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.vocab_only = vocab_only;
    llama_model * m = llama_model_load_from_file(a.model.c_str(), mp);
    if (!m) fail("llama.cpp cannot load model " + a.model);
    return m;
}

std::vector<llama_token> tokenize(const llama_vocab * v, const std::string & text, bool add_special, bool parse_special) {
    std::vector<llama_token> t(text.size() + 8);
    int n = llama_tokenize(v, text.data(), (int32_t) text.size(), t.data(), (int32_t) t.size(), add_special, parse_special);
    if (n == INT32_MIN) fail("tokenization overflow");
    if (n < 0) {
        t.resize(-n);
        n = llama_tokenize(v, text.data(), (int32_t) text.size(), t.data(), (int32_t) t.size(), add_special, parse_special);
    }
    t.resize(n);
    return t;
}

std::vector<llama_token> prompt_tokens(const Args & a, const llama_vocab * v) {
    if (a.has_tokens == a.has_prompt) fail("give exactly one of --prompt, --prompt-file, --tokens");
    // add_special: the vocab's BOS rule applies; parse_special: chat markers become single tokens (§5).
    auto t = a.has_tokens ? parse_ids(a.tokens) : tokenize(v, a.prompt, true, true);
    const int n_vocab = llama_vocab_n_tokens(v);
    for (llama_token id : t) if (id >= n_vocab) fail("token id " + std::to_string(id) + " >= n_vocab");
    if (t.empty()) fail("the prompt has no tokens");
    return t;
}

std::string piece(const llama_vocab * v, llama_token id, bool special) {
    std::string s(64, '\0');
    int n = llama_token_to_piece(v, id, s.data(), (int32_t) s.size(), 0, special);
    if (n < 0) { s.resize(-n); n = llama_token_to_piece(v, id, s.data(), (int32_t) s.size(), 0, special); }
    s.resize(std::max(n, 0));
    return s;
}

// Exact-comparison settings (§6): F32 K/V, no flash attention, every position in one ubatch.
llama_context * make_context(const Args & a, llama_model * m, int n_tokens) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = (uint32_t) std::max(a.n_ctx > 0 ? a.n_ctx : 512, n_tokens);
    cp.n_threads = cp.n_threads_batch = a.threads;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx = llama_init_from_model(m, cp);
    if (!ctx) fail("llama_init_from_model failed");
    if (!a.lora.empty()) {
        llama_adapter_lora * ad = llama_adapter_lora_init(m, a.lora.c_str());  // freed with the model
        if (!ad) fail("llama.cpp rejects LoRA adapter " + a.lora);
        float scale = a.lora_scale;
        if (llama_set_adapters_lora(ctx, &ad, 1, &scale) != 0) fail("llama_set_adapters_lora failed for " + a.lora);
    }
    return ctx;
}

void decode(llama_context * ctx, const llama_token * t, int n, int pos0, bool all_logits) {
    llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
        b.token[i] = t[i]; b.pos[i] = pos0 + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0;
        b.logits[i] = all_logits || i == n - 1;
    }
    b.n_tokens = n;
    int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    if (rc != 0) fail("llama_decode returned " + std::to_string(rc));
}

int argmax(const float * z, int n) { return int(std::max_element(z, z + n) - z); }

int run_logits(const Args & a) {
    auto t0 = std::chrono::steady_clock::now();
    llama_model * m = load_model(a, false);
    double t_load = ms_since(t0);
    const llama_vocab * v = llama_model_get_vocab(m);
    const int nv = llama_vocab_n_tokens(v);
    std::vector<llama_token> tok = prompt_tokens(a, v), labels;
    if (a.ce >= 0) {  // inputs t_0..t_{N-1}, labels t_1..t_N (§9)
        if (a.ce < 1 || (size_t) a.ce + 1 > tok.size())
            fail("--ce " + std::to_string(a.ce) + " needs " + std::to_string(a.ce + 1) + " tokens, the prompt has " + std::to_string(tok.size()));
        labels.assign(tok.begin() + 1, tok.begin() + a.ce + 1);
        tok.resize(a.ce);
    }
    const int n = (int) tok.size();
    char desc[256];
    llama_model_desc(m, desc, sizeof desc);
    std::printf("backend: %s\n", g_backend.c_str());
    std::printf("model: %s n_vocab=%d n_embd=%d n_layer=%d n_head=%d n_head_kv=%d n_ctx_train=%d params=%llu\n", desc, nv,
                llama_model_n_embd(m), llama_model_n_layer(m), llama_model_n_head(m), llama_model_n_head_kv(m),
                llama_model_n_ctx_train(m), (unsigned long long) llama_model_n_params(m));
    std::printf("tokens(%d):", n);
    for (llama_token id : tok) std::printf(" %d", id);
    std::printf("\npieces:");
    for (llama_token id : tok) std::printf(" [%s]", piece(v, id, true).c_str());
    std::printf("\n");
    llama_context * ctx = make_context(a, m, n);
    if (!a.lora.empty()) {
        std::string base = a.lora.substr(a.lora.find_last_of('/') + 1);
        std::printf("applied lora %s scale %.3f\n", base.c_str(), a.lora_scale);
    }
    t0 = std::chrono::steady_clock::now();
    std::vector<float> logits((size_t) n * nv);
    const int step = a.step > 0 ? a.step : n;
    for (int i0 = 0; i0 < n; i0 += step) {
        const int piece_n = std::min(step, n - i0);
        decode(ctx, tok.data() + i0, piece_n, i0, true);
        for (int i = 0; i < piece_n; ++i) {
            const float * row = llama_get_logits_ith(ctx, i);
            if (!row) fail("no logits for position " + std::to_string(i0 + i));
            std::copy(row, row + nv, logits.begin() + (size_t) (i0 + i) * nv);
        }
    }
    double t_dec = ms_since(t0);
    const float * last = &logits[(size_t) (n - 1) * nv];
    std::printf("last-position logits[0..15]:");
    for (int j = 0; j < std::min(16, nv); ++j) std::printf(" %.6f", last[j]);
    std::printf("\n");
    double ce = 0;
    for (int i = 0; i < n; ++i) {
        const float * z = &logits[(size_t) i * nv];
        int am = argmax(z, nv);
        double sum = 0, zmax = z[am], se = 0;
        for (int j = 0; j < nv; ++j) { sum += z[j]; se += std::exp((double) z[j] - zmax); }
        std::printf("pos %d tok %d argmax %d (%.5f) sum %.5f\n", i, tok[i], am, z[am], sum);
        if (!labels.empty()) ce += zmax + std::log(se) - z[labels[i]];  // logsumexp - z[label], in double (§9)
    }
    if (!a.out.empty()) {
        std::string tmp = a.out + ".tmp";
        std::FILE * f = std::fopen(tmp.c_str(), "wb");
        if (!f) fail("cannot write " + tmp);
        bool ok = std::fwrite(logits.data(), sizeof(float), logits.size(), f) == logits.size();
        ok = (std::fclose(f) == 0) && ok;
        if (!ok || std::rename(tmp.c_str(), a.out.c_str()) != 0) { std::remove(tmp.c_str()); fail("cannot write " + a.out); }
        std::printf("wrote %d x %d f32 logits to %s\n", n, nv, a.out.c_str());
    }
    if (!labels.empty()) std::printf("mean CE over %d next-token labels = %.9f\n", n, ce / n);
    std::printf("timing: load %.1f ms, decode(%d tok) %.2f ms\n", t_load, n, t_dec);
    llama_free(ctx);
    llama_model_free(m);
    return 0;
}

int run_tokenize(const Args & a) {
    llama_model * m = load_model(a, true);
    const llama_vocab * v = llama_model_get_vocab(m);
    std::string text(std::istreambuf_iterator<char>(std::cin), {});
    std::vector<std::string> cases;
    if (a.cases) {  // the vocab fixtures' .inp format: every case followed by this separator
        const std::string sep = "\n__ggml_vocab_test__\n";
        size_t p = 0, q;
        while ((q = text.find(sep, p)) != std::string::npos) { cases.push_back(text.substr(p, q - p)); p = q + sep.size(); }
        if (p != text.size()) fail("--cases: input does not end with the separator");
    } else {
        cases.push_back(text);
    }
    for (const std::string & c : cases) {
        auto t = tokenize(v, c, a.add_special, a.parse_special);
        for (size_t i = 0; i < t.size(); ++i) std::printf(i ? " %d" : "%d", t[i]);
        std::printf("\n");
    }
    llama_model_free(m);
    return 0;
}

int run_generate(const Args & a) {
    if (a.n_gen < 0) fail("generate needs -n N");
    llama_model * m = load_model(a, false);
    const llama_vocab * v = llama_model_get_vocab(m);
    const int nv = llama_vocab_n_tokens(v);
    std::vector<llama_token> tok = prompt_tokens(a, v), gen;
    llama_context * ctx = make_context(a, m, (int) tok.size() + a.n_gen);
    decode(ctx, tok.data(), (int) tok.size(), 0, false);  // the prompt in one batch, then one token at a time
    for (int i = 0; i < a.n_gen; ++i) {
        llama_token next = argmax(llama_get_logits_ith(ctx, -1), nv);  // greedy
        if (!a.ignore_eos && llama_vocab_is_eog(v, next)) break;
        gen.push_back(next);
        decode(ctx, &next, 1, (int) (tok.size() + gen.size() - 1), true);
    }
    for (size_t i = 0; i < gen.size(); ++i) std::printf(i ? " %d" : "%d", gen[i]);
    std::printf("\n");
    llama_free(ctx);
    llama_model_free(m);
    return 0;
}

int run_detok(const Args & a) {
    llama_model * m = load_model(a, true);
    const llama_vocab * v = llama_model_get_vocab(m);
    for (llama_token id : a.ids) if (id >= llama_vocab_n_tokens(v)) fail("token id " + std::to_string(id) + " >= n_vocab");
    std::string s(a.ids.size() * 16 + 16, '\0');
    int n = llama_detokenize(v, a.ids.data(), (int32_t) a.ids.size(), s.data(), (int32_t) s.size(), a.remove_special, a.render_special);
    if (n < 0) { s.resize(-n); n = llama_detokenize(v, a.ids.data(), (int32_t) a.ids.size(), s.data(), (int32_t) s.size(), a.remove_special, a.render_special); }
    s.resize(std::max(n, 0));
    std::fwrite(s.data(), 1, s.size(), stdout);  // exactly the text: no newline added
    llama_model_free(m);
    return 0;
}

// llama-quantize's file-type names (lower case) -> llama_ftype.
llama_ftype ftype_from_name(const std::string & name) {
    static const std::pair<const char *, llama_ftype> kTypes[] = {
        {"f32", LLAMA_FTYPE_ALL_F32}, {"f16", LLAMA_FTYPE_MOSTLY_F16}, {"bf16", LLAMA_FTYPE_MOSTLY_BF16},
        {"q4_0", LLAMA_FTYPE_MOSTLY_Q4_0}, {"q4_1", LLAMA_FTYPE_MOSTLY_Q4_1}, {"q5_0", LLAMA_FTYPE_MOSTLY_Q5_0},
        {"q5_1", LLAMA_FTYPE_MOSTLY_Q5_1}, {"q8_0", LLAMA_FTYPE_MOSTLY_Q8_0}, {"q2_k", LLAMA_FTYPE_MOSTLY_Q2_K},
        {"q2_k_s", LLAMA_FTYPE_MOSTLY_Q2_K_S}, {"q3_k_s", LLAMA_FTYPE_MOSTLY_Q3_K_S}, {"q3_k_m", LLAMA_FTYPE_MOSTLY_Q3_K_M},
        {"q3_k_l", LLAMA_FTYPE_MOSTLY_Q3_K_L}, {"q4_k_s", LLAMA_FTYPE_MOSTLY_Q4_K_S}, {"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M},
        {"q5_k_s", LLAMA_FTYPE_MOSTLY_Q5_K_S}, {"q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M}, {"q6_k", LLAMA_FTYPE_MOSTLY_Q6_K},
        {"mxfp4_moe", LLAMA_FTYPE_MOSTLY_MXFP4_MOE},
    };
    for (const auto & [n, t] : kTypes)
        if (name == n) return t;
    fail("--ftype: unknown file type '" + name + "'");
}

int run_quantize(const Args & a) {
    if (a.out.empty() || a.ftype.empty()) fail("quantize needs --out FILE and --ftype NAME");
    llama_model_quantize_params p = llama_model_quantize_default_params();
    p.ftype = ftype_from_name(a.ftype);
    p.pure = a.pure;
    p.nthread = a.threads;
    if (llama_model_quantize(a.model.c_str(), a.out.c_str(), &p) != 0) fail("llama_model_quantize failed on " + a.model);
    return 0;
}

// ggml's own quantizer and dequantizer of one type, on rows of floats.
int run_quantize_rows(const Args & a) {
    if (a.out.empty() || a.ftype.empty() || a.row <= 0) fail("quantize-rows needs --ftype TYPE, --row N and --out FILE");
    int type = -1;
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * name = ggml_type_name(static_cast<ggml_type>(t));
        if (name && a.ftype == name) type = t;
    }
    if (type < 0) fail("quantize-rows: unknown ggml type '" + a.ftype + "'");
    const std::string in = read_file(a.model);
    if (in.size() % (sizeof(float) * static_cast<size_t>(a.row)) != 0) fail("quantize-rows: the input is not whole rows of floats");
    const int64_t rows = static_cast<int64_t>(in.size() / sizeof(float)) / a.row;
    const ggml_type t = static_cast<ggml_type>(type);
    const size_t rb = ggml_row_size(t, a.row);
    std::vector<uint8_t> q(rb * static_cast<size_t>(rows));
    const size_t n = ggml_quantize_chunk(t, reinterpret_cast<const float *>(in.data()), q.data(), 0, rows, a.row, nullptr);
    if (n != q.size()) fail("quantize-rows: ggml_quantize_chunk wrote " + std::to_string(n) + " bytes");
    std::vector<float> back(static_cast<size_t>(rows * a.row));
    const ggml_type_traits * tr = ggml_get_type_traits(t);
    for (int64_t r = 0; r < rows; ++r) tr->to_float(q.data() + static_cast<size_t>(r) * rb, back.data() + r * a.row, a.row);
    std::ofstream out(a.out, std::ios::binary);
    out.write(reinterpret_cast<const char *>(q.data()), static_cast<std::streamsize>(q.size()));
    out.write(reinterpret_cast<const char *>(back.data()), static_cast<std::streamsize>(back.size() * sizeof(float)));
    if (!out) fail("cannot write " + a.out);
    return 0;
}

std::vector<double> numbers(const std::string & list, size_t n, const char * flag) {
    std::vector<double> r;
    std::stringstream ss(list);
    for (std::string item; std::getline(ss, item, ',');) r.push_back(std::stod(item));
    if (r.size() != n) fail(std::string(flag) + ": " + std::to_string(n) + " comma-separated values");
    return r;
}

// Runs the graph ending in `out` on the CPU backend, after `fill` has set its inputs; returns out's floats.
template <class Fill> std::vector<float> compute_on_cpu(ggml_context * ctx, ggml_tensor * out, Fill fill) {
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_t be = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    if (!be) fail("no CPU backend");
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    fill();
    if (ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) fail("ggml_backend_graph_compute failed");
    std::vector<float> v(static_cast<size_t>(ggml_nelements(out)));
    ggml_backend_tensor_get(out, v.data(), 0, v.size() * sizeof(float));
    ggml_backend_buffer_free(buf);
    ggml_backend_free(be);
    return v;
}

void write_floats(const std::string & path, const std::vector<float> & v) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char *>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    if (!f) fail("cannot write " + path);
}

// ggml's gated activations: the clamped SwiGLU (swiglu-oai) and GeGLU (geglu).
int run_glu(const Args & a) {
    const bool oai = a.mode == "swiglu-oai";
    if (a.out.empty() || a.row <= 0 || (oai && a.params.empty())) fail(a.mode + " needs --row" + (oai ? ", --params" : "") + " and --out");
    const std::vector<double> p = oai ? numbers(a.params, 2, "--params") : std::vector<double>();
    const std::string in = read_file(a.model);
    const size_t row_bytes = static_cast<size_t>(a.row) * sizeof(float);
    if (in.size() % (2 * row_bytes) != 0) fail(a.mode + ": the input is not gate and up rows of N floats");
    const int64_t rows = static_cast<int64_t>(in.size() / (2 * row_bytes));
    ggml_init_params ip = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * g = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, a.row, rows);
    ggml_tensor * u = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, a.row, rows);
    ggml_tensor * y = oai ? ggml_swiglu_oai(ctx, g, u, static_cast<float>(p[0]), static_cast<float>(p[1])) : ggml_geglu_split(ctx, g, u);
    const std::vector<float> out = compute_on_cpu(ctx, y, [&] {
        ggml_backend_tensor_set(g, in.data(), 0, in.size() / 2);
        ggml_backend_tensor_set(u, in.data() + in.size() / 2, 0, in.size() / 2);
    });
    write_floats(a.out, out);
    ggml_free(ctx);
    return 0;
}

// ggml's rope (ggml_rope_ext, YaRN included) on the CPU backend.
int run_rope(const Args & a) {
    if (a.out.empty() || a.row <= 0 || a.heads <= 0 || a.rope.empty() || !a.has_tokens) fail("rope needs --row, --heads, --tokens, --rope and --out");
    const std::vector<double> r = numbers(a.rope, 9, "--rope");
    const std::vector<llama_token> pos = parse_ids(a.tokens);
    const int64_t T = static_cast<int64_t>(pos.size());
    const std::string in = read_file(a.model);
    if (in.size() != static_cast<size_t>(a.row * a.heads * T) * sizeof(float)) fail("rope: the input is not D x H x T floats");
    ggml_init_params ip = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, a.row, a.heads, T);
    ggml_tensor * p = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, T);
    // --params: the freq factors (n_rot / 2 of them), ggml_rope_ext's c
    const std::vector<double> fd = a.params.empty() ? std::vector<double>() : numbers(a.params, static_cast<size_t>(r[0]) / 2, "--params");
    const std::vector<float> fv(fd.begin(), fd.end());
    ggml_tensor * c = fv.empty() ? nullptr : ggml_new_tensor_1d(ctx, GGML_TYPE_F32, static_cast<int64_t>(fv.size()));
    ggml_tensor * y = ggml_rope_ext(ctx, x, p, c, static_cast<int>(r[0]), static_cast<int>(r[1]), static_cast<int>(r[8]),
                                    static_cast<float>(r[2]), static_cast<float>(r[3]), static_cast<float>(r[4]), static_cast<float>(r[5]),
                                    static_cast<float>(r[6]), static_cast<float>(r[7]));
    const std::vector<int32_t> pv(pos.begin(), pos.end());
    const std::vector<float> out = compute_on_cpu(ctx, y, [&] {
        ggml_backend_tensor_set(x, in.data(), 0, in.size());
        ggml_backend_tensor_set(p, pv.data(), 0, pv.size() * sizeof(int32_t));
        if (c) ggml_backend_tensor_set(c, fv.data(), 0, fv.size() * sizeof(float));
    });
    write_floats(a.out, out);
    ggml_free(ctx);
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    try {
        Args a = parse_args(argc, argv);
        llama_log_set(log_cb, &a.verbose);
        g_backend = load_backends(a);
        llama_backend_init();
        int rc;
        if (a.mode == "logits") rc = run_logits(a);
        else if (a.mode == "tokenize") rc = run_tokenize(a);
        else if (a.mode == "generate") rc = run_generate(a);
        else if (a.mode == "detok") rc = run_detok(a);
        else if (a.mode == "quantize") rc = run_quantize(a);
        else if (a.mode == "quantize-rows") rc = run_quantize_rows(a);
        else if (a.mode == "rope") rc = run_rope(a);
        else if (a.mode == "swiglu-oai" || a.mode == "geglu") rc = run_glu(a);
        else fail("unknown mode '" + a.mode + "' (logits, tokenize, generate, detok, quantize, quantize-rows, rope, swiglu-oai, geglu)");
        llama_backend_free();
        return rc;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
