// PEFT adapters (models/convert/peft.h) and the safetensors format (models/convert/safetensors.h):
//   - llama.cpp's reference adapter (llama, q/v/down) -> PEFT -> GGUF gives every tensor back bit for bit, with
//     PEFT's names, shapes and config; its q rows are in Hugging Face's order, checked against formats.md §3.6
//     computed here (k with the KV heads; qwen3 and v are not permuted);
//   - a mixture of experts' router, experts and an embedding pair: PEFT's per-expert names, the embedding's
//     (r, vocab) A, and the round trip;
//   - F16 / BF16 exports hold the rounded values; the header follows the specification (8-byte length,
//     padded JSON, contiguous offsets);
//   - bad files and configurations fail naming the tensor or key, and nothing is written.
#include "models_test_util.h"

#include "ggml_rp/core/fp16.h"
#include "ggml_rp/core/json.h"
#include "models/arch/hparams.h"
#include "models/arch/lora.h"
#include "models/convert/hf_names.h"
#include "models/convert/peft.h"
#include "models/convert/safetensors.h"
#include "models/convert/synth_model.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <set>
#include <random>

using namespace models_test;
namespace fs = std::filesystem;

namespace {

const std::string kAdapter = ref_path("lora/stories260K-lora-r4-a8.gguf");

std::string error_of(const std::function<void()> & f) {
    try {
        f();
    } catch (const rp::Error & e) {
        return e.what();
    }
    return "(no error)";
}

// Every tensor of two GGUF files, byte for byte.
void expect_same_tensors(const std::string & a, const std::string & b) {
    const auto ra = gguf::Reader::open(a), rb = gguf::Reader::open(b);
    ASSERT_EQ(ra->tensors().size(), rb->tensors().size());
    for (const gguf::TensorInfo & t : ra->tensors()) {
        const gguf::TensorInfo * u = rb->find_tensor(t.name);
        ASSERT_NE(u, nullptr) << t.name;
        ASSERT_EQ(t.nbytes, u->nbytes) << t.name;
        EXPECT_EQ(std::memcmp(ra->tensor_data(t), rb->tensor_data(*u), t.nbytes), 0) << t.name;
    }
}

// An adapter on `targets` with random factors, saved to path.
void random_adapter(const rp::Model & m, const std::vector<std::string> & targets, int64_t rank, float alpha, const std::string & path) {
    auto ad = rp::LoraAdapter::create(m, targets, rank, alpha);
    std::mt19937 rng(7);
    std::normal_distribution<float> n(0.0f, 0.5f);
    for (const rp::LoraTensor & t : ad->tensors())
        for (rp::Tensor * f : {t.a, t.b}) {
            std::vector<float> v(static_cast<size_t>(f->nelements()));
            for (float & x : v) x = n(rng);
            rp::tensor_set_f32(f, v);
        }
    ad->save(path);
}

std::string write_text(const std::string & path, const std::string & text) {
    std::ofstream(path, std::ios::binary) << text;
    return path;
}

// A safetensors file from a header (JSON text) and data bytes.
std::string safetensors_bytes(const std::string & header, const std::string & data) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
    return out + header + data;
}

std::string parse_error(const std::string & bytes) {
    return error_of([&] { rp::SafetensorsReader::parse(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size(), "t.safetensors"); });
}

} // namespace

TEST(Peft, ReferenceAdapterRoundTripsBitForBitWithPeftsNamesAndConfig) {
    TempDir d;
    const auto model = rp::Model::load(stories());
    const auto ad = rp::LoraAdapter::load(kAdapter, *model);
    rp::export_peft(*ad, *model, d.file("peft"));
    const rp::json::Value cfg = rp::json::parse(slurp(d.file("peft/adapter_config.json")), "adapter_config.json");
    EXPECT_EQ(cfg.find("r")->number, 4);
    EXPECT_EQ(cfg.find("lora_alpha")->number, 8);
    EXPECT_EQ(cfg.find("peft_type")->string, "LORA");
    EXPECT_EQ(cfg.find("task_type")->string, "CAUSAL_LM");
    EXPECT_EQ(cfg.find("bias")->string, "none");
    std::vector<std::string> targets;
    for (const rp::json::Value & v : cfg.find("target_modules")->array) targets.push_back(v.string);
    EXPECT_EQ(targets, (std::vector<std::string>{"down_proj", "q_proj", "v_proj"}));

    const auto st = rp::SafetensorsReader::open(d.file("peft/adapter_model.safetensors"));
    EXPECT_EQ(st->tensors().size(), 30u);
    EXPECT_EQ(st->metadata().at("format"), "pt");
    const rp::SafetensorsTensor * qa = st->find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    const rp::SafetensorsTensor * db = st->find("base_model.model.model.layers.4.mlp.down_proj.lora_B.weight");
    ASSERT_TRUE(qa && db);
    EXPECT_EQ(qa->shape, (std::vector<int64_t>{4, 64}));   // (r, in)
    EXPECT_EQ(db->shape, (std::vector<int64_t>{64, 4}));   // (out, r)
    // A and unpermuted B are the GGUF bytes as they are.
    const rp::LoraTensor * down = ad->find("blk.4.ffn_down.weight");
    EXPECT_EQ(st->to_f32(*db), rp::tensor_get_f32(down->b));
    EXPECT_EQ(st->to_f32(*qa), rp::tensor_get_f32(ad->find("blk.0.attn_q.weight")->a));

    rp::import_peft(d.file("peft"), *model, d.file("back.gguf"));
    expect_same_tensors(kAdapter, d.file("back.gguf"));
    EXPECT_EQ(rp::LoraAdapter::load(d.file("back.gguf"), *model)->alpha(), ad->alpha());
}

// formats.md §3.6: per head of D rows, GGUF row 2j + s holds HF row s*D/2 + j.
TEST(Peft, LlamaQueryAndKeyRowsAreInHuggingFacesOrder) {
    TempDir d;
    const auto model = rp::Model::load(stories());
    const rp::HParams & hp = model->hparams();
    random_adapter(*model, {"blk.1.attn_q.weight", "blk.1.attn_k.weight", "blk.1.attn_v.weight"}, 3, 6.0f, d.file("a.gguf"));
    const auto ad = rp::LoraAdapter::load(d.file("a.gguf"), *model);
    rp::export_peft(*ad, *model, d.file("peft"));
    const auto st = rp::SafetensorsReader::open(d.file("peft/adapter_model.safetensors"));
    const int64_t r = 3, D = hp.head_dim;
    for (const auto & [proj, heads, base] : {std::tuple<const char *, int64_t, const char *>{"q_proj", hp.n_head, "blk.1.attn_q.weight"},
                                            {"k_proj", hp.n_head_kv, "blk.1.attn_k.weight"}, {"v_proj", 0, "blk.1.attn_v.weight"}}) {
        const std::vector<float> gguf = rp::tensor_get_f32(ad->find(base)->b);
        const std::vector<float> hf = st->to_f32(*st->find(std::string("base_model.model.model.layers.1.self_attn.") + proj + ".lora_B.weight"));
        ASSERT_EQ(gguf.size(), hf.size());
        if (heads == 0) {
            EXPECT_EQ(gguf, hf) << "v is not permuted";
            continue;
        }
        EXPECT_NE(gguf, hf) << proj;
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t j = 0; j < D / 2; ++j)
                for (int64_t s = 0; s < 2; ++s)
                    for (int64_t k = 0; k < r; ++k)
                        ASSERT_EQ(gguf[static_cast<size_t>((h * D + 2 * j + s) * r + k)], hf[static_cast<size_t>((h * D + s * D / 2 + j) * r + k)])
                            << proj << " head " << h << " j " << j << " s " << s;
    }
    rp::import_peft(d.file("peft"), *model, d.file("back.gguf"));
    expect_same_tensors(d.file("a.gguf"), d.file("back.gguf"));

    // qwen3 keeps Hugging Face's order (NEOX RoPE): nothing is permuted.
    const auto qwen = rp::Model::load(model_path("synthetic/tiny-random-qwen3.gguf"));
    random_adapter(*qwen, {"blk.0.attn_q.weight"}, 2, 4.0f, d.file("q.gguf"));
    const auto qa = rp::LoraAdapter::load(d.file("q.gguf"), *qwen);
    rp::export_peft(*qa, *qwen, d.file("qpeft"));
    const auto qs = rp::SafetensorsReader::open(d.file("qpeft/adapter_model.safetensors"));
    EXPECT_EQ(qs->to_f32(*qs->find("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight")),
              rp::tensor_get_f32(qa->find("blk.0.attn_q.weight")->b));
}

// phi3's fused projections are transformers' Phi3 modules qkv_proj and gate_up_proj, rows unchanged, and come back.
TEST(Peft, Phi3FusedProjectionsAreQkvProjAndGateUpProj) {
    TempDir d;
    rp::SynthSpec s;
    s.arch = "phi3";
    s.vocab_from = model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 8, s.n_layer = 2, s.n_ff = 40;
    rp::write_synth_model(s, d.file("phi3.gguf"));
    const auto model = rp::Model::load(d.file("phi3.gguf"));
    random_adapter(*model, {"blk.1.attn_qkv.weight", "blk.1.ffn_up.weight", "blk.0.ffn_down.weight"}, 2, 4.0f, d.file("a.gguf"));
    const auto ad = rp::LoraAdapter::load(d.file("a.gguf"), *model);
    rp::export_peft(*ad, *model, d.file("peft"));
    const auto st = rp::SafetensorsReader::open(d.file("peft/adapter_model.safetensors"));
    for (const auto & [module, base] : {std::pair<const char *, const char *>{"self_attn.qkv_proj", "blk.1.attn_qkv.weight"},
                                        {"mlp.gate_up_proj", "blk.1.ffn_up.weight"}}) {
        const rp::SafetensorsTensor * b = st->find(std::string("base_model.model.model.layers.1.") + module + ".lora_B.weight");
        ASSERT_NE(b, nullptr) << module;
        EXPECT_EQ(st->to_f32(*b), rp::tensor_get_f32(ad->find(base)->b)) << module;
    }
    EXPECT_EQ(st->find("base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"), nullptr);
    rp::import_peft(d.file("peft"), *model, d.file("back.gguf"));
    expect_same_tensors(d.file("a.gguf"), d.file("back.gguf"));
}

TEST(Peft, ExpertsRouterAndEmbeddingPairs) {
    TempDir d;
    const auto model = write_tiny_moe(d.file("moe.gguf"));
    random_adapter(*model, {"blk.0.ffn_gate_exps.weight", "blk.1.ffn_down_exps.weight", "blk.0.ffn_gate_inp.weight", "token_embd.weight"}, 2, 0.0f,
                   d.file("a.gguf"));
    const auto ad = rp::LoraAdapter::load(d.file("a.gguf"), *model);
    rp::export_peft(*ad, *model, d.file("peft"), {"BF16", "tiny-moe"});
    const rp::json::Value cfg = rp::json::parse(slurp(d.file("peft/adapter_config.json")), "adapter_config.json");
    EXPECT_EQ(cfg.find("lora_alpha")->number, 2) << "no alpha (scale 1) is lora_alpha = r";
    EXPECT_EQ(cfg.find("base_model_name_or_path")->string, "tiny-moe");
    const auto st = rp::SafetensorsReader::open(d.file("peft/adapter_model.safetensors"));
    EXPECT_EQ(st->tensors().size(), 2u * (4 + 4 + 1 + 1));
    for (int e = 0; e < 4; ++e) {
        const rp::SafetensorsTensor * a = st->find("base_model.model.model.layers.0.mlp.experts." + std::to_string(e) + ".gate_proj.lora_A.weight");
        ASSERT_NE(a, nullptr) << e;
        EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 32}));
        EXPECT_EQ(a->dtype, "BF16");
        // expert e's A is slice e of the stacked GGUF A, rounded to bf16
        const std::vector<float> stacked = rp::tensor_get_f32(ad->find("blk.0.ffn_gate_exps.weight")->a), got = st->to_f32(*a);
        for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], rp::bf16_to_fp32(rp::fp32_to_bf16(stacked[e * got.size() + i]))) << i;
    }
    EXPECT_NE(st->find("base_model.model.model.layers.1.mlp.experts.3.down_proj.lora_B.weight"), nullptr);
    EXPECT_NE(st->find("base_model.model.model.layers.0.mlp.gate.lora_A.weight"), nullptr);
    const rp::SafetensorsTensor * ea = st->find("base_model.model.model.embed_tokens.lora_embedding_A");
    ASSERT_NE(ea, nullptr);
    EXPECT_EQ(ea->shape, (std::vector<int64_t>{2, 96}));  // (r, vocab): GGUF's [r, vocab] ne transposed
    const std::vector<float> ga = rp::tensor_get_f32(ad->find("token_embd.weight")->a), pa = st->to_f32(*ea);
    EXPECT_EQ(pa[1 * 96 + 5], rp::bf16_to_fp32(rp::fp32_to_bf16(ga[5 * 2 + 1])));  // A[k = 1, v = 5]

    // F32 round trip: every tensor back bit for bit.
    rp::export_peft(*ad, *model, d.file("f32"));
    rp::import_peft(d.file("f32"), *model, d.file("back.gguf"));
    expect_same_tensors(d.file("a.gguf"), d.file("back.gguf"));
}

TEST(Peft, HeaderFollowsTheSpecification) {
    rp::SafetensorsWriter w;
    const float x[6] = {1, -2, 3.5f, 0, 1e-3f, 65504};
    w.add_f32("b", "F16", {2, 3}, x);
    w.add_f32("a", "F32", {3}, x);
    w.set_metadata("format", "pt");
    const std::string bytes = w.bytes();
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
    EXPECT_EQ(n % 8, 0u) << "the header is padded to 8 bytes";
    EXPECT_EQ(bytes[8], '{');
    EXPECT_EQ(bytes.size(), 8 + n + 2 * 6 + 4 * 3);
    const rp::json::Value h = rp::json::parse(bytes.substr(8, n), "header");
    EXPECT_EQ(h.find("b")->find("dtype")->string, "F16");
    EXPECT_EQ(h.find("b")->find("data_offsets")->array[0].number, 0);
    EXPECT_EQ(h.find("b")->find("data_offsets")->array[1].number, 12);
    EXPECT_EQ(h.find("a")->find("data_offsets")->array[0].number, 12);  // in the order added, no gap
    EXPECT_EQ(h.find("a")->find("data_offsets")->array[1].number, 24);
    EXPECT_EQ(h.find("__metadata__")->find("format")->string, "pt");
    const auto r = rp::SafetensorsReader::parse(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size(), "mem");
    const std::vector<float> b = r->to_f32(*r->find("b"));
    for (int i = 0; i < 6; ++i) EXPECT_EQ(b[static_cast<size_t>(i)], rp::fp16_to_fp32(rp::fp32_to_fp16(x[i])));
    EXPECT_EQ(r->to_f32(*r->find("a")), std::vector<float>(x, x + 3));
}

// A shape with a 0 is legal (no bytes, data_offsets [x, x]); every dtype reads it as no values. The F32 path once
// handed memcpy the empty vector's null data() (UBSan in the fuzz run; tests/fuzz/corpus/safetensors/).
TEST(Peft, ZeroElementSafetensorsTensorsReadAsNoValues) {
    const std::string bytes = safetensors_bytes(
        R"({"z":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"h":{"dtype":"BF16","shape":[2,0],"data_offsets":[0,0]},)"
        R"("t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
        std::string("\x00\x00\x80\x3f", 4));
    const auto r = rp::SafetensorsReader::parse(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size(), "mem");
    ASSERT_NE(r->find("z"), nullptr);
    EXPECT_EQ(r->find("z")->elements(), 0);
    EXPECT_TRUE(r->to_f32(*r->find("z")).empty());
    EXPECT_TRUE(r->to_f32(*r->find("h")).empty());
    EXPECT_EQ(r->to_f32(*r->find("t")), std::vector<float>{1.0f});
}

TEST(Peft, BadSafetensorsFilesNameTheFault) {
    const std::string t4 = R"("t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
    EXPECT_EQ(parse_error(safetensors_bytes("{" + t4 + "}", std::string(4, '\0'))), "(no error)");
    EXPECT_NE(parse_error("abc").find("too short"), std::string::npos);
    std::string past = safetensors_bytes("{}", "");
    past[0] = 100;
    EXPECT_NE(parse_error(past).find("runs past the end of the file"), std::string::npos);
    EXPECT_NE(parse_error(safetensors_bytes("{" + t4 + "}", std::string(8, '\0'))).find("4 bytes after the last tensor belong to no tensor"),
              std::string::npos);
    EXPECT_NE(parse_error(safetensors_bytes(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"u":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                                            std::string(6, '\0')))
                  .find("overlaps"),
              std::string::npos);
    EXPECT_NE(parse_error(safetensors_bytes(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, '\0'))).find("belong to no tensor"),
              std::string::npos);
    EXPECT_NE(parse_error(safetensors_bytes(R"({"t":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})", std::string(4, '\0')))
                  .find("tensor 't': dtype I8 is not one of F32, F16, BF16"),
              std::string::npos);
    EXPECT_NE(parse_error(safetensors_bytes(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", std::string(4, '\0')))
                  .find("tensor 't': 4 bytes for 2 F32 values (8 bytes)"),
              std::string::npos);
    EXPECT_NE(parse_error(safetensors_bytes(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,9]}})", std::string(4, '\0'))).find("data_offsets[1]"),
              std::string::npos);
    EXPECT_NE(parse_error(safetensors_bytes("{" + t4 + "," + t4 + "}", std::string(4, '\0'))).find("named twice"), std::string::npos);
    EXPECT_NE(parse_error(safetensors_bytes("[1]", "")).find("not a JSON object"), std::string::npos);
    EXPECT_NE(parse_error(safetensors_bytes("{\"t\":", "")).find("header"), std::string::npos);
}

TEST(Peft, ImportRefusesWhatAGgufAdapterCannotHoldAndWritesNothing) {
    TempDir d;
    const auto model = rp::Model::load(stories());
    const auto ad = rp::LoraAdapter::load(kAdapter, *model);
    rp::export_peft(*ad, *model, d.file("peft"));
    const std::string cfg = slurp(d.file("peft/adapter_config.json"));
    const std::string out = d.file("out.gguf");
    auto import_error = [&](const std::string & config) {
        write_text(d.file("peft/adapter_config.json"), config);
        const std::string e = error_of([&] { rp::import_peft(d.file("peft"), *model, out); });
        EXPECT_FALSE(fs::exists(out)) << e;
        return e;
    };
    auto with = [&](const std::string & from, const std::string & to) {
        std::string c = cfg;
        c.replace(c.find(from), from.size(), to);
        return c;
    };
    EXPECT_NE(import_error(with("\"use_dora\": false", "\"use_dora\": true")).find("adapter_config.json: use_dora: DoRA"), std::string::npos);
    EXPECT_NE(import_error(with("\"modules_to_save\": null", "\"modules_to_save\": [\"lm_head\"]")).find("modules_to_save"), std::string::npos);
    EXPECT_NE(import_error(with("\"bias\": \"none\"", "\"bias\": \"lora_only\"")).find("bias"), std::string::npos);
    EXPECT_NE(import_error(with("\"r\": 4", "\"r\": 4, \"rank_pattern\": {\"q_proj\": 8}")).find("rank_pattern"), std::string::npos);
    EXPECT_NE(import_error(with("\"peft_type\": \"LORA\"", "\"peft_type\": \"IA3\"")).find("peft_type"), std::string::npos);
    EXPECT_NE(import_error(with("\"r\": 4", "\"r\": 8")).find("needs (8, 64)"), std::string::npos) << "a rank the tensors do not have";
    // rsLoRA: alpha / sqrt(r) is kept as alpha' = alpha sqrt(r) over r.
    write_text(d.file("peft/adapter_config.json"), with("\"use_rslora\": false", "\"use_rslora\": true"));
    rp::import_peft(d.file("peft"), *model, out);
    EXPECT_FLOAT_EQ(rp::LoraAdapter::load(out, *model)->alpha(), 8.0f * 2.0f);
    fs::remove(out);
    write_text(d.file("peft/adapter_config.json"), cfg);

    // Tensors: a module the base lacks, a factor that is not LoRA's, a lone half.
    auto tensors_error = [&](const std::string & name, const std::vector<int64_t> & shape) {
        const auto st = rp::SafetensorsReader::open(d.file("peft/adapter_model.safetensors"));
        rp::SafetensorsWriter w;
        for (const rp::SafetensorsTensor & t : st->tensors()) w.add(t.name, t.dtype, t.shape, st->data(t));
        size_t n = 1;
        for (int64_t x : shape) n *= static_cast<size_t>(x);
        const std::vector<float> zeros(n, 0.0f);
        w.add_f32(name, "F32", shape, zeros.data());
        fs::create_directories(d.file("bad"));
        w.write(d.file("bad/adapter_model.safetensors"));
        write_text(d.file("bad/adapter_config.json"), cfg);
        const std::string e = error_of([&] { rp::import_peft(d.file("bad"), *model, out); });
        EXPECT_FALSE(fs::exists(out)) << e;
        return e;
    };
    EXPECT_NE(tensors_error("base_model.model.model.layers.99.self_attn.q_proj.lora_A.weight", {4, 64}).find("has no blk.99.attn_q.weight"),
              std::string::npos);
    EXPECT_NE(tensors_error("base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", {64}).find("not a LoRA factor"),
              std::string::npos);
    EXPECT_NE(tensors_error("base_model.model.model.layers.0.mlp.up_proj.lora_A.weight", {4, 64}).find("has lora_A but no lora_B"),
              std::string::npos);
    EXPECT_NE(tensors_error("base_model.model.model.layers.0.self_attn.rotary.lora_A.weight", {4, 64}).find("not one a GGUF adapter can hold"),
              std::string::npos);
}

TEST(Peft, RpGgufExportsAndImports) {
    TempDir d;
    ToolResult r = run_tool("rp-gguf", "export-peft " + kAdapter + " -m " + stories() + " -o " + d.file("peft") + " --dtype f16");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("(15 LoRA pairs)"), std::string::npos) << r.out;
    const auto st = rp::SafetensorsReader::open(d.file("peft/adapter_model.safetensors"));
    EXPECT_EQ(st->tensors().front().dtype, "F16");
    r = run_tool("rp-gguf", "import-peft " + d.file("peft") + " -m " + stories() + " -o " + d.file("a.gguf"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(fs::exists(d.file("a.gguf")));
    r = run_tool("rp-gguf", "export-peft " + kAdapter + " -m " + stories() + " -o " + d.file("x") + " --dtype f8");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("--dtype: 'f8' is not one of f32, f16, bf16"), std::string::npos) << r.err;
    r = run_tool("rp-gguf", "import-peft " + d.file("nothing") + " -m " + stories() + " -o " + d.file("b.gguf"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("nothing/adapter_config.json: cannot open"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(d.file("b.gguf")));
}

// gpt-oss: attention pairs round-trip; expert and router pairs are refused, naming the tensor (transformers fuses
// the experts into parameters and its router is no Linear module: PEFT's LoRA can wrap neither); import reads
// transformers' name of the router (mlp.router) and not the other MoE models' mlp.gate.
TEST(Peft, GptOssAttentionPairsRoundTripExpertAndRouterPairsAreRefused) {
    TempDir d;
    rp::SynthSpec s;
    s.arch = "gpt-oss";
    s.vocab_from = model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 8, s.n_layer = 2, s.n_expert = 4, s.n_expert_used = 2, s.n_ff_exp = 16;
    s.n_swa = 8;
    rp::write_synth_model(s, d.file("oss.gguf"));
    const auto model = rp::Model::load(d.file("oss.gguf"));
    random_adapter(*model, {"blk.1.attn_q.weight", "blk.0.attn_output.weight"}, 2, 4.0f, d.file("a.gguf"));
    rp::export_peft(*rp::LoraAdapter::load(d.file("a.gguf"), *model), *model, d.file("peft"));
    const auto st = rp::SafetensorsReader::open(d.file("peft/adapter_model.safetensors"));
    EXPECT_NE(st->find("base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"), nullptr);
    EXPECT_NE(st->find("base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight"), nullptr);
    rp::import_peft(d.file("peft"), *model, d.file("back.gguf"));
    expect_same_tensors(d.file("a.gguf"), d.file("back.gguf"));
    for (const char * target : {"blk.1.ffn_up_exps.weight", "blk.0.ffn_gate_inp.weight"}) {
        random_adapter(*model, {target}, 2, 4.0f, d.file("e.gguf"));
        const std::string err = error_of([&] { rp::export_peft(*rp::LoraAdapter::load(d.file("e.gguf"), *model), *model, d.file("peft-e")); });
        EXPECT_NE(err.find(target), std::string::npos) << err;
        EXPECT_FALSE(fs::exists(d.file("peft-e")));
    }
    EXPECT_EQ(rp::gguf_weight_of(model->hparams(), "model.layers.0.mlp.router").first, "blk.0.ffn_gate_inp.weight");
    EXPECT_EQ(rp::gguf_weight_of(model->hparams(), "model.layers.0.mlp.gate").first, "");
}

// Qwen3.5: the DeltaNet projections under linear_attn (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj) with
// the value heads in transformers' grouped order (B's rows; out_proj: A's columns), and back bit for bit.
TEST(Peft, Qwen35LinearAttentionModulesAndValueHeadOrder) {
    TempDir d;
    rp::SynthSpec s;
    s.arch = "qwen35";
    s.vocab_from = model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 8, s.n_ff = 40, s.n_layer = 4;
    s.ssm_k_heads = 2, s.ssm_v_heads = 4, s.ssm_head_dim = 8, s.full_attn_interval = 4;
    rp::write_synth_model(s, d.file("q35.gguf"));
    const auto model = rp::Model::load(d.file("q35.gguf"));
    random_adapter(*model, {"blk.0.attn_qkv.weight", "blk.0.attn_gate.weight", "blk.1.ssm_beta.weight", "blk.1.ssm_alpha.weight",
                            "blk.1.ssm_out.weight", "blk.3.attn_q.weight", "blk.2.ffn_down.weight"},
                   2, 4.0f, d.file("a.gguf"));
    const auto ad = rp::LoraAdapter::load(d.file("a.gguf"), *model);
    rp::export_peft(*ad, *model, d.file("peft"));
    const auto st = rp::SafetensorsReader::open(d.file("peft/adapter_model.safetensors"));
    const std::string P = "base_model.model.model.layers.";
    for (const char * m : {"0.linear_attn.in_proj_qkv", "0.linear_attn.in_proj_z", "1.linear_attn.in_proj_b", "1.linear_attn.in_proj_a",
                           "1.linear_attn.out_proj", "3.self_attn.q_proj", "2.mlp.down_proj"})
        EXPECT_NE(st->find(P + m + ".lora_A.weight"), nullptr) << m;
    const int64_t Hk = 2, Hv = 4, r = 2, Dv = 8, rank = 2;
    auto tiled = [&](int64_t g) { return (g % r) * Hk + g / r; };
    const std::vector<float> zb = rp::tensor_get_f32(ad->find("blk.0.attn_gate.weight")->b), hzb = st->to_f32(*st->find(P + "0.linear_attn.in_proj_z.lora_B.weight"));
    for (int64_t g = 0; g < Hv; ++g)
        for (int64_t i = 0; i < Dv * rank; ++i) ASSERT_EQ(hzb[static_cast<size_t>(g * Dv * rank + i)], zb[static_cast<size_t>(tiled(g) * Dv * rank + i)]);
    const std::vector<float> oa = rp::tensor_get_f32(ad->find("blk.1.ssm_out.weight")->a), hoa = st->to_f32(*st->find(P + "1.linear_attn.out_proj.lora_A.weight"));
    for (int64_t k = 0; k < rank; ++k)
        for (int64_t g = 0; g < Hv; ++g)
            for (int64_t i = 0; i < Dv; ++i)
                ASSERT_EQ(hoa[static_cast<size_t>(k * Hv * Dv + g * Dv + i)], oa[static_cast<size_t>(k * Hv * Dv + tiled(g) * Dv + i)]);
    rp::import_peft(d.file("peft"), *model, d.file("back.gguf"));
    expect_same_tensors(d.file("a.gguf"), d.file("back.gguf"));
}

// qwen35moe: the shared expert's pairs as mlp.shared_expert.*, round-tripping; the routed experts' and the router's
// pairs refused (transformers packs the experts into parameters and its router is no Linear module).
TEST(Peft, Qwen35MoeSharedExpertPairsRoundTripExpertAndRouterPairsAreRefused) {
    TempDir d;
    rp::SynthSpec s;
    s.arch = "qwen35moe";
    s.vocab_from = model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 8, s.n_ff = 40, s.n_layer = 4, s.n_expert = 4, s.n_expert_used = 2, s.n_ff_exp = 16;
    s.ssm_k_heads = 2, s.ssm_v_heads = 4, s.ssm_head_dim = 8;
    rp::write_synth_model(s, d.file("moe.gguf"));
    const auto model = rp::Model::load(d.file("moe.gguf"));
    random_adapter(*model, {"blk.3.ffn_up_shexp.weight", "blk.0.ssm_out.weight"}, 2, 4.0f, d.file("a.gguf"));
    rp::export_peft(*rp::LoraAdapter::load(d.file("a.gguf"), *model), *model, d.file("peft"));
    const auto st = rp::SafetensorsReader::open(d.file("peft/adapter_model.safetensors"));
    EXPECT_NE(st->find("base_model.model.model.layers.3.mlp.shared_expert.up_proj.lora_A.weight"), nullptr);
    EXPECT_NE(st->find("base_model.model.model.layers.0.linear_attn.out_proj.lora_A.weight"), nullptr);
    rp::import_peft(d.file("peft"), *model, d.file("back.gguf"));
    expect_same_tensors(d.file("a.gguf"), d.file("back.gguf"));
    for (const char * target : {"blk.1.ffn_gate_exps.weight", "blk.2.ffn_gate_inp.weight"}) {
        random_adapter(*model, {target}, 2, 4.0f, d.file("e.gguf"));
        const std::string err = error_of([&] { rp::export_peft(*rp::LoraAdapter::load(d.file("e.gguf"), *model), *model, d.file("peft-e")); });
        EXPECT_NE(err.find(target), std::string::npos) << err;
        EXPECT_FALSE(fs::exists(d.file("peft-e")));
    }
}
