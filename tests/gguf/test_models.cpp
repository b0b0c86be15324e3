// The real files in shared/models read, and their contents match MANIFEST.md (expectations written here
// from the manifest, not from our reader's output); the two invalid files fail with their specific errors.
#include "gguf/gguf.h"
#include "gguf_test_util.h"
#include "base/error.h"
#include "models/convert/synth_model.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <memory>
#include <utility>

using namespace gguf_test;
using gguf::TensorType;

namespace {

struct ExpectedTensor {
    std::string name;
    std::vector<int64_t> ne;
};

// MANIFEST.md: token_embd [64,512], output_norm [64], output [64,512]; per block attn_q [64,64],
// attn_k [64,32], attn_v [64,32], attn_output [64,64], attn_norm [64], ffn_gate [64,172], ffn_up [64,172],
// ffn_down [172,64], ffn_norm [64].
std::vector<ExpectedTensor> stories_tensors() {
    std::vector<ExpectedTensor> t = {
        {"token_embd.weight", {64, 512}}, {"output_norm.weight", {64}}, {"output.weight", {64, 512}}};
    for (int b = 0; b < 5; ++b) {
        const std::string p = "blk." + std::to_string(b) + ".";
        t.push_back({p + "attn_q.weight", {64, 64}});
        t.push_back({p + "attn_k.weight", {64, 32}});
        t.push_back({p + "attn_v.weight", {64, 32}});
        t.push_back({p + "attn_output.weight", {64, 64}});
        t.push_back({p + "attn_norm.weight", {64}});
        t.push_back({p + "ffn_gate.weight", {64, 172}});
        t.push_back({p + "ffn_up.weight", {64, 172}});
        t.push_back({p + "ffn_down.weight", {172, 64}});
        t.push_back({p + "ffn_norm.weight", {64}});
    }
    return t;
}

std::map<TensorType, int> type_counts(const gguf::Reader & r) {
    std::map<TensorType, int> c;
    for (const auto & t : r.tensors()) c[t.type]++;
    return c;
}

// True when `m` contains "tensor 'blk.N.ffn_down.weight'" for some number N (no std::regex: g++ 12 warns
// inside <regex> under the sanitizers).
bool names_ffn_down(const std::string & m) {
    const std::string head = "tensor 'blk.", tail = ".ffn_down.weight'";
    for (size_t p = m.find(head); p != std::string::npos; p = m.find(head, p + 1)) {
        size_t q = p + head.size(), digits = 0;
        while (q < m.size() && std::isdigit(static_cast<unsigned char>(m[q]))) ++q, ++digits;
        if (digits && m.compare(q, tail.size(), tail) == 0) return true;
    }
    return false;
}

} // namespace

TEST(GgufModels, EveryValidFileReads) {
    const auto files = valid_model_files();
    ASSERT_GE(files.size(), 13u) << "shared/models looks incomplete";
    for (const std::string & f : files) {
        SCOPED_TRACE(f);
        std::unique_ptr<gguf::Reader> r;
        ASSERT_NO_THROW(r = gguf::Reader::open(f));
        EXPECT_EQ(r->file_size(), fs::file_size(f));
        if (!r->tensors().empty()) {
            EXPECT_EQ(r->data_offset() % r->alignment(), 0u);
        }
        // Tensors tile the data section in order, each padded to the alignment (formats.md §1.4).
        uint64_t off = 0;
        for (const auto & t : r->tensors()) {
            EXPECT_EQ(t.offset, off) << t.name;
            off += (t.nbytes + r->alignment() - 1) / r->alignment() * r->alignment();
            EXPECT_LE(r->data_offset() + t.offset + t.nbytes, r->file_size());
        }
    }
}

TEST(GgufModels, Stories260KMatchesManifest) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = gguf::Reader::open(stories());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ info ] read stories260K.gguf in %.3f ms\n", ms);

    EXPECT_EQ(r->file_size(), 1185376u);
    EXPECT_EQ(r->version(), 3u);
    EXPECT_EQ(r->alignment(), 32u);
    EXPECT_EQ(r->get_string("general.architecture"), "llama");
    EXPECT_EQ(r->get_u32("llama.context_length"), 2048u);
    EXPECT_EQ(r->get_u32("llama.embedding_length"), 64u);
    EXPECT_EQ(r->get_u32("llama.feed_forward_length"), 172u);
    EXPECT_EQ(r->get_u32("llama.attention.head_count"), 8u);
    EXPECT_EQ(r->get_u32("llama.attention.head_count_kv"), 4u);
    EXPECT_EQ(r->get_u32("llama.block_count"), 5u);
    EXPECT_EQ(r->get_u32("llama.rope.dimension_count"), 8u);
    EXPECT_FLOAT_EQ(r->get_f32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
    EXPECT_FALSE(r->has("llama.rope.freq_base"));
    EXPECT_FLOAT_EQ(r->get_f32_or("llama.rope.freq_base", 10000.0f), 10000.0f);
    EXPECT_EQ(r->get_string("tokenizer.ggml.model"), "llama");
    EXPECT_FALSE(r->has("tokenizer.ggml.pre"));
    EXPECT_FALSE(r->has("tokenizer.ggml.add_bos_token"));
    EXPECT_EQ(r->get_u32("tokenizer.ggml.bos_token_id"), 1u);
    EXPECT_EQ(r->get_u32("tokenizer.ggml.eos_token_id"), 2u);
    EXPECT_EQ(r->get_u32("tokenizer.ggml.unknown_token_id"), 0u);
    EXPECT_EQ(r->get_u32("tokenizer.ggml.seperator_token_id"), 0xFFFFFFFFu);
    EXPECT_EQ(r->get_u32("tokenizer.ggml.padding_token_id"), 0xFFFFFFFFu);
    EXPECT_EQ(r->get_string_array("tokenizer.ggml.tokens").size(), 512u);
    EXPECT_EQ(r->get_string_array("tokenizer.ggml.tokens")[1], "<s>");

    const auto expected = stories_tensors();
    ASSERT_EQ(expected.size(), 48u);
    ASSERT_EQ(r->tensors().size(), 48u);
    int64_t params = 0;
    for (const auto & e : expected) {
        SCOPED_TRACE(e.name);
        const gguf::TensorInfo * t = r->find_tensor(e.name);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->type, TensorType::F32);
        ASSERT_EQ(t->n_dims, e.ne.size());
        for (size_t d = 0; d < 4; ++d) EXPECT_EQ(t->ne[d], d < e.ne.size() ? e.ne[d] : 1);
        EXPECT_EQ(t->nbytes, static_cast<uint64_t>(t->nelements()) * 4);
        params += t->nelements();
    }
    EXPECT_EQ(params, 292800);
    EXPECT_EQ(r->find_tensor("nope"), nullptr);
    // The first element of output_norm.weight as raw bytes: tensor_data points into the file.
    const auto bytes = read_bytes(stories());
    const gguf::TensorInfo * on = r->find_tensor("output_norm.weight");
    EXPECT_EQ(std::memcmp(r->tensor_data(*on), bytes.data() + r->data_offset() + on->offset, on->nbytes), 0);
}

TEST(GgufModels, DerivedFilesHaveManifestTypes) {
    struct Case {
        const char * file;
        uint64_t size;
        std::map<TensorType, int> types;
    };
    const Case cases[] = {
        {"stories260K-F16.gguf", 601248, {{TensorType::F16, 37}, {TensorType::F32, 11}}},
        {"stories260K-BF16.gguf", 601248, {{TensorType::BF16, 37}, {TensorType::F32, 11}}},
        {"stories260K-Q8_0.gguf", 379168, {{TensorType::Q8_0, 32}, {TensorType::F16, 5}, {TensorType::F32, 11}}},
        {"stories260K-Q4_0.gguf", 277024,
         {{TensorType::Q4_0, 31}, {TensorType::Q8_0, 1}, {TensorType::F16, 5}, {TensorType::F32, 11}}},
    };
    for (const Case & c : cases) {
        SCOPED_TRACE(c.file);
        const auto r = gguf::Reader::open(models_dir() + "/derived/" + c.file);
        EXPECT_EQ(r->file_size(), c.size);
        EXPECT_EQ(type_counts(*r), c.types);
        for (int b = 0; b < 5; ++b) {
            const auto * t = r->find_tensor("blk." + std::to_string(b) + ".ffn_down.weight");
            ASSERT_NE(t, nullptr);
            if (c.types.count(TensorType::Q8_0)) {
                EXPECT_EQ(t->type, TensorType::F16);
            }
        }
        if (c.types.count(TensorType::Q4_0)) {
            EXPECT_EQ(r->find_tensor("output.weight")->type, TensorType::Q8_0);
        }
        if (c.types.count(TensorType::Q4_0)) {
            EXPECT_EQ(r->find_tensor("token_embd.weight")->type, TensorType::Q4_0);
        }
        // Byte sizes follow the block table of formats.md §2.1: Q8_0 34 bytes / 32, Q4_0 18 / 32, F16 2.
        for (const auto & t : r->tensors()) {
            uint64_t per_row = 0;
            switch (t.type) {
                case TensorType::F32: per_row = 4 * t.ne[0]; break;
                case TensorType::F16: case TensorType::BF16: per_row = 2 * t.ne[0]; break;
                case TensorType::Q8_0: per_row = 34 * t.ne[0] / 32; break;
                case TensorType::Q4_0: per_row = 18 * t.ne[0] / 32; break;
                default: ADD_FAILURE() << "unexpected type in " << t.name;
            }
            EXPECT_EQ(t.nbytes, per_row * static_cast<uint64_t>(t.nelements() / t.ne[0])) << t.name;
        }
    }
}

TEST(GgufModels, VocabFilesMatchManifest) {
    struct Case {
        const char * file;
        size_t tokens, merges;
        uint32_t bos, eos;
        const char * model;
    };
    const Case cases[] = {
        {"ggml-vocab-llama-spm.gguf", 32000, 0, 1, 2, "llama"},
        {"ggml-vocab-llama-bpe.gguf", 128256, 280147, 128000, 128001, "gpt2"},
        {"ggml-vocab-qwen2.gguf", 151936, 151387, 151643, 151643, "gpt2"},
        {"ggml-vocab-gpt-2.gguf", 50257, 50000, 50256, 50256, "gpt2"},
    };
    for (const Case & c : cases) {
        SCOPED_TRACE(c.file);
        const auto r = gguf::Reader::open(models_dir() + "/vocab/" + c.file);
        EXPECT_TRUE(r->tensors().empty());
        EXPECT_EQ(r->data_offset(), r->file_size()) << "a vocab-only file ends right after its metadata";
        EXPECT_EQ(r->get_string("tokenizer.ggml.model"), c.model);
        EXPECT_EQ(r->get_string_array("tokenizer.ggml.tokens").size(), c.tokens);
        if (c.merges) {
            EXPECT_EQ(r->get_string_array("tokenizer.ggml.merges").size(), c.merges);
        } else {
            EXPECT_FALSE(r->has("tokenizer.ggml.merges"));
        }
        EXPECT_EQ(r->get_u32("tokenizer.ggml.bos_token_id"), c.bos);
        EXPECT_EQ(r->get_u32("tokenizer.ggml.eos_token_id"), c.eos);
    }
    const auto spm = gguf::Reader::open(models_dir() + "/vocab/ggml-vocab-llama-spm.gguf");
    EXPECT_TRUE(spm->get_bool("tokenizer.ggml.add_bos_token"));
}

TEST(GgufModels, SyntheticAndLoraFiles) {
    const auto q2 = gguf::Reader::open(models_dir() + "/synthetic/tiny-random-qwen2.gguf");
    EXPECT_EQ(q2->get_string("general.architecture"), "qwen2");
    EXPECT_EQ(q2->get_u32("qwen2.embedding_length"), 64u);
    EXPECT_EQ(q2->get_u32("qwen2.block_count"), 2u);
    EXPECT_NE(q2->find_tensor("blk.0.attn_q.bias"), nullptr);
    EXPECT_NE(q2->find_tensor("output.weight"), nullptr);
    EXPECT_EQ(q2->get_string_array("tokenizer.ggml.tokens").size(), 269u);
    EXPECT_EQ(q2->get_string_array("tokenizer.ggml.merges").size(), 10u);

    const auto q3 = gguf::Reader::open(models_dir() + "/synthetic/tiny-random-qwen3.gguf");
    EXPECT_EQ(q3->get_string("general.architecture"), "qwen3");
    EXPECT_EQ(q3->find_tensor("output.weight"), nullptr) << "tied output";
    EXPECT_NE(q3->find_tensor("blk.0.attn_q_norm.weight"), nullptr);
    EXPECT_FLOAT_EQ(q3->get_f32("qwen3.rope.freq_base"), 1e6f);

    const auto lora = gguf::Reader::open(models_dir() + "/reference/lora/stories260K-lora-r4-a8.gguf");
    EXPECT_EQ(lora->get_string("general.type"), "adapter");
    EXPECT_EQ(lora->get_string("adapter.type"), "lora");
    EXPECT_FLOAT_EQ(lora->get_f32("adapter.lora.alpha"), 8.0f);
    EXPECT_EQ(lora->tensors().size(), 30u);
    for (int b = 0; b < 5; ++b) {
        const std::string p = "blk." + std::to_string(b) + ".";
        const auto * a = lora->find_tensor(p + "ffn_down.weight.lora_a");
        const auto * bb = lora->find_tensor(p + "ffn_down.weight.lora_b");
        ASSERT_TRUE(a && bb);
        EXPECT_EQ(a->ne[0], 172);   // [n_in, r]
        EXPECT_EQ(a->ne[1], 4);
        EXPECT_EQ(bb->ne[0], 4);    // [r, n_out]
        EXPECT_EQ(bb->ne[1], 64);
    }
}

TEST(GgufModels, V1FileIsRejected) {
    const std::string f = models_dir() + "/invalid/tinyllamas-stories-260k-f32.ggufv1.gguf";
    try {
        gguf::Reader::open(f);
        FAIL() << "v1 file was accepted";
    } catch (const rp::Error & e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("GGUF v1 is not supported"), std::string::npos) << m;
        EXPECT_NE(m.find(f), std::string::npos) << m;
        EXPECT_NE(m.find("byte offset 4"), std::string::npos) << m;
    }
}

TEST(GgufModels, BadRowsFileIsRejected) {
    const std::string f = models_dir() + "/invalid/tinyllamas-stories-260k-q8_0.ggufv2-badrows.gguf";
    try {
        gguf::Reader::open(f);
        FAIL() << "file with 172-value Q8_0 rows was accepted";
    } catch (const rp::Error & e) {
        const std::string m = e.what();
        EXPECT_TRUE(names_ffn_down(m)) << m;
        EXPECT_NE(m.find("ne[0] = 172 is not a multiple of the block size 32"), std::string::npos) << m;
        EXPECT_NE(m.find("q8_0"), std::string::npos) << m;
        EXPECT_NE(m.find(f), std::string::npos) << m;
        EXPECT_NE(m.find("byte offset"), std::string::npos) << m;
    }
}

TEST(GgufModels, OpenErrorsNameTheFile) {
    TempDir dir;
    const std::string missing = dir.file("missing.gguf");
    try {
        gguf::Reader::open(missing);
        FAIL();
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
    }
    try {
        gguf::Reader::open(dir.path.string());
        FAIL();
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
    const std::string empty = dir.file("empty.gguf");
    write_bytes(empty, {});
    try {
        gguf::Reader::open(empty);
        FAIL();
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(empty), std::string::npos) << e.what();
    }
}

// release_pages drops a copied tensor's whole pages from the process (a full finetune's masters); the data
// reads back the same from the file afterwards. Outside the mapping, or on a reader over memory, it does
// nothing. resident_bytes sees both: the pages gone after the release, present again after the read.
TEST(GgufModels, ReleasedPagesReadBackTheSameBytes) {
    auto r = gguf::Reader::open(stories());
    const gguf::TensorInfo * t = r->find_tensor("token_embd.weight");
    ASSERT_NE(t, nullptr);
    const uint8_t * p = r->tensor_data(*t);
    const size_t n = t->nbytes;
    const std::vector<uint8_t> before(p, p + n);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t released = r->release_pages(p, n);
    EXPECT_GE(released, n - 2 * page);   // every whole page inside the tensor
    EXPECT_LE(released, n);
    EXPECT_EQ(released % page, 0u);
    // released: only the partial pages at the tensor's two ends can still be present
    const std::optional<size_t> after_release = r->resident_bytes(p, n);
    ASSERT_TRUE(after_release.has_value());
    EXPECT_LE(*after_release, n - released);
    EXPECT_EQ(std::vector<uint8_t>(p, p + n), before);
    EXPECT_EQ(r->resident_bytes(p, n), std::optional<size_t>(n));  // read back: every byte present again
    EXPECT_EQ(r->resident_bytes(p, 0), std::optional<size_t>(0));
    std::vector<uint8_t> other(n);
    EXPECT_FALSE(r->resident_bytes(other.data(), n).has_value());  // not the mapping
    EXPECT_FALSE(r->resident_bytes(r->bytes() + r->file_size() - 8, 64).has_value());
    EXPECT_EQ(r->release_pages(other.data(), n), 0u);
    EXPECT_EQ(r->release_pages(r->bytes() + r->file_size() - 8, 64), 0u);  // runs past the end
    const std::vector<uint8_t> file(r->bytes(), r->bytes() + r->file_size());
    auto m = gguf::Reader::from_memory(file.data(), file.size(), "stories260K in memory");
    EXPECT_EQ(m->release_pages(m->tensor_data(*m->find_tensor("token_embd.weight")), n), 0u);
    EXPECT_FALSE(m->resident_bytes(m->tensor_data(*m->find_tensor("token_embd.weight")), n).has_value());
}

// Qwen3.5's dense presets have the sizes their names give: the text model's parameters (no vision tower, no MTP
// block), read back from a shapes-only file, within 7% of 0.8 / 2 / 4 / 9 / 27 billion (measured: 0.752, 1.882,
// 4.206, 8.954, 26.896). A wrong width, depth or head count moves one by far more.
TEST(GgufModels, Qwen35PresetsHaveTheirNamedSizes) {
    TempDir dir;
    const std::pair<const char *, double> sizes[] = {
        {"qwen3.5-0.8b", 0.8e9}, {"qwen3.5-2b", 2e9}, {"qwen3.5-4b", 4e9}, {"qwen3.5-9b", 9e9}, {"qwen3.5-27b", 27e9}};
    for (const auto & [name, billions] : sizes) {
        rp::SynthSpec spec = rp::synth_preset(name);
        spec.weights = false;  // holes: no disk
        const std::string path = dir.file(std::string(name) + ".gguf");
        rp::write_synth_model(spec, path);
        int64_t params = 0;
        {
            const std::unique_ptr<gguf::Reader> r = gguf::Reader::open(path);
            for (const gguf::TensorInfo & t : r->tensors()) params += t.nelements();
        }
        EXPECT_NEAR(static_cast<double>(params) / billions, 1.0, 0.07) << name << ": " << params << " parameters";
        std::filesystem::remove(path);
    }
}

// The preset list (synth_preset_names: rp-gguf synth --help and the unknown-shape error print it) is exactly the
// names synth_preset takes.
TEST(GgufModels, EveryListedPresetIsAPresetAndTheErrorListsThemAll) {
    for (const std::string & name : rp::synth_preset_names()) EXPECT_NO_THROW(rp::synth_preset(name)) << name;
    try {
        rp::synth_preset("qwen9-1t");
        FAIL() << "an unknown shape was accepted";
    } catch (const rp::Error & e) {
        const std::string msg = e.what();
        for (const std::string & name : rp::synth_preset_names()) EXPECT_NE(msg.find(name), std::string::npos) << name;
    }
}
