// Models as Hugging Face safetensors (models/convert/hf_export.h), read back with our reader:
//   - stories260K (llama) in three shards: the index maps every tensor to the shard that holds it, every GGUF
//     tensor comes back bit for bit under its HF name with its shape reversed, q/k rows in HF's order
//     (formats.md §3.6, computed here), and config.json states the hyper-parameters;
//   - qwen3 (tied head, q/k norms: no lm_head, no permutation), qwen2 (q/k/v biases), a quantized file
//     (dequantized values) and a mixture of experts (each expert its own tensors, the router as mlp.gate);
//   - a failed export leaves no file.
#include "models_test_util.h"

#include "base/atomic_file.h"
#include "ggml_rp/core/json.h"
#include "ggml_rp/core/quant.h"
#include "models/arch/hparams.h"
#include "models/convert/hf_export.h"
#include "models/convert/safetensors.h"
#include "models/convert/synth_model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

using namespace models_test;
namespace fs = std::filesystem;

namespace {

// The exported directory: its tensors by name, through the index.
struct Exported {
    rp::json::Value index, config;
    std::map<std::string, std::unique_ptr<rp::SafetensorsReader>> shards;
    explicit Exported(const std::string & dir) {
        index = rp::json::parse(slurp(dir + "/model.safetensors.index.json"), "index");
        config = rp::json::parse(slurp(dir + "/config.json"), "config.json");
        for (const rp::json::Member & m : index.find("weight_map")->object)
            if (!shards.count(m.second.string)) shards[m.second.string] = rp::SafetensorsReader::open(dir + "/" + m.second.string);
    }
    // The tensor `name` (checked to be in the shard the index names).
    std::pair<const rp::SafetensorsReader *, const rp::SafetensorsTensor *> get(const std::string & name) const {
        const rp::json::Value * file = index.find("weight_map")->find(name);
        if (!file) return {nullptr, nullptr};
        const rp::SafetensorsReader * r = shards.at(file->string).get();
        return {r, r->find(name)};
    }
    std::vector<float> values(const std::string & name) const {
        const auto [r, t] = get(name);
        return r && t ? r->to_f32(*t) : std::vector<float>{};
    }
    size_t tensors() const {
        size_t n = 0;
        for (const auto & [f, r] : shards) n += r->tensors().size();
        return n;
    }
};

std::vector<float> gguf_values(const rp::Model & m, const std::string & name) {
    const gguf::TensorInfo * t = m.file().find_tensor(name);
    std::vector<float> v(static_cast<size_t>(t->nelements()));
    const size_t rb = gguf::row_bytes(t->type, t->ne[0]);
    for (int64_t r = 0; r < t->nelements() / t->ne[0]; ++r)
        rp::dequantize_row(t->type, m.file().tensor_data(*t) + static_cast<size_t>(r) * rb, v.data() + r * t->ne[0], t->ne[0]);
    return v;
}

} // namespace

TEST(HfExport, LlamaShardsNamesShapesPermutationAndConfig) {
    TempDir d;
    const auto model = rp::Model::load(stories());
    rp::HfExportOptions o;
    o.shard_bytes = 400 * 1024;
    size_t calls = 0, last_done = 0, last_bytes = 0;
    o.progress = [&](size_t done, size_t total, size_t bytes_done, size_t bytes) {  // once a tensor, in order, to the totals
        ++calls;
        EXPECT_EQ(done, last_done + 1);
        EXPECT_GT(bytes_done, last_bytes);
        EXPECT_EQ(total, 48u);
        EXPECT_EQ(bytes, 1171200u);
        last_done = done, last_bytes = bytes_done;
    };
    const rp::HfExportReport rep = rp::export_hf(*model, d.file("hf"), o);
    EXPECT_EQ(calls, 48u);
    EXPECT_EQ(last_bytes, 1171200u);
    EXPECT_EQ(rep.dtype, "F32");
    const Exported ex(d.file("hf"));
    EXPECT_EQ(ex.shards.size(), 3u);
    EXPECT_TRUE(ex.shards.count("model-00001-of-00003.safetensors"));
    EXPECT_EQ(ex.tensors(), 48u);
    EXPECT_EQ(ex.index.find("metadata")->find("total_size")->number, 1171200);
    const rp::HParams & hp = model->hparams();
    // Every tensor bit for bit, q/k rows in HF order.
    const std::vector<std::pair<std::string, std::string>> names = {
        {"token_embd.weight", "model.embed_tokens.weight"}, {"output.weight", "lm_head.weight"}, {"output_norm.weight", "model.norm.weight"},
        {"blk.2.attn_norm.weight", "model.layers.2.input_layernorm.weight"}, {"blk.2.ffn_norm.weight", "model.layers.2.post_attention_layernorm.weight"},
        {"blk.2.attn_q.weight", "model.layers.2.self_attn.q_proj.weight"}, {"blk.2.attn_k.weight", "model.layers.2.self_attn.k_proj.weight"},
        {"blk.2.attn_v.weight", "model.layers.2.self_attn.v_proj.weight"}, {"blk.2.attn_output.weight", "model.layers.2.self_attn.o_proj.weight"},
        {"blk.2.ffn_gate.weight", "model.layers.2.mlp.gate_proj.weight"}, {"blk.2.ffn_up.weight", "model.layers.2.mlp.up_proj.weight"},
        {"blk.2.ffn_down.weight", "model.layers.2.mlp.down_proj.weight"}};
    for (const auto & [g, h] : names) {
        const gguf::TensorInfo * t = model->file().find_tensor(g);
        const auto [r, st] = ex.get(h);
        ASSERT_TRUE(r && st) << h;
        std::vector<int64_t> shape;
        for (int k = static_cast<int>(t->n_dims) - 1; k >= 0; --k) shape.push_back(t->ne[k]);
        EXPECT_EQ(st->shape, shape) << h;
        const std::vector<float> a = gguf_values(*model, g), b = r->to_f32(*st);
        const int64_t heads = g.find("attn_q") != std::string::npos ? hp.n_head : g.find("attn_k") != std::string::npos ? hp.n_head_kv : 0;
        if (!heads) {
            EXPECT_EQ(a, b) << h;
            continue;
        }
        const int64_t D = hp.head_dim, row = t->ne[0];
        for (int64_t hd = 0; hd < heads; ++hd)
            for (int64_t j = 0; j < D / 2; ++j)
                for (int64_t s = 0; s < 2; ++s)
                    for (int64_t c = 0; c < row; ++c)
                        ASSERT_EQ(a[static_cast<size_t>((hd * D + 2 * j + s) * row + c)], b[static_cast<size_t>((hd * D + s * D / 2 + j) * row + c)]) << h;
    }
    const rp::json::Value & c = ex.config;
    EXPECT_EQ(c.find("architectures")->array.at(0).string, "LlamaForCausalLM");
    EXPECT_EQ(c.find("hidden_size")->number, 64);
    EXPECT_EQ(c.find("intermediate_size")->number, 172);
    EXPECT_EQ(c.find("num_hidden_layers")->number, 5);
    EXPECT_EQ(c.find("num_attention_heads")->number, 8);
    EXPECT_EQ(c.find("num_key_value_heads")->number, 4);
    EXPECT_EQ(c.find("vocab_size")->number, 512);
    EXPECT_EQ(c.find("rms_norm_eps")->number, 1e-5);
    EXPECT_EQ(c.find("rope_theta")->number, 10000);
    EXPECT_EQ(c.find("tie_word_embeddings")->boolean, false);
    EXPECT_EQ(c.find("torch_dtype")->string, "float32");
    const rp::json::Value gen = rp::json::parse(slurp(d.file("hf/generation_config.json")), "generation_config.json");
    EXPECT_EQ(gen.find("bos_token_id")->number, 1);
    EXPECT_EQ(gen.find("eos_token_id")->number, 2);
    // Its SentencePiece vocabulary as tokenizer.json (test_hf_tokenizer.cpp reads such files with tokenizers.js).
    EXPECT_EQ(rep.tokenizer_refused, "");
    const rp::json::Value tj = rp::json::parse(slurp(d.file("hf/tokenizer.json")), "tokenizer.json");
    EXPECT_TRUE(tj.find("model")->find("byte_fallback")->boolean);
    EXPECT_EQ(tj.find("model")->find("vocab")->object.size(), 512u);
}

TEST(HfExport, QwenTiedHeadNormsBiasesAndQuantizedWeights) {
    TempDir d;
    const auto q3 = rp::Model::load(model_path("synthetic/tiny-random-qwen3.gguf"));
    EXPECT_EQ(rp::export_hf(*q3, d.file("q3")).tokenizer_refused, "");
    const Exported e3(d.file("q3"));
    // Its byte-level BPE vocabulary as tokenizer.json (test_hf_tokenizer.cpp reads such files with tokenizers.js).
    const rp::json::Value tj = rp::json::parse(slurp(d.file("q3/tokenizer.json")), "tokenizer.json");
    EXPECT_EQ(tj.find("model")->find("vocab")->object.size(), static_cast<size_t>(q3->hparams().n_vocab));
    EXPECT_EQ(rp::json::parse(slurp(d.file("q3/tokenizer_config.json")), "tokenizer_config.json").find("model_max_length")->number,
              q3->hparams().n_ctx_train);
    EXPECT_FALSE(e3.get("lm_head.weight").first) << "a tied head has no lm_head";
    EXPECT_EQ(e3.config.find("tie_word_embeddings")->boolean, true);
    EXPECT_EQ(e3.config.find("head_dim")->number, 32);
    EXPECT_EQ(e3.values("model.layers.1.self_attn.q_norm.weight"), gguf_values(*q3, "blk.1.attn_q_norm.weight"));
    EXPECT_EQ(e3.values("model.layers.1.self_attn.q_proj.weight"), gguf_values(*q3, "blk.1.attn_q.weight")) << "qwen3 is not permuted";

    const auto q2 = rp::Model::load(model_path("synthetic/tiny-random-qwen2.gguf"));
    rp::export_hf(*q2, d.file("q2"));
    const Exported e2(d.file("q2"));
    EXPECT_EQ(e2.config.find("architectures")->array.at(0).string, "Qwen2ForCausalLM");
    EXPECT_EQ(e2.values("model.layers.0.self_attn.k_proj.bias"), gguf_values(*q2, "blk.0.attn_k.bias"));

    const auto q8 = rp::Model::load(model_path("derived/stories260K-Q8_0.gguf"));
    rp::HfExportOptions f32;
    f32.dtype = "F32";
    EXPECT_EQ(rp::export_hf(*q8, d.file("q8"), f32).dtype, "F32");
    const Exported e8(d.file("q8"));
    EXPECT_EQ(e8.values("model.layers.0.mlp.up_proj.weight"), gguf_values(*q8, "blk.0.ffn_up.weight")) << "the dequantized values";
    EXPECT_EQ(rp::export_hf(*q8, d.file("q8auto")).dtype, "F16") << "auto: a quantized file gives f16";
}

TEST(HfExport, MixtureOfExpertsSplitsTheExperts) {
    TempDir d;
    const auto model = write_tiny_moe(d.file("moe.gguf"));
    rp::export_hf(*model, d.file("hf"));
    const Exported ex(d.file("hf"));
    EXPECT_EQ(ex.config.find("architectures")->array.at(0).string, "Qwen3MoeForCausalLM");
    EXPECT_EQ(ex.config.find("num_experts")->number, 4);
    EXPECT_EQ(ex.config.find("num_experts_per_tok")->number, 2);
    EXPECT_EQ(ex.config.find("moe_intermediate_size")->number, 16);
    const std::vector<float> stacked = gguf_values(*model, "blk.1.ffn_up_exps.weight");
    for (int e = 0; e < 4; ++e) {
        const auto [r, t] = ex.get("model.layers.1.mlp.experts." + std::to_string(e) + ".up_proj.weight");
        ASSERT_TRUE(r && t) << e;
        EXPECT_EQ(t->shape, (std::vector<int64_t>{16, 32}));
        const std::vector<float> v = r->to_f32(*t);
        EXPECT_EQ(v, std::vector<float>(stacked.begin() + e * 512, stacked.begin() + (e + 1) * 512)) << e;
    }
    const auto [rg, tg] = ex.get("model.layers.0.mlp.gate.weight");
    ASSERT_TRUE(rg && tg);
    EXPECT_EQ(tg->shape, (std::vector<int64_t>{4, 32}));
}

// The directory of a multi-file output goes again when its files are not committed, unless it was there.
// Llama 3.1-3.3's rope_freqs become config.json's rope_scaling ({"rope_type": "llama3", factor, 1, 4, 8192}); the
// tensor itself has no HF name. Factors that are not Llama 3's are refused, nothing written.
TEST(HfExport, Llama3RopeFactorsBecomeTheConfigsRopeScaling) {
    TempDir d;
    rp::SynthSpec s;
    s.vocab_from = stories();
    s.n_embd = 64, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 16, s.n_ff = 96, s.n_layer = 2, s.n_ctx_train = 131072;
    s.rope_base = 500000.0f, s.llama3_rope = 32.0f;
    rp::write_synth_model(s, d.file("l3.gguf"));
    const auto model = rp::Model::load(d.file("l3.gguf"));
    rp::export_hf(*model, d.file("hf"));
    const Exported ex(d.file("hf"));
    EXPECT_EQ(ex.tensors(), model->weights().size() - 1);  // all but rope_freqs
    const rp::json::Value * rs = ex.config.find("rope_scaling");
    ASSERT_TRUE(rs && rs->is_object());
    EXPECT_EQ(rs->find("rope_type")->string, "llama3");
    EXPECT_EQ(rs->find("factor")->number, 32);
    EXPECT_EQ(rs->find("low_freq_factor")->number, 1);
    EXPECT_EQ(rs->find("high_freq_factor")->number, 4);
    EXPECT_EQ(rs->find("original_max_position_embeddings")->number, 8192);
    EXPECT_EQ(ex.config.find("max_position_embeddings")->number, 131072);
    s.llama3_rope_ctx = 64;  // not Meta's context: no config states these
    rp::write_synth_model(s, d.file("odd.gguf"));
    try {
        rp::export_hf(*rp::Model::load(d.file("odd.gguf")), d.file("odd"));
        ADD_FAILURE() << "exported";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("rope_freqs.weight holds factors that are not Llama 3's"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(d.file("odd")));
}

// phi3 as transformers' Phi3ForCausalLM: the fused qkv_proj and gate_up_proj as the GGUF holds them (no permutation:
// NEOX RoPE), LongRoPE's factors in rope_scaling with the original context.
TEST(HfExport, Phi3FusedProjectionsAndLongRope) {
    TempDir d;
    rp::SynthSpec s;
    s.arch = "phi3";
    s.vocab_from = stories();
    s.n_embd = 64, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 16, s.n_ff = 96, s.n_layer = 2, s.n_ctx_train = 4096, s.long_rope_ctx = 256;
    s.n_rot = 12;  // Phi-4-mini's partial RoPE (its 0.75)
    rp::write_synth_model(s, d.file("phi3.gguf"));
    const auto model = rp::Model::load(d.file("phi3.gguf"));
    rp::export_hf(*model, d.file("hf"));
    const Exported ex(d.file("hf"));
    EXPECT_EQ(ex.tensors(), model->weights().size() - 2);  // all but the two factor tensors
    for (const auto & [g, h] : {std::pair<const char *, const char *>{"blk.1.attn_qkv.weight", "model.layers.1.self_attn.qkv_proj.weight"},
                                {"blk.1.ffn_up.weight", "model.layers.1.mlp.gate_up_proj.weight"},
                                {"blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"}})
        EXPECT_EQ(ex.values(h), gguf_values(*model, g)) << h;
    EXPECT_EQ(ex.config.find("architectures")->array.at(0).string, "Phi3ForCausalLM");
    EXPECT_EQ(ex.config.find("original_max_position_embeddings")->number, 256);
    EXPECT_EQ(ex.config.find("partial_rotary_factor")->number, 0.75);
    const rp::json::Value * rs = ex.config.find("rope_scaling");
    ASSERT_TRUE(rs && rs->is_object());
    EXPECT_EQ(rs->find("type")->string, "longrope");
    for (const auto & [key, tensor] : {std::pair<const char *, const char *>{"long_factor", "rope_factors_long.weight"}, {"short_factor", "rope_factors_short.weight"}}) {
        const std::vector<float> want = gguf_values(*model, tensor);
        const rp::json::Value * got = rs->find(key);
        ASSERT_TRUE(got && got->is_array() && got->array.size() == want.size()) << key;
        for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(static_cast<float>(got->array[i].number), want[i]) << key << " " << i;
    }
}

// Gemma 3 and Gemma 2 as Gemma3ForCausalLM (text) and Gemma2ForCausalLM: the four norms of a layer under their HF
// names holding w where the GGUF holds 1 + w, the tied head (no lm_head), and the config's Gemma fields.
TEST(HfExport, GemmaNormsAndConfig) {
    TempDir d;
    for (const char * arch : {"gemma3", "gemma2"}) {
        const bool g3 = std::string(arch) == "gemma3";
        rp::SynthSpec s;
        s.arch = arch;
        s.vocab_from = stories();
        s.n_embd = 64, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32, s.n_ff = 96, s.n_layer = 7, s.n_swa = 16, s.tied = true;
        if (g3) s.rope_linear = 8.0f, s.rope_base = 1e6f;
        else s.attn_softcap = 50.0f, s.final_softcap = 30.0f;
        const std::string file = d.file(std::string(arch) + ".gguf"), dir = d.file(std::string(arch) + "-hf");
        rp::write_synth_model(s, file);
        const auto model = rp::Model::load(file);
        rp::export_hf(*model, dir);
        const Exported ex(dir);
        EXPECT_EQ(ex.tensors(), model->weights().size()) << arch;
        EXPECT_TRUE(ex.values("lm_head.weight").empty()) << arch;
        const std::vector<std::pair<std::string, std::string>> norms = {
            {"blk.3.attn_norm.weight", "model.layers.3.input_layernorm.weight"},
            {"blk.3.post_attention_norm.weight", "model.layers.3.post_attention_layernorm.weight"},
            {"blk.3.ffn_norm.weight", "model.layers.3.pre_feedforward_layernorm.weight"},
            {"blk.3.post_ffw_norm.weight", "model.layers.3.post_feedforward_layernorm.weight"},
            {"output_norm.weight", "model.norm.weight"}};
        for (const auto & [g, h] : norms) {
            std::vector<float> want = gguf_values(*model, g);
            for (float & x : want) x -= 1.0f;
            EXPECT_EQ(ex.values(h), want) << h;
        }
        if (g3) {
            std::vector<float> want = gguf_values(*model, "blk.3.attn_q_norm.weight");
            for (float & x : want) x -= 1.0f;
            EXPECT_EQ(ex.values("model.layers.3.self_attn.q_norm.weight"), want);
        }
        EXPECT_EQ(ex.values("model.layers.3.mlp.up_proj.weight"), gguf_values(*model, "blk.3.ffn_up.weight"));  // no permutation
        const rp::json::Value & c = ex.config;
        EXPECT_EQ(c.find("architectures")->array.at(0).string, g3 ? "Gemma3ForCausalLM" : "Gemma2ForCausalLM");
        EXPECT_EQ(c.find("model_type")->string, g3 ? "gemma3_text" : "gemma2");
        EXPECT_EQ(c.find("hidden_activation")->string, "gelu_pytorch_tanh");
        EXPECT_EQ(c.find("query_pre_attn_scalar")->number, 32);
        EXPECT_EQ(c.find("sliding_window")->number, 16);
        const rp::json::Value * types = c.find("layer_types");
        ASSERT_TRUE(types && types->array.size() == 7u);
        for (uint32_t il = 0; il < 7; ++il)
            EXPECT_EQ(types->array[il].string, model->hparams().is_swa(il) ? "sliding_attention" : "full_attention") << il;
        EXPECT_EQ(types->array[g3 ? 5 : 1].string, "full_attention");
        if (g3) {
            EXPECT_EQ(c.find("rope_local_base_freq")->number, 10000);
            EXPECT_EQ(c.find("rope_scaling")->find("rope_type")->string, "linear");
            EXPECT_EQ(c.find("rope_scaling")->find("factor")->number, 8);
            EXPECT_EQ(c.find("final_logit_softcapping")->type, rp::json::Value::Type::Null);
        } else {
            EXPECT_EQ(c.find("attn_logit_softcapping")->number, 50);
            EXPECT_EQ(c.find("final_logit_softcapping")->number, 30);
        }
        EXPECT_EQ(c.find("tie_word_embeddings")->boolean, true);
    }
}

TEST(HfExport, AnOutputDirectoryMadeForAFailedWriteIsRemoved) {
    TempDir d;
    try {
        rp::OutputDir out(d.file("new/sub"));
        rp::AtomicFile f(out.file("a.json"));
        f.write("{}");
        throw rp::Error("a later file failed");
    } catch (const rp::Error &) {
    }
    EXPECT_FALSE(fs::exists(d.file("new/sub"))) << "made for the write, removed with it";
    fs::create_directories(d.file("kept"));
    { rp::OutputDir out(d.file("kept")); }
    EXPECT_TRUE(fs::exists(d.file("kept"))) << "a directory that was there stays";
    {
        rp::OutputDir out(d.file("done"));
        rp::write_file_atomically(out.file("x"), "1");
        out.commit();
    }
    EXPECT_EQ(slurp(d.file("done/x")), "1");
}

TEST(HfExport, AFailedExportWritesNothing) {
    TempDir d;
    const auto model = rp::Model::load(stories());
    rp::HfExportOptions o;
    o.dtype = "F8";
    EXPECT_THROW(rp::export_hf(*model, d.file("hf"), o), rp::Error);
    EXPECT_FALSE(fs::exists(d.file("hf/config.json")));
    std::ofstream(d.file("file")) << "x";
    EXPECT_THROW(rp::export_hf(*model, d.file("file/hf")), rp::Error);  // a file where the directory goes
    ToolResult r = run_tool("rp-gguf", "export-hf " + stories() + " -o " + d.file("cli") + " --dtype bf16 --shard-size 1M");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("wrote 48 BF16 tensors (585600 bytes) in 1 safetensors files"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("wrote tokenizer.json and tokenizer_config.json"), std::string::npos) << r.out;
    // The vocabulary alone: written for a vocabulary-only file; refused, with nothing written, for one without
    // tokenizer.ggml.pre (llama.cpp's fallback pre-tokenizer, which no Hugging Face tokenizer has).
    r = run_tool("rp-gguf", "export-tokenizer " + model_path("vocab/ggml-vocab-qwen2.gguf") + " -o " + d.file("tok"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(fs::exists(d.file("tok/tokenizer.json")) && fs::exists(d.file("tok/tokenizer_config.json")));
    {
        const auto src = gguf::Reader::open(model_path("vocab/ggml-vocab-gpt-2.gguf"));
        gguf::Writer w;
        gguf::copy_kvs(*src, w);
        w.remove("tokenizer.ggml.pre");
        w.write(d.file("nopre.gguf"));
    }
    r = run_tool("rp-gguf", "export-tokenizer " + d.file("nopre.gguf") + " -o " + d.file("nopre"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find(d.file("nopre.gguf") + ": the vocabulary cannot be written as tokenizer.json exactly: no tokenizer.ggml.pre"),
              std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(d.file("nopre")));
    r = run_tool("rp-gguf", "export-hf " + stories() + " -o " + d.file("x") + " --dtype f8");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("--dtype: 'f8' is not one of auto, f32, f16, bf16"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(d.file("x")));
}

// gpt-oss as GptOssForCausalLM: the experts' gate and up fused into gate_up_proj [E, n_embd, 2 ff] with their
// columns interleaved (gate even, up odd), down_proj input-major [E, ff, n_embd], their biases likewise, the router
// as mlp.router, the sinks as self_attn.sinks; the config's experts, windows and YaRN. (llama.cpp's converter
// undoes exactly this layout: the index arithmetic below is its inverse.)
TEST(HfExport, GptOssFusedExpertsRouterSinksAndConfig) {
    TempDir d;
    rp::SynthSpec s;
    s.arch = "gpt-oss";
    s.vocab_from = stories();
    s.n_embd = 48, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 16, s.n_layer = 3, s.n_expert = 4, s.n_expert_used = 2, s.n_ff_exp = 24;
    s.n_swa = 8, s.yarn_factor = 4.0f, s.yarn_orig_ctx = 256, s.n_ctx_train = 1024;
    rp::write_synth_model(s, d.file("oss.gguf"));
    const auto model = rp::Model::load(d.file("oss.gguf"));
    rp::export_hf(*model, d.file("hf"));
    const Exported ex(d.file("hf"));
    const int64_t E = 4, ff = 24, C = 48;
    const std::string L = "model.layers.1.";
    const std::vector<float> gate = gguf_values(*model, "blk.1.ffn_gate_exps.weight"), up = gguf_values(*model, "blk.1.ffn_up_exps.weight");
    const auto [r, gu] = ex.get(L + "mlp.experts.gate_up_proj");
    ASSERT_TRUE(r && gu);
    EXPECT_EQ(gu->shape, (std::vector<int64_t>{E, C, 2 * ff}));
    const std::vector<float> v = r->to_f32(*gu);
    for (int64_t e = 0; e < E; ++e)
        for (int64_t j = 0; j < ff; ++j)
            for (int64_t c = 0; c < C; ++c) {
                ASSERT_EQ(v[static_cast<size_t>((e * C + c) * 2 * ff + 2 * j)], gate[static_cast<size_t>((e * ff + j) * C + c)]);
                ASSERT_EQ(v[static_cast<size_t>((e * C + c) * 2 * ff + 2 * j + 1)], up[static_cast<size_t>((e * ff + j) * C + c)]);
            }
    const std::vector<float> gb = gguf_values(*model, "blk.1.ffn_gate_exps.bias"), ub = gguf_values(*model, "blk.1.ffn_up_exps.bias");
    const std::vector<float> gub = ex.values(L + "mlp.experts.gate_up_proj_bias");
    ASSERT_EQ(gub.size(), static_cast<size_t>(E * 2 * ff));
    for (size_t i = 0; i < gb.size(); ++i) {
        EXPECT_EQ(gub[2 * i], gb[i]);
        EXPECT_EQ(gub[2 * i + 1], ub[i]);
    }
    const std::vector<float> down = gguf_values(*model, "blk.1.ffn_down_exps.weight"), hd = ex.values(L + "mlp.experts.down_proj");
    EXPECT_EQ(ex.get(L + "mlp.experts.down_proj").second->shape, (std::vector<int64_t>{E, ff, C}));
    for (int64_t e = 0; e < E; ++e)
        for (int64_t c = 0; c < C; ++c)
            for (int64_t j = 0; j < ff; ++j)
                ASSERT_EQ(hd[static_cast<size_t>((e * ff + j) * C + c)], down[static_cast<size_t>((e * C + c) * ff + j)]);
    for (const auto & [g, h] : std::vector<std::pair<std::string, std::string>>{
             {"blk.1.ffn_down_exps.bias", "mlp.experts.down_proj_bias"}, {"blk.1.ffn_gate_inp.weight", "mlp.router.weight"},
             {"blk.1.ffn_gate_inp.bias", "mlp.router.bias"}, {"blk.1.attn_sinks.weight", "self_attn.sinks"},
             {"blk.1.post_attention_norm.weight", "post_attention_layernorm.weight"}, {"blk.1.attn_q.bias", "self_attn.q_proj.bias"},
             {"blk.1.attn_q.weight", "self_attn.q_proj.weight"}})
        EXPECT_EQ(ex.values(L + h), gguf_values(*model, g)) << h;  // no permutation: gpt-oss's RoPE is NEOX
    EXPECT_EQ(ex.get(L + "mlp.router.weight").second->shape, (std::vector<int64_t>{E, C}));
    EXPECT_EQ(ex.get(L + "mlp.experts.down_proj_bias").second->shape, (std::vector<int64_t>{E, C}));
    EXPECT_FALSE(ex.get(L + "mlp.experts.0.gate_proj.weight").first);
    EXPECT_EQ(ex.tensors(), 3u + 3 * 17u);  // embeddings, norm, head; per layer: 2 norms, 8 attention, sinks, 2 router, 4 experts
    const rp::json::Value & c = ex.config;
    EXPECT_EQ(c.find("architectures")->array.at(0).string, "GptOssForCausalLM");
    EXPECT_EQ(c.find("model_type")->string, "gpt_oss");
    EXPECT_EQ(c.find("intermediate_size")->number, ff);
    EXPECT_EQ(c.find("num_local_experts")->number, E);
    EXPECT_EQ(c.find("num_experts_per_tok")->number, 2);
    EXPECT_TRUE(c.find("attention_bias")->boolean);
    EXPECT_EQ(c.find("sliding_window")->number, 8);
    const rp::json::Value * types = c.find("layer_types");
    ASSERT_TRUE(types && types->array.size() == 3u);
    EXPECT_EQ(types->array[0].string, "sliding_attention");
    EXPECT_EQ(types->array[1].string, "full_attention");
    const rp::json::Value * yarn = c.find("rope_scaling");
    ASSERT_TRUE(yarn && yarn->is_object());
    EXPECT_EQ(yarn->find("rope_type")->string, "yarn");
    EXPECT_EQ(yarn->find("factor")->number, 4);
    EXPECT_EQ(yarn->find("original_max_position_embeddings")->number, 256);
    EXPECT_EQ(c.find("max_position_embeddings")->number, 1024);
    EXPECT_EQ(c.find("num_experts"), nullptr) << "qwen3moe's fields are not gpt-oss's";
}

// Qwen3.5 as Qwen3_5ForCausalLM: the DeltaNet tensors under linear_attn with the value heads back in transformers'
// grouped order (llama.cpp's converter tiles them: tiled head j * Hk + k holds grouped head k * r + j), A_log from
// ssm_a = -exp(A_log), conv1d as [C, 1, K], the (1 + w) norms as w and the gated norm as it is, no MTP block; the
// config's layer types, DeltaNet widths and M-RoPE.
TEST(HfExport, Qwen35DeltaNetTensorsValueHeadOrderAndConfig) {
    TempDir d;
    rp::SynthSpec s;
    s.arch = "qwen35";
    s.vocab_from = model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 48, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 16, s.n_rot = 8, s.n_ff = 40, s.n_layer = 4;
    s.ssm_k_heads = 2, s.ssm_v_heads = 6, s.ssm_head_dim = 8, s.full_attn_interval = 4, s.mtp_layers = 1;
    rp::write_synth_model(s, d.file("q35.gguf"));
    const auto model = rp::Model::load(d.file("q35.gguf"));
    rp::export_hf(*model, d.file("hf"));
    const Exported ex(d.file("hf"));
    const int64_t Hk = 2, Hv = 6, r = 3, Dk = 8, Dv = 8, C = 48, conv = 2 * Hk * Dk + Hv * Dv;
    const std::string L = "model.layers.1.linear_attn.";
    // grouped head g of HF is tiled head (g % r) * Hk + g / r of the GGUF
    auto tiled = [&](int64_t g) { return (g % r) * Hk + g / r; };
    // rows: HF row (first + g * D + i) is GGUF row (first + tiled(g) * D + i)
    auto check_rows = [&](const std::string & gguf, const std::string & hf, int64_t first, int64_t D, int64_t row_len) {
        const std::vector<float> a = gguf_values(*model, gguf), b = ex.values(L + hf);
        ASSERT_EQ(a.size(), b.size()) << hf;
        for (int64_t row = 0; row < first; ++row)
            for (int64_t c = 0; c < row_len; ++c) ASSERT_EQ(b[static_cast<size_t>(row * row_len + c)], a[static_cast<size_t>(row * row_len + c)]) << hf;
        for (int64_t g = 0; g < Hv; ++g)
            for (int64_t i = 0; i < D; ++i)
                for (int64_t c = 0; c < row_len; ++c)
                    ASSERT_EQ(b[static_cast<size_t>((first + g * D + i) * row_len + c)], a[static_cast<size_t>((first + tiled(g) * D + i) * row_len + c)])
                        << hf << " head " << g;
    };
    check_rows("blk.1.attn_qkv.weight", "in_proj_qkv.weight", 2 * Hk * Dk, Dv, C);
    check_rows("blk.1.attn_gate.weight", "in_proj_z.weight", 0, Dv, C);
    check_rows("blk.1.ssm_beta.weight", "in_proj_b.weight", 0, 1, C);
    check_rows("blk.1.ssm_alpha.weight", "in_proj_a.weight", 0, 1, C);
    check_rows("blk.1.ssm_dt.bias", "dt_bias", 0, 1, 1);
    check_rows("blk.1.ssm_conv1d.weight", "conv1d.weight", 2 * Hk * Dk, Dv, 4);
    EXPECT_EQ(ex.get(L + "conv1d.weight").second->shape, (std::vector<int64_t>{conv, 1, 4}));
    const std::vector<float> a = gguf_values(*model, "blk.1.ssm_a"), alog = ex.values(L + "A_log");
    for (int64_t g = 0; g < Hv; ++g) EXPECT_NEAR(-std::exp(alog[static_cast<size_t>(g)]), a[static_cast<size_t>(tiled(g))], 1e-6f * std::fabs(a[static_cast<size_t>(tiled(g))]));
    const std::vector<float> out = gguf_values(*model, "blk.1.ssm_out.weight"), hout = ex.values(L + "out_proj.weight");  // [C][Hv * Dv]
    for (int64_t row = 0; row < C; ++row)
        for (int64_t g = 0; g < Hv; ++g)
            for (int64_t i = 0; i < Dv; ++i)
                ASSERT_EQ(hout[static_cast<size_t>(row * Hv * Dv + g * Dv + i)], out[static_cast<size_t>(row * Hv * Dv + tiled(g) * Dv + i)]);
    EXPECT_EQ(ex.values(L + "norm.weight"), gguf_values(*model, "blk.1.ssm_norm.weight")) << "the gated norm multiplies by w";
    for (const auto & [g, h] : std::vector<std::pair<std::string, std::string>>{
             {"blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"}, {"blk.3.attn_q_norm.weight", "model.layers.3.self_attn.q_norm.weight"},
             {"blk.3.post_attention_norm.weight", "model.layers.3.post_attention_layernorm.weight"}, {"output_norm.weight", "model.norm.weight"}}) {
        std::vector<float> want = gguf_values(*model, g);
        for (float & x : want) x -= 1.0f;
        EXPECT_EQ(ex.values(h), want) << h;
    }
    EXPECT_EQ(ex.values("model.layers.3.self_attn.q_proj.weight"), gguf_values(*model, "blk.3.attn_q.weight")) << "query and gate rows per head, as the GGUF";
    EXPECT_FALSE(ex.get("model.layers.4.input_layernorm.weight").first) << "the MTP block is not written";
    const rp::json::Value & c = ex.config;
    EXPECT_EQ(c.find("architectures")->array.at(0).string, "Qwen3_5ForCausalLM");
    const rp::json::Value * types = c.find("layer_types");
    ASSERT_TRUE(types && types->array.size() == 4u);
    for (int il = 0; il < 4; ++il) EXPECT_EQ(types->array[static_cast<size_t>(il)].string, il == 3 ? "full_attention" : "linear_attention");
    EXPECT_EQ(c.find("full_attention_interval")->number, 4);
    EXPECT_EQ(c.find("linear_num_key_heads")->number, Hk);
    EXPECT_EQ(c.find("linear_num_value_heads")->number, Hv);
    EXPECT_EQ(c.find("linear_key_head_dim")->number, Dk);
    EXPECT_EQ(c.find("linear_value_head_dim")->number, Dv);
    EXPECT_EQ(c.find("linear_conv_kernel_dim")->number, 4);
    const rp::json::Value * rope = c.find("rope_parameters");
    ASSERT_TRUE(rope && rope->is_object());
    EXPECT_EQ(rope->find("partial_rotary_factor")->number, 0.5);
    EXPECT_EQ(rope->find("mrope_section")->array.size(), 3u);
    EXPECT_TRUE(rope->find("mrope_interleaved")->boolean);

}

// A DeltaNet decay that is no -exp(A_log) (a non-negative ssm_a) is refused while the shard is written, naming the
// tensor and the value, and nothing is left: no shard, no config, no directory.
TEST(HfExport, Qwen35ANonNegativeDecayIsRefusedAndNothingIsWritten) {
    TempDir d;
    rp::SynthSpec s;
    s.arch = "qwen35";
    s.vocab_from = model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 32, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 8, s.n_ff = 40, s.n_layer = 4, s.ssm_k_heads = 2, s.ssm_v_heads = 4, s.ssm_head_dim = 8;
    rp::write_synth_model(s, d.file("q35.gguf"));
    {
        const auto r = gguf::Reader::open(d.file("q35.gguf"));
        const gguf::TensorInfo * a = r->find_tensor("blk.2.ssm_a");
        ASSERT_TRUE(a && a->type == gguf::TensorType::F32);
        const size_t at = size_t(r->data_offset() + a->offset) + sizeof(float);  // its second head
        std::fstream file(d.file("q35.gguf"), std::ios::in | std::ios::out | std::ios::binary);
        const float zero = 0.0f;
        file.seekp(std::streamoff(at));
        file.write(reinterpret_cast<const char *>(&zero), sizeof zero);
    }
    try {
        rp::export_hf(*rp::Model::load(d.file("q35.gguf")), d.file("hf"));
        ADD_FAILURE() << "a zero ssm_a exported";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("tensor 'blk.2.ssm_a' holds 0.0, which is no -exp(A_log)"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(d.file("hf")));
}

// qwen35moe as Qwen3_5MoeForCausalLM: the experts as transformers' packed parameters (gate_up_proj [E, 2 ff, n_embd]:
// each expert's gate rows then its up rows; down_proj [E, n_embd, ff]), the router mlp.gate, the shared expert and its
// gate [1, n_embd]; the DeltaNet layers as qwen35's; the config's MoE fields.
TEST(HfExport, Qwen35MoePackedExpertsSharedExpertAndConfig) {
    TempDir d;
    rp::SynthSpec s;
    s.arch = "qwen35moe";
    s.vocab_from = model_path("synthetic/tiny-random-qwen2.gguf");
    s.n_embd = 48, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 16, s.n_ff = 40, s.n_layer = 4, s.n_expert = 4, s.n_expert_used = 2, s.n_ff_exp = 24;
    rp::write_synth_model(s, d.file("moe.gguf"));
    const auto model = rp::Model::load(d.file("moe.gguf"));
    rp::export_hf(*model, d.file("hf"));
    const Exported ex(d.file("hf"));
    const int64_t E = 4, ff = 24, C = 48;
    const std::string L = "model.layers.3.mlp.";
    const std::vector<float> g = gguf_values(*model, "blk.3.ffn_gate_exps.weight"), u = gguf_values(*model, "blk.3.ffn_up_exps.weight");
    const auto [r, gu] = ex.get(L + "experts.gate_up_proj");
    ASSERT_TRUE(r && gu);
    EXPECT_EQ(gu->shape, (std::vector<int64_t>{E, 2 * ff, C}));
    const std::vector<float> v = r->to_f32(*gu);
    for (int64_t e = 0; e < E; ++e)
        for (int64_t j = 0; j < 2 * ff; ++j)
            for (int64_t c = 0; c < C; ++c)
                ASSERT_EQ(v[static_cast<size_t>((e * 2 * ff + j) * C + c)],
                          (j < ff ? g : u)[static_cast<size_t>((e * ff + j % ff) * C + c)]);
    EXPECT_EQ(ex.get(L + "experts.down_proj").second->shape, (std::vector<int64_t>{E, C, ff}));
    EXPECT_EQ(ex.values(L + "experts.down_proj"), gguf_values(*model, "blk.3.ffn_down_exps.weight"));
    EXPECT_EQ(ex.values(L + "gate.weight"), gguf_values(*model, "blk.3.ffn_gate_inp.weight"));
    EXPECT_EQ(ex.get(L + "shared_expert_gate.weight").second->shape, (std::vector<int64_t>{1, C}));
    EXPECT_EQ(ex.values(L + "shared_expert_gate.weight"), gguf_values(*model, "blk.3.ffn_gate_inp_shexp.weight"));
    EXPECT_EQ(ex.values(L + "shared_expert.down_proj.weight"), gguf_values(*model, "blk.3.ffn_down_shexp.weight"));
    EXPECT_FALSE(ex.get(L + "experts.0.gate_proj.weight").first);
    const rp::json::Value & c = ex.config;
    EXPECT_EQ(c.find("architectures")->array.at(0).string, "Qwen3_5MoeForCausalLM");
    EXPECT_EQ(c.find("model_type")->string, "qwen3_5_moe_text");
    EXPECT_EQ(c.find("num_experts")->number, E);
    EXPECT_EQ(c.find("moe_intermediate_size")->number, ff);
    EXPECT_EQ(c.find("shared_expert_intermediate_size")->number, model->hparams().n_ff_shexp);
    EXPECT_EQ(c.find("layer_types")->array.size(), 4u);
    EXPECT_EQ(c.find("linear_num_value_heads")->number, model->hparams().ssm_dt_rank);
}

// mistral3 (Ministral 3) as Ministral3ForCausalLM: q/k rows back in HF's order (llama.cpp permutes them as a llama's),
// and rope_parameters with YaRN, DeepSeek's mscale / mscale_all_dim (llama.cpp's yarn_log_multiplier) and
// llama_4_scaling_beta (attention.temperature_scale); RoPE factor tensors refused (its config has none).
TEST(HfExport, Mistral3YarnAndAttentionTemperatureInRopeParameters) {
    TempDir d;
    rp::SynthSpec s;
    s.arch = "mistral3";
    s.vocab_from = stories();
    s.n_embd = 64, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 16, s.n_ff = 96, s.n_layer = 2;
    s.yarn_factor = 16.0f, s.yarn_orig_ctx = 256, s.yarn_log_mul = 1.0f, s.attn_temp_scale = 0.1f;
    rp::write_synth_model(s, d.file("m3.gguf"));
    const auto model = rp::Model::load(d.file("m3.gguf"));
    rp::export_hf(*model, d.file("hf"));
    const Exported ex(d.file("hf"));
    const rp::json::Value & c = ex.config;
    EXPECT_EQ(c.find("architectures")->array.at(0).string, "Ministral3ForCausalLM");
    EXPECT_EQ(c.find("model_type")->string, "ministral3");
    EXPECT_EQ(c.find("rope_scaling")->type, rp::json::Value::Type::Null);
    const rp::json::Value * rp_ = c.find("rope_parameters");
    ASSERT_TRUE(rp_ && rp_->is_object());
    EXPECT_EQ(rp_->find("rope_type")->string, "yarn");
    EXPECT_EQ(rp_->find("factor")->number, 16);
    EXPECT_EQ(rp_->find("original_max_position_embeddings")->number, 256);
    EXPECT_EQ(rp_->find("mscale")->number, 1);
    EXPECT_EQ(rp_->find("mscale_all_dim")->number, 1);
    EXPECT_NEAR(rp_->find("llama_4_scaling_beta")->number, 0.1, 1e-7);
    EXPECT_EQ(rp_->find("rope_theta")->number, 10000);
    // q rows in HF's order (the llama permutation undone), v as it is
    const int64_t D = 16, row = 64;
    const std::vector<float> q = gguf_values(*model, "blk.1.attn_q.weight"), hq = ex.values("model.layers.1.self_attn.q_proj.weight");
    for (int64_t h = 0; h < 4; ++h)
        for (int64_t j = 0; j < D / 2; ++j)
            for (int64_t sgn = 0; sgn < 2; ++sgn)
                for (int64_t col = 0; col < row; ++col)
                    ASSERT_EQ(hq[static_cast<size_t>((h * D + sgn * D / 2 + j) * row + col)], q[static_cast<size_t>((h * D + 2 * j + sgn) * row + col)]);
    EXPECT_EQ(ex.values("model.layers.1.self_attn.v_proj.weight"), gguf_values(*model, "blk.1.attn_v.weight"));

    rp::SynthSpec f = s;
    f.yarn_factor = 0.0f, f.yarn_log_mul = 0.0f, f.llama3_rope = 8.0f;
    rp::write_synth_model(f, d.file("factors.gguf"));
    try {
        rp::export_hf(*rp::Model::load(d.file("factors.gguf")), d.file("factors"));
        ADD_FAILURE() << "a mistral3 file with RoPE factors exported";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("rope_freqs"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(d.file("factors")));
}
