// gradient_check.h: directional finite differences of the training loss against its analytic gradient.
#include "models/check/gradient_check.h"

#include "base/error.h"
#include "ggml_rp/cpu/routing_tape.h"
#include "ggml_rp/ggml_rp.h"
#include "models/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

namespace rp {

namespace {

double rms(const std::vector<float> & v) {
    double s = 0;
    for (float x : v) s += static_cast<double>(x) * x;
    return v.empty() ? 0 : std::sqrt(s / static_cast<double>(v.size()));
}

struct Sequence {
    std::vector<int32_t> ids, labels;
    float loss_scale = 1;
};

Sequence sequence_of(const std::vector<int32_t> & tokens) {
    if (tokens.size() < 2) throw Error("gradient check: needs at least 2 tokens, got " + std::to_string(tokens.size()));
    Sequence s;
    s.ids.assign(tokens.begin(), tokens.end() - 1);
    s.labels.assign(tokens.begin() + 1, tokens.end());
    s.loss_scale = 1.0f / static_cast<float>(s.labels.size());
    return s;
}

// Checks every parameter of `tr` whose name is selected (all when `only` is empty). A mixture of experts is
// checked with its routing held at the base weights' (cpu/routing_tape.h): the perturbed losses are those of
// the same expert choices, the function the analytic gradient differentiates.
std::vector<TensorGradientCheck> check_params(Trainer & tr, const Sequence & s, const GradientCheckOptions & opt, bool fix_routing) {
    const int64_t T = static_cast<int64_t>(s.ids.size());
    tr.zero_grads();
    tr.accumulate(s.ids.data(), s.labels.data(), T, 1, s.loss_scale, opt.threads);
    tr.collect_grads();
    std::unique_ptr<cpu::RoutingTape> tape(fix_routing ? new cpu::RoutingTape() : nullptr);
    auto loss = [&] {
        if (tape && tape->nodes() > 0) tape->replay();  // after the base evaluation recorded the routing
        return tr.loss(s.ids.data(), s.labels.data(), T, 1, s.loss_scale, opt.threads);
    };
    // f32 rounding of the loss grows with its size: the loss step scales with it.
    const double l0 = loss();
    const double loss_step = opt.loss_step * std::max(1.0, std::fabs(l0) / 2.0);
    std::mt19937_64 rng(opt.seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<TensorGradientCheck> out;
    for (const Trainer::Param & p : tr.params()) {
        TensorGradientCheck c;
        c.tensor = p.name;
        const std::vector<float> w0 = tensor_get_f32(p.t), g = tensor_get_f32(p.t->grad);
        c.grad_rms = rms(g);
        if (c.grad_rms == 0) {
            c.skipped = true;
            c.note = "zero gradient (the tokens do not reach this tensor)";
            out.push_back(c);
            continue;
        }
        const double scale = rms(w0) > 0 ? rms(w0) : 1e-2;
        const double h_max = opt.eps * scale;
        const size_t n = w0.size();
        double num = 0, den = 0;
        for (int k = 0; k < opt.directions; ++k) {
            // D with unit RMS: the gradient's direction first, then random ones.
            std::vector<double> d(n);
            for (size_t i = 0; i < n; ++i) d[i] = k == 0 ? g[i] / c.grad_rms : normal(rng);
            if (k > 0) {
                double r = 0;
                for (double x : d) r += x * x;
                r = std::sqrt(r / static_cast<double>(n));
                for (double & x : d) x /= r;
            }
            // The step: eps of the tensor's scale, but no larger than moves the loss by `loss_step` to first
            // order (beyond that the loss is far from quadratic along D; below it f32 rounding dominates).
            double slope = 0;
            for (size_t i = 0; i < n; ++i) slope += g[i] * d[i];
            const double h = std::min(h_max, std::fabs(slope) > 0 ? loss_step / std::fabs(slope) : h_max);
            // Evaluate at W + s D; the directional derivative uses the perturbation as stored in f32.
            auto central = [&](double step) {
                std::vector<float> wp(n), wm(n);
                double dot = 0;
                for (size_t i = 0; i < n; ++i) {
                    wp[i] = static_cast<float>(w0[i] + step * d[i]);
                    wm[i] = static_cast<float>(w0[i] - step * d[i]);
                    dot += static_cast<double>(g[i]) * (static_cast<double>(wp[i]) - wm[i]);
                }
                tensor_set_f32(p.t, wp);
                const double lp = loss();
                tensor_set_f32(p.t, wm);
                const double lm = loss();
                return std::pair<double, double>{(lp - lm) / (2 * step), dot / (2 * step)};
            };
            auto [fd1, a1] = central(h);
            double fd = fd1, a = a1;
            if (opt.richardson) {
                // Richardson from h and h/2. Where the loss is far from cubic over h along D (a direction of small
                // slope takes the largest step, and e.g. a Gated DeltaNet layer's norm reaches its decays through
                // exp), the two central differences disagree: the step halves again (at most 3 times) until two
                // successive extrapolations agree within 1%.
                auto [fd2, a2] = central(h / 2);
                fd = (4 * fd2 - fd1) / 3, a = (4 * a2 - a1) / 3;
                double step = h / 2;
                for (int more = 0; more < 3 && std::fabs(fd1 - fd2) > 0.05 * std::fabs(fd); ++more) {
                    step /= 2;
                    const auto [fd3, a3] = central(step);
                    const double next = (4 * fd3 - fd2) / 3;
                    const bool settled = std::fabs(next - fd) <= 0.01 * std::fabs(next);
                    fd1 = fd2, a1 = a2, fd2 = fd3, a2 = a3;
                    fd = next, a = (4 * a2 - a1) / 3;
                    if (settled) break;
                }
            }
            tensor_set_f32(p.t, w0);
            num += (fd - a) * (fd - a);
            den += a * a;
        }
        c.error = den > 0 ? std::sqrt(num / den) : 0;
        out.push_back(c);
    }
    return out;
}

} // namespace

std::vector<std::string> gradient_check_tensors(const Model & model) {
    std::vector<std::string> names;
    auto add = [&](const std::string & n) {
        if (model.find(n)) names.push_back(n);
    };
    add("token_embd.weight");
    const uint32_t mid = model.hparams().n_layer / 2;
    const std::string blk = "blk." + std::to_string(mid) + ".";
    for (const Tensor * t : model.weights())
        if (t->name.rfind(blk, 0) == 0) names.push_back(t->name);
    add("output_norm.weight");
    add("output.weight");
    return names;
}

std::vector<TensorGradientCheck> check_base_gradients(const Model & model, const std::vector<std::string> & tensors,
                                                      const std::vector<int32_t> & tokens, const GradientCheckOptions & opt) {
    const Sequence s = sequence_of(tokens);
    std::vector<TensorGradientCheck> frozen;
    FinetuneConfig cfg;
    cfg.full = true;
    for (const std::string & n : tensors) {
        const Tensor * t = model.find(n);
        if (!t) throw Error("gradient check: the model has no tensor '" + n + "'");
        if (!dtype_is_float(t->type)) {
            TensorGradientCheck c;
            c.tensor = n;
            c.skipped = true;
            c.note = std::string("stored as ") + dtype_name(t->type) + ": frozen in training (its LoRA factors are checked)";
            frozen.push_back(c);
        } else {
            cfg.full_tensors.push_back(n);
        }
    }
    std::vector<TensorGradientCheck> out;
    if (!cfg.full_tensors.empty()) {
        Trainer tr(model, cfg);
        out = check_params(tr, s, opt, model.hparams().is_moe());
    }
    out.insert(out.end(), frozen.begin(), frozen.end());
    return out;
}

std::vector<TensorGradientCheck> check_lora_gradients(const Model & model, const LoraAdapter * adapter,
                                                      const std::vector<int32_t> & tokens, const GradientCheckOptions & opt) {
    const Sequence s = sequence_of(tokens);
    FinetuneConfig cfg;
    cfg.full = false;
    if (adapter) {
        cfg.lora_targets.clear();
        for (const LoraTensor & t : adapter->tensors())
            cfg.lora_targets.push_back(t.base.substr(0, t.base.size() - 7));  // "blk.0.attn_q.weight" -> "blk.0.attn_q"
        cfg.lora_alpha = adapter->alpha();
        cfg.lora_rank = adapter->tensors().empty() ? 1 : adapter->tensors().front().rank();
        for (const LoraTensor & t : adapter->tensors())
            if (t.rank() != cfg.lora_rank)
                throw Error("gradient check: the adapter's ranks differ between tensors (" + t.base + " has " +
                            std::to_string(t.rank()) + "); check it one rank at a time");
    } else {
        cfg.lora_rank = 4;
        cfg.lora_targets.clear();
        const std::string blk = "blk." + std::to_string(model.hparams().n_layer / 2) + ".";
        for (const char * k : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"})
            if (model.find(blk + k + ".weight")) cfg.lora_targets.push_back(blk + k);
    }
    Trainer tr(model, cfg);
    std::mt19937_64 rng(opt.seed + 1);
    std::uniform_real_distribution<double> u(-0.1, 0.1);
    for (const Trainer::Param & p : tr.params()) {
        std::vector<float> v(static_cast<size_t>(p.t->nelements()));
        bool set = false;
        if (adapter) {
            const std::string base = p.name.substr(0, p.name.rfind('.'));
            const LoraTensor * lt = adapter->find(base);
            if (lt) {
                v = tensor_get_f32(p.name.size() > 7 && p.name.compare(p.name.size() - 7, 7, ".lora_a") == 0 ? lt->a : lt->b);
                set = true;
            }
        }
        if (!set)
            for (float & x : v) x = static_cast<float>(u(rng));
        tensor_set_f32(p.t, v);
    }
    return check_params(tr, s, opt, model.hparams().is_moe());
}

} // namespace rp
