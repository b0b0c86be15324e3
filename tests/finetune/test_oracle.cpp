// Finetune results against llama.cpp (rp-oracle, reference-oracle.md §8-§10) and against llama-export-lora's
// merged reference file:
//   - directional finite differences of the oracle's loss for attn_k, attn_v and token_embd (the tensors whose
//     gradients llama.cpp's own training gets wrong) agree with our analytic gradients;
//   - an adapter written by rp-finetune loads in llama.cpp and its logits equal ours;
//   - rp-merge-lora's output gives the base+adapter logits in both engines;
//   - our merge of the shared test adapter equals llama-export-lora's, tensor by tensor.
#include "ft_test_util.h"
#include "tests/oracle/oracle_run.h"

#include "ggml_rp/ggml_rp.h"
#include "gguf/gguf.h"
#include "models/finetune.h"
#include "models/inference.h"
#include "models/lora.h"
#include "models/merge_lora.h"
#include "models/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using rp::oracle::quote;

const std::vector<int32_t> kPrompt1 = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426};

struct TmpDir {
    fs::path p;
    TmpDir() {
        char tmpl[] = "/tmp/rp-ft-oracle-XXXXXX";
        p = mkdtemp(tmpl);
    }
    ~TmpDir() { fs::remove_all(p); }
    std::string operator/(const std::string & f) const { return (p / f).string(); }
};

std::string tokens_arg(const std::vector<int32_t> & t) {
    std::string s;
    for (int32_t x : t) {
        if (!s.empty()) s += ' ';
        s += std::to_string(x);
    }
    return quote(s);
}

// The oracle's mean CE over n next-token labels of `tokens`.
double oracle_ce(const std::string & model, const std::vector<int32_t> & tokens, int n) {
    const rp::oracle::Result r = rp::oracle::run("logits " + quote(model) + " --tokens " + tokens_arg(tokens) + " --ce " + std::to_string(n));
    EXPECT_EQ(r.status, 0) << r.out;
    const auto lines = rp::oracle::lines_starting(r.out, "mean CE");
    if (lines.empty()) return NAN;
    return std::stod(lines[0].substr(lines[0].find('=') + 1));
}

std::vector<float> oracle_logits(const std::string & model, const std::vector<int32_t> & tokens, const std::string & lora,
                                 const std::string & out) {
    std::string args = "logits " + quote(model) + " --tokens " + tokens_arg(tokens) + " --out " + quote(out);
    if (!lora.empty()) args += " --lora " + quote(lora);
    const rp::oracle::Result r = rp::oracle::run(args);
    EXPECT_EQ(r.status, 0) << r.out;
    return rp::oracle::read_f32(out);
}

// A copy of the GGUF at `src` with one tensor's values replaced (f32).
void write_variant(const std::string & src, const std::string & dst, const std::string & name, const std::vector<float> & v) {
    auto f = gguf::Reader::open(src);
    gguf::Writer w(f->alignment());
    for (const gguf::KV & kv : f->kvs())
        if (kv.key != "general.alignment") w.set_kv(kv);
    for (const gguf::TensorInfo & t : f->tensors())
        w.add_tensor(t.name, t.type, t.n_dims, t.ne, t.name == name ? static_cast<const void *>(v.data()) : f->tensor_data(t));
    w.write(dst);
}

float max_abs(const std::vector<float> & v) {
    float m = 0;
    for (float x : v) m = std::max(m, std::abs(x));
    return m;
}

float max_diff(const std::vector<float> & a, const std::vector<float> & b) {
    EXPECT_EQ(a.size(), b.size());
    float m = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
    return m;
}

TEST(FinetuneOracle, DirectionalFiniteDifferences) {
    RP_REQUIRE_ORACLE();
    TmpDir d;
    const int n = 15;  // inputs t0..t14, labels t1..t15, no mask: the oracle's --ce loss
    for (const char * rel : {"stories260K.gguf", "synthetic/tiny-random-qwen2.gguf", "synthetic/tiny-random-qwen3.gguf"}) {
        const std::string path = ft_test::model_path(rel);
        auto model = rp::Model::load(path);
        rp::FinetuneConfig cfg;
        cfg.full = true;
        rp::Trainer tr(*model, cfg);
        std::vector<int32_t> toks = kPrompt1;
        for (int32_t & t : toks) t %= static_cast<int32_t>(model->hparams().n_vocab);
        std::vector<int32_t> labels(toks.begin() + 1, toks.end());
        tr.zero_grads();
        const double loss = tr.accumulate(toks.data(), labels.data(), n, 1, 1.0f / n, 1);
        tr.collect_grads();
        const double ce0 = oracle_ce(path, toks, n);
        EXPECT_NEAR(loss, ce0, 1e-4 * std::abs(ce0)) << rel;
        const int last = static_cast<int>(model->hparams().n_layer) - 1;
        const std::vector<std::string> names = {"blk.0.attn_k.weight", "blk.0.attn_v.weight",
                                                std::string("blk.").append(std::to_string(last)).append(".attn_k.weight"), "token_embd.weight"};
        for (const std::string & name : names) {
            const rp::Trainer::Param * p = nullptr;
            for (const auto & q : tr.params())
                if (q.name == name) p = &q;
            ASSERT_NE(p, nullptr) << name;
            const std::vector<float> g = rp::tensor_get_f32(p->t->grad), w = rp::tensor_get_f32(p->t);
            double gn = 0;
            for (float x : g) gn += static_cast<double>(x) * x;
            gn = std::sqrt(gn);
            const double eps = 1e-2;
            std::vector<float> wp(w), wm(w);
            double expected = 0;  // <g, W+ - W-> from the stored float values
            for (size_t i = 0; i < w.size(); ++i) {
                wp[i] = static_cast<float>(w[i] + eps * g[i] / gn);
                wm[i] = static_cast<float>(w[i] - eps * g[i] / gn);
                expected += static_cast<double>(g[i]) * (static_cast<double>(wp[i]) - wm[i]);
            }
            write_variant(path, d / "p.gguf", name, wp);
            write_variant(path, d / "m.gguf", name, wm);
            const double got = oracle_ce(d / "p.gguf", toks, n) - oracle_ce(d / "m.gguf", toks, n);
            const double rel_err = std::abs(got - expected) / std::abs(expected);
            std::printf("  %-40s %-26s |g| %.4e  oracle dCE %.6e  <g,dW> %.6e  rel err %.2e\n", rel, name.c_str(), gn, got,
                        expected, rel_err);
            EXPECT_LT(rel_err, 1e-2) << rel << " " << name;
        }
    }
}

TEST(FinetuneOracle, TrainedAdapterAndMergeMatchLlamaCpp) {
    RP_REQUIRE_ORACLE();
    TmpDir d;
    const std::string base = ft_test::stories();
    std::string log;
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-finetune") + " -m " + base + " --data " + ft_test::shared_dir() +
                               "/models/reference/train.txt -o " + (d / "a.gguf") +
                               " --seq-len 32 --batch 2 --steps 3 --lr 1e-2 -t 1 --lora-targets attn_q,attn_k,attn_v,ffn_down,token_embd",
                           &log),
              0)
        << log;
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-merge-lora") + " -m " + base + " --lora " + (d / "a.gguf") + " -o " + (d / "merged.gguf"), &log), 0)
        << log;

    // Ours: base + adapter at run time, and the merged file.
    auto model = rp::Model::load(base);
    auto ad = rp::LoraAdapter::load(d / "a.gguf", *model);
    rp::LoraSet set;
    set.add(*ad);
    rp::InferenceSession ours(*model, 64, 1, &set);
    const std::vector<float> ours_lora = ours.eval(kPrompt1, true);
    auto merged = rp::Model::load(d / "merged.gguf");
    rp::InferenceSession ours_m(*merged, 64, 1);
    const std::vector<float> ours_merged = ours_m.eval(kPrompt1, true);
    rp::InferenceSession plain(*model, 64, 1);
    const std::vector<float> ours_base = plain.eval(kPrompt1, true);

    const std::vector<float> ref_lora = oracle_logits(base, kPrompt1, d / "a.gguf", d / "l1.f32");
    const std::vector<float> ref_merged = oracle_logits(d / "merged.gguf", kPrompt1, "", d / "l2.f32");
    const float scale = max_abs(ref_lora);
    const float e1 = max_diff(ours_lora, ref_lora), e2 = max_diff(ref_merged, ref_lora), e3 = max_diff(ours_merged, ours_lora);
    std::printf("max |dlogit| (logits up to %.2f): ours vs llama.cpp with adapter %.2e, llama.cpp merged vs adapter %.2e, "
                "ours merged vs adapter %.2e; adapter moved logits by %.3f\n",
                scale, e1, e2, e3, max_diff(ours_base, ours_lora));
    EXPECT_LE(e1, 1e-4f * scale);
    EXPECT_LE(e2, 1e-4f * scale);
    EXPECT_LE(e3, 1e-4f * scale);
    EXPECT_GT(max_diff(ours_base, ours_lora), 1e-2f);  // the adapter is not a no-op
}

TEST(FinetuneOracle, FullFinetuneOutputLoadsInLlamaCpp) {
    RP_REQUIRE_ORACLE();
    TmpDir d;
    // F32 files: on F16 files llama.cpp rounds activations to f16 (reference-oracle.md §7), so only the
    // layout is checked there (below).
    for (const char * rel : {"stories260K.gguf", "synthetic/tiny-random-qwen3.gguf"}) {
        const std::string base = ft_test::model_path(rel);
        std::string log;
        ASSERT_EQ(ft_test::run(ft_test::tool("rp-finetune") + " -m " + base + " --data " + ft_test::shared_dir() +
                                   "/models/reference/train.txt -o " + (d / "f.gguf") + " --full --seq-len 32 --batch 2 --steps 2 --lr 1e-2 -t 1",
                               &log),
                  0)
            << log;
        std::vector<int32_t> toks = kPrompt1;
        auto model = rp::Model::load(d / "f.gguf");
        for (int32_t & t : toks) t %= static_cast<int32_t>(model->hparams().n_vocab);
        rp::InferenceSession ours(*model, 64, 1);
        const std::vector<float> a = ours.eval(toks, true);
        const std::vector<float> b = oracle_logits(d / "f.gguf", toks, "", d / "l.f32");
        auto base_model = rp::Model::load(base);
        rp::InferenceSession before(*base_model, 64, 1);
        const float moved = max_diff(before.eval(toks, true), a), e = max_diff(a, b);
        std::printf("%s --full: ours vs llama.cpp on the finetuned file %.2e (logits up to %.2f, training moved them by %.3f)\n", rel, e,
                    max_abs(b), moved);
        EXPECT_LE(e, 1e-4f * max_abs(b)) << rel;
        EXPECT_GT(moved, 1e-2f) << rel;
    }
}

// A full finetune keeps every tensor in its base dtype (F16 weights stay F16, F32 norms F32) and changes them.
TEST(FinetuneTool, FullOutputKeepsDtypes) {
    TmpDir d;
    const std::string base = ft_test::model_path("derived/stories260K-F16.gguf");
    std::string log;
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-finetune") + " -m " + base + " --data " + ft_test::shared_dir() +
                               "/models/reference/train.txt -o " + (d / "f.gguf") + " --full --seq-len 32 --batch 2 --steps 2 --lr 1e-2 -t 1",
                           &log),
              0)
        << log;
    auto a = gguf::Reader::open(base);
    auto b = gguf::Reader::open(d / "f.gguf");
    ASSERT_EQ(a->tensors().size(), b->tensors().size());
    for (size_t i = 0; i < a->tensors().size(); ++i) {
        const gguf::TensorInfo & x = a->tensors()[i];
        const gguf::TensorInfo & y = b->tensors()[i];
        EXPECT_EQ(x.name, y.name);
        EXPECT_EQ(x.type, y.type) << x.name;
        ASSERT_EQ(x.nbytes, y.nbytes) << x.name;
        EXPECT_NE(std::memcmp(a->tensor_data(x), b->tensor_data(y), x.nbytes), 0) << x.name << " unchanged";
    }
}

TEST(FinetuneMerge, EqualsLlamaExportLora) {
    TmpDir d;
    const std::string dir = ft_test::shared_dir() + "/models/reference/lora/";
    rp::merge_lora(ft_test::stories(), {{dir + "stories260K-lora-r4-a8.gguf", 1.0f}}, d / "m.gguf");
    auto ours = gguf::Reader::open(d / "m.gguf");
    auto ref = gguf::Reader::open(dir + "stories260K-lora-r4-a8-merged-by-export-lora.gguf");
    ASSERT_EQ(ours->tensors().size(), ref->tensors().size());
    double worst = 0;
    for (const gguf::TensorInfo & t : ref->tensors()) {
        const gguf::TensorInfo * o = ours->find_tensor(t.name);
        ASSERT_NE(o, nullptr) << t.name;
        ASSERT_EQ(o->type, t.type) << t.name;
        ASSERT_EQ(o->nelements(), t.nelements()) << t.name;
        const float * a = reinterpret_cast<const float *>(ours->tensor_data(*o));
        const float * b = reinterpret_cast<const float *>(ref->tensor_data(t));
        for (int64_t i = 0; i < t.nelements(); ++i) worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
    }
    std::printf("max |ours - export-lora| over all tensors: %.3e\n", worst);
    EXPECT_LE(worst, 1e-6);
    EXPECT_EQ(ours->get_u32("general.file_type"), ref->get_u32("general.file_type"));
}

TEST(FinetuneMerge, ErrorsLeaveNoFile) {
    TmpDir d;
    const std::string lora = ft_test::shared_dir() + "/models/reference/lora/stories260K-lora-r4-a8.gguf";
    std::string log;
    EXPECT_EQ(ft_test::run(ft_test::tool("rp-merge-lora") + " -m " + ft_test::model_path("synthetic/tiny-random-qwen2.gguf") +
                               " --lora " + lora + " -o " + (d / "o.gguf"), &log), 1);
    EXPECT_EQ(log.rfind("error: ", 0), 0u) << log;
    EXPECT_FALSE(fs::exists(d / "o.gguf"));
    // ffn_down rows hold 172 values: no Q8_0 re-quantization possible.
    EXPECT_EQ(ft_test::run(ft_test::tool("rp-merge-lora") + " -m " + ft_test::stories() + " --lora " + lora + " -o " + (d / "o.gguf") +
                               " --type q8_0", &log), 1);
    EXPECT_NE(log.find("ffn_down"), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(d / "o.gguf"));
}

} // namespace
