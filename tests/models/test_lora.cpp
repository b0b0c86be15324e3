// LoRA adapters: loading the llama.cpp-made test adapter, scales, saving in the same layout, creating new
// adapters, and the other adapter tensor types (F16, Q8_0).
#include "models_test_util.h"

#include "ggml_rp/core/quant.h"
#include "models/arch/lora.h"

#include <gtest/gtest.h>

#include <random>

using namespace models_test;

namespace {

const std::string kAdapter = ref_path("lora/stories260K-lora-r4-a8.gguf");

TEST(Lora, LoadsTheReferenceAdapter) {
    auto m = rp::Model::load(stories());
    auto ad = rp::LoraAdapter::load(kAdapter, *m);
    EXPECT_EQ(ad->arch(), "llama");
    EXPECT_EQ(ad->alpha(), 8.0f);
    ASSERT_EQ(ad->tensors().size(), 15u);  // attn_q, attn_v, ffn_down of 5 blocks
    for (const rp::LoraTensor & t : ad->tensors()) {
        EXPECT_EQ(t.rank(), 4);
        EXPECT_FALSE(t.embedding);
        EXPECT_EQ(t.base_weight, m->find(t.base));
        EXPECT_EQ(ad->scale(t), 2.0f);         // llama.cpp logs "calculated_scale = 2.0, rank = 4"
        EXPECT_EQ(ad->scale(t, 0.5f), 1.0f);   // user_scale * alpha / r
    }
    const rp::LoraTensor * q = ad->find("blk.3.ffn_down.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->a->ne[0], 172);
    EXPECT_EQ(q->b->ne[1], 64);
    EXPECT_EQ(ad->find("blk.3.attn_k.weight"), nullptr);
}

TEST(Lora, UserScaleZeroGivesTheBaseModel) {
    auto m = rp::Model::load(stories());
    auto ad = rp::LoraAdapter::load(kAdapter, *m);
    rp::LoraSet lora;
    lora.add(*ad, 0.0f);
    const std::vector<float> ref = read_f32(ref_path("stories260K.prompt1.logits.16x512.f32"), 16 * 512);
    EXPECT_LE(max_abs_diff(forward_all(*m, kPrompt1, &lora), ref), 1e-4f * value_range(ref));
}

TEST(Lora, TwoHalfScaleCopiesEqualOneFullScale) {
    // Several adapters add up: the same adapter twice at user scale 0.5 equals it once at scale 1 (llama.cpp's
    // run-time reference).
    auto m = rp::Model::load(stories());
    auto a1 = rp::LoraAdapter::load(kAdapter, *m);
    auto a2 = rp::LoraAdapter::load(kAdapter, *m);
    rp::LoraSet lora;
    lora.add(*a1, 0.5f);
    lora.add(*a2, 0.5f);
    const std::vector<float> ref = read_f32(ref_path("lora/stories260K+lora.prompt1.logits.16x512.f32"), 16 * 512);
    EXPECT_LE(max_abs_diff(forward_all(*m, kPrompt1, &lora), ref), 1e-4f * value_range(ref));
}

TEST(Lora, SaveWritesLlamaCppsLayoutByteForByte) {
    auto m = rp::Model::load(stories());
    auto ad = rp::LoraAdapter::load(kAdapter, *m);
    TempDir d;
    const std::string out = d.file("saved.gguf");
    ad->save(out);
    EXPECT_FALSE(fs::exists(out + ".tmp"));

    auto orig = gguf::Reader::open(kAdapter);
    auto saved = gguf::Reader::open(out);
    for (const char * k : {"general.architecture", "general.type", "adapter.type"})
        EXPECT_EQ(saved->get_string(k), orig->get_string(k)) << k;
    EXPECT_EQ(saved->get_f32("adapter.lora.alpha"), 8.0f);
    EXPECT_EQ(saved->find("adapter.lora.alpha")->type, gguf::ValueType::F32);
    ASSERT_EQ(saved->tensors().size(), orig->tensors().size());
    for (const gguf::TensorInfo & t : orig->tensors()) {
        const gguf::TensorInfo * s = saved->find_tensor(t.name);
        ASSERT_NE(s, nullptr) << t.name;
        EXPECT_EQ(s->type, t.type);
        EXPECT_EQ(s->n_dims, 2u);
        for (int i = 0; i < 4; ++i) EXPECT_EQ(s->ne[i], t.ne[i]) << t.name;
        ASSERT_EQ(s->nbytes, t.nbytes);
        EXPECT_EQ(std::memcmp(saved->tensor_data(*s), orig->tensor_data(t), t.nbytes), 0) << t.name;
    }
    // And it loads back and gives llama.cpp's logits.
    auto again = rp::LoraAdapter::load(out, *m);
    rp::LoraSet lora;
    lora.add(*again);
    const std::vector<float> ref = read_f32(ref_path("lora/stories260K+lora.prompt1.logits.16x512.f32"), 16 * 512);
    EXPECT_LE(max_abs_diff(forward_all(*m, kPrompt1, &lora), ref), 1e-4f * value_range(ref));
}

TEST(Lora, CreateNewAdapter) {
    auto m = rp::Model::load(stories());
    auto ad = rp::LoraAdapter::create(*m, {"token_embd.weight", "blk.0.attn_q.weight", "output.weight"}, 8, 16.0f);
    ASSERT_EQ(ad->tensors().size(), 3u);
    const rp::LoraTensor & e = ad->tensors()[0];
    EXPECT_TRUE(e.embedding);  // roles swapped: A [r, n_vocab], B [r, n_embd]
    EXPECT_EQ(e.a->ne[0], 8);
    EXPECT_EQ(e.a->ne[1], 512);
    EXPECT_EQ(e.b->ne[0], 8);
    EXPECT_EQ(e.b->ne[1], 64);
    const rp::LoraTensor & q = ad->tensors()[1];
    EXPECT_EQ(q.a->ne[0], 64);
    EXPECT_EQ(q.a->ne[1], 8);
    EXPECT_EQ(q.b->ne[0], 8);
    EXPECT_EQ(q.b->ne[1], 64);
    EXPECT_EQ(ad->scale(q), 2.0f);

    // Zero A and B: exactly the base model.
    rp::LoraSet lora;
    lora.add(*ad);
    const std::vector<float> base = forward_all(*m, kPrompt1);
    EXPECT_EQ(max_abs_diff(forward_all(*m, kPrompt1, &lora), base), 0.0f);

    // Save, reload, same values; llama.cpp's rules accept it (our loader implements them).
    std::vector<float> vals(static_cast<size_t>(q.b->nelements()));
    for (size_t i = 0; i < vals.size(); ++i) vals[i] = 0.01f * static_cast<float>(i % 7);
    rp::tensor_set_f32(q.b, vals);
    TempDir d;
    ad->save(d.file("new.gguf"));
    auto back = rp::LoraAdapter::load(d.file("new.gguf"), *m);
    ASSERT_NE(back->find("blk.0.attn_q.weight"), nullptr);
    EXPECT_EQ(rp::tensor_get_f32(back->find("blk.0.attn_q.weight")->b), vals);
    EXPECT_EQ(back->alpha(), 16.0f);
    EXPECT_TRUE(back->find("token_embd.weight")->embedding);

    EXPECT_THROW(rp::LoraAdapter::create(*m, {"blk.0.attn_x.weight"}, 4, 8.0f), rp::Error);
    EXPECT_THROW(rp::LoraAdapter::create(*m, {"blk.0.attn_norm.weight"}, 4, 8.0f), rp::Error);
    EXPECT_THROW(rp::LoraAdapter::create(*m, {"blk.0.attn_q.weight"}, 0, 8.0f), rp::Error);
    auto tied = rp::Model::load(model_path("synthetic/tiny-random-qwen3.gguf"));
    EXPECT_THROW(rp::LoraAdapter::create(*tied, {"output.weight"}, 4, 8.0f), rp::Error);
    EXPECT_THROW(rp::LoraAdapter::create(*tied, {"token_embd.weight"}, 4, 8.0f), rp::Error);
}

// Run-time LoRA equals the merged weights W + s * delta computed here from formats.md §5.5, for ordinary
// projections, the untied LM head and token_embd with its swapped roles.
TEST(Lora, RuntimeAdapterEqualsMergedWeights) {
    const std::string base = model_path("synthetic/tiny-random-qwen2.gguf");
    auto m = rp::Model::load(base);
    auto ad = rp::LoraAdapter::create(*m, {"token_embd.weight", "blk.1.attn_k.weight", "blk.0.ffn_down.weight", "output.weight"}, 3, 5.0f);
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 0.2f);
    for (const rp::LoraTensor & t : ad->tensors())
        for (rp::Tensor * w : {t.a, t.b}) {
            std::vector<float> v(static_cast<size_t>(w->nelements()));
            for (float & f : v) f = nd(rng);
            rp::tensor_set_f32(w, v);
        }
    const float user_scale = 0.8f, s = user_scale * 5.0f / 3.0f;

    TempDir d;
    const std::string merged = d.file("merged.gguf");
    auto r = gguf::Reader::open(base);
    gguf::Writer w;
    gguf::copy_kvs(*r, w);
    std::vector<std::vector<float>> keep;
    for (const gguf::TensorInfo & t : r->tensors()) {
        const rp::LoraTensor * lt = ad->find(t.name);
        if (!lt) {
            w.add_tensor(t.name, t.type, t.n_dims, t.ne, r->tensor_data(t));
            continue;
        }
        ASSERT_EQ(t.type, gguf::TensorType::F32);
        const float * W = reinterpret_cast<const float *>(r->tensor_data(t));
        const std::vector<float> A = rp::tensor_get_f32(lt->a), B = rp::tensor_get_f32(lt->b);
        const int64_t n0 = t.ne[0], n1 = t.ne[1], rk = lt->rank();
        std::vector<float> out(W, W + n0 * n1);
        for (int64_t i1 = 0; i1 < n1; ++i1)
            for (int64_t i0 = 0; i0 < n0; ++i0) {
                double acc = 0.0;
                for (int64_t k = 0; k < rk; ++k)
                    acc += lt->embedding ? double(B[i0 * rk + k]) * A[i1 * rk + k]   // dE[j, v] = sum_k B[k, j] A[k, v]
                                         : double(A[k * n0 + i0]) * B[i1 * rk + k];  // dW[i, o] = sum_k A[i, k] B[k, o]
                out[i1 * n0 + i0] += static_cast<float>(s * acc);
            }
        keep.push_back(std::move(out));
        w.add_tensor(t.name, t.type, t.n_dims, t.ne, keep.back().data());
    }
    w.write(merged);

    auto mm = rp::Model::load(merged);
    rp::LoraSet lora;
    lora.add(*ad, user_scale);
    const std::vector<float> want = forward_all(*mm, kPrompt2), got = forward_all(*m, kPrompt2, &lora);
    EXPECT_GT(max_abs_diff(want, forward_all(*m, kPrompt2)), 0.1f);  // the adapter matters
    EXPECT_LE(max_abs_diff(got, want), 1e-4f * value_range(want));
}

// Writes a copy of the reference adapter with the tensors `convert` selects stored as `type`, and (second
// output) the same adapter in f32 holding the dequantized values of the converted tensors.
void write_typed_adapter(const std::string & typed, const std::string & f32, gguf::TensorType type,
                         const std::function<bool(const gguf::TensorInfo &)> & convert) {
    auto r = gguf::Reader::open(kAdapter);
    gguf::Writer wt, wf;
    gguf::copy_kvs(*r, wt);
    gguf::copy_kvs(*r, wf);
    std::vector<std::vector<uint8_t>> keep;
    for (const gguf::TensorInfo & t : r->tensors()) {
        const float * src = reinterpret_cast<const float *>(r->tensor_data(t));
        if (!convert(t)) {
            wt.add_tensor(t.name, t.type, t.n_dims, t.ne, r->tensor_data(t));
            wf.add_tensor(t.name, t.type, t.n_dims, t.ne, r->tensor_data(t));
            continue;
        }
        const int64_t n = t.nelements(), rows = n / t.ne[0];
        std::vector<uint8_t> q(gguf::row_bytes(type, t.ne[0]) * static_cast<size_t>(rows));
        std::vector<uint8_t> back(static_cast<size_t>(n) * sizeof(float));
        for (int64_t i = 0; i < rows; ++i) {
            uint8_t * qr = q.data() + i * gguf::row_bytes(type, t.ne[0]);
            rp::quantize_row(type, src + i * t.ne[0], qr, t.ne[0]);
            rp::dequantize_row(type, qr, reinterpret_cast<float *>(back.data()) + i * t.ne[0], t.ne[0]);
        }
        keep.push_back(std::move(q));
        wt.add_tensor(t.name, type, t.n_dims, t.ne, keep.back().data());
        keep.push_back(std::move(back));
        wf.add_tensor(t.name, t.type, t.n_dims, t.ne, keep.back().data());
    }
    wt.write(typed);
    wf.write(f32);
}

TEST(Lora, F16AndQ8_0AdapterTensors) {
    auto m = rp::Model::load(stories());
    const std::vector<float> ref = read_f32(ref_path("lora/stories260K+lora.prompt1.logits.16x512.f32"), 16 * 512);
    TempDir d;
    struct Case {
        gguf::TensorType type;
        std::function<bool(const gguf::TensorInfo &)> convert;
        float vs_llama;  // bound vs llama.cpp's f32-adapter logits (the stored values changed)
    };
    const std::vector<Case> cases = {
        {gguf::TensorType::F16, [](const gguf::TensorInfo &) { return true; }, 0.005f},
        {gguf::TensorType::BF16, [](const gguf::TensorInfo &) { return true; }, 0.03f},
        // Q8_0 rows need 32 | ne0: the lora_a of attn_q / attn_v ([64, 4]).
        {gguf::TensorType::Q8_0, [](const gguf::TensorInfo & t) { return t.ne[0] % 32 == 0 && t.name.find("ffn_down") == std::string::npos; }, 0.05f},
    };
    for (const Case & c : cases) {
        SCOPED_TRACE(rp::dtype_name(c.type));
        write_typed_adapter(d.file("typed.gguf"), d.file("f32.gguf"), c.type, c.convert);
        auto typed = rp::LoraAdapter::load(d.file("typed.gguf"), *m);
        auto plain = rp::LoraAdapter::load(d.file("f32.gguf"), *m);
        bool any = false;
        for (const rp::LoraTensor & t : typed->tensors()) any = any || t.a->type == c.type || t.b->type == c.type;
        EXPECT_TRUE(any);
        rp::LoraSet lt, lf;
        lt.add(*typed);
        lf.add(*plain);
        const std::vector<float> got = forward_all(*m, kPrompt1, &lt), want = forward_all(*m, kPrompt1, &lf);
        EXPECT_LE(max_abs_diff(got, want), 1e-5f * value_range(want));
        const float d_llama = max_abs_diff(got, ref);
        std::printf("[ %s adapter ] max |d| vs the f32 adapter of its values %.3g, vs llama.cpp's f32-adapter logits %.3g\n",
                    rp::dtype_name(c.type), max_abs_diff(got, want), d_llama);
        EXPECT_LE(d_llama, c.vs_llama);
    }
}

} // namespace
