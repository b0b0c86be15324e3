// Finetune results against llama.cpp (rp-oracle, reference-oracle.md §8-§10) and against llama-export-lora's
// merged reference file:
//   - directional finite differences of the oracle's loss for attn_k, attn_v and token_embd (the tensors whose
//     gradients llama.cpp's own training gets wrong) agree with our analytic gradients;
//   - an adapter written by rp-finetune loads in llama.cpp and its logits equal ours;
//   - rp-merge-lora's output gives the base+adapter logits in both engines;
//   - our merge of the shared test adapter equals llama-export-lora's, tensor by tensor.
#include "ft_test_util.h"
#include "tests/common/reference_prompts.h"
#include "tests/oracle/oracle_run.h"

#include "ggml_rp/cpu/matvec_dot.h"
#include "ggml_rp/ggml_rp.h"
#include "gguf/gguf.h"
#include "models/train/trainer.h"
#include "models/arch/inference.h"
#include "models/arch/lora.h"
#include "models/convert/merge_lora.h"
#include "models/arch/model.h"
#include "models/convert/synth_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using rp::oracle::quote;

using rp_test::kPrompt1;

struct TmpDir {
    fs::path p;
    TmpDir() {
        char tmpl[] = "/tmp/rp-ft-oracle-XXXXXX";
        p = mkdtemp(tmpl);
    }
    ~TmpDir() { fs::remove_all(p); }
    std::string operator/(const std::string & f) const { return (p / f).string(); }
};

std::string tokens_arg(const std::vector<int32_t> & t) { return quote(rp::oracle::id_list(t)); }

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
    // llama-export-lora stamps general.file_type = 1 (MOSTLY_F16) whatever it wrote; we keep every tensor's
    // type, so the base's metadata (which has no file_type here) stays as it was.
    EXPECT_EQ(ours->find("general.file_type"), nullptr);
}

TEST(FinetuneMerge, ErrorsLeaveNoFile) {
    TmpDir d;
    const std::string lora = ft_test::shared_dir() + "/models/reference/lora/stories260K-lora-r4-a8.gguf";
    std::string log;
    EXPECT_EQ(ft_test::run(ft_test::tool("rp-merge-lora") + " -m " + ft_test::model_path("synthetic/tiny-random-qwen2.gguf") +
                               " --lora " + lora + " -o " + (d / "o.gguf"), &log), 1);
    EXPECT_EQ(log.rfind("error: ", 0), 0u) << log;
    EXPECT_FALSE(fs::exists(d / "o.gguf"));
    EXPECT_EQ(ft_test::run(ft_test::tool("rp-merge-lora") + " -m " + ft_test::stories() + " --lora " + lora + " -o " + (d / "o.gguf") +
                               " --type q9_k", &log), 1);
    EXPECT_NE(log.find("q4_k_m"), std::string::npos) << "the valid types are listed: " << log;
    EXPECT_FALSE(fs::exists(d / "o.gguf"));
    // A diverged adapter (a NaN in one factor): refused naming the tensor, no output.
    {
        const auto r = gguf::Reader::open(lora);
        gguf::Writer w(r->alignment());
        gguf::copy_kvs(*r, w);
        for (const gguf::TensorInfo & t : r->tensors()) {
            if (t.name != "blk.2.attn_q.weight.lora_b" || t.type != rp::DType::F32) {
                w.add_tensor(t.name, t.type, t.n_dims, t.ne, r->tensor_data(t));
                continue;
            }
            const float * src = reinterpret_cast<const float *>(r->tensor_data(t));
            auto v = std::make_shared<std::vector<float>>(src, src + t.nelements());
            (*v)[3] = std::nanf("");
            w.add_tensor(t.name, t.type, t.n_dims, t.ne, [v](uint8_t * dst, size_t n) { std::memcpy(dst, v->data(), n); });
        }
        w.write(d / "nan.gguf");
    }
    EXPECT_EQ(ft_test::run(ft_test::tool("rp-merge-lora") + " -m " + ft_test::stories() + " --lora " + (d / "nan.gguf") + " -o " + (d / "o.gguf"), &log), 1);
    EXPECT_NE(log.find("blk.2.attn_q.weight"), std::string::npos) << log;
    EXPECT_NE(log.find("not finite"), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(d / "o.gguf"));
    EXPECT_FALSE(fs::exists(d / "o.gguf.tmp"));
    // --type q8_0 is llama-quantize's Q8_0: ffn_down's rows of 172 values fall back to F16.
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-merge-lora") + " -m " + ft_test::stories() + " --lora " + lora + " -o " + (d / "o.gguf") +
                               " --type q8_0", &log), 0) << log;
    const auto q8 = gguf::Reader::open(d / "o.gguf");
    EXPECT_EQ(q8->find_tensor("blk.0.ffn_down.weight")->type, rp::DType::F16);
    EXPECT_EQ(q8->find_tensor("blk.0.attn_q.weight")->type, rp::DType::Q8_0);
    EXPECT_EQ(q8->get_u32("general.file_type"), 7u);
}

// QLoRA's output: an adapter trained on a Q4_K_M base (made by llama-quantize) merged into that base gives a
// Q4_K_M file, every tensor in its base type; the merged tensors hold exactly the bytes llama-quantize makes
// from our f32 merge, the others the base's own bytes; llama.cpp loads the file and its logits agree with
// ours on it as closely as they do on the base (both engines round differently only where llama.cpp
// quantizes the activations for its K-quant dot products).
TEST(FinetuneMerge, AQ4KMBaseGivesAQ4KMFileWithLlamaQuantizesBytes) {
    RP_REQUIRE_ORACLE();
    TmpDir d;
    rp::SynthSpec s;
    s.vocab_from = ft_test::stories();
    s.n_layer = 4, s.n_embd = 256, s.n_head = 4, s.n_head_kv = 1, s.head_dim = 64, s.n_ff = 256;
    rp::write_synth_model(s, d / "f32.gguf");
    ASSERT_EQ(rp::oracle::run("quantize " + quote(d / "f32.gguf") + " --out " + quote(d / "q4km.gguf") + " --ftype q4_k_m").status, 0);
    const std::string bq = d / "q4km.gguf";
    std::string log;
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-finetune") + " -m " + bq + " --data " + ft_test::shared_dir() +
                               "/models/reference/train.txt -o " + (d / "a.gguf") + " --seq-len 32 --batch 2 --steps 2 --lr 3e-2 -t 1",
                           &log), 0) << log;
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-merge-lora") + " -m " + bq + " --lora " + (d / "a.gguf") + " -o " + (d / "m.gguf"), &log), 0) << log;
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-merge-lora") + " -m " + bq + " --lora " + (d / "a.gguf") + " -o " + (d / "m32.gguf") + " --type f32", &log), 0) << log;
    ASSERT_EQ(rp::oracle::run("quantize " + quote(d / "m32.gguf") + " --out " + quote(d / "ref.gguf") + " --ftype q4_k_m").status, 0);

    const auto base = gguf::Reader::open(bq), merged = gguf::Reader::open(d / "m.gguf"), ref = gguf::Reader::open(d / "ref.gguf");
    const auto adapter = gguf::Reader::open(d / "a.gguf");
    int n_merged = 0, n_copied = 0;
    for (const gguf::TensorInfo & t : merged->tensors()) {
        const gguf::TensorInfo * b = base->find_tensor(t.name);
        const gguf::TensorInfo * r = ref->find_tensor(t.name);
        ASSERT_TRUE(b && r) << t.name;
        EXPECT_EQ(t.type, b->type) << t.name << " keeps its base type";
        ASSERT_EQ(t.nbytes, b->nbytes) << t.name;
        if (adapter->find_tensor(t.name + ".lora_a")) {
            ++n_merged;
            EXPECT_EQ(t.type, r->type) << t.name;
            EXPECT_EQ(std::memcmp(merged->tensor_data(t), ref->tensor_data(*r), t.nbytes), 0) << t.name << ": not llama-quantize's bytes";
            EXPECT_NE(std::memcmp(merged->tensor_data(t), base->tensor_data(*b), t.nbytes), 0) << t.name << " unchanged by the merge";
        } else {
            ++n_copied;
            EXPECT_EQ(std::memcmp(merged->tensor_data(t), base->tensor_data(*b), t.nbytes), 0) << t.name << " not copied";
        }
    }
    EXPECT_GT(n_merged, 0);
    EXPECT_GT(n_copied, 0);
    EXPECT_EQ(merged->get_u32("general.file_type"), base->get_u32("general.file_type"));
    const auto size = [](const std::string & p) { return static_cast<double>(fs::file_size(p)); };
    std::printf("Q4_K_M base %.0f bytes, merged %.0f bytes (llama-export-lora would write F16: %.0f); %d tensors merged, %d copied\n",
                size(bq), size(d / "m.gguf"), size(d / "m32.gguf") / 2, n_merged, n_copied);
    EXPECT_EQ(size(d / "m.gguf"), size(bq));

    // Both engines on the merged file, and on the base for the scale of their disagreement.
    std::vector<int32_t> toks = kPrompt1;
    auto logits_of = [&](const std::string & path) {
        auto m = rp::Model::load(path);
        rp::InferenceSession ours(*m, 64, 1);
        return ours.eval(toks, true);
    };
    const std::vector<float> ours_m = logits_of(d / "m.gguf"), ours_b = logits_of(bq);
    const std::vector<float> ref_m = oracle_logits(d / "m.gguf", toks, "", d / "lm.f32"), ref_b = oracle_logits(bq, toks, "", d / "lb.f32");
    const float e_m = max_diff(ours_m, ref_m), e_b = max_diff(ours_b, ref_b), moved = max_diff(ours_b, ours_m);
    std::printf("ours vs llama.cpp: on the merged Q4_K_M file %.3e, on its base %.3e (logits up to %.2f); the merge moved them %.3f\n",
                e_m, e_b, max_abs(ref_m), moved);
    EXPECT_LE(e_m, 2.0f * e_b + 1e-4f * max_abs(ref_m));
    EXPECT_GT(moved, 10.0f * e_b) << "the adapter must move the logits well beyond the engines' disagreement";
}

// Generation as row dots (rp-generate's default; ggml_rp/cpu/matvec_dot.h: int8 activations for the
// quantized types, bf16 for BF16) on files llama-quantize makes: token by token through the KV cache, our
// logits stay as close to llama.cpp's (which converts its activations the same way) as our exact path is,
// and within the activation rounding of that exact path.
TEST(FinetuneOracle, RowDotGenerationAgreesWithLlamaCppOnQuantizedFiles) {
    RP_REQUIRE_ORACLE();
    TmpDir d;
    rp::SynthSpec s;
    s.vocab_from = ft_test::stories();
    s.n_layer = 2, s.n_embd = 256, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 64, s.n_ff = 512, s.seed = 77;
    rp::write_synth_model(s, d / "f32.gguf");
    const std::vector<int32_t> toks = kPrompt1;
    for (const char * ftype : {"bf16", "q8_0", "q4_k_m", "q6_k", "q3_k_m", "q2_k"}) {
        SCOPED_TRACE(ftype);
        const std::string q = d / (std::string(ftype) + ".gguf");
        ASSERT_EQ(rp::oracle::run("quantize " + quote(d / "f32.gguf") + " --out " + quote(q) + " --ftype " + ftype).status, 0);
        auto m = rp::Model::load(q);
        std::vector<float> exact, int8;
        {
            rp::InferenceSession batch(*m, 64, 2);
            exact = batch.eval(toks, true);
        }
        {
            const bool saved = rp::cpu::row_dots();
            rp::cpu::set_row_dots(true);
            rp::InferenceSession gen(*m, 64, 2);
            for (int32_t t : toks) {
                const std::vector<float> row = gen.eval({t});
                int8.insert(int8.end(), row.begin(), row.end());
            }
            rp::cpu::set_row_dots(saved);
        }
        const std::vector<float> ref = oracle_logits(q, toks, "", d / "l.f32");
        ASSERT_EQ(ref.size(), exact.size());
        const float e_exact = max_diff(exact, ref), e_int8 = max_diff(int8, ref), moved = max_diff(int8, exact);
        std::printf("%s: vs llama.cpp, exact path %.4e, row-dot generation %.4e; the two paths differ by %.4e (logits up to %.2f)\n", ftype,
                    e_exact, e_int8, moved, max_abs(ref));
        const std::string f = ftype;
        const rp::DType main = f == "bf16" ? rp::DType::BF16 : f == "q8_0" ? rp::DType::Q8_0 : f == "q6_k" ? rp::DType::Q6_K
                               : f == "q3_k_m" ? rp::DType::Q3_K : f == "q2_k" ? rp::DType::Q2_K : rp::DType::Q4_K;
        if (!rp::cpu::row_dot_is_simd(main)) {   // this CPU lacks the instructions: generation stays exact
            EXPECT_EQ(moved, 0.0f);
            continue;
        }
        EXPECT_GT(moved, 0.0f) << "the row-dot path was not taken";
        EXPECT_LE(moved, 2e-2f * max_abs(ref)) << "more than the activation rounding";
        EXPECT_LE(e_int8, 1.5f * e_exact + 1e-3f * max_abs(ref));
    }
}

// --type MIX: the merge quantized to the mix is, tensor for tensor, what llama-quantize makes of our f32 merge.
TEST(FinetuneMerge, TypeMixQuantizesTheMergeLikeLlamaQuantize) {
    RP_REQUIRE_ORACLE();
    TmpDir d;
    const std::string lora = ft_test::shared_dir() + "/models/reference/lora/stories260K-lora-r4-a8.gguf";
    std::string log;
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-merge-lora") + " -m " + ft_test::stories() + " --lora " + lora + " -o " + (d / "m32.gguf") + " --type f32", &log), 0) << log;
    for (const char * mix : {"q4_k_m", "q5_0", "q8_0"}) {
        ASSERT_EQ(ft_test::run(ft_test::tool("rp-merge-lora") + " -m " + ft_test::stories() + " --lora " + lora + " -o " + (d / "m.gguf") +
                                   " --type " + mix, &log), 0) << log;
        ASSERT_EQ(rp::oracle::run("quantize " + quote(d / "m32.gguf") + " --out " + quote(d / "ref.gguf") + " --ftype " + mix).status, 0);
        const auto ours = gguf::Reader::open(d / "m.gguf"), ref = gguf::Reader::open(d / "ref.gguf");
        int same = 0;
        for (const gguf::TensorInfo & t : ours->tensors()) {
            const gguf::TensorInfo * r = ref->find_tensor(t.name);
            ASSERT_NE(r, nullptr) << t.name;
            const bool eq = t.type == r->type && t.nbytes == r->nbytes && std::memcmp(ours->tensor_data(t), ref->tensor_data(*r), t.nbytes) == 0;
            EXPECT_TRUE(eq) << mix << ": " << t.name;
            same += eq;
        }
        std::printf("merge --type %s: %d of %zu tensors identical to llama-quantize of the f32 merge\n", mix, same, ours->tensors().size());
    }
}

} // namespace

// qwen3moe: an adapter rp-finetune trains on the experts (one pair per expert, 3-D lora_a / lora_b), the
// router and attention loads in llama.cpp (whose build_lora_mm_id applies it) with our logits; the merge of
// that adapter gives the same logits in both engines; a full finetune's output loads with our logits.
TEST(FinetuneOracle, MixtureOfExpertsAdapterMergeAndFullFinetune) {
    RP_REQUIRE_ORACLE();
    TmpDir d;
    rp::SynthSpec s;
    s.arch = "qwen3moe";
    s.vocab_from = ft_test::stories();
    s.n_embd = 64, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 24, s.n_layer = 2, s.n_ff = 96;
    s.n_expert = 8, s.n_expert_used = 2, s.n_ff_exp = 48, s.seed = 51;
    const std::string base = d / "moe.gguf";
    rp::write_synth_model(s, base);
    const std::string data = ft_test::shared_dir() + "/models/reference/train.txt";
    std::string log;
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-finetune") + " -m " + base + " --data " + data + " -o " + (d / "a.gguf") +
                               " --lora-targets attn_q,attn_v,ffn_gate,ffn_up,ffn_down,ffn_gate_inp --seq-len 32 --batch 2 --steps 3 --lr 3e-2 -t 1",
                           &log),
              0)
        << log;
    {
        auto ad = gguf::Reader::open(d / "a.gguf");
        const gguf::TensorInfo * a = ad->find_tensor("blk.0.ffn_up_exps.weight.lora_a");
        ASSERT_NE(a, nullptr);
        EXPECT_EQ(a->n_dims, 3u);
        EXPECT_EQ(a->ne[2], 8);
    }
    auto model = rp::Model::load(base);
    auto adapter = rp::LoraAdapter::load(d / "a.gguf", *model);
    rp::LoraSet set;
    set.add(*adapter);
    rp::InferenceSession plain(*model, 64, 1), with(*model, 64, 1, &set);
    const std::vector<float> before = plain.eval(kPrompt1, true), ours = with.eval(kPrompt1, true);
    const std::vector<float> ref = oracle_logits(base, kPrompt1, d / "a.gguf", d / "a.f32");
    const float e = max_diff(ours, ref), moved = max_diff(before, ours);
    std::printf("qwen3moe adapter (experts, router, attention): ours vs llama.cpp %.2e (logits up to %.2f, the adapter moved them by %.3f)\n",
                e, max_abs(ref), moved);
    EXPECT_LE(e, 1e-4f * max_abs(ref));
    EXPECT_GT(moved, 1e-2f);

    ASSERT_EQ(ft_test::run(ft_test::tool("rp-merge-lora") + " -m " + base + " --lora " + (d / "a.gguf") + " -o " + (d / "m.gguf"), &log), 0)
        << log;
    auto merged = rp::Model::load(d / "m.gguf");
    rp::InferenceSession m(*merged, 64, 1);
    const std::vector<float> ours_m = m.eval(kPrompt1, true), ref_m = oracle_logits(d / "m.gguf", kPrompt1, "", d / "m.f32");
    std::printf("qwen3moe merge: merged vs base + adapter %.2e (ours), merged ours vs llama.cpp %.2e\n", max_diff(ours_m, ours),
                max_diff(ours_m, ref_m));
    EXPECT_LE(max_diff(ours_m, ours), 1e-4f * max_abs(ref));
    EXPECT_LE(max_diff(ours_m, ref_m), 1e-4f * max_abs(ref));

    ASSERT_EQ(ft_test::run(ft_test::tool("rp-finetune") + " -m " + base + " --data " + data + " -o " + (d / "f.gguf") +
                               " --full --seq-len 32 --batch 2 --steps 2 --lr 1e-2 -t 1",
                           &log),
              0)
        << log;
    auto full = rp::Model::load(d / "f.gguf");
    rp::InferenceSession f(*full, 64, 1);
    const std::vector<float> ours_f = f.eval(kPrompt1, true), ref_f = oracle_logits(d / "f.gguf", kPrompt1, "", d / "f.f32");
    std::printf("qwen3moe --full: ours vs llama.cpp %.2e, training moved the logits by %.3f\n", max_diff(ours_f, ref_f),
                max_diff(before, ours_f));
    EXPECT_LE(max_diff(ours_f, ref_f), 1e-4f * max_abs(ref_f));
    EXPECT_GT(max_diff(before, ours_f), 1e-2f);
}
