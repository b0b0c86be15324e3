// LoRA dropout (PEFT's lora_dropout): masks keyed by (seed, step, module, position in the batch).
//   - the gradient with dropout is the derivative of the loss with the same masks (directional finite
//     difference of the f32 loss along a random direction of every LoRA factor);
//   - the masks do not depend on how a batch is split into micro-batches (seq_offset keys them);
//   - a different step draws different masks; p = 0 is exactly no dropout; a bad p is refused.
#include "ft_test_util.h"
#include "base/error.h"
#include "models/train/trainer.h"
#include "models/arch/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace {

struct Batch {
    std::vector<int32_t> ids, labels;
};

Batch make_batch(int64_t T, int64_t B, uint32_t vocab) {
    Batch b;
    std::mt19937 rng(5);
    for (int64_t i = 0; i < T * B; ++i) {
        b.ids.push_back(static_cast<int32_t>(rng() % vocab));
        b.labels.push_back(static_cast<int32_t>(rng() % vocab));
    }
    return b;
}

std::vector<float> grads_of(rp::Trainer & tr) {
    std::vector<float> g;
    for (const auto & p : tr.params()) {
        const float * d = p.t->grad->data_as<float>();
        g.insert(g.end(), d, d + p.t->nelements());
    }
    return g;
}

// LoRA factors set to small random values (B = 0 would make the A gradients vanish).
void randomize(rp::Trainer & tr, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (const auto & p : tr.params()) {
        std::vector<float> v(static_cast<size_t>(p.t->nelements()));
        for (float & x : v) x = static_cast<float>((static_cast<double>(rng() >> 11) * 0x1.0p-53 - 0.5) * 0.2);
        rp::tensor_set_f32(p.t, v);
    }
}

rp::FinetuneConfig cfg(float p) {
    rp::FinetuneConfig c;
    c.lora_rank = 4;
    c.lora_dropout = p;
    return c;
}

} // namespace

TEST(LoraDropout, GradientIsTheDerivativeOfTheMaskedLoss) {
    auto model = rp::Model::load(ft_test::stories());
    rp::Trainer tr(*model, cfg(0.3f));
    randomize(tr, 3);
    const int64_t T = 16, B = 2;
    const Batch b = make_batch(T, B, model->hparams().n_vocab);
    const float ls = 1.0f / static_cast<float>(T * B);
    tr.zero_grads();
    tr.accumulate(b.ids.data(), b.labels.data(), T, B, ls, 1, 7, 0);
    tr.collect_grads();
    const std::vector<float> g = grads_of(tr);

    std::mt19937_64 rng(11);
    std::vector<std::vector<float>> base, dir;
    double gd = 0;
    size_t k = 0;
    for (const auto & p : tr.params()) {
        base.push_back(rp::tensor_get_f32(p.t));
        dir.emplace_back(base.back().size());
        for (float & x : dir.back()) {
            x = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-53 - 0.5);
            gd += static_cast<double>(x) * g[k++];
        }
    }
    auto loss_at = [&](double h) {
        for (size_t i = 0; i < base.size(); ++i) {
            std::vector<float> v = base[i];
            for (size_t j = 0; j < v.size(); ++j) v[j] += static_cast<float>(h * dir[i][j]);
            rp::tensor_set_f32(tr.params()[i].t, v);
        }
        tr.zero_grads();
        return tr.accumulate(b.ids.data(), b.labels.data(), T, B, ls, 1, 7, 0);  // same step: same masks
    };
    // Richardson extrapolation of two central differences cancels the h^2 term of the f32 loss's curvature.
    const double h = 2e-3;
    const double fd1 = (loss_at(h) - loss_at(-h)) / (2 * h), fd2 = (loss_at(h / 2) - loss_at(-h / 2)) / h;
    const double fd = (4 * fd2 - fd1) / 3;
    EXPECT_NEAR(fd, gd, 2e-3 * std::abs(gd)) << "directional derivative vs gradient (h: " << fd1 << ", h/2: " << fd2 << ")";
    EXPECT_GT(std::abs(gd), 1e-3);
}

TEST(LoraDropout, MasksDoNotDependOnTheMicroBatchSplit) {
    auto model = rp::Model::load(ft_test::stories());
    const int64_t T = 12, B = 3;
    const Batch b = make_batch(T, B, model->hparams().n_vocab);
    const float ls = 1.0f / static_cast<float>(T * B);
    rp::Trainer one(*model, cfg(0.5f)), split(*model, cfg(0.5f)), nodrop(*model, cfg(0.0f));
    for (rp::Trainer * t : {&one, &split, &nodrop}) randomize(*t, 4);
    one.zero_grads();
    one.accumulate(b.ids.data(), b.labels.data(), T, B, ls, 1, 2, 0);
    split.zero_grads();
    split.accumulate(b.ids.data(), b.labels.data(), T, 1, ls, 1, 2, 0);
    split.accumulate(b.ids.data() + T, b.labels.data() + T, T, 2, ls, 1, 2, 1);
    nodrop.zero_grads();
    nodrop.accumulate(b.ids.data(), b.labels.data(), T, B, ls, 1, 2, 0);
    const std::vector<float> g1 = grads_of(one), g2 = grads_of(split), g0 = grads_of(nodrop);
    double num = 0, den = 0, diff0 = 0;
    for (size_t i = 0; i < g1.size(); ++i) {
        num += (static_cast<double>(g1[i]) - g2[i]) * (static_cast<double>(g1[i]) - g2[i]);
        den += static_cast<double>(g1[i]) * g1[i];
        diff0 += (static_cast<double>(g1[i]) - g0[i]) * (static_cast<double>(g1[i]) - g0[i]);
    }
    EXPECT_LT(std::sqrt(num / den), 1e-5) << "one micro-batch vs a 1 + 2 split";
    EXPECT_GT(std::sqrt(diff0 / den), 1e-2) << "dropout must change the gradient";
}

TEST(LoraDropout, StepsDrawDifferentMasksAndZeroIsNoDropout) {
    auto model = rp::Model::load(ft_test::stories());
    const int64_t T = 12;
    const Batch b = make_batch(T, 1, model->hparams().n_vocab);
    rp::Trainer a(*model, cfg(0.2f)), z(*model, cfg(0.0f));
    randomize(a, 8);
    randomize(z, 8);
    const double l0 = a.accumulate(b.ids.data(), b.labels.data(), T, 1, 1.0f, 1, 0, 0);
    const double l1 = a.accumulate(b.ids.data(), b.labels.data(), T, 1, 1.0f, 1, 1, 0);
    const double l0b = a.accumulate(b.ids.data(), b.labels.data(), T, 1, 1.0f, 1, 0, 0);
    EXPECT_EQ(l0, l0b);
    EXPECT_NE(l0, l1);
    // p = 0 builds the graph without dropout: the loss equals the evaluation loss (never dropped out).
    EXPECT_EQ(z.accumulate(b.ids.data(), b.labels.data(), T, 1, 1.0f, 1, 5, 0), z.loss(b.ids.data(), b.labels.data(), T, 1, 1.0f, 1));
    EXPECT_THROW(rp::Trainer(*model, cfg(1.0f)), rp::Error);
    EXPECT_THROW(rp::Trainer(*model, cfg(-0.1f)), rp::Error);
}
