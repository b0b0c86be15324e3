// Bad input: broken models and adapters (written with gguf::Writer into a temp dir) and impossible requests
// must throw rp::Error naming the file and the key or tensor at fault.
#include "models_test_util.h"

#include "models/arch/lora.h"

#include <gtest/gtest.h>

using namespace models_test;

namespace {

// Runs fn, expects an rp::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn fn, std::initializer_list<std::string> parts) {
    try {
        fn();
        ADD_FAILURE() << "no error thrown";
    } catch (const rp::Error & e) {
        const std::string msg = e.what();
        for (const std::string & p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    }
}

std::string broken_model(const TempDir & d, const std::string & name, const Variant & v) {
    const std::string out = d.file(name);
    write_variant(stories(), out, v);
    return out;
}

TEST(ModelErrors, UnsupportedArchitecture) {
    TempDir d;
    const std::string p = broken_model(d, "gpt2.gguf", {[](gguf::Writer & w) { w.set_string("general.architecture", "gpt2"); }, {}, {}, {}});
    expect_error([&] { rp::Model::load(p); }, {p, "unsupported architecture 'gpt2'", "general.architecture"});
}

TEST(ModelErrors, AdapterFileIsNotAModel) {
    const std::string p = ref_path("lora/stories260K-lora-r4-a8.gguf");
    expect_error([&] { rp::Model::load(p); }, {p, "general.type", "adapter"});
}

TEST(ModelErrors, MissingRequiredKey) {
    TempDir d;
    const std::string p = broken_model(d, "nokey.gguf", {[](gguf::Writer & w) { w.remove("llama.block_count"); }, {}, {}, {}});
    expect_error([&] { rp::Model::load(p); }, {p, "llama.block_count"});
}

TEST(ModelErrors, MissingTensor) {
    TempDir d;
    const std::string p =
        broken_model(d, "missing.gguf", {{}, [](const gguf::TensorInfo & t) { return t.name != "blk.2.ffn_up.weight"; }, {}, {}});
    expect_error([&] { rp::Model::load(p); }, {p, "missing tensor 'blk.2.ffn_up.weight'"});
}

TEST(ModelErrors, MisShapedTensor) {
    TempDir d;
    const std::string p = broken_model(d, "shape.gguf",
                                       {{}, {}, [](gguf::TensorInfo & t) { if (t.name == "blk.3.attn_k.weight") t.ne[1] = 64; }, {}});
    expect_error([&] { rp::Model::load(p); }, {p, "blk.3.attn_k.weight: expected [64, 32], found [64, 64]"});
}

TEST(ModelErrors, MisShapedTiedEmbedding) {
    TempDir d;
    const std::string p = broken_model(d, "embd.gguf",
                                       {{}, {}, [](gguf::TensorInfo & t) { if (t.name == "token_embd.weight") t.ne[1] = 500; }, {}});
    expect_error([&] { rp::Model::load(p); }, {p, "token_embd.weight: expected [64, 512], found [64, 500]"});
}

TEST(ModelErrors, NormWeightMustBeF32) {
    TempDir d;
    const std::string p = broken_model(d, "norm.gguf", {{}, {}, [](gguf::TensorInfo & t) {
        if (t.name == "blk.0.ffn_norm.weight") t.type = gguf::TensorType::F16;
    }, {}});
    expect_error([&] { rp::Model::load(p); }, {p, "blk.0.ffn_norm.weight", "f16"});
}

void add_zero_tensor(gguf::Writer & w, const std::string & name, std::vector<int64_t> ne) {
    w.add_tensor(name, gguf::TensorType::F32, static_cast<uint32_t>(ne.size()), ne.data(),
                 [](uint8_t * out, size_t n) { std::memset(out, 0, n); });
}

// A fused attn_qkv is phi3's (tests/models/test_phi3.cpp); on a llama it is named as unused.
TEST(ModelErrors, FusedQkvOnALlamaIsRejectedExplicitly) {
    TempDir d;
    const std::string p = broken_model(d, "qkv.gguf", {{}, {}, {}, [](gguf::Writer & w) { add_zero_tensor(w, "blk.0.attn_qkv.weight", {64, 128}); }});
    expect_error([&] { rp::Model::load(p); }, {p, "blk.0.attn_qkv.weight", "fused", "not used by the llama graph"});
}

// Llama 3's rope_freqs must hold n_rot / 2 factors (tests/models/test_llama3_rope.cpp runs them).
TEST(ModelErrors, RopeFreqsOfTheWrongLengthIsRejected) {
    TempDir d;
    const std::string p = broken_model(d, "rf.gguf", {{}, {}, {}, [](gguf::Writer & w) { add_zero_tensor(w, "rope_freqs.weight", {6}); }});
    expect_error([&] { rp::Model::load(p); }, {p, "rope_freqs.weight: expected [4], found [6]"});
}

TEST(ModelErrors, UnknownTensor) {
    TempDir d;
    const std::string p = broken_model(d, "extra.gguf", {{}, {}, {}, [](gguf::Writer & w) { add_zero_tensor(w, "blk.0.ffn_up.bias", {172}); }});
    expect_error([&] { rp::Model::load(p); }, {p, "blk.0.ffn_up.bias", "not supported"});
}

TEST(ModelErrors, NotAGgufFile) {
    const std::string p = ref_path("train.txt");
    EXPECT_THROW(rp::Model::load(p), rp::Error);
    EXPECT_THROW(rp::Model::load("/nonexistent/model.gguf"), rp::Error);
}

// ---- adapters ----------------------------------------------------------------------------------------------

const std::string kAdapter = ref_path("lora/stories260K-lora-r4-a8.gguf");

TEST(LoraErrors, AdapterForAnotherArchitecture) {
    auto qwen = rp::Model::load(model_path("synthetic/tiny-random-qwen2.gguf"));
    expect_error([&] { rp::LoraAdapter::load(kAdapter, *qwen); }, {kAdapter, "'llama'", "'qwen2'", "another base model?"});
}

TEST(LoraErrors, AdapterForAnotherBaseShape) {
    TempDir d;
    const std::string p = d.file("shape.gguf");
    write_variant(kAdapter, p, {{}, {}, [](gguf::TensorInfo & t) { if (t.name == "blk.1.attn_v.weight.lora_b") t.ne[1] = 64; }, {}});
    auto m = rp::Model::load(stories());
    expect_error([&] { rp::LoraAdapter::load(p, *m); }, {p, "blk.1.attn_v.weight", "lora_b [4, 64]", "another base model?"});
}

TEST(LoraErrors, RankMismatch) {
    TempDir d;
    const std::string p = d.file("rank.gguf");
    write_variant(kAdapter, p, {{}, {}, [](gguf::TensorInfo & t) { if (t.name == "blk.0.attn_q.weight.lora_b") t.ne[0] = 8; }, {}});
    auto m = rp::Model::load(stories());
    expect_error([&] { rp::LoraAdapter::load(p, *m); }, {p, "blk.0.attn_q.weight", "not transposed"});
}

TEST(LoraErrors, UnpairedHalfAndUnknownBase) {
    TempDir d;
    auto m = rp::Model::load(stories());
    const std::string p1 = d.file("unpaired.gguf");
    write_variant(kAdapter, p1, {{}, [](const gguf::TensorInfo & t) { return t.name != "blk.4.ffn_down.weight.lora_b"; }, {}, {}});
    expect_error([&] { rp::LoraAdapter::load(p1, *m); }, {p1, "blk.4.ffn_down.weight", "missing its lora_b"});

    const std::string p2 = d.file("base.gguf");
    write_variant(kAdapter, p2, {{}, {}, [](gguf::TensorInfo & t) {
        if (t.name.rfind("blk.2.attn_q.weight", 0) == 0) t.name.replace(0, 5, "blk.9");
    }, {}});
    expect_error([&] { rp::LoraAdapter::load(p2, *m); }, {p2, "blk.9.attn_q.weight", "does not exist in the base model"});

    const std::string p3 = d.file("suffix.gguf");
    write_variant(kAdapter, p3, {{}, {}, {}, [](gguf::Writer & w) { add_zero_tensor(w, "blk.0.attn_q.weight.lora_c", {64, 4}); }});
    expect_error([&] { rp::LoraAdapter::load(p3, *m); }, {p3, "blk.0.attn_q.weight.lora_c", "unexpected suffix"});
}

TEST(LoraErrors, BadAdapterKeys) {
    TempDir d;
    auto m = rp::Model::load(stories());
    const std::string p1 = d.file("type.gguf");
    write_variant(kAdapter, p1, {[](gguf::Writer & w) { w.set_string("adapter.type", "ia3"); }, {}, {}, {}});
    expect_error([&] { rp::LoraAdapter::load(p1, *m); }, {p1, "adapter.type", "ia3"});
    // A model is not an adapter.
    expect_error([&] { rp::LoraAdapter::load(stories(), *m); }, {stories(), "general.type"});
}

TEST(LoraErrors, TokenEmbdOfATiedModel) {
    // llama.cpp would apply this pair to the tied LM head too and abort: refused with a reason.
    auto q = rp::Model::load(model_path("synthetic/tiny-random-qwen3.gguf"));
    TempDir d;
    const std::string p = d.file("embd.gguf");
    gguf::Writer w;
    w.set_string("general.architecture", "qwen3");
    w.set_string("general.type", "adapter");
    w.set_string("adapter.type", "lora");
    w.set_f32("adapter.lora.alpha", 8.0f);
    add_zero_tensor(w, "token_embd.weight.lora_a", {4, 269});
    add_zero_tensor(w, "token_embd.weight.lora_b", {4, 64});
    w.write(p);
    expect_error([&] { rp::LoraAdapter::load(p, *q); }, {p, "token_embd.weight", "tied"});
}

// ---- inference ---------------------------------------------------------------------------------------------

TEST(InferenceErrors, ContextLongerThanTheModels) {
    auto m = rp::Model::load(stories());
    expect_error([&] { rp::InferenceSession s(*m, 4096); }, {"context 4096 is longer than the model's 2048", "llama.context_length"});
    auto q = rp::Model::load(model_path("synthetic/tiny-random-qwen3.gguf"));
    expect_error([&] { rp::InferenceSession s(*q, 300); }, {"context 300 is longer than the model's 256"});
}

TEST(InferenceErrors, CacheFullAndBadTokens) {
    auto m = rp::Model::load(stories());
    rp::InferenceSession s(*m, 8);
    s.eval(std::vector<int32_t>(kPrompt1.begin(), kPrompt1.begin() + 6));
    expect_error([&] { s.eval({1, 2, 3}); }, {"6 past + 3 new tokens exceed the context size 8"});
    EXPECT_EQ(s.n_past(), 6);
    expect_error([&] { s.eval({512}); }, {"token id 512", "outside the vocabulary"});
    expect_error([&] { s.eval({-1}); }, {"token id -1"});
    expect_error([&] { s.eval({}); }, {"no tokens"});
    expect_error([&] { s.reset(7); }, {"reset"});
    EXPECT_EQ(s.eval({1, 2}).size(), 512u);  // still usable
}

} // namespace
