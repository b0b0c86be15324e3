// Live comparison with llama.cpp: our logits against rp-oracle's on seeded random token sequences (lengths 1
// to 512) for every model in shared/models and for random-weight models this test writes itself
// (synth_model.h) in shapes the shared files lack. Tolerances (the issue's, reference-oracle.md §7): F32
// max |Δlogit| <= 1e-4 · (max - min of the logits); on other weight types llama.cpp rounds the activations to
// the weight's dot type, so the bound is absolute: F16 0.02, BF16 0.12, Q8_0 0.3, Q4_0 4.
#include "live_util.h"
#include "models/convert/synth_model.h"

#include <gtest/gtest.h>

using namespace rp::live;
using rp::SynthSpec;
using rp::write_synth_model;

namespace {

constexpr float kRelF32 = 1e-4f;
constexpr float kF16 = 0.02f, kBF16 = 0.12f, kQ8_0 = 0.3f, kQ4_0 = 4.0f;
constexpr int kStoriesVocab = 512, kQwenVocab = 269;
constexpr int32_t kBos = 1;  // stories260K (SentencePiece) sequences start with BOS; the Qwen ones have none

const std::string kStories = "stories260K.gguf";

void f32_case(const std::string & label, const std::string & file, uint64_t seed, int n, int n_vocab, int32_t first) {
    check_case(label, file, random_tokens(seed, n, n_vocab, first), n_vocab, 0.0f, kRelF32);
}

void abs_case(const std::string & label, const std::string & file, uint64_t seed, int n, int n_vocab, float tol) {
    check_case(label, file, random_tokens(seed, n, n_vocab, kBos), n_vocab, tol, 0.0f);
}

} // namespace

// ---- the shared models ---------------------------------------------------------------------------------

TEST(LiveLogits, Stories260K_F32) {
    RP_REQUIRE_ORACLE();
    for (int n : {1, 64, 512}) f32_case("stories260K F32", model_path(kStories), 100 + n, n, kStoriesVocab, kBos);
}

TEST(LiveLogits, Stories260K_F16) {
    RP_REQUIRE_ORACLE();
    for (int n : {7, 200}) abs_case("stories260K F16", model_path("derived/stories260K-F16.gguf"), 200 + n, n, kStoriesVocab, kF16);
}

TEST(LiveLogits, Stories260K_BF16) {
    RP_REQUIRE_ORACLE();
    for (int n : {1, 200}) abs_case("stories260K BF16", model_path("derived/stories260K-BF16.gguf"), 300 + n, n, kStoriesVocab, kBF16);
}

TEST(LiveLogits, Stories260K_Q8_0) {
    RP_REQUIRE_ORACLE();
    for (int n : {64, 512}) abs_case("stories260K Q8_0", model_path("derived/stories260K-Q8_0.gguf"), 400 + n, n, kStoriesVocab, kQ8_0);
}

TEST(LiveLogits, Stories260K_Q4_0) {
    RP_REQUIRE_ORACLE();
    for (int n : {7, 200}) abs_case("stories260K Q4_0", model_path("derived/stories260K-Q4_0.gguf"), 500 + n, n, kStoriesVocab, kQ4_0);
}

// The synthetic Qwen files have context_length 256: our session refuses more, so at most 200 tokens here.
TEST(LiveLogits, TinyRandomQwen2) {
    RP_REQUIRE_ORACLE();
    for (int n : {1, 200}) f32_case("tiny-random-qwen2 F32", model_path("synthetic/tiny-random-qwen2.gguf"), 600 + n, n, kQwenVocab, -1);
}

TEST(LiveLogits, TinyRandomQwen3) {
    RP_REQUIRE_ORACLE();
    for (int n : {7, 200}) f32_case("tiny-random-qwen3 F32", model_path("synthetic/tiny-random-qwen3.gguf"), 700 + n, n, kQwenVocab, -1);
}

// ---- models written by this test -------------------------------------------------------------------------

namespace {

struct SynthCase {
    const char * label;
    SynthSpec spec;
    std::vector<int> lengths;
    float tol_abs;  // 0: F32 (relative bound)
};

void run_synth(const SynthCase & c) {
    TempDir dir;
    const std::string file = dir.file("model.gguf");
    ASSERT_NO_THROW(write_synth_model(c.spec, file)) << c.label;
    const bool llama_vocab = c.spec.vocab_from.find("stories260K") != std::string::npos;
    const int n_vocab = llama_vocab ? kStoriesVocab : kQwenVocab;
    for (int n : c.lengths) {
        const auto tokens = random_tokens(c.spec.seed * 7919 + n, n, n_vocab, llama_vocab ? kBos : -1);
        if (c.tol_abs > 0) check_case(c.label, file, tokens, n_vocab, c.tol_abs, 0.0f);
        else check_case(c.label, file, tokens, n_vocab, 0.0f, kRelF32);
    }
}

SynthSpec spec(const char * arch, uint32_t n_embd, uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim, uint32_t n_ff,
               uint32_t n_layer, float rope_base, bool tied, gguf::TensorType wtype, uint64_t seed) {
    SynthSpec s;
    s.arch = arch;
    s.vocab_from = model_path(s.arch == "llama" ? kStories : "synthetic/tiny-random-qwen2.gguf");
    s.n_embd = n_embd, s.n_head = n_head, s.n_head_kv = n_head_kv, s.head_dim = head_dim, s.n_ff = n_ff;
    s.n_layer = n_layer, s.rope_base = rope_base, s.tied = tied, s.wtype = wtype, s.seed = seed;
    return s;
}

constexpr auto F32 = gguf::TensorType::F32;

} // namespace

TEST(LiveLogits, SynthLlamaGqa3HeadDim48) {
    RP_REQUIRE_ORACLE();
    run_synth({"synth llama gqa3:1 hd48 L3 1e4", spec("llama", 288, 6, 2, 48, 768, 3, 1e4f, false, F32, 11), {512}, 0});
}

TEST(LiveLogits, SynthLlamaHeadDim128Base1e6) {
    RP_REQUIRE_ORACLE();
    run_synth({"synth llama gqa2:1 hd128 L4 1e6", spec("llama", 256, 2, 1, 128, 640, 4, 1e6f, false, F32, 12), {200}, 0});
}

TEST(LiveLogits, SynthQwen2Gqa3HeadDim48) {
    RP_REQUIRE_ORACLE();
    run_synth({"synth qwen2 gqa3:1 hd48 L5 1e4", spec("qwen2", 288, 6, 2, 48, 512, 5, 1e4f, false, F32, 13), {1, 512}, 0});
}

TEST(LiveLogits, SynthQwen3TiedHeadDim128) {
    RP_REQUIRE_ORACLE();
    run_synth({"synth qwen3 gqa3:1 hd128 L6 1e6 tied", spec("qwen3", 192, 3, 1, 128, 512, 6, 1e6f, true, F32, 14), {7, 200}, 0});
}

TEST(LiveLogits, SynthLlamaF16) {
    RP_REQUIRE_ORACLE();
    run_synth({"synth llama F16 gqa3:1 hd48 L3", spec("llama", 288, 6, 2, 48, 768, 3, 1e4f, false, gguf::TensorType::F16, 15), {64}, kF16});
}

TEST(LiveLogits, SynthQwen3Q8_0) {
    RP_REQUIRE_ORACLE();
    run_synth({"synth qwen3 Q8_0 gqa2:1 hd48 L3 tied", spec("qwen3", 256, 4, 2, 48, 512, 3, 1e6f, true, gguf::TensorType::Q8_0, 16), {64}, kQ8_0});
}
