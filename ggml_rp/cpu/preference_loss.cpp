// PREFERENCE_LOSS and PREFERENCE_LOSS_BACK: ops/preference_math.h's preference_batch_loss (the pairs in order, in
// double, rounded once). A handful of numbers per sequence: one thread. The CUDA kernel runs the same function.
#include "ggml_rp/cpu/kernel_registry.h"
#include "ggml_rp/ops/preference_loss.h"
#include "base/error.h"

#include <string>

namespace rp::cpu {

namespace {

// Every answer of a pair needs a token (the length-normalised methods divide by the count); an empty answer slot
// (0 tokens) has an empty partner.
void check_counts(const Tensor * n, const float * seq, int64_t B) {
    for (int64_t b = 0; b < B; ++b) {
        const float tokens = seq[kSequenceValues * b + kAnswerTokens];
        const bool empty_pair = !preference_pair_present(seq, b - b % 2);
        if (!(empty_pair ? tokens == 0.0f : tokens >= 1.0f))
            throw Error(std::string(op_name(n->op)) + ": answer " + std::to_string(b) + " (pair " + std::to_string(b / 2) + ") has " +
                        std::to_string(tokens) + " tokens; every answer of a pair needs at least one (0 in both: an empty slot)");
    }
}

void preference_loss(Tensor * n) {
    const float * seq = n->src[1]->data_as<float>();
    const int64_t B = n->src[0]->nelements();
    check_counts(n, seq, B);
    *n->data_as<float>() = static_cast<float>(
        preference_batch_loss(preference_params(n), n->src[0]->data_as<float>(), seq, B, preference_loss_scale(n), 0.0, nullptr));
}

void preference_loss_back(Tensor * n) {
    const float * seq = n->src[1]->data_as<float>();
    const int64_t B = n->src[0]->nelements();
    check_counts(n, seq, B);
    preference_batch_loss(preference_params(n), n->src[0]->data_as<float>(), seq, B, preference_loss_scale(n), *n->src[2]->data_as<float>(),
                          n->data_as<float>());
}

const RegisterKernels kRegister{{Op::PREFERENCE_LOSS, preference_loss}, {Op::PREFERENCE_LOSS_BACK, preference_loss_back}};

} // namespace

} // namespace rp::cpu
