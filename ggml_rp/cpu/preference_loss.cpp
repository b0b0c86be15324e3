// PREFERENCE_LOSS and PREFERENCE_LOSS_BACK: the pairs in order, in double (ops/preference_math.h), rounded once.
// A handful of numbers per answer: one thread. The CUDA kernel (cuda/preference_loss.cu) runs the same loop.
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/ops/preference_loss.h"
#include "base/error.h"

#include <string>

namespace rp::cpu {

namespace {

// Every answer needs a token: the length-normalised methods divide by the count.
void check_counts(const Tensor * n, const float * seq, int64_t B) {
    for (int64_t b = 0; b < B; ++b)
        if (!(seq[3 * b + 1] >= 1.0f))
            throw Error(std::string(op_name(n->op)) + ": answer " + std::to_string(b) + " (pair " + std::to_string(b / 2) +
                        ") has " + std::to_string(seq[3 * b + 1]) + " tokens; every answer needs at least one");
}

void preference_loss(Tensor * n) {
    const float * lp = n->src[0]->data_as<float>();
    const float * seq = n->src[1]->data_as<float>();
    const int64_t B = n->src[0]->nelements();
    check_counts(n, seq, B);
    const PreferenceParams p = preference_params(n);
    const double scale = preference_loss_scale(n);
    double loss = 0;
    for (int64_t c = 0; c < B; c += 2) {
        const int64_t r = c + 1;
        loss += scale * pair_loss(p, lp[c], lp[r], seq[3 * c], seq[3 * r], seq[3 * c + 1], seq[3 * r + 1]).loss;
        loss -= double(seq[3 * c + 2]) * lp[c];
        loss -= double(seq[3 * r + 2]) * lp[r];
    }
    *n->data_as<float>() = static_cast<float>(loss);
}

void preference_loss_back(Tensor * n) {
    const float * lp = n->src[0]->data_as<float>();
    const float * seq = n->src[1]->data_as<float>();
    const double dloss = *n->src[2]->data_as<float>();
    const int64_t B = n->src[0]->nelements();
    check_counts(n, seq, B);
    const PreferenceParams p = preference_params(n);
    const double scale = preference_loss_scale(n);
    float * d = n->data_as<float>();
    for (int64_t c = 0; c < B; c += 2) {
        const int64_t r = c + 1;
        const PairLoss pl = pair_loss(p, lp[c], lp[r], seq[3 * c], seq[3 * r], seq[3 * c + 1], seq[3 * r + 1]);
        d[c] = static_cast<float>(dloss * (scale * pl.d_chosen - double(seq[3 * c + 2])));
        d[r] = static_cast<float>(dloss * (scale * pl.d_rejected - double(seq[3 * r + 2])));
    }
}

const RegisterKernels kRegister{{Op::PREFERENCE_LOSS, preference_loss}, {Op::PREFERENCE_LOSS_BACK, preference_loss_back}};

} // namespace

} // namespace rp::cpu
