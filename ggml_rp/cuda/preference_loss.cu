// PREFERENCE_LOSS and PREFERENCE_LOSS_BACK: one thread runs the CPU kernel's loop (cpu/preference_loss.cpp) over
// the pairs in order, in double (ops/preference_math.h): a handful of numbers per answer, deterministic. An
// answer without tokens is the data's to refuse (the CPU kernel throws); here it makes the loss non-finite, which
// the trainer's step check reports.
#include "ggml_rp/cuda/common.cuh"
#include "ggml_rp/cuda/launch.h"
#include "ggml_rp/cuda/node_kernel.cuh"
#include "ggml_rp/ops/preference_loss.h"

namespace rp::cuda {

namespace {

__global__ void __launch_bounds__(1) preference_loss_kernel(const float * lp, const float * seq, int64_t B, PreferenceParams p,
                                                            double scale, float * loss) {
    double acc = 0;
    for (int64_t c = 0; c < B; c += 2) {
        const int64_t r = c + 1;
        acc += scale * pair_loss(p, lp[c], lp[r], seq[3 * c], seq[3 * r], seq[3 * c + 1], seq[3 * r + 1]).loss;
        acc -= static_cast<double>(seq[3 * c + 2]) * lp[c];
        acc -= static_cast<double>(seq[3 * r + 2]) * lp[r];
    }
    *loss = static_cast<float>(acc);
}

__global__ void __launch_bounds__(1) preference_loss_back_kernel(const float * lp, const float * seq, const float * dloss, int64_t B,
                                                                 PreferenceParams p, double scale, float * d) {
    const double dl = *dloss;
    for (int64_t c = 0; c < B; c += 2) {
        const int64_t r = c + 1;
        const PairLoss pl = pair_loss(p, lp[c], lp[r], seq[3 * c], seq[3 * r], seq[3 * c + 1], seq[3 * r + 1]);
        d[c] = static_cast<float>(dl * (scale * pl.d_chosen - static_cast<double>(seq[3 * c + 2])));
        d[r] = static_cast<float>(dl * (scale * pl.d_rejected - static_cast<double>(seq[3 * r + 2])));
    }
}

void run_preference_loss(Tensor * n, const NodeRun & r) {
    preference_loss_kernel<<<1, 1, 0, r.stream>>>(in<float>(n->src[0]), in<float>(n->src[1]), n->src[0]->nelements(),
                                                  preference_params(n), preference_loss_scale(n), out<float>(n));
    check_launch("preference_loss");
}

void run_preference_loss_back(Tensor * n, const NodeRun & r) {
    preference_loss_back_kernel<<<1, 1, 0, r.stream>>>(in<float>(n->src[0]), in<float>(n->src[1]), in<float>(n->src[2]),
                                                       n->src[0]->nelements(), preference_params(n), preference_loss_scale(n),
                                                       out<float>(n));
    check_launch("preference_loss_back");
}

const RegisterNodeKernels kRegister{{Op::PREFERENCE_LOSS, run_preference_loss}, {Op::PREFERENCE_LOSS_BACK, run_preference_loss_back}};

} // namespace

} // namespace rp::cuda
