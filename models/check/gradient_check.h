// Gradients against finite differences of our own loss, for any model (rp-check's gradient check).
//
// For each tensor checked, the analytic gradient g of the mean cross-entropy on one sequence (the training
// graphs: checkpoint + recompute, fused head) is compared with directional central differences of the same
// loss along a few directions D (the first is g itself, the others random), Richardson-extrapolated:
//   fd(h) = (L(W + hD) - L(W - hD)) / 2h,   fd = (4 fd(h/2) - fd(h)) / 3,   error = ||fd - <g, D>|| / ||<g, D>||
// over the directions, with h a fraction `eps` of the tensor's RMS (D has unit RMS). The loss is computed in
// f32 (one forward per evaluation, summed in double); its rounding limits the agreement to about 1e-4 on the
// shapes tested, which is what the tolerance of rp-check allows for (a 1% error in a backward shows as 1e-2).
//
// Base tensors are checked through a full finetune of just those tensors (FinetuneConfig::full_tensors): f32
// masters of them alone, the rest of the model frozen, so a 1B model costs two copies of the checked tensors.
// Quantized tensors are frozen in training and are reported as skipped; LoRA factors are checked on an adapter
// (the user's, or a random one on every linear kind). A mixture of experts is differentiated with its expert
// choices held at the base weights' (ggml_rp/cpu/routing_tape.h): top-k routing is discontinuous, and a step
// that changes a choice would measure the jump.
#pragma once

#include "models/arch/lora.h"
#include "models/arch/model.h"

#include <cstdint>
#include <string>
#include <vector>

namespace rp {

struct GradientCheckOptions {
    int directions = 2;    // the gradient's own direction, then random ones
    double eps = 5e-2;     // h <= eps * RMS of the tensor (1e-2 absolute for an all-zero tensor)
    double loss_step = 3e-3;  // and h * |<g, D>| <= this * max(1, L / 2): the loss moves by about that much
    bool richardson = true;   // false: one central difference (half the evaluations; --quick)
    int threads = 0;
    uint64_t seed = 1;     // the random directions
};

struct TensorGradientCheck {
    std::string tensor;    // what was checked: a GGUF name, or "<base>.lora_a" / ".lora_b"
    double grad_rms = 0;   // RMS of its analytic gradient
    double error = 0;      // ||fd - <g, D>|| / ||<g, D>|| over the directions
    bool skipped = false;  // not checked; `note` says why
    std::string note;
};

// One tensor of each kind: token_embd, output_norm, output (when untied), and every tensor of the middle
// layer (norms, q/k/v/o with their biases and q/k norms, gate/up/down).
std::vector<std::string> gradient_check_tensors(const Model & model);

// `tokens` (>= 2): the sequence; the loss is the mean CE of predicting tokens[1..] from tokens[..n-1].
std::vector<TensorGradientCheck> check_base_gradients(const Model & model, const std::vector<std::string> & tensors,
                                                      const std::vector<int32_t> & tokens, const GradientCheckOptions & opt);

// The LoRA factors of `adapter` (its values), or with adapter == nullptr of a random rank-4 adapter on every
// linear kind of the middle layer (both factors non-zero, so both have a gradient).
std::vector<TensorGradientCheck> check_lora_gradients(const Model & model, const LoraAdapter * adapter,
                                                      const std::vector<int32_t> & tokens, const GradientCheckOptions & opt);

} // namespace rp
