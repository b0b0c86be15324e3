// Quantization parity with llama.cpp: models we generate are quantized by our quantize_model and by
// llama.cpp's llama_model_quantize (rp-oracle quantize, the prebuilt libraries, no importance matrix); every
// tensor must get the same type and the same bytes. Covers each K type alone (--pure) and every mix, on
// shapes that exercise the mix rules: 16 layers (use_more_bits, the first eighth and sixteenth), GQA 4 (Q2_K's
// attn_v), a tied head (token_embd as the output), rows that are not a multiple of 256 (Q4_K -> Q5_0 ...) or
// of 32 (-> F16), f32 / bf16 / f16 inputs, special rows (zeros, constants, tiny, huge, one spike), and an
// 80-layer llama with 8 query heads per KV head (llama.cpp's 70B rule).
#include "base/error.h"
#include "ggml_rp/core/quant.h"
#include "gguf/gguf.h"
#include "models/convert/quantize_model.h"
#include "models/convert/synth_model.h"
#include "tests/common/shared_paths.h"
#include "tests/common/temp_dir.h"
#include "tests/oracle/oracle_run.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

using gguf::TensorType;

struct Model {
    std::string name;
    rp::SynthSpec spec;
};

std::string stories() { return rp_test::shared_dir() + "/models/stories260K.gguf"; }

// llama, 16 layers, every row a multiple of 256, GQA 4, untied head, f32.
rp::SynthSpec deep_llama() {
    rp::SynthSpec s;
    s.vocab_from = stories();
    s.n_layer = 16, s.n_embd = 256, s.n_head = 4, s.n_head_kv = 1, s.head_dim = 64, s.n_ff = 256;
    return s;
}

// qwen3, tied head, rows of 320 (a multiple of 32, not 256) and an ffn_down row of 224, bf16.
rp::SynthSpec tied_qwen3() {
    rp::SynthSpec s;
    s.arch = "qwen3";
    s.vocab_from = stories();
    s.tied = true;
    s.n_layer = 8, s.n_embd = 320, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 64, s.n_ff = 224;
    s.wtype = TensorType::BF16;
    return s;
}

// qwen2 with q/k/v biases, ffn_down rows of 200 (not even a multiple of 32: F16), f16.
rp::SynthSpec odd_qwen2() {
    rp::SynthSpec s;
    s.arch = "qwen2";
    s.vocab_from = stories();
    s.n_layer = 4, s.n_embd = 256, s.n_head = 8, s.n_head_kv = 2, s.head_dim = 32, s.n_ff = 200;
    s.wtype = TensorType::F16;
    return s;
}

// Rewrites `path` with rows of blk.0.ffn_up.weight replaced by the cases a quantizer's search handles
// specially: all zero, constant, below the all-zero threshold, huge, a single spike, alternating signs.
void plant_special_rows(const std::string & path, const std::string & out) {
    const auto r = gguf::Reader::open(path);
    gguf::Writer w(r->alignment());
    gguf::copy_kvs(*r, w);
    for (const gguf::TensorInfo & t : r->tensors()) {
        if (t.name != "blk.0.ffn_up.weight") {
            w.add_tensor(t.name, t.type, t.n_dims, t.ne, r->tensor_data(t));
            continue;
        }
        ASSERT_EQ(t.type, TensorType::F32);
        const float * src = reinterpret_cast<const float *>(r->tensor_data(t));
        const auto data = std::make_shared<std::vector<float>>(src, src + t.nelements());  // lives as long as the writer
        const int64_t n = t.ne[0];
        float * row = data->data();
        for (int64_t i = 0; i < n; ++i) {
            row[0 * n + i] = 0.0f;
            row[1 * n + i] = 0.125f;
            row[2 * n + i] = 1e-17f * static_cast<float>(i % 7);
            row[3 * n + i] = 3e4f * std::sin(static_cast<float>(i));
            row[4 * n + i] = i == 77 ? 5.0f : 0.0f;
            row[5 * n + i] = (i % 2 ? -1.0f : 1.0f) * 0.01f;
            row[6 * n + i] = i < 16 ? -2.0f : 1e-3f * static_cast<float>(i);  // a negative sub-block, then positives
        }
        w.add_tensor(t.name, t.type, t.n_dims, t.ne, [data](uint8_t * dst, size_t nbytes) {
            std::memcpy(dst, data->data(), nbytes);
        });
    }
    w.write(out);
}

struct Compared {
    int tensors = 0, identical = 0;
    std::map<std::string, int> by_type;  // type name -> tensors of that type, all identical
};

// Our quantization of `in` against llama.cpp's, tensor by tensor.
Compared compare_with_llama(const std::string & in, const std::string & mix_name, bool pure, rp_test::TempDir & dir) {
    Compared c;
    rp::QuantizeOptions opt;
    EXPECT_TRUE(rp::quant_mix_from_name(mix_name, opt.mix)) << mix_name;
    opt.pure = pure;
    opt.threads = 2;
    const std::string ours = dir.file("ours-" + mix_name + ".gguf"), ref = dir.file("ref-" + mix_name + ".gguf");
    rp::quantize_model(in, ours, opt);
    const auto res = rp::oracle::run("quantize " + rp::oracle::quote(in) + " --out " + rp::oracle::quote(ref) +
                                     " --ftype " + mix_name + (pure ? " --pure" : "") + " --threads 2");
    EXPECT_EQ(res.status, 0) << "rp-oracle quantize " << mix_name;
    if (res.status != 0) return c;
    const auto a = gguf::Reader::open(ours), b = gguf::Reader::open(ref);
    EXPECT_EQ(a->tensors().size(), b->tensors().size());
    EXPECT_EQ(a->get_u32("general.file_type"), b->get_u32("general.file_type")) << mix_name;
    for (const gguf::TensorInfo & t : a->tensors()) {
        const gguf::TensorInfo * u = b->find_tensor(t.name);
        ++c.tensors;
        if (!u) {
            ADD_FAILURE() << mix_name << ": llama.cpp wrote no " << t.name;
            continue;
        }
        const bool same = t.type == u->type && t.nbytes == u->nbytes &&
                          std::memcmp(a->tensor_data(t), b->tensor_data(*u), t.nbytes) == 0;
        EXPECT_TRUE(same) << mix_name << (pure ? " --pure" : "") << ": " << t.name << ": ours "
                          << gguf::type_name(static_cast<uint32_t>(t.type)) << ", llama.cpp "
                          << gguf::type_name(static_cast<uint32_t>(u->type));
        if (same) {
            ++c.identical;
            c.by_type[gguf::type_name(static_cast<uint32_t>(t.type))]++;
        }
    }
    std::string types;
    for (const auto & [n, k] : c.by_type) types += " " + std::to_string(k) + "x" + n;
    std::printf("[quant parity] %-8s %-6s %d/%d tensors identical:%s\n", mix_name.c_str(), pure ? "pure" : "mix",
                c.identical, c.tensors, types.c_str());
    return c;
}

// Under the sanitizers (ten times slower) the mixes that reach every rule branch; the Release build runs all.
std::vector<std::string> mixes() {
#ifdef RP_SANITIZED
    return {"q2_k", "q3_k_m", "q4_k_m", "q6_k"};
#else
    return {"q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k",
            "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "f16", "bf16", "f32"};
#endif
}

// `spec` written to dir/`name`.gguf, then quantized to every mix by us and by llama.cpp: every tensor equal.
void expect_every_mix_equal(const rp::SynthSpec & spec, const std::string & name, rp_test::TempDir & dir) {
    const std::string in = dir.file(name + ".gguf");
    rp::write_synth_model(spec, in);
    for (const std::string & m : mixes()) {
        const Compared c = compare_with_llama(in, m, false, dir);
        EXPECT_EQ(c.identical, c.tensors) << name << " " << m;
    }
}

} // namespace

TEST(QuantizeParity, EachKTypeAloneEqualsLlamaCppByteForByte) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir dir;
    const std::string base = dir.file("deep.gguf"), in = dir.file("deep-special.gguf");
    rp::write_synth_model(deep_llama(), base);
    plant_special_rows(base, in);
    for (const char * t : {"q2_k", "q3_k_s", "q4_k_s", "q5_k_s", "q6_k"}) {
        const Compared c = compare_with_llama(in, t, true, dir);
        EXPECT_EQ(c.identical, c.tensors) << t;
        EXPECT_GT(c.tensors, 0);
    }
}

TEST(QuantizeParity, EveryMixEqualsLlamaCppOnADeepLlama) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir dir;
    expect_every_mix_equal(deep_llama(), "deep", dir);
}

TEST(QuantizeParity, EveryMixEqualsLlamaCppOnATiedQwen3WithOddRows) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir dir;
    expect_every_mix_equal(tied_qwen3(), "qwen3", dir);
}

TEST(QuantizeParity, EveryMixEqualsLlamaCppOnAQwen2WhoseRowsFallBackToF16) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir dir;
    const std::string in = dir.file("qwen2.gguf");
    rp::write_synth_model(odd_qwen2(), in);
    for (const std::string & m : mixes()) {
        const Compared c = compare_with_llama(in, m, false, dir);
        EXPECT_EQ(c.identical, c.tensors) << m;
        if (m != "f32" && m != "f16" && m != "bf16") {
            const auto r = gguf::Reader::open(dir.file("ours-" + m + ".gguf"));
            EXPECT_EQ(r->find_tensor("blk.0.ffn_down.weight")->type, TensorType::F16) << m << ": rows of 200";
        }
    }
}

// MXFP4_MOE: the experts in MXFP4, the other matrices Q8_0, the router as it is.
TEST(QuantizeParity, Mxfp4MoeEqualsLlamaCppOnAMixtureOfExperts) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir dir;
    rp::SynthSpec s;
    s.arch = "qwen3moe";
    s.vocab_from = stories();
    s.n_layer = 2, s.n_embd = 128, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32, s.n_ff = 256;
    s.n_expert = 4, s.n_expert_used = 2, s.n_ff_exp = 96;
    const std::string in = dir.file("moe.gguf");
    rp::write_synth_model(s, in);
    const Compared c = compare_with_llama(in, "mxfp4_moe", false, dir);
    EXPECT_EQ(c.identical, c.tensors);
    EXPECT_EQ(c.by_type.count("mxfp4") ? c.by_type.at("mxfp4") : 0, 6) << "the three expert tensors of both layers";
    EXPECT_EQ(c.by_type.count("q8_0") ? c.by_type.at("q8_0") : 0, 2 + 4 * 2) << "token_embd, output, q/k/v/o";
    EXPECT_EQ(c.by_type.count("f32") ? c.by_type.at("f32") : 0, 1 + 5 * 2) << "the norms, q/k norms and routers";
}

// phi3 (fused attn_qkv: llama.cpp's attn_v rules apply to it; the fused ffn_up [n_embd, 2 n_ff]; LongRoPE's two
// factor tensors, which stay f32) and a llama with Llama 3's rope_freqs.
TEST(QuantizeParity, EveryMixEqualsLlamaCppOnPhi3AndLlama3RopeFactors) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir dir;
    rp::SynthSpec phi3;
    phi3.arch = "phi3";
    phi3.vocab_from = stories();
    phi3.n_layer = 4, phi3.n_embd = 256, phi3.n_head = 4, phi3.n_head_kv = 2, phi3.head_dim = 64, phi3.n_ff = 256;
    phi3.n_ctx_train = 4096, phi3.long_rope_ctx = 512;
    rp::SynthSpec llama3 = deep_llama();
    llama3.n_layer = 4, llama3.llama3_rope = 8.0f;
    expect_every_mix_equal(phi3, "phi3", dir);
    expect_every_mix_equal(llama3, "llama3", dir);
}

// qwen35 and qwen35moe (#33): the DeltaNet layers' attn_qkv (llama.cpp's attn_v rules apply to it, as to phi3's),
// attn_gate, ssm_beta / ssm_alpha (rows of 256), ssm_out; ssm_conv1d, ssm_dt, ssm_a and the norms stay f32; the
// attention layers' doubled attn_q; the routed and shared experts and the shared expert's gate vector. Two ffn_down
// tensors a layer (the experts' and the shared expert's) take the layer of their name, not a count (q4_k_m gave
// blk.1's Q6_K before the mix knew the model's experts); and a qwen3moe of 8 experts, llama.cpp's Mixtral rules.
TEST(QuantizeParity, EveryMixEqualsLlamaCppOnQwen35AndQwen35Moe) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir dir;
    rp::SynthSpec s;
    s.arch = "qwen35";
    s.vocab_from = stories();
    s.n_layer = 4, s.n_embd = 256, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 64, s.n_rot = 16, s.n_ff = 256;
    s.ssm_k_heads = 2, s.ssm_v_heads = 4, s.ssm_head_dim = 64;
    expect_every_mix_equal(s, "qwen35", dir);
    s.mtp_layers = 1;  // an MTP block after the 4 layers: llama-quantize's layer rules count all 5 blocks
    expect_every_mix_equal(s, "qwen35-mtp", dir);
    s.mtp_layers = 0;
    s.arch = "qwen35moe";
    s.n_expert = 4, s.n_expert_used = 2, s.n_ff_exp = 256;
    expect_every_mix_equal(s, "qwen35moe", dir);
    s.arch = "qwen3moe";
    s.n_expert = 8, s.n_rot = 0;
    expect_every_mix_equal(s, "qwen3moe-8", dir);
}

// llama.cpp's 70B rule (80 layers, GQA): attn_v gets Q5_K where the mix says Q3_K or Q4_K.
TEST(QuantizeParity, The70BRuleMatchesLlamaCpp) {
    RP_REQUIRE_ORACLE();
    rp_test::TempDir dir;
    rp::SynthSpec s;
    s.vocab_from = stories();
    s.n_layer = 80, s.n_embd = 256, s.n_head = 8, s.n_head_kv = 1, s.head_dim = 32, s.n_ff = 256;
    s.wtype = TensorType::F16;
    const std::string in = dir.file("eighty.gguf");
    rp::write_synth_model(s, in);
    for (const char * m : {"q3_k_s", "q4_k_s"}) {
        const Compared c = compare_with_llama(in, m, false, dir);
        EXPECT_EQ(c.identical, c.tensors) << m;
        const auto r = gguf::Reader::open(dir.file(std::string("ours-") + m + ".gguf"));
        EXPECT_EQ(r->find_tensor("blk.40.attn_v.weight")->type, TensorType::Q5_K) << m;
    }
}

// A NaN or an infinity in a tensor to quantize: refused naming the file, the tensor and the first bad row; no
// output, not even its temporary file (the quantized garbage llama-quantize would write is never made).
TEST(QuantizeModel, NonFiniteRowsAreRefusedNamingTheTensorAndLeaveNoFile) {
    rp_test::TempDir d;
    const std::string base = d.file("base.gguf"), bad = d.file("nan.gguf"), out = d.file("out.gguf");
    rp::SynthSpec s = deep_llama();
    s.n_layer = 2;
    rp::write_synth_model(s, base);
    {
        const auto r = gguf::Reader::open(base);
        gguf::Writer w(r->alignment());
        gguf::copy_kvs(*r, w);
        for (const gguf::TensorInfo & t : r->tensors()) {
            if (t.name != "blk.1.ffn_up.weight") {
                w.add_tensor(t.name, t.type, t.n_dims, t.ne, r->tensor_data(t));
                continue;
            }
            const float * src = reinterpret_cast<const float *>(r->tensor_data(t));
            const auto data = std::make_shared<std::vector<float>>(src, src + t.nelements());
            (*data)[static_cast<size_t>(5 * t.ne[0] + 17)] = std::nanf("");
            (*data)[static_cast<size_t>(9 * t.ne[0])] = INFINITY;
            w.add_tensor(t.name, t.type, t.n_dims, t.ne, [data](uint8_t * dst, size_t n) { std::memcpy(dst, data->data(), n); });
        }
        w.write(bad);
    }
    rp::QuantizeOptions opt;
    ASSERT_TRUE(rp::quant_mix_from_name("q4_k_m", opt.mix));
    opt.threads = 2;
    try {
        rp::quantize_model(bad, out, opt);
        FAIL() << "a NaN was quantized";
    } catch (const rp::Error & e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(bad), std::string::npos) << m;
        EXPECT_NE(m.find("blk.1.ffn_up.weight"), std::string::npos) << m;
        EXPECT_NE(m.find("row 5 "), std::string::npos) << "the first bad row: " << m;
    }
    EXPECT_FALSE(std::filesystem::exists(out));
    EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));
    rp::quantize_model(base, out, opt);  // the clean model quantizes
    EXPECT_TRUE(std::filesystem::exists(out));
}

// rp-gguf synth --weights 0 --type MIX (memory plans of the paper's models on their K-quant files): every tensor
// gets the type, and so the bytes, that quantizing the same model to the mix gives (which the tests above hold
// equal to llama-quantize's), and general.file_type; a mix with data is refused (rp-gguf convert quantizes data).
TEST(QuantizeModel, AShapesOnlySynthGetsTheMixsTypes) {
    rp_test::TempDir dir;
    rp::SynthSpec moe;
    moe.arch = "qwen3moe";
    moe.vocab_from = stories();
    moe.n_layer = 4, moe.n_embd = 256, moe.n_head = 4, moe.n_head_kv = 2, moe.head_dim = 64, moe.n_ff = 256;
    moe.n_expert = 8, moe.n_expert_used = 2, moe.n_ff_exp = 256;
    const std::pair<std::string, rp::SynthSpec> specs[] = {{"deep", deep_llama()}, {"qwen3", tied_qwen3()}, {"moe", moe}};
    for (const auto & [name, spec] : specs) {
        const std::string data = dir.file(name + ".gguf");
        rp::write_synth_model(spec, data);
        for (const char * mix : {"q2_k", "q3_k_m", "q4_k_m", "q5_k_s", "q6_k"}) {
            rp::QuantizeOptions opt;
            ASSERT_TRUE(rp::quant_mix_from_name(mix, opt.mix));
            opt.threads = 2;
            const std::string quantized = dir.file(name + "-" + mix + ".gguf"), shapes = dir.file(name + "-" + mix + "-shapes.gguf");
            rp::quantize_model(data, quantized, opt);
            rp::SynthSpec holes = spec;
            holes.weights = false;
            holes.mix = opt.mix;
            rp::write_synth_model(holes, shapes);
            const auto a = gguf::Reader::open(quantized), b = gguf::Reader::open(shapes);
            EXPECT_EQ(b->get_u32("general.file_type"), a->get_u32("general.file_type")) << name << " " << mix;
            ASSERT_EQ(a->tensors().size(), b->tensors().size()) << name << " " << mix;
            int quantized_types = 0;
            for (size_t i = 0; i < a->tensors().size(); ++i) {
                const gguf::TensorInfo & x = a->tensors()[i];
                const gguf::TensorInfo & y = b->tensors()[i];
                EXPECT_EQ(y.name, x.name);
                EXPECT_EQ(y.type, x.type) << name << " " << mix << ": " << x.name;
                EXPECT_EQ(y.nbytes, x.nbytes) << name << " " << mix << ": " << x.name;
                quantized_types += x.type != gguf::TensorType::F32;
            }
            EXPECT_GT(quantized_types, 0);
            std::filesystem::remove(quantized);
            std::filesystem::remove(shapes);
        }
    }
    rp::SynthSpec with_data = deep_llama();
    ASSERT_TRUE(rp::quant_mix_from_name("q4_k_m", with_data.mix.emplace()));
    try {
        rp::write_synth_model(with_data, dir.file("refused.gguf"));
        ADD_FAILURE() << "a mix with data was written";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("rp-gguf convert --type q4_k_m"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(dir.file("refused.gguf")));
}
