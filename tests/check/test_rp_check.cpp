// rp-check, run as a program: it passes on every model in shared/models and on generated models of each
// architecture (f32, bf16 and a Q4_K_M mix); it fails, naming the check, when one kernel's backward is off by
// 1% (RP_TEST_PERTURB_BACKWARD, ops/test_hooks.h) and when the vocabulary is edited so that llama.cpp and we
// tokenize differently; without llama.cpp its parts are skipped, saying how to get it; --json is valid JSON.
#include "ggml_rp/core/json.h"
#include "gguf/gguf.h"
#include "models/convert/quantize_model.h"
#include "models/convert/synth_model.h"
#include "tests/common/shared_paths.h"
#include "tests/common/temp_dir.h"
#include "tests/oracle/oracle_run.h"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct ToolRun {
    int code = -1;
    std::string out, err;
};

ToolRun rp_check(const std::string & args, const std::string & env = "") {
    rp_test::TempDir d;
    const std::string out = d.file("out"), err = d.file("err");
    const std::string oracle = rp::oracle::bin().empty() || args.find("--oracle") != std::string::npos
                                   ? "" : " --oracle " + rp::oracle::quote(rp::oracle::bin());
    const std::string cmd = env + " " + std::string(RP_BIN_DIR) + "/rp-check " + args + oracle + " -t 2 > " + out + " 2> " + err;
    const int st = std::system(cmd.c_str());
    ToolRun r;
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    auto slurp = [](const std::string & p) {
        std::ifstream f(p);
        return std::string((std::istreambuf_iterator<char>(f)), {});
    };
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
}

std::string models() { return rp_test::shared_dir() + "/models/"; }

// The rows whose result is FAIL.
std::vector<std::string> failed_rows(const std::string & out) {
    std::vector<std::string> v;
    std::istringstream in(out);
    for (std::string l; std::getline(in, l);)
        if (l.find(" FAIL ") != std::string::npos) v.push_back(l);
    return v;
}

// `f32` quantized to the llama-quantize mix `mix`, written to `out`.
std::string quantized(const std::string & f32, const char * mix, const std::string & out) {
    rp::QuantizeOptions q;
    EXPECT_TRUE(rp::quant_mix_from_name(mix, q.mix)) << mix;
    rp::quantize_model(f32, out, q);
    return out;
}

// rp-check on `model`: exit 0, no failed row, and a row of each check in `checks`.
void expect_every_check_passes(const std::string & model, std::initializer_list<const char *> checks) {
    const ToolRun r = rp_check("-m " + model);
    EXPECT_EQ(r.code, 0) << model << "\n" << r.out << r.err;
    EXPECT_TRUE(failed_rows(r.out).empty()) << model;
    for (const char * check : checks) EXPECT_NE(r.out.find(std::string("\n") + check), std::string::npos) << model << ": no " << check << " row";
}

// rp-check passes every check on `spec`, written to d/`name`.gguf, in f32 and quantized to q4_k_m.
void expect_passes_in_f32_and_q4_k_m(const rp::SynthSpec & spec, const std::string & name, const rp_test::TempDir & d) {
    const std::string f32 = d.file(name + ".gguf");
    rp::write_synth_model(spec, f32);
    for (const std::string & m : {f32, quantized(f32, "q4_k_m", d.file(name + "-q4km.gguf"))})
        expect_every_check_passes(m, {"tokenizer", "forward", "gradients", "pipeline"});
}

} // namespace

TEST(RpCheck, PassesOnEverySharedModel) {
    RP_REQUIRE_ORACLE();
    for (const char * m : {"stories260K.gguf", "derived/stories260K-F16.gguf", "derived/stories260K-BF16.gguf",
                           "derived/stories260K-Q8_0.gguf", "derived/stories260K-Q4_0.gguf", "synthetic/tiny-random-qwen2.gguf",
                           "synthetic/tiny-random-qwen3.gguf"}) {
        const ToolRun r = rp_check("-m " + models() + m);
        EXPECT_EQ(r.code, 0) << m << "\n" << r.out << r.err;
        EXPECT_TRUE(failed_rows(r.out).empty()) << m;
        EXPECT_NE(r.out.find(" 0 failed"), std::string::npos) << r.out;
        for (const char * check : {"tokenizer", "forward", "gradients", "pipeline", "round trip"})
            EXPECT_NE(r.out.find(std::string("\n") + check), std::string::npos) << m << ": no " << check << " row";
    }
    // With an adapter: both engines apply it, and its own factors' gradients are checked.
    const ToolRun r = rp_check("-m " + models() + "stories260K.gguf --lora " + models() + "reference/lora/stories260K-lora-r4-a8.gguf");
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("the adapter applied by both engines"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("lora_b (the adapter's)"), std::string::npos) << r.out;
}

TEST(RpCheck, PassesOnGeneratedModelsOfEachArchitectureAndType) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir d;
    for (const char * arch : {"llama", "qwen2", "qwen3"}) {
        rp::SynthSpec s;
        s.arch = arch;
        s.vocab_from = models() + (std::string(arch) == "llama" ? "stories260K.gguf" : "synthetic/tiny-random-qwen2.gguf");
        s.n_layer = 2, s.n_embd = 256, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 64, s.n_ff = 256;
        s.tied = std::string(arch) == "qwen3";
        const std::string f32 = d.file(std::string(arch) + ".gguf");
        rp::write_synth_model(s, f32);
        s.wtype = gguf::TensorType::BF16;
        const std::string bf16 = d.file(std::string(arch) + "-bf16.gguf");
        rp::write_synth_model(s, bf16);
        rp::QuantizeOptions q;
        ASSERT_TRUE(rp::quant_mix_from_name("q4_k_m", q.mix));
        const std::string q4 = d.file(std::string(arch) + "-q4km.gguf");
        rp::quantize_model(f32, q4, q);
        for (const std::string & m : {f32, bf16, q4}) {
            const ToolRun r = rp_check("-m " + m + " --quick");
            EXPECT_EQ(r.code, 0) << m << "\n" << r.out << r.err;
            EXPECT_TRUE(failed_rows(r.out).empty()) << m;
        }
    }
}

// Mixtures of experts: qwen3moe, gpt-oss (sinks, a window, biases) and qwen35moe (a shared expert, DeltaNet layers). The
// gradient check holds the routing fixed (cpu/routing_tape.h); without it a whole-tensor step flips expert choices and
// token_embd's error was 5.6.
TEST(RpCheck, PassesOnMixturesOfExperts) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir d;
    for (const char * arch : {"qwen3moe", "gpt-oss", "qwen35moe"}) {
        rp::SynthSpec s;
        s.arch = arch;
        s.vocab_from = models() + "synthetic/tiny-random-qwen2.gguf";
        s.n_layer = 3, s.n_embd = 128, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32, s.n_ff = 128;
        s.n_expert = 8, s.n_expert_used = 2, s.n_ff_exp = 64, s.n_swa = 6, s.seed = 5;
        s.n_rot = 16, s.full_attn_interval = 3;  // (qwen35moe: two DeltaNet layers and an attention layer)
        if (std::string(arch) != "qwen35moe") s.n_rot = 0;
        const std::string f = d.file(std::string(arch) + ".gguf");
        rp::write_synth_model(s, f);
        expect_every_check_passes(f, {"forward", "gradients", "pipeline"});
    }
}

// qwen35 (Gated DeltaNet layers around a gated attention layer), every check, f32 and q4_k_m.
TEST(RpCheck, PassesOnQwen35) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir d;
    rp::SynthSpec s;
    s.arch = "qwen35";
    s.vocab_from = models() + "synthetic/tiny-random-qwen2.gguf";
    s.n_layer = 4, s.n_embd = 128, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32, s.n_rot = 16, s.n_ff = 128;
    s.ssm_k_heads = 2, s.ssm_v_heads = 4, s.ssm_head_dim = 32, s.seed = 8;
    const std::string f32 = d.file("qwen35.gguf");
    rp::write_synth_model(s, f32);
    for (const std::string & m : {f32, quantized(f32, "q4_k_m", d.file("qwen35-q4km.gguf"))})
        expect_every_check_passes(m, {"tokenizer", "forward", "gradients", "pipeline"});
}

// gemma3 (seven layers: windowed and global with linear RoPE scaling, post norms, GeGLU, a tied scaled
// embedding), every check: its logits judged within llama.cpp's fp16 GELU table in f32, and within the
// activation roundings' bounds in bf16, q8_0 and q4_k_m.
TEST(RpCheck, PassesOnGemma3) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir d;
    rp::SynthSpec s;
    s.arch = "gemma3";
    s.vocab_from = models() + "synthetic/tiny-random-qwen2.gguf";
    s.n_layer = 7, s.n_embd = 128, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32, s.n_ff = 128;
    s.n_swa = 6, s.rope_linear = 8.0f, s.tied = true, s.seed = 6;
    const std::string f32 = d.file("gemma3.gguf");
    rp::write_synth_model(s, f32);
    s.wtype = gguf::TensorType::BF16;
    const std::string bf16 = d.file("gemma3-bf16.gguf");
    rp::write_synth_model(s, bf16);
    for (const std::string & m : {f32, bf16, quantized(f32, "q8_0", d.file("gemma3-q8_0.gguf")), quantized(f32, "q4_k_m", d.file("gemma3-q4km.gguf"))})
        expect_every_check_passes(m, {"tokenizer", "forward", "gradients", "pipeline"});
    EXPECT_NE(rp_check("-m " + f32).out.find("fp16 GELU table"), std::string::npos);
}

// gemma2 (soft-capped attention and final logits, windows on every other layer), every check, f32 and q4_k_m.
TEST(RpCheck, PassesOnGemma2) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir d;
    rp::SynthSpec s;
    s.arch = "gemma2";
    s.vocab_from = models() + "synthetic/tiny-random-qwen2.gguf";
    s.n_layer = 4, s.n_embd = 128, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32, s.n_ff = 128;
    s.n_swa = 6, s.attn_softcap = 2.0f, s.final_softcap = 5.0f, s.tied = true, s.seed = 7;
    expect_passes_in_f32_and_q4_k_m(s, "gemma2", d);
}

// mistral3 (YaRN 4 x 32 with a log multiplier, the attention temperature from position 32 on), every check,
// f32 and q4_k_m.
TEST(RpCheck, PassesOnMistral3) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir d;
    rp::SynthSpec s;
    s.arch = "mistral3";
    s.vocab_from = models() + "synthetic/tiny-random-qwen2.gguf";
    s.n_layer = 3, s.n_embd = 128, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32, s.n_ff = 128, s.seed = 8;
    s.n_ctx_train = 128, s.yarn_factor = 4.0f, s.yarn_orig_ctx = 32, s.yarn_log_mul = 1.0f, s.attn_temp_scale = 0.1f;
    expect_passes_in_f32_and_q4_k_m(s, "mistral3", d);
}

// phi3 with LongRoPE (fused attn_qkv and gate/up; the long factors: our context and llama.cpp's, the same, exceed
// the original 64 tokens) and a llama with Llama 3's RoPE factors, every check, f32 and q4_k_m.
TEST(RpCheck, PassesOnPhi3AndLlama3RopeFactors) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir d;
    rp::SynthSpec phi3;
    phi3.arch = "phi3";
    phi3.vocab_from = models() + "stories260K.gguf";
    phi3.n_layer = 3, phi3.n_embd = 128, phi3.n_head = 4, phi3.n_head_kv = 2, phi3.head_dim = 32, phi3.n_ff = 128, phi3.seed = 9;
    phi3.n_ctx_train = 4096, phi3.long_rope_ctx = 64;
    rp::SynthSpec llama3 = phi3;
    llama3.arch = "llama", llama3.long_rope_ctx = 0, llama3.llama3_rope = 8.0f, llama3.llama3_rope_ctx = 64;
    expect_passes_in_f32_and_q4_k_m(phi3, "phi3", d);
    expect_passes_in_f32_and_q4_k_m(llama3, "llama3", d);
}

TEST(RpCheck, CatchesABackwardOffByOnePercent) {
    const ToolRun clean = rp_check("-m " + models() + "stories260K.gguf --only gradients");
    ASSERT_EQ(clean.code, 0) << clean.out;
    const ToolRun r = rp_check("-m " + models() + "stories260K.gguf --only gradients", "RP_TEST_PERTURB_BACKWARD=rms_norm:0.01");
    EXPECT_EQ(r.code, 1) << r.out;
    const std::vector<std::string> bad = failed_rows(r.out);
    ASSERT_FALSE(bad.empty()) << r.out;
    // Exactly the norm weights (whose gradient the perturbed rule gives) fail, in the gradients check.
    for (const std::string & l : bad) {
        EXPECT_EQ(l.rfind("gradients", 0), 0u) << l;
        EXPECT_NE(l.find("norm.weight"), std::string::npos) << l;
    }
    EXPECT_EQ(bad.size(), 3u) << "attn_norm, ffn_norm and output_norm:\n" << r.out;
}

// A tokenizer that disagrees with llama.cpp: llama.cpp is given (through a wrapper in place of rp-oracle) a
// copy of the model whose vocabulary has the texts of two common tokens swapped, while we read the original.
// (The same file would not do: under every vocabulary edit tried — equal scores, byte tokens retyped, a token
// made user-defined — both engines still agree, and a duplicated token text makes llama.cpp abort.) The
// tokenizer check must fail and say which case differs; the forward check, on the untouched file, still passes.
TEST(RpCheck, CatchesATokenizerThatDisagreesWithLlamaCpp) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir d;
    const std::string model = models() + "stories260K.gguf";
    const auto r0 = gguf::Reader::open(model);
    std::vector<std::string> t = r0->find("tokenizer.ggml.tokens")->strs;
    const auto a = std::find(t.begin(), t.end(), "\xe2\x96\x81" "the"), b = std::find(t.begin(), t.end(), "\xe2\x96\x81" "a");
    ASSERT_TRUE(a != t.end() && b != t.end());
    std::swap(*a, *b);
    const std::string edited = d.file("edited.gguf");
    {
        gguf::Writer w(r0->alignment());
        gguf::copy_kvs(*r0, w);
        w.set_string_array("tokenizer.ggml.tokens", t);
        for (const gguf::TensorInfo & ti : r0->tensors()) w.add_tensor(ti.name, ti.type, ti.n_dims, ti.ne, r0->tensor_data(ti));
        w.write(edited);
    }
    const std::string wrapper = d.file("oracle.sh");
    std::ofstream(wrapper) << "#!/bin/sh\nmode=$1; shift; shift\nexec " << rp::oracle::quote(rp::oracle::bin()) << " \"$mode\" "
                           << rp::oracle::quote(edited) << " \"$@\"\n";
    ASSERT_EQ(std::system(("chmod +x " + wrapper).c_str()), 0);
    std::ofstream(d.file("text.txt")) << "Once upon a time the cat saw a dog.\nThe end.\n";
    const ToolRun r = rp_check("-m " + model + " --only tokenizer,forward --text " + d.file("text.txt") + " --oracle " + wrapper);
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    const std::vector<std::string> bad = failed_rows(r.out);
    ASSERT_EQ(bad.size(), 1u) << r.out;
    EXPECT_EQ(bad[0].rfind("tokenizer", 0), 0u) << bad[0];
    EXPECT_NE(bad[0].find("llama.cpp ["), std::string::npos) << "the differing ids are shown: " << bad[0];
}

TEST(RpCheck, WithoutLlamaCppItsPartsAreSkippedSayingHow) {
    ToolRun r = rp_check("-m " + models() + "stories260K.gguf --only forward,tokenizer,gradients --oracle ''");
    EXPECT_EQ(r.code, 0) << "the checks that ran passed:\n" << r.out << r.err;
    EXPECT_NE(r.out.find("skipped"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("scripts/fetch-oracle.sh"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("forward    max"), std::string::npos) << "no forward figure without llama.cpp:\n" << r.out;
    // Everything skipped is not a pass.
    r = rp_check("-m " + models() + "stories260K.gguf --only forward --oracle ''");
    EXPECT_EQ(r.code, 1) << r.out;
}

TEST(RpCheck, JsonAndBadInput) {
    ToolRun r = rp_check("-m " + models() + "stories260K.gguf --quick --json --only gradients,pipeline,round-trip");
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    const rp::json::Value v = rp::json::parse(r.out, "rp-check --json");
    ASSERT_TRUE(v.is_object());
    ASSERT_NE(v.find("checks"), nullptr);
    EXPECT_GT(v.find("checks")->array.size(), 10u);
    EXPECT_EQ(v.find("failed")->number, 0);
    for (const rp::json::Value & c : v.find("checks")->array) EXPECT_NE(c.find("result"), nullptr);

    r = rp_check("-m /no/such/model.gguf");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("/no/such/model.gguf"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << "no partial output: " << r.out;
    r = rp_check("-m " + models() + "stories260K.gguf --only everything");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("--only"), std::string::npos) << r.err;
}
