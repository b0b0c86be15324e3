// qwen3moe against llama.cpp: random-weight mixture-of-experts models written by this test (8 experts top-2,
// 16 experts top-4, 4 experts top-1; head_dim != n_embd / n_head; F32 and Q8_0), our logits against
// rp-oracle's on seeded token sequences (F32: max |Δ| <= 1e-4 · logit range; Q8_0: 0.3 absolute, as the dense
// live tests), and greedy generation token for token.
#include "live_util.h"
#include "tests/models/arch_test_util.h"

#include "models/arch/inference.h"
#include "models/arch/model.h"
#include "models/convert/synth_model.h"
#include "models/text/tokenizer.h"
#include "gguf/gguf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>

using namespace rp::live;

namespace {

constexpr float kRelF32 = 1e-4f, kQ8_0 = 0.3f;
constexpr int kStoriesVocab = 512;
constexpr int32_t kBos = 1;

rp::SynthSpec moe_spec(uint32_t n_expert, uint32_t n_used, uint32_t n_ff_exp, uint32_t n_embd, uint32_t n_head, uint32_t head_dim,
                       uint32_t n_layer, gguf::TensorType wtype, uint64_t seed) {
    rp::SynthSpec s;
    s.arch = "qwen3moe";
    s.vocab_from = model_path("stories260K.gguf");
    s.n_embd = n_embd, s.n_head = n_head, s.n_head_kv = n_head / 2, s.head_dim = head_dim, s.n_layer = n_layer;
    s.n_ff = n_ff_exp * n_used, s.n_expert = n_expert, s.n_expert_used = n_used, s.n_ff_exp = n_ff_exp;
    s.rope_base = 1e6f, s.wtype = wtype, s.seed = seed;
    return s;
}

void run_case(const std::string & label, const rp::SynthSpec & spec, std::initializer_list<int> lengths, float tol_abs) {
    TempDir dir;
    const std::string file = dir.file("moe.gguf");
    ASSERT_NO_THROW(rp::write_synth_model(spec, file)) << label;
    for (int n : lengths) {
        const auto tokens = random_tokens(spec.seed * 7919 + static_cast<uint64_t>(n), n, kStoriesVocab, kBos);
        if (tol_abs > 0) check_case(label, file, tokens, kStoriesVocab, tol_abs, 0.0f);
        else check_case(label, file, tokens, kStoriesVocab, 0.0f, kRelF32);
    }
}

constexpr auto F32 = gguf::TensorType::F32;

} // namespace

TEST(LiveMoe, Experts8Top2) {
    RP_REQUIRE_ORACLE();
    run_case("qwen3moe E8 top2 hd24 (n_embd/n_head = 16) L3 F32", moe_spec(8, 2, 48, 64, 4, 24, 3, F32, 31), {1, 37, 200}, 0);
}

TEST(LiveMoe, Experts16Top4) {
    RP_REQUIRE_ORACLE();
    run_case("qwen3moe E16 top4 hd32 L2 F32", moe_spec(16, 4, 32, 96, 6, 32, 2, F32, 32), {64}, 0);
}

TEST(LiveMoe, Experts4Top1) {
    RP_REQUIRE_ORACLE();
    run_case("qwen3moe E4 top1 hd16 L2 F32", moe_spec(4, 1, 80, 64, 4, 16, 2, F32, 33), {100}, 0);
}

TEST(LiveMoe, Q8_0Experts) {
    RP_REQUIRE_ORACLE();
    run_case("qwen3moe E8 top2 Q8_0 hd32 L2", moe_spec(8, 2, 64, 128, 4, 32, 2, gguf::TensorType::Q8_0, 34), {64}, kQ8_0);
}

TEST(LiveMoe, GreedyGenerationMatchesLlamaCpp) {
    RP_REQUIRE_ORACLE();
    TempDir dir;
    const std::string file = dir.file("moe.gguf");
    rp::write_synth_model(moe_spec(8, 2, 48, 64, 4, 24, 3, F32, 35), file);
    models_test::expect_greedy_equals_llama_cpp(file, 24, "Once upon a time");
}

// Router ties: expert 2's router row copies expert 1's and experts 0 and 3 get its negation, so every token's
// two largest probabilities are exactly equal (experts 1 and 2, or 0 and 3) and top-1 must break the tie.
// llama.cpp sorts the probabilities with std::sort, whose insertion sort keeps equal ones in index order for
// up to 16 experts: the lower expert wins, as in ops/moe_math.h. The experts differ, so a different choice
// would show in the logits.
TEST(LiveMoe, RouterTiesPickTheLowerExpertLikeLlamaCpp) {
    RP_REQUIRE_ORACLE();
    TempDir dir;
    const std::string src = dir.file("moe.gguf"), tied = dir.file("tied.gguf");
    rp::write_synth_model(moe_spec(4, 1, 48, 64, 4, 16, 2, F32, 36), src);
    // swap_experts: also exchange experts 1 <-> 2 and 0 <-> 3 in the expert stacks (the tie then picks the other weights)
    auto write_tied = [&](const std::string & out, bool swap_experts) {
        auto f = gguf::Reader::open(src);
        gguf::Writer w(f->alignment());
        gguf::copy_kvs(*f, w);
        for (const gguf::TensorInfo & t : f->tensors()) {
            const bool router = t.name.find("ffn_gate_inp") != std::string::npos, stack = t.name.find("_exps") != std::string::npos;
            if (!router && !(stack && swap_experts)) {
                w.add_tensor(t.name, t.type, t.n_dims, t.ne, f->tensor_data(t));
                continue;
            }
            const float * v = reinterpret_cast<const float *>(f->tensor_data(t));
            auto rows = std::make_shared<std::vector<float>>(v, v + t.nelements());
            if (router) {
                const int64_t C = t.ne[0];
                for (int64_t c = 0; c < C; ++c) {
                    const float r1 = (*rows)[static_cast<size_t>(C + c)];
                    (*rows)[static_cast<size_t>(2 * C + c)] = r1;
                    (*rows)[static_cast<size_t>(c)] = -r1;
                    (*rows)[static_cast<size_t>(3 * C + c)] = -r1;
                }
            } else {
                const size_t slice = static_cast<size_t>(t.ne[0] * t.ne[1]);
                std::swap_ranges(rows->begin() + static_cast<std::ptrdiff_t>(slice), rows->begin() + static_cast<std::ptrdiff_t>(2 * slice),
                                 rows->begin() + static_cast<std::ptrdiff_t>(2 * slice));
                std::swap_ranges(rows->begin(), rows->begin() + static_cast<std::ptrdiff_t>(slice),
                                 rows->begin() + static_cast<std::ptrdiff_t>(3 * slice));
            }
            w.add_tensor(t.name, t.type, t.n_dims, t.ne, [rows](uint8_t * dst, size_t n) { std::memcpy(dst, rows->data(), n); });
        }
        w.write(out);
    };
    write_tied(tied, false);
    const auto tokens = random_tokens(99, 48, kStoriesVocab, kBos);
    check_case("qwen3moe E4 top1, every token's top-2 tied", tied, tokens, kStoriesVocab, 0.0f, kRelF32);
    // The tie matters: with the tied experts' weights exchanged, the lower index picks the other expert and
    // the logits move (so the agreement above is the tie rule's, not an accident of equal experts).
    const std::string swapped = dir.file("swapped.gguf");
    write_tied(swapped, true);
    const Diff moved = compare(our_logits(tied, tokens), our_logits(swapped, tokens), kStoriesVocab);
    std::printf("[ moe ] exchanging the tied experts moves the logits by %.3f\n", moved.max_abs);
    EXPECT_GT(moved.max_abs, 1e-2f);
}
