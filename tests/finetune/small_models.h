// Small synthetic models the training-program tests compare paths on (written once per test binary): a 3-layer
// llama on stories260K's vocabulary, a tied 3-layer qwen3 on tiny-random-qwen2's, and a 3-layer qwen3moe
// (8 experts, top 2); and one micro-batch of training data for them.
#pragma once

#include "ggml_rp/ggml_rp.h"
#include "models/train/trainer.h"
#include "models/arch/lora.h"
#include "models/convert/synth_model.h"
#include "tests/common/shared_paths.h"
#include "tests/common/temp_dir.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

namespace ft_test {

struct SmallModels {
    rp_test::TempDir dir;
    std::unique_ptr<rp::Model> llama, qwen3, moe;
    SmallModels() {
        rp::SynthSpec s;
        s.vocab_from = rp_test::shared_dir() + "/models/stories260K.gguf";
        s.n_embd = 64, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 16, s.n_ff = 160, s.n_layer = 3, s.seed = 5;
        rp::write_synth_model(s, dir.file("llama.gguf"));
        llama = rp::Model::load(dir.file("llama.gguf"));
        s.arch = "qwen3";
        s.vocab_from = rp_test::shared_dir() + "/models/synthetic/tiny-random-qwen2.gguf";
        s.tied = true, s.n_embd = 32, s.head_dim = 8, s.n_ff = 96;
        rp::write_synth_model(s, dir.file("qwen3.gguf"));
        qwen3 = rp::Model::load(dir.file("qwen3.gguf"));
        s.arch = "qwen3moe";
        s.tied = false, s.head_dim = 12, s.n_expert = 8, s.n_expert_used = 2, s.n_ff_exp = 24, s.seed = 13;
        rp::write_synth_model(s, dir.file("qwen3moe.gguf"));
        moe = rp::Model::load(dir.file("qwen3moe.gguf"));
    }
    static SmallModels & get() {
        static SmallModels m;
        return m;
    }
};

// LoRA's B = 0 at init would leave every A without a gradient: a fixed non-zero B instead.
inline void seed_lora_b(rp::Trainer & tr) {
    if (!tr.adapter()) return;
    for (const rp::LoraTensor & t : tr.adapter()->tensors()) {
        std::vector<float> b(static_cast<size_t>(t.b->nelements()));
        for (size_t i = 0; i < b.size(); ++i) b[i] = 0.05f * static_cast<float>(std::sin(0.7 * static_cast<double>(i) + 1.0));
        rp::tensor_set_f32(t.b, b);
    }
}

// Every parameter's accumulated gradient, in params() order.
inline std::vector<std::vector<float>> gradients_of(const rp::Trainer & tr) {
    std::vector<std::vector<float>> g;
    for (const auto & p : tr.params()) {
        const float * d = p.t->grad->data_as<float>();
        g.emplace_back(d, d + p.t->nelements());
    }
    return g;
}

// The ids and labels of n tokens (ids below 200, every 7th label masked).
// Positions of packed sequences: examples of 5 + shift % 4 tokens, then up to token 14, and the rest, each
// restarting at 0 (shift moves the first boundary: other examples for the same shape).
inline std::vector<int32_t> packed_positions(int64_t T, int64_t B, int shift = 0) {
    std::vector<int32_t> pos;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0, p = 0; t < T; ++t, ++p) {
            if (t == 5 + shift % 4 || t == 14) p = 0;
            pos.push_back(static_cast<int32_t>(p));
        }
    return pos;
}

struct TokenData {
    std::vector<int32_t> ids, labels;
    explicit TokenData(int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
            ids.push_back(static_cast<int32_t>((i * 37 + 11) % 200));
            labels.push_back(i % 7 == 3 ? -1 : static_cast<int32_t>((i * 53 + 5) % 200));
        }
    }
};

} // namespace ft_test
