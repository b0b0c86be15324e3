#include "models/train/layer_program.h"

#include "ggml_rp/cpu/kernel_scratch.h"
#include "ggml_rp/ggml_rp.h"
#include "ggml_rp/runtime/graph_runner.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace rp {

CpuBackend & Trainer::kept_backend(int layer) {
    if (kept_graphs_.size() < static_cast<size_t>(num_layers())) kept_graphs_.resize(static_cast<size_t>(num_layers()));
    std::unique_ptr<CpuBackend> & b = kept_graphs_[static_cast<size_t>(layer)];
    if (!b) b = std::make_unique<CpuBackend>();
    return *b;
}

std::unique_ptr<Trainer::KeptLayer> Trainer::keep_layer(int layer, const void * in, const void * dout, void * din,
                                                        const MicroBatchInfo & mb) {
    const ProgramKey key = program_key(ProgramKind::Backward, layer, mb, true);
    std::unique_ptr<KeptLayer> k;
    if (replays()) {
        const auto it = kept_cache_.find(key);
        if (it != kept_cache_.end()) {
            k = std::move(it->second);
            kept_cache_.erase(it);
        }
    }
    if (!k) {
        const HParams hp = backward_hparams(mb);
        const int64_t T = mb.seq_len, B = mb.n_seq, E = hp.n_embd;
        k = std::make_unique<KeptLayer>(*this, layer, mb);
        Program & p = k->p;
        Program::Step & s = p.new_step();  // (its positions and zeros are handled here, not by run_program)
        // x's gradient (din) is zeroed right before the backward half runs (the buffer serves other layers before)
        Tensor * x = p.boundary_param(s, Arg::In, 0, Arg::Din, E, T, B, /*zero=*/false);
        k->din_bytes = hidden_bytes(mb);
        k->pos = p.positions(s, mb);
        // (k->y, the layer's output as the boundary holds it, is not flagged as an output: it is the last forward
        // node and is copied out before any backward node runs. The backward starts from y: the rounding to the
        // boundary type passes gradients through.)
        Tensor * y = build_layer(p.ctx, hp, p.b.layer, layer - 1, p.as_f32(x), k->pos, &p.b.lora, nullptr, cfg_.attention_type);
        k->y = p.boundary_out(y);
        build_forward(k->whole, k->y);
        const size_t n_forward = k->whole.nodes.size();
        std::vector<Tensor *> ps = p.b.params;
        ps.push_back(x);
        build_backward(p.ctx, k->whole, y, p.leaf(DType::F32, Arg::Dout, 0, E, T, B), ps);
        k->forward.leafs = k->backward.leafs = k->whole.leafs;
        k->forward.nodes.assign(k->whole.nodes.begin(), k->whole.nodes.begin() + static_cast<std::ptrdiff_t>(n_forward));
        k->backward.nodes.assign(k->whole.nodes.begin() + static_cast<std::ptrdiff_t>(n_forward), k->whole.nodes.end());
        split_kept_memory(*k);
    }
    CallArgs a;
    a.in = in;
    a.dout = dout;
    a.din = din;
    rebind(k->p, host_memory(layer), a);
    position_values(mb, k->pos_values, k->first_values);
    k->pos.pos->data = k->pos_values.data();
    if (k->pos.key_start) k->pos.key_start->data = k->first_values.data();
    return k;
}

void Trainer::split_kept_memory(KeptLayer & k) {
    // The forward nodes (their roots: views have no memory) that a backward node reads, or is a view of.
    const std::unordered_set<const Tensor *> forward(k.forward.nodes.begin(), k.forward.nodes.end());
    std::unordered_set<const Tensor *> read;
    auto root = [](const Tensor * t) { return t->view_src ? t->view_src : t; };
    for (const Tensor * n : k.backward.nodes) {
        if (n->view_src && forward.count(n->view_src)) read.insert(n->view_src);
        for (const Tensor * src : n->src)
            if (src && forward.count(root(src))) read.insert(root(src));
    }
    constexpr size_t kAlign = 64;
    k.kept.clear();
    k.kept_bytes = 0;
    std::unordered_set<const Tensor *> placed;
    for (Tensor * n : k.whole.nodes)
        if (!n->is_view() && read.count(n)) {
            k.kept.push_back({n, k.kept_bytes});
            k.kept_bytes += std::max(kAlign, (n->nbytes() + n->aux_bytes + kAlign - 1) / kAlign * kAlign);
            placed.insert(n);
        }
    k.scratch_plan = cpu::plan_cpu_graph(k.whole, &placed);  // (kAlign: the CPU plan's)
}

void Trainer::bind_kept(int layer, KeptLayer & k) {
    char * base = static_cast<char *>(kept_backend(layer).reserve(k.kept_bytes));
    for (const auto & [t, offset] : k.kept) t->data = base + offset;
    host_graphs_.allocate(k.whole, k.scratch_plan);
}

Trainer::KeptBytes Trainer::kept_layer_bytes(int layer, const MicroBatchInfo & mb) {
    const std::unique_ptr<KeptLayer> k = keep_layer(layer, nullptr, nullptr, nullptr, mb);
    return {k->kept_bytes, k->scratch_plan.size};
}

void Trainer::release_kept(int layer, const MicroBatchInfo & mb, std::unique_ptr<KeptLayer> k) {
    if (!replays()) return;
    if (kept_cache_.size() >= kMaxCachedPrograms) kept_cache_.clear();  // shapes that keep changing: bound it
    kept_cache_.emplace(program_key(ProgramKind::Backward, layer, mb, true), std::move(k));
}

size_t kept_activation_layers(const std::vector<size_t> & layer_graph_bytes, size_t budget, size_t * kept_bytes) {
    KeptLayerBudget policy(budget);
    size_t n = 0;
    for (const size_t b : layer_graph_bytes) {
        if (!policy.admit(b)) break;
        ++n;
    }
    if (kept_bytes) *kept_bytes = policy.used();
    return n;
}

double Trainer::accumulate(const int32_t * ids, const int32_t * labels, int64_t T, int64_t B, float loss_scale,
                           int n_threads, int64_t step, int64_t seq_offset, const int32_t * positions) {
    MicroBatchInfo mb;
    mb.packed = positions != nullptr;
    mb.positions = positions;
    mb.seq_len = T;
    mb.n_seq = B;
    mb.loss_scale = loss_scale;
    mb.step = step;
    mb.seq_offset = seq_offset;
    return accumulate(ids, labels, mb, n_threads);
}

double Trainer::accumulate(const int32_t * ids, const int32_t * labels, const MicroBatchInfo & mb_in, int n_threads, float * results) {
    if ((cfg_.preference || cfg_.grpo) && !mb_in.sequence_values)
        throw Error(std::string("accumulate: ") + (cfg_.grpo ? "GRPO needs each token's advantage, log-probabilities and weight"
                                                              : "a preference objective needs each sequence's reference, tokens and NLL weight") +
                    " (sequence_values)");
    MicroBatchInfo mb = mb_in;
    mb.token_chunk = cfg_.token_chunk;
    ProgramContext pc;
    pc.n_threads = n_threads;
    const int L = num_layers();
    const size_t H = hidden_bytes(mb) / sizeof(float), X = (host_input_bytes(mb) + sizeof(float) - 1) / sizeof(float);

    // Forward: the input of every layer (the checkpoints) is kept, and the first decoder layers' whole graphs
    // while they fit cfg_.activation_memory (never with token chunks); the head runs forward + backward at once.
    std::vector<std::vector<float>> & act = step_inputs_;
    act.resize(static_cast<size_t>(L));
    // The output gradients of the backward sweep alternate between two buffers: layer l reads its output's
    // gradient from grad_buf[(L - 2 - l) % 2] and writes its input's into the other.
    std::vector<float> * grad_buf = step_grads_;
    grad_buf[0].assign(H, 0.0f);
    grad_buf[1].assign(H, 0.0f);
    auto dout_of = [&](int l) { return grad_buf[(L - 2 - l) % 2].data(); };
    auto din_of = [&](int l) { return grad_buf[(L - 1 - l) % 2].data(); };
    std::vector<std::unique_ptr<KeptLayer>> kept(static_cast<size_t>(L));
    KeptLayerBudget policy(cfg_);
    kept_live_.store(0);
    for (int l = 0; l < L - 1; ++l) {
        act[static_cast<size_t>(l + 1)].assign(X, 0.0f);
        const void * in = l == 0 ? static_cast<const void *>(ids) : act[static_cast<size_t>(l)].data();
        if (policy.open() && l > 0) {
            std::unique_ptr<KeptLayer> k = keep_layer(l, in, dout_of(l), din_of(l), mb);
            if (policy.admit(k->kept_bytes)) {
                bind_kept(l, *k);
                host_graphs_.compute(k->forward, pc.n_threads);
                CpuGraphRunner(nullptr, &host_graphs_).copy_out(act[static_cast<size_t>(l + 1)].data(), k->y);
                kept[static_cast<size_t>(l)] = std::move(k);
                kept_live_.store(policy.used());
                note_graph_bytes(kept[static_cast<size_t>(l)]->scratch_plan.size);
                continue;
            }
            release_kept(l, mb, std::move(k));  // this layer and the later ones recompute
        }
        forward(l, host_memory(l), in, act[static_cast<size_t>(l + 1)].data(), mb, pc);
    }
    std::vector<float> out(head_results(mb));
    head(host_memory(L - 1), act[static_cast<size_t>(L - 1)].data(), labels, out.data(), dout_of(L - 2), mb, pc);
    if (results) std::copy(out.begin(), out.end(), results);
    // Backward, last layer to first: the kept ones run their backward half, the others are recomputed from
    // their checkpoint.
    for (int l = L - 2; l >= 0; --l) {
        if (std::unique_ptr<KeptLayer> & k = kept[static_cast<size_t>(l)]) {
            std::memset(din_of(l), 0, k->din_bytes);
            bind_kept(l, *k);  // (the shared buffer may have moved since the forward half)
            host_graphs_.compute(k->backward, pc.n_threads);
            note_graph_bytes(k->scratch_plan.size);
            kept_live_.fetch_sub(k->kept_bytes);
            release_kept(l, mb, std::move(k));
            continue;
        }
        backward(l, host_memory(l), l == 0 ? static_cast<const void *>(ids) : act[static_cast<size_t>(l)].data(), dout_of(l),
                     l == 0 ? nullptr : din_of(l), mb, pc);
    }
    return out[0];
}

} // namespace rp
