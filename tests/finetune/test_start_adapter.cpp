// Training that starts from an existing LoRA adapter (FinetuneConfig::start_adapter, rp-finetune --adapter): the
// adapter's rank, alpha and tensors become the run's, its factors the starting weights, so the trainer's logits
// are llama.cpp's with that adapter; the tool's --adapter trains exactly as --resume ADAPTER with the flags that
// match it (tensor for tensor; the result keeps the start adapter's layout); a full finetune, an adapter of
// another model and one of mixed ranks are refused naming the file.
#include "ft_test_util.h"
#include "tests/common/temp_dir.h"
#include "tests/models/models_test_util.h"

#include "base/error.h"
#include "gguf/gguf.h"
#include "models/arch/lora.h"
#include "models/arch/model.h"
#include "models/train/trainer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

using models_test::kPrompt1;
using models_test::max_abs_diff;
using models_test::read_f32;
using models_test::value_range;

const std::string kAdapter = "reference/lora/stories260K-lora-r4-a8.gguf";  // rank 4, alpha 8: attn_q, attn_v, ffn_down

} // namespace

TEST(StartAdapter, TheAdaptersRankAlphaTensorsAndFactorsBecomeTheRunsAndGiveLlamaCppsLogits) {
    auto model = rp::Model::load(ft_test::stories());
    rp::FinetuneConfig cfg;  // rank 8, alpha 16 and the default targets: all replaced by the adapter's
    cfg.start_adapter = ft_test::model_path(kAdapter);
    rp::Trainer tr(*model, cfg);
    auto file = rp::LoraAdapter::load(cfg.start_adapter, *model);
    EXPECT_EQ(tr.config().lora_rank, 4);
    EXPECT_EQ(tr.config().lora_alpha, 8.0f);
    std::vector<std::string> bases;
    for (const rp::LoraTensor & t : file->tensors()) bases.push_back(t.base);
    EXPECT_EQ(bases.size(), 15u);
    EXPECT_EQ(tr.config().lora_targets, bases);
    ASSERT_EQ(tr.params().size(), 2 * bases.size());
    for (size_t i = 0; i < bases.size(); ++i) {
        const rp::LoraTensor & t = file->tensors()[i];
        EXPECT_EQ(rp::tensor_get_f32(tr.params()[2 * i].t), rp::tensor_get_f32(t.a)) << t.base;
        EXPECT_EQ(rp::tensor_get_f32(tr.params()[2 * i + 1].t), rp::tensor_get_f32(t.b)) << t.base;
    }
    const std::vector<float> ref =
        read_f32(ft_test::model_path("reference/lora/stories260K+lora.prompt1.logits.16x512.f32"), 16 * 512);
    const std::vector<float> got = tr.logits(kPrompt1.data(), static_cast<int64_t>(kPrompt1.size()));
    const float err = max_abs_diff(got, ref);
    EXPECT_LE(err, 1e-4f * value_range(ref)) << "llama.cpp's logits with the adapter";
    // Without the adapter's factors (a new adapter's B = 0) the logits are the base model's: far off.
    rp::FinetuneConfig fresh;
    fresh.lora_rank = 4, fresh.lora_alpha = 8.0f, fresh.lora_targets = {"attn_q", "attn_v", "ffn_down"};
    rp::Trainer base(*model, fresh);
    EXPECT_GT(max_abs_diff(base.logits(kPrompt1.data(), static_cast<int64_t>(kPrompt1.size())), ref), 100 * err + 1e-3f);
}

TEST(StartAdapter, RefusesAFullFinetuneAnotherModelsAdapterAndMixedRanks) {
    auto model = rp::Model::load(ft_test::stories());
    auto expect_refused = [&](const rp::FinetuneConfig & cfg, const std::string & what) {
        try {
            rp::Trainer tr(*model, cfg);
            ADD_FAILURE() << "accepted: " << what;
        } catch (const rp::Error & e) {
            EXPECT_NE(std::string(e.what()).find(cfg.start_adapter), std::string::npos) << what << ": " << e.what();
        }
    };
    rp::FinetuneConfig full;
    full.full = true;
    full.start_adapter = ft_test::model_path(kAdapter);
    expect_refused(full, "a full finetune from an adapter");

    // An adapter whose pairs have ranks 4 and 2.
    rp_test::TempDir d;
    auto ref = rp::LoraAdapter::load(ft_test::model_path(kAdapter), *model);
    gguf::Writer w;
    w.set_string("general.architecture", "llama");
    w.set_string("general.type", "adapter");
    w.set_string("adapter.type", "lora");
    w.set_f32("adapter.lora.alpha", 8.0f);
    std::vector<std::vector<float>> keep;
    for (size_t i = 0; i < 2; ++i) {
        const rp::LoraTensor & t = ref->tensors()[i];
        const int64_t r = i == 0 ? 4 : 2, n_in = t.a->ne[0], n_out = t.b->ne[1];
        keep.emplace_back(static_cast<size_t>(n_in * r), 0.01f);
        const int64_t na[3] = {n_in, r, 1};
        w.add_tensor(t.base + ".lora_a", gguf::TensorType::F32, 2, na, keep.back().data());
        keep.emplace_back(static_cast<size_t>(r * n_out), 0.01f);
        const int64_t nb[3] = {r, n_out, 1};
        w.add_tensor(t.base + ".lora_b", gguf::TensorType::F32, 2, nb, keep.back().data());
    }
    w.write(d.file("mixed.gguf"));
    rp::FinetuneConfig mixed;
    mixed.start_adapter = d.file("mixed.gguf");
    expect_refused(mixed, "mixed ranks");

    auto qwen = rp::Model::load(ft_test::model_path("synthetic/tiny-random-qwen2.gguf"));
    rp::FinetuneConfig other;
    other.start_adapter = ft_test::model_path(kAdapter);
    try {
        rp::Trainer tr(*qwen, other);
        ADD_FAILURE() << "an adapter of another model was accepted";
    } catch (const rp::Error & e) {
        EXPECT_NE(std::string(e.what()).find(other.start_adapter), std::string::npos) << e.what();
    }
}

// The adapter's own tensor order is kept (the result has the start adapter's layout), so the flags' run, whose
// order is the targets', is compared tensor by tensor, without gradient clipping (a global norm sums in order).
TEST(StartAdapter, ToolTrainsAsResumingTheAdapterWithTheFlagsThatMatchIt) {
    rp_test::TempDir d;
    const std::string base = ft_test::tool("rp-finetune") + " -m " + ft_test::stories() + " --data " + ft_test::shared_dir() +
                             "/models/reference/train.txt --seq-len 16 --batch 2 --steps 3 -t 1 --clip 0 --lr-schedule constant ";
    const std::string adapter = ft_test::model_path(kAdapter);
    std::string log;
    ASSERT_EQ(ft_test::run(base + "--adapter " + adapter + " -o " + d.file("a.gguf"), &log), 0) << log;
    EXPECT_NE(log.find("starting from adapter " + adapter + ": rank 4, alpha 8, 15 LoRA pairs"), std::string::npos) << log;
    ASSERT_EQ(ft_test::run(base + "--resume " + adapter + " --lora-rank 4 --lora-alpha 8 --lora-targets attn_q,attn_v,ffn_down -o " +
                               d.file("b.gguf"),
                           &log),
              0)
        << log;
    auto a = gguf::Reader::open(d.file("a.gguf")), b = gguf::Reader::open(d.file("b.gguf")), start = gguf::Reader::open(adapter);
    ASSERT_EQ(a->tensors().size(), 30u);
    ASSERT_EQ(b->tensors().size(), 30u);
    EXPECT_EQ(a->get_f32("adapter.lora.alpha"), 8.0f);
    size_t changed = 0;
    for (size_t i = 0; i < a->tensors().size(); ++i) {
        const gguf::TensorInfo & t = a->tensors()[i];
        EXPECT_EQ(t.name, start->tensors()[i].name) << "the start adapter's order";
        const gguf::TensorInfo * u = b->find_tensor(t.name);
        ASSERT_NE(u, nullptr) << t.name;
        ASSERT_EQ(u->nbytes, t.nbytes) << t.name;
        EXPECT_EQ(std::memcmp(a->tensor_data(t), b->tensor_data(*u), t.nbytes), 0) << t.name;
        const gguf::TensorInfo * s0 = start->find_tensor(t.name);
        ASSERT_NE(s0, nullptr) << t.name;
        if (s0->nbytes != t.nbytes || std::memcmp(a->tensor_data(t), start->tensor_data(*s0), t.nbytes) != 0) ++changed;
    }
    EXPECT_EQ(changed, 30u) << "three steps change every factor";
    // Its checkpoint resumes (the recorded options name the start adapter) to the uninterrupted run's bytes (a
    // constant schedule: --steps changes between the two parts).
    const std::string two = base + "--adapter " + adapter + " --steps 2 -o " + d.file("r.gguf");
    ASSERT_EQ(ft_test::run(two, &log), 0) << log;
    ASSERT_EQ(ft_test::run(ft_test::tool("rp-finetune") + " --resume " + d.file("r.gguf.ckpt.gguf") + " --steps 3 -o " + d.file("r.gguf"), &log), 0)
        << log;
    auto r = gguf::Reader::open(d.file("r.gguf"));
    ASSERT_EQ(r->tensors().size(), a->tensors().size());
    for (size_t i = 0; i < a->tensors().size(); ++i)
        EXPECT_EQ(std::memcmp(a->tensor_data(a->tensors()[i]), r->tensor_data(r->tensors()[i]), a->tensors()[i].nbytes), 0)
            << a->tensors()[i].name;
    // A bad start adapter: an error naming it, nothing written.
    EXPECT_NE(ft_test::run(base + "--adapter " + adapter + " --full -o " + d.file("c.gguf"), &log), 0) << log;
    EXPECT_NE(log.find(adapter), std::string::npos) << log;
    EXPECT_FALSE(std::ifstream(d.file("c.gguf")).good());
}
